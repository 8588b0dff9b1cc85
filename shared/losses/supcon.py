"""SupCon (L_out, L_in) and NT-Xent / InfoNCE (SupCon with one positive per anchor).

All of them are thin derivations of the contrastive core (:mod:`shared.losses.core`): a masked
log-softmax over ``anchors × contrasts``. SupCon's ``L_out`` never builds an N×N positive mask:
``Σ_{p ∈ P(i)} s_ip = a_i · (S_{y_i} − a_i)`` with ``S_y`` the sum of the class's contrast rows,
which costs O(N·D) (:mod:`shared.losses.class_sums`).

No loss here reads a tensor value back to the host (no ``.item()``, ``unique`` or value
comparison), so a call never waits for the device and the dense path compiles whole under
``torch.compile(fullgraph=True)``. NaN or infinite inputs are not checked (that would be such a
read); they make the loss non-finite, which the training loops check on logging steps.

Every loss here follows the empty-batch rule of :mod:`shared.losses.core`: N = 0 rows give a zero
loss with a zero gradient (an empty per-row tensor with ``reduction="none"``).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
from torch import Tensor, nn

from shared.distributed import gather_no_grad, gather_with_offset
from shared.losses.class_sums import class_ids, positive_logit_sums
from shared.losses.common import (
    Gather,
    Reduction,
    autocast_off,
    check_block_size,
    check_choice,
    check_features,
    check_gather,
    check_labels,
    check_positive,
    check_reduction,
    check_same_shape,
    l2_normalize,
    reduce,
)
from shared.losses.core import masked_logsumexp

__all__ = [
    "NTXentLoss",
    "SupConLoss",
    "nt_xent_loss",
    "supcon_loss",
]

Variant = Literal["out", "in"]
ContrastMode = Literal["all", "one"]


def _other_view_sums(z: Tensor, contrast_mode: ContrastMode) -> tuple[Tensor, Tensor]:
    """SimCLR's positives, a sample's other views (all local): ``Σ_p a_i·c_p`` and ``|P(i)|``.

    Shape:
        z: ``(N, V, D)``; results: ``(M,)`` each, M = N·V (``"all"``) or N (``"one"``).
    """
    others = z.sum(1, keepdim=True) - z  # (N, V, D): sum of the other views
    positive_sum = (z * others).sum(-1)  # (N, V)
    positive_sum = positive_sum.reshape(-1) if contrast_mode == "all" else positive_sum[:, 0]
    return positive_sum, torch.full_like(positive_sum, z.shape[1] - 1, dtype=torch.long)


class _Rows(NamedTuple):
    """What SupCon contrasts: anchors, contrasts, their classes and each anchor's positives."""

    anchors: Tensor  # (M, D)
    contrasts: Tensor  # (K, D), row = global sample · V + view
    self_index: Tensor | Literal["diagonal"]  # (M,) each anchor's own column
    ya: Tensor  # (M,) class index of each anchor
    yc: Tensor  # (K,) class index of each contrast
    positive_sum: Tensor  # (M,) Σ_{p ∈ P(i)} a_i·c_p
    n_pos: Tensor  # (M,) |P(i)|, long


def _per_view(per_sample: Tensor, V: int) -> Tensor:
    """Each sample's value once per view, sample-major (``repeat_interleave`` without a sync).

    Shape:
        per_sample: ``(N,)``; result: ``(N·V,)``.
    """
    return per_sample.unsqueeze(1).expand(-1, V).reshape(-1)  # (N·V,)


def _supcon_rows(z: Tensor, y: Tensor | None, contrast_mode: ContrastMode, gather: Gather) -> _Rows:
    """Anchors, contrasts (every rank's with ``gather``) and positives of normalised views.

    Shape:
        z: ``(N, V, D)``; y: ``(N,)``; fields: see :class:`_Rows`.
    """
    N, V, D = z.shape
    equal = gather == "equal"
    z_all, offset = gather_with_offset(z, equal_sizes=equal) if gather else (z, 0)  # (Ng, V, D)
    Ng = z_all.shape[0]
    samples = torch.arange(offset, offset + N, device=z.device)  # (N,) global sample index
    if y is None:  # instance discrimination: the global sample index is the class
        ya_samples, yc_samples = samples, torch.arange(Ng, device=z.device)
    else:
        y_all = gather_no_grad(y, equal_sizes=equal) if gather else y  # (Ng,)
        yc_samples = class_ids(y_all)  # (Ng,) in [0, C)
        ya_samples = yc_samples[offset : offset + N]  # (N,)
    contrasts = z_all.reshape(Ng * V, D)  # (Ng·V, D), row = sample·V + view
    yc = _per_view(yc_samples, V)  # (Ng·V,)
    self_index: Tensor | Literal["diagonal"]
    if contrast_mode == "all":
        # local rows, sample-major; without gather the very same tensor as the contrasts,
        # which lets the core use the symmetry of the similarity matrix
        anchors = z.reshape(N * V, D) if gather else contrasts  # (N·V, D)
        self_index = (
            offset * V + torch.arange(N * V, device=z.device) if gather else "diagonal"
        )  # (N·V,): own column
        ya = _per_view(ya_samples, V)  # (N·V,)
    else:
        anchors = z[:, 0]  # (N, D)
        self_index = samples * V  # (N,)
        ya = ya_samples
    if y is None:
        positive_sum, n_pos = _other_view_sums(z, contrast_mode)
    else:  # each anchor's own row, through the contrasts so its class-sum share cancels
        own = (
            contrasts[offset * V : (offset + N) * V]  # (N·V, D), a view
            if contrast_mode == "all"
            else z_all[offset : offset + N, 0]  # (N, D), a view
        )
        # the number of samples bounds the number of classes (C itself is on the device)
        positive_sum, n_pos = positive_logit_sums(anchors, contrasts, own, ya, yc, max(Ng, 1))
    return _Rows(anchors, contrasts, self_index, ya, yc, positive_sum, n_pos)


def _supcon_out(rows: _Rows, temperature: float, block_size: int | None) -> Tensor:
    """Eq. 2: ℓ_i = log Σ_{a∈A(i)} exp(s_ia/τ) − mean_{p∈P(i)} s_ip/τ.  # (M,)"""
    lse = masked_logsumexp(
        rows.anchors,
        rows.contrasts,
        temperature=temperature,
        self_index=rows.self_index,
        block_size=block_size,
        norm_bound=1.0,
    )
    return lse.all - rows.positive_sum / rows.n_pos.clamp(min=1) / temperature  # (M,)


def _supcon_in(rows: _Rows, temperature: float, block_size: int | None) -> Tensor:
    """Eq. 3: ℓ_i = log Σ_{a∈A(i)} exp(s_ia/τ) − log mean_{p∈P(i)} exp(s_ip/τ).  # (M,)"""
    lse = masked_logsumexp(
        rows.anchors,
        rows.contrasts,
        temperature=temperature,
        self_index=rows.self_index,
        anchor_labels=rows.ya,
        contrast_labels=rows.yc,
        block_size=block_size,
        norm_bound=1.0,
    )
    assert lse.positive is not None
    n_pos = rows.n_pos.clamp(min=1).to(lse.all.dtype)  # (M,)
    log_mean_pos = torch.where(rows.n_pos > 0, lse.positive, 0.0) - n_pos.log()  # (M,)
    return lse.all - log_mean_pos  # (M,)


def supcon_loss(
    features: Tensor,
    labels: Tensor | None = None,
    *,
    temperature: float = 0.1,
    variant: Variant = "out",
    contrast_mode: ContrastMode = "all",
    gather: Gather = False,
    block_size: int | None = None,
    reduction: Reduction = "mean",
) -> Tensor:
    """Supervised contrastive loss (Khosla et al. 2020, Eq. 2 ``L_out`` and Eq. 3 ``L_in``).

    ``L_out``: ℓ_i = −(1/|P(i)|) Σ_{p∈P(i)} [s_ip/τ − log Σ_{a∈A(i)} exp(s_ia/τ)];
    ``L_in``: ℓ_i = −log[(1/|P(i)|) Σ_{p∈P(i)} exp(s_ip/τ) / Σ_{a∈A(i)} exp(s_ia/τ)],
    with ``A(i)`` every contrast but the anchor itself and ``P(i)`` those with its label. The paper
    finds ``L_out`` better; τ = 0.1 is its CIFAR default. ``labels=None`` gives SimCLR (each sample
    its own class). There is no base-temperature factor (equivalently τ_base = τ).

    Anchors without a positive are left out of the mean (the reference counts them as 0 and still
    divides by them, diluting the loss); with none, the loss is 0 and its gradient is zero.
    ``reduction="none"`` returns per-anchor losses, 0 where an anchor has no positive. An empty
    batch (N = 0) gives a zero loss with a zero gradient (see :mod:`shared.losses.core`).
    Inputs are not checked for NaN (that would wait for the device): the training loop checks
    the loss.

    Args:
        features: ``V`` views of ``N`` samples, normalised inside.
        labels: class of each sample, or ``None`` for instance discrimination.
        contrast_mode: ``"all"`` uses every view as anchors, ``"one"`` only view 0.
        gather: contrast against every rank's samples (gradient-correct all-gather); the
            returned loss is this rank's share, and DDP's averaging makes the parameter
            gradients those of one process holding the whole batch. ``True`` exchanges the
            ranks' row counts (a host read); ``"equal"`` promises every rank holds N rows
            (as under ``DistributedSampler``) and reads nothing back.
        block_size: see :func:`shared.losses.core.masked_logsumexp`.

    Shape:
        features: ``(N, V, D)``; labels: ``(N,)``; result: scalar, or ``(N, V)`` (``"all"``) /
        ``(N,)`` (``"one"``) with ``reduction="none"``.
    """
    check_features(features, "features", ndim=3)
    check_positive(temperature, "temperature")
    check_choice(variant, ("out", "in"), "variant")
    check_choice(contrast_mode, ("all", "one"), "contrast_mode")
    check_reduction(reduction)
    check_gather(gather)
    N, V, _ = features.shape
    y = None if labels is None else check_labels(labels, N)
    with autocast_off(features):
        z = l2_normalize(features)  # (N, V, D)
        rows = _supcon_rows(z, y, contrast_mode, gather)
        per_variant = _supcon_out if variant == "out" else _supcon_in
        per_anchor = per_variant(rows, temperature, block_size)  # (M,)
        loss = reduce(per_anchor, reduction, rows.n_pos > 0)
    if reduction == "none":
        return loss.reshape(N, V) if contrast_mode == "all" else loss  # (N, V) or (N,)
    return loss


def nt_xent_loss(
    z1: Tensor,
    z2: Tensor,
    *,
    temperature: float = 0.5,
    gather: Gather = False,
    block_size: int | None = None,
    reduction: Reduction = "mean",
) -> Tensor:
    """NT-Xent / InfoNCE of SimCLR (Chen et al. 2020, Eq. 1): SupCon with instance labels.

    Each of the 2N views is an anchor whose positive is the other view of its sample and whose
    negatives are the other 2N−2 views; the loss is the mean over the 2N anchors (the TF
    reference returns twice this value: mind it when transferring learning rates). τ = 0.5 is the
    paper's CIFAR default. Identical embeddings give log(2N−1). N = 0 gives a zero loss with a
    zero gradient (see :mod:`shared.losses.core`). ``gather`` as for :func:`supcon_loss`. Inputs
    are not checked for NaN (that would wait for the device): the training loop checks the loss.

    Shape:
        z1, z2: ``(N, D)``; result: scalar, or ``(N, 2)`` with ``reduction="none"``.
    """
    check_features(z1, "z1", ndim=2)
    check_features(z2, "z2", ndim=2)
    check_same_shape(z1, z2, "z1 and z2")
    features = torch.stack([z1, z2], dim=1)  # (N, 2, D)
    return supcon_loss(
        features,
        None,
        temperature=temperature,
        gather=gather,
        block_size=block_size,
        reduction=reduction,
    )


class SupConLoss(nn.Module):
    """Module form of :func:`supcon_loss`; stores the settings only."""

    def __init__(
        self,
        temperature: float = 0.1,
        variant: Variant = "out",
        contrast_mode: ContrastMode = "all",
        gather: Gather = False,
        block_size: int | None = None,
        reduction: Reduction = "mean",
    ) -> None:
        super().__init__()
        self.temperature = check_positive(temperature, "temperature")
        self.variant: Variant = variant
        self.contrast_mode: ContrastMode = contrast_mode
        self.gather, self.block_size = check_gather(gather), check_block_size(block_size)
        self.reduction: Reduction = reduction
        check_choice(variant, ("out", "in"), "variant")
        check_choice(contrast_mode, ("all", "one"), "contrast_mode")
        check_reduction(reduction)

    def forward(self, features: Tensor, labels: Tensor | None = None) -> Tensor:
        return supcon_loss(
            features,
            labels,
            temperature=self.temperature,
            variant=self.variant,
            contrast_mode=self.contrast_mode,
            gather=self.gather,
            block_size=self.block_size,
            reduction=self.reduction,
        )


class NTXentLoss(nn.Module):
    """Module form of :func:`nt_xent_loss`."""

    def __init__(
        self,
        temperature: float = 0.5,
        gather: Gather = False,
        block_size: int | None = None,
        reduction: Reduction = "mean",
    ) -> None:
        super().__init__()
        self.temperature = check_positive(temperature, "temperature")
        self.gather, self.block_size = check_gather(gather), check_block_size(block_size)
        self.reduction: Reduction = reduction
        check_reduction(reduction)

    def forward(self, z1: Tensor, z2: Tensor) -> Tensor:
        return nt_xent_loss(
            z1,
            z2,
            temperature=self.temperature,
            gather=self.gather,
            block_size=self.block_size,
            reduction=self.reduction,
        )
