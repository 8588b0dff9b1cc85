"""N-pairs and triplet losses: SupCon's relatives with one positive per anchor.

N-pairs (Sohn 2016) is a softmax over the other anchors' positives and goes through the
contrastive core; the triplet loss (FaceNet) is a hinge on squared distances. Their relations to
SupCon are stated in the docstrings and tested. Empty batches follow the rule of
:mod:`shared.losses.core`: zero loss, zero gradient. The maths runs in fp32 (fp64 stays fp64)
whatever the autocast dtype, with or without normalisation.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from shared.losses.common import (
    Reduction,
    autocast_off,
    check_block_size,
    check_features,
    check_positive,
    check_reduction,
    check_same_shape,
    l2_normalize,
    reduce,
    upcast,
)
from shared.losses.core import masked_logsumexp

__all__ = ["NPairsLoss", "TripletLoss", "npairs_loss", "triplet_loss"]


def npairs_loss(
    anchors: Tensor,
    positives: Tensor,
    *,
    temperature: float = 1.0,
    normalize: bool = True,
    block_size: int | None = None,
    reduction: Reduction = "mean",
) -> Tensor:
    """Multi-class N-pair loss (Sohn 2016, Eq. 6): one positive and N−1 negatives per anchor.

    ℓ_i = log(1 + Σ_{j≠i} exp((f_i·f⁺_j − f_i·f⁺_i)/τ)), i.e. a softmax cross-entropy of
    anchor i over all positives with target i. Per anchor it equals SupCon with that anchor's
    single positive and the other positives as negatives (tested). Sohn uses raw embeddings with
    an L2 penalty (``normalize=False``, τ = 1); ``normalize=True`` uses cosine similarities.
    N = 0 gives a zero loss with a zero gradient (see :mod:`shared.losses.core`). Inputs are not
    checked for NaN (that would wait for the device): the training loop checks the loss.

    Shape:
        anchors, positives: ``(N, D)``; result: scalar, or ``(N,)`` with ``reduction="none"``.
    """
    check_features(anchors, "anchors", ndim=2)
    check_features(positives, "positives", ndim=2)
    check_same_shape(anchors, positives, "anchors and positives")
    check_positive(temperature, "temperature")
    check_reduction(reduction)
    with autocast_off(anchors):
        a, p = (
            (l2_normalize(anchors), l2_normalize(positives))
            if normalize
            else (upcast(anchors), upcast(positives))
        )
        lse = masked_logsumexp(  # raw rows: the core measures their norms (one host read)
            a,
            p,
            temperature=temperature,
            block_size=block_size,
            norm_bound=1.0 if normalize else None,
        )
        per_anchor = lse.all - (a * p).sum(1) / temperature  # (N,)
        return reduce(per_anchor, reduction)


def _check_margin(margin: float) -> float:
    if not isinstance(margin, (int, float)) or not margin >= 0:
        raise ValueError(f"margin must be >= 0, got {margin!r}")
    return float(margin)


def triplet_loss(
    anchor: Tensor,
    positive: Tensor,
    negative: Tensor,
    *,
    margin: float = 0.2,
    normalize: bool = True,
    reduction: Reduction = "mean",
) -> Tensor:
    """Triplet loss on squared Euclidean distances (Schroff et al. 2015, FaceNet, Eq. 1).

    ℓ_i = max(0, ‖a_i − p_i‖² − ‖a_i − n_i‖² + margin), margin α = 0.2 as in FaceNet, on
    L2-normalised embeddings by default. Relation to SupCon (Khosla et al. 2020, Sec. 7 of the
    supplement): with one positive and one negative per anchor SupCon is
    softplus((‖a−p‖² − ‖a−n‖²)/(2τ)), so 2τ·SupCon → triplet loss with margin 0 as τ → 0 (tested).
    N = 0 gives a zero loss with a zero gradient (see :mod:`shared.losses.core`). Inputs are not
    checked for NaN (that would wait for the device): the training loop checks the loss.

    Shape:
        anchor, positive, negative: ``(N, D)``; result: scalar, or ``(N,)``.
    """
    for x, name in ((anchor, "anchor"), (positive, "positive"), (negative, "negative")):
        check_features(x, name, ndim=2)
    check_same_shape(anchor, positive, "anchor and positive")
    check_same_shape(anchor, negative, "anchor and negative")
    _check_margin(margin)
    check_reduction(reduction)
    with autocast_off(anchor):
        prepare = l2_normalize if normalize else upcast  # fp32 maths under bf16 autocast
        anchor, positive, negative = (prepare(x) for x in (anchor, positive, negative))
        d_pos = (anchor - positive).pow(2).sum(1)  # (N,)
        d_neg = (anchor - negative).pow(2).sum(1)  # (N,)
        return reduce(F.relu(d_pos - d_neg + margin), reduction)


class NPairsLoss(nn.Module):
    """Module form of :func:`npairs_loss`."""

    def __init__(
        self,
        temperature: float = 1.0,
        normalize: bool = True,
        block_size: int | None = None,
        reduction: Reduction = "mean",
    ) -> None:
        super().__init__()
        self.temperature = check_positive(temperature, "temperature")
        self.normalize, self.block_size = normalize, check_block_size(block_size)
        self.reduction: Reduction = reduction
        check_reduction(reduction)

    def forward(self, anchors: Tensor, positives: Tensor) -> Tensor:
        return npairs_loss(
            anchors,
            positives,
            temperature=self.temperature,
            normalize=self.normalize,
            block_size=self.block_size,
            reduction=self.reduction,
        )


class TripletLoss(nn.Module):
    """Module form of :func:`triplet_loss`."""

    def __init__(
        self, margin: float = 0.2, normalize: bool = True, reduction: Reduction = "mean"
    ) -> None:
        super().__init__()
        self.margin, self.normalize = _check_margin(margin), normalize
        self.reduction: Reduction = reduction
        check_reduction(reduction)

    def forward(self, anchor: Tensor, positive: Tensor, negative: Tensor) -> Tensor:
        return triplet_loss(
            anchor,
            positive,
            negative,
            margin=self.margin,
            normalize=self.normalize,
            reduction=self.reduction,
        )
