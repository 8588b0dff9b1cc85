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
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from shared.losses._checks import check_choice, check_features, check_positive, check_same_shape
from shared.losses.core import autocast_off

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
    sorted values is returned. Gradients flow to ``x`` through the sort.

    Shape:
        x, prior_samples: ``(N, D)``; result: scalar.
    """
    check_features(x, "x", ndim=2)
    check_features(prior_samples, "prior_samples", ndim=2)
    check_same_shape(x, prior_samples, "x and prior_samples")
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
    return (p_sorted - x_sorted).pow(2).mean()


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
    sliced-Wasserstein priors (the random projection and the prior samples).

    Shape:
        h1, h2: ``(N, D)``; result: scalar.
    """
    check_features(h1, "h1", ndim=2)
    check_features(h2, "h2", ndim=2)
    check_same_shape(h1, h2, "h1 and h2")
    check_choice(prior, PRIORS, "prior")
    check_positive(temperature, "temperature")
    if not math.isfinite(lam) or lam < 0:
        raise ValueError(f"lam must be a finite number >= 0, got {lam!r}")
    if not math.isfinite(scale):
        raise ValueError(f"scale must be a finite number, got {scale!r}")
    with autocast_off(h1):
        dtype = torch.float64 if h1.dtype == torch.float64 else torch.float32
        h1, h2 = h1.to(dtype), h2.to(dtype)
        if prior in ("uniform_hypersphere", "decoupled_nt_xent"):
            h1, h2 = F.normalize(h1, dim=1), F.normalize(h2, dim=1)
        align = (h1 - h2).pow(2).mean() / 2
        H = torch.cat([h1, h2], dim=0)  # (2N, D)
        N2, D = H.shape
        if prior == "decoupled_nt_xent":
            dist = (torch.logsumexp(H @ H.T / temperature, dim=1) - math.log(D)).mean()
        else:
            samples = sample_prior(
                prior, (N2, D), generator=generator, device=H.device, dtype=dtype
            )
            dist = sliced_wasserstein_distance(H, samples, generator=generator)
        return scale * (align + lam * dist)


class GeneralizedContrastiveLoss(nn.Module):
    """Module form of :func:`generalized_contrastive_loss`; holds its own generator if seeded."""

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
        if not math.isfinite(lam) or lam < 0:
            raise ValueError(f"lam must be a finite number >= 0, got {lam!r}")
        self.prior: Prior = prior
        self.lam, self.scale = lam, scale
        self.temperature = check_positive(temperature, "temperature")
        self.generator: torch.Generator | None = None
        if seed is not None:
            self.generator = torch.Generator().manual_seed(seed)

    def forward(self, h1: Tensor, h2: Tensor) -> Tensor:
        generator = self.generator
        if generator is not None and generator.device != h1.device:
            generator = None  # a CPU generator cannot drive sampling on another device
        return generalized_contrastive_loss(
            h1, h2, prior=self.prior, lam=self.lam, temperature=self.temperature,
            scale=self.scale, generator=generator,
        )  # fmt: skip
