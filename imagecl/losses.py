"""The loss of the SimCLR pipeline (``imagecl train --method simclr --loss ...``).

SimCLR (Chen et al. 2020, Sec. 5.1, Tables 2, 4 and 5) compares its NT-Xent with NT-Logistic and
a margin triplet loss, each with and without ℓ2 normalisation of z; "Intriguing Properties of
Contrastive Losses" (Chen, Luo & Li 2021) replaces the uniformity part by a prior on the
distribution of z. ``--loss`` picks one of them:

* ``nt_xent`` (default): :func:`shared.losses.nt_xent_loss`; ``--no-normalize`` contrasts raw dot
  products (:func:`nt_xent`), the "without ℓ2 normalisation" rows of SimCLR Table 5;
* ``nt_logistic``: :func:`shared.losses.nt_logistic_loss`;
* ``triplet``: :func:`margin_triplet_loss`, every other view of the batch a negative;
* ``generalized``: :func:`shared.losses.generalized_contrastive_loss` with ``--prior`` (uniform
  hypersphere, normal, uniform hypercube or decoupled NT-Xent) and its weight ``--lam``; the
  temperature acts on the decoupled NT-Xent prior only.

Only ``nt_xent`` gathers negatives across ranks and takes a queue; the others contrast the local
batch, so they refuse to run distributed rather than silently change what they compute.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from shared.losses import (
    MemoryQueue,
    generalized_contrastive_loss,
    masked_logsumexp,
    nt_logistic_loss,
    nt_xent_loss,
    two_view_info_nce_loss,
)
from shared.losses.common import autocast_off
from shared.losses.generalized import PRIORS, Prior

__all__ = [
    "LOSSES",
    "PRIORS",
    "LossName",
    "check_loss_settings",
    "margin_triplet_loss",
    "nt_xent",
    "simclr_loss",
]

LossName = Literal["nt_xent", "nt_logistic", "triplet", "generalized"]
LOSSES: tuple[str, ...] = ("nt_xent", "nt_logistic", "triplet", "generalized")


def _rows(z1: Tensor, z2: Tensor) -> Tensor:
    """Both views as rows ``n·2 + v``, in fp32 (fp64 stays fp64).

    Shape:
        z1, z2: ``(N, D)``; result: ``(2N, D)``.
    """
    z = torch.stack([z1, z2], dim=1).flatten(0, 1)  # (2N, D)
    return z if z.dtype == torch.float64 else z.float()


def nt_xent(z1: Tensor, z2: Tensor, *, temperature: float, normalize: bool = True) -> Tensor:
    """NT-Xent (SimCLR Eq. 1), with ``normalize=False`` on raw dot products z_i·z_k / τ.

    Normalised, it is :func:`shared.losses.nt_xent_loss`. Raw, the same softmax over the other
    2N − 1 views runs through the contrastive core on the un-normalised rows (SimCLR Table 5's
    "without ℓ2 norm"): ℓ_i = log Σ_{k≠i} exp(z_i·z_k/τ) − z_i·z_i'/τ, mean over the 2N views.

    Shape:
        z1, z2: ``(N, D)``; result: scalar.
    """
    if normalize:
        return nt_xent_loss(z1, z2, temperature=temperature)
    with autocast_off(z1):
        z = _rows(z1, z2)  # (2N, D)
        rows = torch.arange(z.shape[0], device=z.device)  # (2N,)
        lse = masked_logsumexp(z, z, temperature=temperature, self_index="diagonal").all  # (2N,)
        positive = (z * z[rows ^ 1]).sum(1) / temperature  # (2N,) the other view of each sample
        per_row = lse - positive  # (2N,)
        return per_row.mean() if per_row.numel() else per_row.sum()


def margin_triplet_loss(
    z1: Tensor, z2: Tensor, *, margin: float = 0.5, normalize: bool = True
) -> Tensor:
    """SimCLR's margin triplet loss (Table 2) over every negative of a two-view batch.

    For each of the 2N views i with positive i' and every other view k of another sample:
    max(0, ‖z_i − z_i'‖² − ‖z_i − z_k‖² + margin), averaged over all (i, k) — the FaceNet
    triplet of :func:`shared.losses.triplet_loss` on every triple the batch holds (tested equal).
    On normalised rows ‖a − b‖² = 2 − 2 a·b, so this is SimCLR's form on cosine similarities,
    max(0, s_ik − s_ii' + m), with m = margin / 2.

    Shape:
        z1, z2: ``(N, D)``; result: scalar.
    """
    with autocast_off(z1):
        z = _rows(z1, z2)  # (2N, D)
        if normalize:
            z = F.normalize(z, dim=1)
        # squared distances from the Gram matrix: exact gradients also at distance 0 (cdist's
        # square root is not differentiable there)
        squared = (z * z).sum(1)  # (2N,)
        distance = squared[:, None] + squared[None, :] - 2 * z @ z.T  # (2N, 2N)
        rows = torch.arange(z.shape[0], device=z.device)  # (2N,)
        positive = distance[rows, rows ^ 1]  # (2N,)
        sample = rows // 2  # (2N,)
        negative = sample[:, None] != sample[None, :]  # (2N, 2N) another sample's views
        hinge = F.relu(positive[:, None] - distance + margin)  # (2N, 2N)
        return (hinge * negative).sum() / negative.sum().clamp(min=1)


def check_loss_settings(*, loss: str, prior: str, lam: float, margin: float) -> None:
    """Refuse values that no loss of :func:`simclr_loss` takes (``Config.__post_init__`` calls
    it; which methods take which loss is each method's check, :mod:`imagecl.steps`)."""
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
    if prior not in PRIORS:
        raise ValueError(f"prior must be one of {PRIORS}, got {prior!r}")
    if not lam >= 0 or not margin >= 0:
        raise ValueError(f"lam and margin must be >= 0, got {lam} and {margin}")


def simclr_loss(
    z: Tensor,
    *,
    loss: LossName = "nt_xent",
    temperature: float,
    normalize: bool = True,
    prior: Prior = "uniform_hypersphere",
    lam: float = 1.0,
    margin: float = 0.5,
    queue: MemoryQueue | None = None,
    gather: bool = False,
) -> Tensor:
    """The SimCLR pipeline's ``loss`` on two views; with a ``queue`` (NT-Xent only) both
    directions of InfoNCE against in-batch keys + queue, and the views join the queue.

    Args:
        z: both views' projections.
        loss: nt_xent, nt_logistic, triplet or generalized (see the module docstring).
        temperature: τ of nt_xent, nt_logistic and the generalized loss's decoupled NT-Xent
            prior.
        normalize: ℓ2-normalise z (nt_xent, nt_logistic, triplet; SimCLR Table 5).
        prior, lam: the generalized loss's distribution term and its weight.
        margin: the triplet loss's margin on squared distances.
        queue: extra negatives (MoCo's queue); nt_xent with normalised z only.
        gather: contrast every rank's samples (nt_xent with normalised z only; the others
            contrast the local batch and refuse to run distributed).

    Shape:
        z: ``(N, 2, D)``; result: scalar.
    """
    z1, z2 = z[:, 0], z[:, 1]
    if gather and (loss != "nt_xent" or not normalize):
        raise ValueError(f"loss {loss!r} contrasts the local batch only: run one process")
    if loss == "nt_logistic":
        return nt_logistic_loss(z1, z2, temperature=temperature, normalize=normalize)
    if loss == "triplet":
        return margin_triplet_loss(z1, z2, margin=margin, normalize=normalize)
    if loss == "generalized":
        return generalized_contrastive_loss(z1, z2, prior=prior, lam=lam, temperature=temperature)
    if queue is None:
        if not normalize:
            return nt_xent(z1, z2, temperature=temperature, normalize=False)
        return nt_xent_loss(z1, z2, temperature=temperature, gather=gather)
    result = two_view_info_nce_loss(
        z1, z2, queue.negatives(), temperature=temperature, gather=gather
    )
    queue.enqueue(z.detach().flatten(0, 1))  # (2N, D) of every rank join the queue
    return result
