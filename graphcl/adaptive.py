"""JOAO's adaptive choice of the augmentation pair (You et al. 2021, "Graph Contrastive Learning
Automated", ICML; reference code Shen-Lab/GraphCL_Automated).

JOAO solves min_θ max_{P∈Δ} Σ_{(i,j)} P_ij ℓ_ij(θ) − (γ/2)·‖P − uniform‖² over the K×K pairs of
augmentations (one for each view), alternating SGD on θ with one projected gradient ASCENT step
on the pair distribution P per epoch (the reference's ``joao`` step, with its β = 1):

    P ← Proj_Δ(P + β·(ℓ − γ·(P − 1/K²)))

where ℓ_ij is the mean contrastive loss of pair (i, j) over the epoch and Proj_Δ the Euclidean
projection onto the probability simplex. Its fixed point is the exact inner maximiser
Proj_Δ(1/K² + ℓ/γ), reached geometrically when β·γ < 2. Pairs that are harder (higher loss)
gain probability; γ pulls P back toward uniform.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from shared.distributed import all_reduce_sum

__all__ = ["AugmentationSampler", "project_simplex"]


def project_simplex(v: Tensor) -> Tensor:
    """Euclidean projection of each row of ``v`` onto the probability simplex
    {w : w ≥ 0, Σ w = 1} (Duchi et al. 2008, "Efficient projections onto the l1-ball", Fig. 1):
    w = max(v − θ, 0) with θ = (Σ_{k≤ρ} u_k − 1)/ρ, u sorted descending and ρ the largest k with
    u_k > (Σ_{i≤k} u_i − 1)/k. Exact (sort-based), where the reference bisects to 1e-2 and
    renormalises.

    Shape:
        v: ``(..., n)``; returns ``(..., n)``.
    """
    if v.numel() == 0 or not v.is_floating_point():
        raise ValueError(f"project_simplex needs a non-empty float tensor, got {v.dtype} {v.shape}")
    u = torch.sort(v, dim=-1, descending=True).values  # (..., n)
    excess = u.cumsum(-1) - 1  # (..., n)
    k = torch.arange(1, v.size(-1) + 1, dtype=v.dtype, device=v.device)
    rho = (u - excess / k > 0).sum(-1, keepdim=True)  # (..., 1); the condition holds on a prefix
    theta = excess.gather(-1, rho - 1) / rho  # (..., 1)
    return (v - theta).clamp_min(0)


class AugmentationSampler:
    """JOAO's distribution over the K×K augmentation pairs: ``sample`` draws the pair of a
    batch, ``update`` takes one projected gradient-ascent step per epoch (module docstring).

    Args:
        augmentations: the augmentation names (or their number K); pair (i, j) means
            augmentation i for the first view and j for the second.
        gamma: γ, the weight of the pull toward uniform (JOAO chem default 0.1).
        step_size: β, the ascent step (1 in the reference code).

    Losses reach ``update`` either as a ``(K, K)`` tensor of mean losses per pair (NaN where a
    pair was not observed) or, with ``update()``, as the means of the losses passed to
    ``record(i, j, loss)`` since the last update (no host sync per step). A pair not observed
    keeps its last loss estimate; a pair never observed gets the mean of the observed ones.
    Under DDP ``update()`` sums the records of every rank first (a collective: every rank calls
    it at the same point), so all ranks keep the same distribution.

    Shape:
        probabilities: ``(K, K)`` float64; ``history``: one ``(K, K)`` per update, the initial
        uniform distribution first.
    """

    def __init__(
        self, augmentations: Sequence[str] | int, *, gamma: float = 0.1, step_size: float = 1.0
    ) -> None:
        names = (
            tuple(f"aug{i}" for i in range(augmentations))
            if isinstance(augmentations, int)
            else tuple(augmentations)
        )
        if len(names) < 1:
            raise ValueError("AugmentationSampler needs at least one augmentation")
        if not gamma >= 0 or not step_size > 0:
            raise ValueError(f"need gamma >= 0 and step_size > 0, got {gamma}, {step_size}")
        K = len(names)
        self.names, self.gamma, self.step_size = names, float(gamma), float(step_size)
        self.probabilities = torch.full((K, K), 1.0 / K**2, dtype=torch.float64)
        self.history: list[Tensor] = [self.probabilities.clone()]
        self._estimate = torch.full((K, K), float("nan"), dtype=torch.float64)
        self._loss_sum = torch.zeros(K, K, dtype=torch.float64)
        self._count = torch.zeros(K, K, dtype=torch.long)

    @property
    def num_augmentations(self) -> int:
        return len(self.names)

    def sample(self, generator: torch.Generator | None = None) -> tuple[int, int]:
        """Draw the pair ``(i, j)`` of one batch from the current distribution (CPU)."""
        # the distribution lives on the CPU: reading the draw is no device wait
        (index,) = torch.multinomial(self.probabilities.view(-1), 1, generator=generator).tolist()
        i, j = divmod(index, self.num_augmentations)
        return i, j

    def record(self, i: int, j: int, loss: Tensor) -> None:
        """Add one observed loss of pair ``(i, j)``; the sum stays on the loss's device."""
        if self._loss_sum.device != loss.device:
            self._loss_sum = self._loss_sum.to(loss.device)
        self._loss_sum[i, j] += loss.detach().to(torch.float64)
        self._count[i, j] += 1

    def update(self, pair_losses: Tensor | None = None) -> Tensor:
        """One JOAO step: P ← Proj_Δ(P + β·(ℓ − γ·(P − 1/K²))); returns the new ``(K, K)`` P.

        Shape:
            pair_losses: ``(K, K)`` mean loss per pair observed this epoch (NaN: not observed);
            ``None``: the means of the recorded losses.
        """
        K = self.num_augmentations
        if pair_losses is None:
            # every rank's records: the ranks of a DDP run keep one distribution (each calls
            # update at the same point, fit's per-epoch evaluation on all ranks)
            device = self._loss_sum.device
            both = torch.stack([self._loss_sum, self._count.to(device, torch.float64)])  # (2, K, K)
            sums, counts = all_reduce_sum(both).cpu().unbind(0)  # (K, K) each
            if int(counts.sum()) == 0:
                raise ValueError("update() without pair_losses needs record(...) calls first")
            losses = torch.where(counts > 0, sums / counts.clamp_min(1), float("nan"))
            self._loss_sum = torch.zeros_like(self._loss_sum)
            self._count.zero_()
        else:
            losses = pair_losses.detach().to("cpu", torch.float64)
        if losses.shape != (K, K):
            raise ValueError(f"pair_losses must be ({K}, {K}), got {tuple(losses.shape)}")
        observed = ~losses.isnan()
        if not bool(observed.any()) or not bool(losses[observed].isfinite().all()):
            raise ValueError(f"pair_losses need a finite loss for some pair, got {losses}")
        self._estimate = torch.where(observed, losses, self._estimate)
        loss = torch.where(self._estimate.isnan(), losses[observed].mean(), self._estimate)
        p = self.probabilities
        ascent = p + self.step_size * (loss - self.gamma * (p - 1.0 / K**2))  # (K, K)
        self.probabilities = project_simplex(ascent.view(-1)).view(K, K)
        self.history.append(self.probabilities.clone())
        return self.probabilities

    def state_dict(self) -> dict[str, Tensor]:
        """Everything ``load_state_dict`` needs to resume exactly (tensors only)."""
        return {
            "probabilities": self.probabilities.clone(),
            "history": torch.stack(self.history),  # (T, K, K)
            "estimate": self._estimate.clone(),
            "loss_sum": self._loss_sum.cpu().clone(),
            "count": self._count.clone(),
            "gamma": torch.tensor(self.gamma, dtype=torch.float64),
            "step_size": torch.tensor(self.step_size, dtype=torch.float64),
        }

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        K = self.num_augmentations
        if tuple(state["probabilities"].shape) != (K, K):
            raise ValueError(
                f"state is for {state['probabilities'].shape[0]} augmentations, not {K}"
            )
        self.probabilities = state["probabilities"].to("cpu", torch.float64).clone()
        self.history = list(state["history"].to("cpu", torch.float64).clone().unbind())
        self._estimate = state["estimate"].to("cpu", torch.float64).clone()
        self._loss_sum = state["loss_sum"].to("cpu", torch.float64).clone()
        self._count = state["count"].to("cpu", torch.long).clone()
        self.gamma, self.step_size = float(state["gamma"]), float(state["step_size"])

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({list(self.names)}, gamma={self.gamma}, "
            f"step_size={self.step_size})"
        )
