"""NT-Logistic: SimCLR's normalized temperature-scaled logistic loss (Chen et al. 2020, Table 2).

SimCLR compares NT-Xent with two losses that score each pair on its own instead of through a
softmax over the batch. NT-Logistic is the log-likelihood of a binary classifier that says
"positive" with probability σ(s/τ) for a cosine similarity s (Table 2, second row):

    ℓ_i = −log σ(s_{i,i'}/τ) − w · Σ_{k ∈ N(i)} log σ(−s_{ik}/τ)

over the 2N views of a two-view batch: anchor i, its positive i' (the other view of its sample)
and its negatives N(i) (the other 2N − 2 views), s = ẑ·ẑ with ẑ = z/‖z‖. The loss is the mean
of ℓ_i over the 2N anchors, as for :func:`~shared.losses.nt_xent_loss`.

Negative weighting (our choice, ``negative_weight``). Table 2 writes the loss for one negative;
with 2N − 2 negatives per positive an unweighted sum lets the negatives outweigh the positive
by a factor that grows with the batch. Our default, ``"mean"``, gives each negative the weight
w = 1/(2N − 2), so the positive term and the negative term weigh the same whatever the batch
size; ``"sum"`` (w = 1) is the plain sum over all negatives. SimCLR's appendix also reports
NT-Logistic with semi-hard negative mining; that variant is not implemented here.

Numerics: log σ(x) = −softplus(−x), exact for every x (no log of a rounded 0). Without
normalisation (``normalize=False``) the logits are raw dot products over τ. The similarity
matrix is dense: O(N²) memory, like the dense path of the contrastive core. There is no
``gather``: the loss contrasts the local batch (``imagecl.losses`` refuses it under DDP).

Empty batches follow the rule of :mod:`shared.losses.core`: N = 0 gives a zero loss with a zero
gradient, still attached to the inputs' graph. N = 1 has no negatives: the negative term is a
sum over nothing, 0, with either weighting.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from shared.losses.common import (
    Reduction,
    autocast_off,
    check_choice,
    check_features,
    check_positive,
    check_reduction,
    check_same_shape,
    l2_normalize,
    reduce,
    upcast,
)

__all__ = ["NEGATIVE_WEIGHTS", "NTLogisticLoss", "nt_logistic_loss"]

NegativeWeight = Literal["mean", "sum"]
NEGATIVE_WEIGHTS: tuple[str, ...] = ("mean", "sum")


def nt_logistic_loss(
    z1: Tensor,
    z2: Tensor,
    *,
    temperature: float = 0.5,
    normalize: bool = True,
    negative_weight: NegativeWeight = "mean",
    reduction: Reduction = "mean",
) -> Tensor:
    """NT-Logistic of two views (SimCLR Table 2): sigmoid likelihood of positives and negatives.

    ℓ_i = softplus(−s_{i,i'}/τ) + w · Σ_{k ∈ N(i)} softplus(s_{ik}/τ), i.e.
    −log σ(s_{i,i'}/τ) − w · Σ_k log σ(−s_{ik}/τ), for each of the 2N views (see the module
    docstring). ``negative_weight="mean"`` (default) is w = 1/(2N − 2), so positive and negative
    terms weigh alike at any batch size; ``"sum"`` is w = 1. τ = 0.5 as for NT-Xent on CIFAR
    (SimCLR tunes τ per loss: pass the one that suits). ``normalize=False`` uses raw dot products.
    N = 0 gives a zero loss with a zero gradient (see :mod:`shared.losses.core`). Inputs are not
    checked for NaN (that would wait for the device): the training loop checks the loss.

    Shape:
        z1, z2: ``(N, D)``; result: scalar, or ``(N, 2)`` with ``reduction="none"`` (anchor
        ``(n, v)`` is view ``v`` of sample ``n``).
    """
    check_features(z1, "z1", ndim=2)
    check_features(z2, "z2", ndim=2)
    check_same_shape(z1, z2, "z1 and z2")
    check_positive(temperature, "temperature")
    check_choice(negative_weight, NEGATIVE_WEIGHTS, "negative_weight")
    check_reduction(reduction)
    N, D = z1.shape
    with autocast_off(z1):
        prepare = l2_normalize if normalize else upcast  # fp32 maths (fp64 stays fp64)
        z = prepare(torch.stack([z1, z2], dim=1)).reshape(2 * N, D)  # (2N, D), row n·2 + v
        logits = z @ z.T / temperature  # (2N, 2N)
        rows = torch.arange(2 * N, device=z.device)  # (2N,)
        partner = rows ^ 1  # (2N,) the other view of the same sample: 2n <-> 2n + 1
        positive = logits[rows, partner]  # (2N,)
        negative = torch.ones_like(logits, dtype=torch.bool)  # (2N, 2N)
        negative[rows, rows] = False
        negative[rows, partner] = False
        negative_terms = (F.softplus(logits) * negative).sum(1)  # (2N,)
        if negative_weight == "mean":
            negative_terms = negative_terms / max(2 * N - 2, 1)
        per_anchor = F.softplus(-positive) + negative_terms  # (2N,)
        loss = reduce(per_anchor, reduction)
    return loss.reshape(N, 2) if reduction == "none" else loss


class NTLogisticLoss(nn.Module):
    """Module form of :func:`nt_logistic_loss`; stores the settings only."""

    def __init__(
        self,
        temperature: float = 0.5,
        normalize: bool = True,
        negative_weight: NegativeWeight = "mean",
        reduction: Reduction = "mean",
    ) -> None:
        super().__init__()
        self.temperature = check_positive(temperature, "temperature")
        self.normalize = normalize
        check_choice(negative_weight, NEGATIVE_WEIGHTS, "negative_weight")
        check_reduction(reduction)
        self.negative_weight: NegativeWeight = negative_weight
        self.reduction: Reduction = reduction

    def forward(self, z1: Tensor, z2: Tensor) -> Tensor:
        return nt_logistic_loss(
            z1,
            z2,
            temperature=self.temperature,
            normalize=self.normalize,
            negative_weight=self.negative_weight,
            reduction=self.reduction,
        )
