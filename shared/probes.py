"""Evaluation of frozen representations: linear probe, weighted kNN, alignment/uniformity.

Every probe takes feature tensors and returns numbers; accuracies are fractions in [0, 1].
`extract_features` runs an encoder over a loader to get those tensors.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from shared.losses.metrics import alignment, uniformity
from shared.runtime import eval_mode, move_to_device

__all__ = [
    "FittedProbe",
    "ProbeResult",
    "Split",
    "alignment_uniformity",
    "extract_features",
    "knn_probe",
    "linear_probe",
    "train_val_split",
]

# Weight decays tried by default: 10^-6 ... 10^0. SimCLR's transfer protocol (Chen et al. 2020,
# appendix, after Kornblith et al. 2019) searches 45 values in [1e-6, 1e5]; a coarser grid suffices
# for monitoring and keeps the probe fast.
DEFAULT_WEIGHT_DECAYS: tuple[float, ...] = tuple(10.0**e for e in range(-6, 1))


class FittedProbe(NamedTuple):
    """The logistic regression `linear_probe` refit on all of train: standardise, then W x + b.

    Apply it to other features of the same encoder (e.g. of corrupted test images) with
    `predict`.
    """

    weight: Tensor  # (C, D)
    bias: Tensor  # (C,)
    mean: Tensor  # (D,) standardisation of the training features (0 without standardize)
    std: Tensor  # (D,) (1 without standardize)

    def logits(self, x: Tensor) -> Tensor:
        """Shape: x (N, D) -> (N, C), computed in the probe's dtype on its device."""
        x = x.to(device=self.weight.device, dtype=self.weight.dtype)
        return ((x - self.mean) / self.std) @ self.weight.T + self.bias  # (N, C)

    def predict(self, x: Tensor) -> Tensor:
        """Shape: x (N, D) -> predicted classes (N,)."""
        return self.logits(x).argmax(dim=1)


class ProbeResult(NamedTuple):
    """Outcome of `linear_probe`."""

    accuracy: float  # test accuracy of the model refit on all of train with `weight_decay`
    val_accuracy: float  # accuracy on the held-out part of train (nan when val_fraction == 0)
    weight_decay: float  # the chosen weight decay
    model: FittedProbe | None = None  # that refit model


class Split(NamedTuple):
    """Disjoint index sets of a train/validation split."""

    fit: Tensor  # (N - N_val,) int64, sorted
    val: Tensor  # (N_val,) int64, sorted


def train_val_split(num_samples: int, val_fraction: float, *, seed: int = 0) -> Split:
    """Random split of `range(num_samples)` holding out round(val_fraction * N) indices (>= 1).

    Deterministic given `seed` (a private CPU generator; the global RNG is not touched).
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    num_val = max(1, round(val_fraction * num_samples))
    if num_val >= num_samples:
        raise ValueError(
            f"val_fraction={val_fraction} leaves no training samples out of {num_samples}"
        )
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(num_samples, generator=generator)  # (N,)
    return Split(fit=order[num_val:].sort().values, val=order[:num_val].sort().values)


def _check_features(x: Tensor, y: Tensor, name: str) -> None:
    if x.ndim != 2 or y.ndim != 1 or x.shape[0] != y.shape[0]:
        raise ValueError(
            f"{name}: expected features (N, D) and labels (N,), got {tuple(x.shape)} and "
            f"{tuple(y.shape)}"
        )
    if x.shape[0] == 0:
        raise ValueError(f"{name}: no samples")
    if y.dtype.is_floating_point or y.dtype.is_complex or y.dtype == torch.bool:
        raise ValueError(f"{name}: labels must be integer class indices, got dtype {y.dtype}")
    if int(y.min()) < 0:
        raise ValueError(f"{name}: labels must be >= 0, got {int(y.min())}")


def _check_pair(train_x: Tensor, train_y: Tensor, test_x: Tensor, test_y: Tensor) -> None:
    _check_features(train_x, train_y, "train")
    _check_features(test_x, test_y, "test")
    if train_x.shape[1] != test_x.shape[1]:
        raise ValueError(
            f"train and test feature dims differ: {train_x.shape[1]} vs {test_x.shape[1]}"
        )


def _num_classes(num_classes: int | None, *labels: Tensor) -> int:
    needed = max(int(y.max()) for y in labels) + 1
    if num_classes is None:
        return needed
    if num_classes < needed:
        raise ValueError(f"num_classes={num_classes} but labels go up to {needed - 1}")
    return num_classes


def _compute_dtype(x: Tensor) -> torch.dtype:
    # Half-precision features are probed in float32; float64 stays float64.
    return torch.promote_types(x.dtype, torch.float32)


def _fit_logistic(
    x: Tensor,
    y: Tensor,
    num_classes: int,
    weight_decay: float,
    optimizer: Literal["lbfgs", "adam"],
    max_iter: int,
    lr: float,
) -> tuple[Tensor, Tensor]:
    """Multinomial logistic regression: min mean CE(W x + b, y) + weight_decay / 2 * ||W||^2.

    Convex; zero initialisation makes it deterministic. Returns W (C, D) and b (C,).
    """
    _, D = x.shape
    weight = torch.zeros(num_classes, D, dtype=x.dtype, device=x.device, requires_grad=True)
    bias = torch.zeros(num_classes, dtype=x.dtype, device=x.device, requires_grad=True)

    def objective() -> Tensor:
        logits = x @ weight.T + bias  # (N, C)
        return F.cross_entropy(logits, y) + 0.5 * weight_decay * weight.square().sum()

    with torch.enable_grad():
        if optimizer == "lbfgs":
            lbfgs = torch.optim.LBFGS(
                [weight, bias], lr=1.0, max_iter=max_iter, line_search_fn="strong_wolfe"
            )

            def closure() -> float:
                lbfgs.zero_grad()
                loss = objective()
                torch.autograd.backward(loss)
                return float(loss.detach())

            lbfgs.step(closure)  # type: ignore[no-untyped-call]
        else:
            adam = torch.optim.Adam([weight, bias], lr=lr)
            for _ in range(max_iter):
                adam.zero_grad()
                torch.autograd.backward(objective())
                adam.step()
    return weight.detach(), bias.detach()


def _standardizer(x: Tensor) -> tuple[Tensor, Tensor]:
    mean = x.mean(dim=0)  # (D,)
    std = x.std(dim=0, unbiased=False)  # (D,)
    # Constant features keep scale 1 (as sklearn's StandardScaler does) instead of blowing up.
    return mean, torch.where(std > 0, std, torch.ones_like(std))


class _FitSettings(NamedTuple):
    optimizer: Literal["lbfgs", "adam"]
    max_iter: int
    lr: float
    standardize: bool


def _fit_and_score(
    fit_x: Tensor,
    fit_y: Tensor,
    eval_x: Tensor,
    eval_y: Tensor,
    num_classes: int,
    weight_decay: float,
    settings: _FitSettings,
) -> tuple[float, FittedProbe]:
    if settings.standardize:
        mean, std = _standardizer(fit_x)
    else:
        mean, std = fit_x.new_zeros(fit_x.shape[1]), fit_x.new_ones(fit_x.shape[1])
    weight, bias = _fit_logistic(
        (fit_x - mean) / std,
        fit_y,
        num_classes,
        weight_decay,
        settings.optimizer,
        settings.max_iter,
        settings.lr,
    )
    model = FittedProbe(weight, bias, mean, std)
    predictions = model.predict(eval_x)  # (N_eval,)
    return int((predictions == eval_y).sum()) / eval_y.shape[0], model


@torch.no_grad()
def linear_probe(
    train_x: Tensor,
    train_y: Tensor,
    test_x: Tensor,
    test_y: Tensor,
    *,
    optimizer: Literal["lbfgs", "adam"] = "lbfgs",  # SimCLR's transfer linear eval (appendix)
    weight_decay: float | Sequence[float] = DEFAULT_WEIGHT_DECAYS,
    val_fraction: float = 0.1,
    max_iter: int = 500,
    lr: float = 1e-2,  # Adam only
    standardize: bool = True,
    num_classes: int | None = None,
    seed: int = 0,
) -> ProbeResult:
    """Accuracy of an L2-regularised multinomial logistic regression on frozen features.

    Full batch, in torch, on the features' device. A fraction `val_fraction` of train (split by
    `train_val_split` with `seed`) is held out; every weight decay of the grid is fitted on the
    rest and scored on it; the best (ties: the larger weight decay) is refit on all of train and
    scored on test. Features are standardised with the statistics of the data each model is fit
    on. With a single weight decay, `val_fraction=0` skips the held-out fit (val_accuracy nan).

    Objective: mean cross-entropy + weight_decay / 2 * ||W||_F^2 (bias not decayed).

    Shape:
        - train_x: (N, D), train_y: (N,) int
        - test_x: (M, D), test_y: (M,) int
    """
    _check_pair(train_x, train_y, test_x, test_y)
    if optimizer not in ("lbfgs", "adam"):
        raise ValueError(f"optimizer must be 'lbfgs' or 'adam', got {optimizer!r}")
    grid = [float(weight_decay)] if isinstance(weight_decay, int | float) else list(weight_decay)
    if not grid or any(not wd >= 0.0 for wd in grid):
        raise ValueError(f"weight_decay must be >= 0 (or a non-empty grid of such), got {grid}")
    if max_iter < 1:
        raise ValueError(f"max_iter must be >= 1, got {max_iter}")
    if not lr > 0.0:
        raise ValueError(f"lr must be > 0, got {lr}")
    if val_fraction == 0.0 and len(grid) > 1:
        raise ValueError(f"a weight-decay grid needs val_fraction > 0, got {val_fraction}")
    C = _num_classes(num_classes, train_y, test_y)
    dtype = _compute_dtype(train_x)
    # .to returns the input itself when nothing changes; nothing below writes in place.
    train_x = train_x.to(dtype)
    test_x = test_x.to(device=train_x.device, dtype=dtype)
    train_y, test_y = train_y.to(train_x.device), test_y.to(train_x.device)
    settings = _FitSettings(optimizer, max_iter, lr, standardize)

    best_wd, best_val = grid[0], float("nan")
    if val_fraction != 0.0:
        split = train_val_split(train_x.shape[0], val_fraction, seed=seed)
        fit, val = split.fit.to(train_x.device), split.val.to(train_x.device)
        for wd in grid:
            score, _ = _fit_and_score(
                train_x[fit], train_y[fit], train_x[val], train_y[val], C, wd, settings
            )
            # Keep the first score, a better one, or a tie with a larger weight decay.
            if best_val != best_val or score > best_val or (score == best_val and wd > best_wd):
                best_wd, best_val = wd, score
    accuracy, model = _fit_and_score(train_x, train_y, test_x, test_y, C, best_wd, settings)
    return ProbeResult(accuracy, best_val, best_wd, model)


@torch.no_grad()
def knn_probe(
    train_x: Tensor,
    train_y: Tensor,
    test_x: Tensor,
    test_y: Tensor,
    *,
    k: int = 20,  # DINO (Caron et al. 2021); InstDisc (Wu et al. 2018) used 200
    temperature: float = 0.07,  # InstDisc's tau for the exp(sim / tau) weights, kept by DINO
    weighted: bool = True,
    num_classes: int | None = None,
    chunk_size: int = 1024,
) -> float:
    """Accuracy of a k-nearest-neighbour vote under cosine similarity.

    The weighted vote of InstDisc (Wu et al. 2018), as in the kNN monitors of MoCo and
    SimCLR re-implementations: each test row takes its k most similar train rows (cosine s);
    neighbour j votes for its class with weight exp(s_j / temperature) (1 when `weighted=False`);
    the class with the largest total wins (ties: the smallest class index). Test rows are
    processed `chunk_size` at a time, so memory is O(chunk_size * N), never O(M * N).

    Shape:
        - train_x: (N, D), train_y: (N,) int
        - test_x: (M, D), test_y: (M,) int
    """
    _check_pair(train_x, train_y, test_x, test_y)
    if not 1 <= k <= train_x.shape[0]:
        raise ValueError(f"k must be in [1, {train_x.shape[0]}] (train size), got {k}")
    if not temperature > 0.0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    C = _num_classes(num_classes, train_y, test_y)
    dtype = _compute_dtype(train_x)
    bank = F.normalize(train_x.to(dtype), dim=1)  # (N, D)
    bank_y = train_y.to(bank.device)
    correct = 0
    for start in range(0, test_x.shape[0], chunk_size):
        query = F.normalize(test_x[start : start + chunk_size].to(bank), dim=1)  # (B, D)
        sim = query @ bank.T  # (B, N)
        top_sim, top_idx = sim.topk(k, dim=1)  # (B, k) each
        votes = (top_sim / temperature).exp() if weighted else torch.ones_like(top_sim)  # (B, k)
        scores = torch.zeros(query.shape[0], C, dtype=dtype, device=bank.device)  # (B, C)
        scores.scatter_add_(1, bank_y[top_idx], votes)  # (B, C)
        target = test_y[start : start + chunk_size].to(bank.device)  # (B,)
        correct += int((scores.argmax(dim=1) == target).sum())
    return correct / test_x.shape[0]


@torch.no_grad()
def alignment_uniformity(
    z1: Tensor,
    z2: Tensor,
    *,
    alpha: float = 2.0,  # Wang & Isola 2020
    t: float = 2.0,  # Wang & Isola 2020
) -> dict[str, float]:
    """Alignment and uniformity of paired embeddings (Wang & Isola 2020), both lower-is-better.

    Returns {"alignment": E||f(x) - f(y)||^alpha, "uniformity": mean of the uniformity of z1 and
    of z2} (the paper's evaluation averages the two views). Inputs are L2-normalised by
    `shared.losses.alignment` / `uniformity`, which this calls.

    Shape:
        - z1, z2: (N, D), row i of z1 and row i of z2 are a positive pair
    """
    if z1.ndim != 2 or z1.shape != z2.shape:
        raise ValueError(f"expected z1, z2 of the same shape (N, D), got {z1.shape}, {z2.shape}")
    align = float(alignment(z1, z2, alpha=alpha))
    uniform = 0.5 * (float(uniformity(z1, t=t)) + float(uniformity(z2, t=t)))
    return {"alignment": align, "uniformity": uniform}


def extract_features(
    encoder: nn.Module, loader: Iterable[Any], device: torch.device | str
) -> tuple[Tensor, Tensor]:
    """Run `encoder` over `loader` in eval mode without gradients; return (features, labels).

    A batch is either a sequence `(inputs, labels, ...)` (torchvision-style) or an object with a
    `.y` attribute that the encoder takes whole (a PyG `Batch`). Inputs go to `device` with
    `shared.runtime.move_to_device`, so they may also be tuples, lists or dicts of tensors.
    Outputs are moved to the CPU batch by batch so device memory stays bounded. Every
    submodule's train/eval mode is restored afterwards, even on error.

    Shape:
        - encoder output per batch: (B, D)
        - returns: features (N, D) on CPU, labels (N,) on CPU
    """
    features: list[Tensor] = []
    labels: list[Tensor] = []
    with eval_mode(encoder), torch.no_grad():
        for batch in loader:
            if isinstance(batch, list | tuple):
                inputs, y = batch[0], batch[1]
            elif hasattr(batch, "y"):
                inputs, y = batch, batch.y
            else:
                raise ValueError(
                    f"cannot find labels in a batch of type {type(batch).__name__}: expected "
                    "(inputs, labels, ...) or an object with .y"
                )
            out = encoder(move_to_device(inputs, torch.device(device)))
            if not isinstance(out, Tensor) or out.ndim != 2:
                shape = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
                raise ValueError(f"encoder must return (B, D) features, got {shape}")
            features.append(out.detach().cpu())
            labels.append(torch.as_tensor(y).reshape(-1).cpu())
    if not features:
        raise ValueError("loader yielded no batches")
    return torch.cat(features), torch.cat(labels)  # (N, D), (N,)
