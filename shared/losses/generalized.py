"""The generalized contrastive loss of "Intriguing Properties of Contrastive Losses".

Chen, Luo & Li (2021): L = scale · (L_align + λ · L_dist), a faithful port of the only released
code (the TF2 notebook ``colabs/intriguing_properties/generalized_contrastive_loss.ipynb`` of
google-research/simclr):

* L_align = mean over all N·D elements of (h1 − h2)² / 2 (note the 1/D);
* decoupled NT-Xent: L_dist = mean_i [logsumexp_k(H_i·H_k/τ) − log D] over ALL 2N rows of
  H = [h1; h2] (self and positive included), τ and λ decoupled;
* sliced-Wasserstein priors: project H and a sample P of the prior with a fresh random orthogonal
  D×D matrix, sort each projected column over the batch, L_dist = mean((sort(PW) − sort(HW))²).
  The prior and the normalisation of h go together as in the notebook: uniform hypersphere =
  normal samples, normalised (h normalised too); normal = normal samples, nothing normalised;
  uniform hypercube = U(−1, 1) samples, nothing normalised.

Empty batches follow the rule of :mod:`shared.losses.core`: every mean over no element is 0, not
NaN, so N = 0 rows give a zero loss with a zero gradient, still attached to the inputs' graph.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from shared.losses.common import (
    autocast_off,
    check_choice,
    check_features,
    check_generator,
    check_positive,
    check_same_shape,
)

__all__ = [
    "PRIORS",
    "GeneralizedContrastiveLoss",
    "generalized_contrastive_loss",
    "random_orthogonal",
    "sample_prior",
    "sliced_wasserstein_distance",
]

Prior = Literal["uniform_hypersphere", "normal", "uniform_hypercube", "decoupled_nt_xent"]
PRIORS: tuple[str, ...] = (
    "uniform_hypersphere",
    "normal",
    "uniform_hypercube",
    "decoupled_nt_xent",
)


def _mean(x: Tensor) -> Tensor:
    """Mean of every element; 0 (not NaN) over none, still attached to ``x``'s graph."""
    return x.mean() if x.numel() else x.sum()


def _check_lam(lam: float) -> float:
    if not isinstance(lam, (int, float)) or not math.isfinite(lam) or lam < 0:
        raise ValueError(f"lam must be a finite number >= 0, got {lam!r}")
    return float(lam)


def _check_scale(scale: float) -> float:
    if not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"scale must be a finite number, got {scale!r}")
    return float(scale)


def random_orthogonal(
    dim: int,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """A Haar-random orthogonal matrix: QR of a Gaussian matrix with the signs of R's diagonal
    folded into Q (as Keras' ``Orthogonal`` initializer does).

    Shape:
        result: ``(dim, dim)``.
    """
    g = torch.randn(dim, dim, generator=generator, device=device, dtype=torch.float64)
    q, r = torch.linalg.qr(g)
    signs: Tensor = torch.sign(torch.diagonal(r))  # (D,)
    haar: Tensor = q * signs.unsqueeze(0)  # (D, D) unique, Haar-distributed
    return haar.to(dtype)


def sample_prior(
    prior: Prior,
    shape: tuple[int, int],
    *,
    generator: torch.Generator | None = None,
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Samples of a sliced-Wasserstein prior: N(0,1) rows normalised (hypersphere), N(0,1)
    (normal) or U(−1, 1) (hypercube).

    Shape:
        result: ``shape`` = ``(N, D)``.
    """
    check_choice(prior, PRIORS[:3], "prior")
    if prior == "uniform_hypercube":
        return torch.rand(shape, generator=generator, device=device, dtype=dtype) * 2 - 1
    samples = torch.randn(shape, generator=generator, device=device, dtype=dtype)
    return F.normalize(samples, dim=-1) if prior == "uniform_hypersphere" else samples


def sliced_wasserstein_distance(
    x: Tensor,
    prior_samples: Tensor,
    *,
    num_projections: int | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Squared sliced-Wasserstein-2 distance between the rows of ``x`` and ``prior_samples``.

    Both are projected on the columns of a fresh random orthogonal matrix (``num_projections``
    of them, D by default as in the notebook; more than D uses several independent orthogonal
    blocks); each projection is sorted over the batch and the mean squared difference of the
    sorted values is returned. Gradients flow to ``x`` through the sort. N = 0 gives 0 (see
    :mod:`shared.losses.core`). ``generator`` must be on ``x``'s device. Inputs are not checked
    for NaN (that would wait for the device): the training loop checks the loss.

    Shape:
        x, prior_samples: ``(N, D)``; result: scalar.
    """
    check_features(x, "x", ndim=2)
    check_features(prior_samples, "prior_samples", ndim=2)
    check_same_shape(x, prior_samples, "x and prior_samples")
    check_generator(generator, x, "x")
    D = x.shape[1]
    projections = D if num_projections is None else num_projections
    if projections < 1:
        raise ValueError(f"num_projections must be >= 1, got {num_projections}")
    blocks = [
        random_orthogonal(D, generator=generator, device=x.device, dtype=x.dtype)
        for _ in range(math.ceil(projections / D))
    ]
    W = torch.cat(blocks, dim=1)[:, :projections]  # (D, P)
    x_sorted = torch.sort(x @ W, dim=0).values  # (N, P), each projection sorted over the batch
    p_sorted = torch.sort(prior_samples.to(x.dtype) @ W, dim=0).values  # (N, P)
    return _mean((p_sorted - x_sorted).pow(2))


def generalized_contrastive_loss(
    h1: Tensor,
    h2: Tensor,
    *,
    prior: Prior = "uniform_hypersphere",
    lam: float = 1.0,
    temperature: float = 1.0,
    scale: float = 1.0,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Generalized contrastive loss: alignment + λ · distribution matching (see module doc).

    ``prior`` picks the distribution term; the default is the uniform hypersphere, as in the
    paper. ``temperature`` only acts on ``"decoupled_nt_xent"`` and ``generator`` only on the
    sliced-Wasserstein priors (the random projection and the prior samples); it must be on the
    device of ``h1``. N = 0 gives a zero loss with a zero gradient (see :mod:`shared.losses.core`).
    Inputs are not checked for NaN (that would wait for the device): the training loop checks
    the loss.

    Shape:
        h1, h2: ``(N, D)``; result: scalar.
    """
    check_features(h1, "h1", ndim=2)
    check_features(h2, "h2", ndim=2)
    check_same_shape(h1, h2, "h1 and h2")
    check_choice(prior, PRIORS, "prior")
    check_positive(temperature, "temperature")
    _check_lam(lam)
    _check_scale(scale)
    check_generator(generator, h1, "h1")
    with autocast_off(h1):
        dtype = torch.float64 if h1.dtype == torch.float64 else torch.float32
        h1, h2 = h1.to(dtype), h2.to(dtype)
        if prior in ("uniform_hypersphere", "decoupled_nt_xent"):
            h1, h2 = F.normalize(h1, dim=1), F.normalize(h2, dim=1)
        align = _mean((h1 - h2).pow(2)) / 2
        H = torch.cat([h1, h2], dim=0)  # (2N, D)
        N2, D = H.shape
        if prior == "decoupled_nt_xent":
            dist = _mean(torch.logsumexp(H @ H.T / temperature, dim=1) - math.log(D))
        else:
            samples = sample_prior(
                prior, (N2, D), generator=generator, device=H.device, dtype=dtype
            )
            dist = sliced_wasserstein_distance(H, samples, generator=generator)
        return scale * (align + lam * dist)


class GeneralizedContrastiveLoss(nn.Module):
    """Module form of :func:`generalized_contrastive_loss`; seeded, it draws from its own stream.

    With ``seed``, one generator per device is made on the first call with inputs there
    (``torch.Generator(device=...)`` seeded with ``seed``) and kept, so successive calls draw fresh
    numbers and two modules with the same seed draw the same ones, on CPU and GPU alike. The
    generators' states are the module's extra state: they go into ``state_dict()``, hence into
    checkpoints, and a resumed run continues the same stream.
    """

    def __init__(
        self,
        prior: Prior = "uniform_hypersphere",
        lam: float = 1.0,
        temperature: float = 1.0,
        scale: float = 1.0,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        check_choice(prior, PRIORS, "prior")
        self.prior: Prior = prior
        self.lam, self.scale = _check_lam(lam), _check_scale(scale)
        self.temperature = check_positive(temperature, "temperature")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"seed must be an int or None, got {seed!r}")
        self.seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}

    def generator_for(self, device: torch.device) -> torch.Generator | None:
        """This module's generator on ``device`` (made on first use), or ``None`` unseeded."""
        if self.seed is None:
            return None
        generator = self._generators.get(device)
        if generator is None:
            generator = torch.Generator(device=device).manual_seed(self.seed)
            self._generators[device] = generator
        return generator

    def get_extra_state(self) -> dict[str, Tensor]:
        """The state of each device's generator, keyed by device name (tensors only)."""
        return {str(device): gen.get_state() for device, gen in self._generators.items()}

    def set_extra_state(self, state: Mapping[str, Tensor]) -> None:
        """Continue the saved streams; a device this machine lacks starts afresh when used."""
        generators: dict[torch.device, torch.Generator] = {}
        for name, value in state.items():
            device = torch.device(name)
            if device.type == "cuda" and not torch.cuda.is_available():
                continue
            generator = torch.Generator(device=device)
            generator.set_state(value.to("cpu", torch.uint8))
            generators[device] = generator
        self._generators = generators

    def forward(self, h1: Tensor, h2: Tensor) -> Tensor:
        return generalized_contrastive_loss(
            h1,
            h2,
            prior=self.prior,
            lam=self.lam,
            temperature=self.temperature,
            scale=self.scale,
            generator=self.generator_for(h1.device),
        )
