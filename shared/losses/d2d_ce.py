"""ReACGAN's data-to-data cross-entropy (D2D-CE) loss (Kang, Shin, Cho & Park, NeurIPS 2021).

Per anchor i, with f the L2-normalised embeddings, v_{y_i} the L2-normalised class proxy, τ the
temperature, m_p the positive and m_n the negative margin:

* positive term: p_i = relu((m_p − f_i·v_{y_i})/τ), the proxy pulled only while its cosine is
  below m_p;
* negatives: the samples of another class, n_ik = relu((f_i·f_k − m_n)/τ) for y_k ≠ y_i, pushed
  only while their cosine is above m_n (same-class samples are neither positives nor negatives);
* ℓ_i = p_i + log(e^{−p_i} + Σ_{k: y_k≠y_i} e^{n_ik − M_i}), the cross-entropy of the proxy
  against the negatives, with M_i = 0 (``form="paper"``) or StudioGAN's shift (``"studiogan"``).

Why the core's :func:`~shared.losses.core.masked_logsumexp` is not used: its exponents are the
plain logits a·c/τ, and here a relu sits inside the exponent. :class:`_NegativeLogSumExp` is
built the same way (one autograd function, blocks of anchor rows, dense blocks keep what
backward needs, larger ones recompute it), with a per-row max shift over the negatives, which
is exact at any τ (the largest term is 1). It reads no device value: no host sync, and it
traces under ``torch.compile(fullgraph=True)``.
"""

from __future__ import annotations

import math
from typing import Any, Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from shared.distributed import gather_no_grad, gather_with_offset
from shared.losses import common, core
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
    reduce,
)

__all__ = ["DataToDataCrossEntropyLoss", "data_to_data_cross_entropy_loss"]

Form = Literal["studiogan", "paper"]
FORMS = ("studiogan", "paper")
# StudioGAN's ReACGAN configs (src/configs/CIFAR10/ReACGAN.yaml: temperature 0.5, m_p 0.98);
# the negative margin is not a setting there: its code uses 1 − m_p
DEFAULT_TEMPERATURE = 0.5
DEFAULT_MARGIN_POS = 0.98


def check_margin(value: object, name: str) -> float:
    """A margin on a cosine: any finite number (outside [−1, 1] the relu is always or never 0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def data_to_data_cross_entropy_loss(
    embeddings: Tensor,
    proxies: Tensor,
    labels: Tensor,
    *,
    temperature: float = DEFAULT_TEMPERATURE,
    margin_pos: float = DEFAULT_MARGIN_POS,
    margin_neg: float | None = None,
    form: Form = "studiogan",
    gather: Gather = False,
    block_size: int | None = None,
    reduction: Reduction = "mean",
) -> Tensor:
    """D2D-CE: each embedding against its class proxy (positive) and other classes' samples.

    ℓ_i = p_i + log(e^{−p_i} + Σ_{k: y_k≠y_i} e^{n_ik − M_i}) with p_i = relu((m_p − f_i·v_{y_i})/τ)
    and n_ik = relu((f_i·f_k − m_n)/τ), f and v L2-normalised (see the module docstring).

    ``form`` (how the negatives are scaled):

    * ``"studiogan"`` (default): M_i = max_{k≠i} (f_i·f_k − m_n)/τ, over every other sample (its
      own class included) and before the relu, detached from the graph. This is StudioGAN's
      ``Data2DataCrossEntropyLoss`` (src/utils/losses.py), the code behind ReACGAN's published
      numbers, value and gradient. Its comment calls the shift "numerical stability", but it is
      not value-preserving: the positive term e^{−p_i} is not shifted, so the negatives' sum is
      scaled by e^{−M_i}, i.e. the loss equals the paper's form with every negative logit
      lowered by M_i ∈ [−(1 + m_n)/τ, (1 − m_n)/τ] ([−2.04, 1.96] at the defaults): weaker
      repulsion for an anchor whose nearest other sample (of any class) has a cosine above m_n,
      stronger below; M_i gets no gradient.
    * ``"paper"``: M_i = 0, the cross-entropy of the paper's equation as written.

    ``margin_neg=None`` means m_n = 1 − m_p (0.02 at the default m_p = 0.98), as StudioGAN's code
    has it. Defaults (τ 0.5, m_p 0.98) are StudioGAN's CIFAR-10 ReACGAN config.

    An anchor with no negative in the batch (one sample, or all labels equal) has ℓ_i = 0 and a
    zero gradient in both forms: p_i + log e^{−p_i}; the proxy only pulls against negatives.
    ``gather=True`` or ``"equal"``: local anchors against every rank's embeddings and labels, the
    scaling of :func:`shared.losses.supcon_loss` (with DDP's averaging, the gradients of one
    process holding the whole batch). StudioGAN's class instead averages over every rank's
    anchors on every rank, and its gather's backward keeps this rank's slice without summing
    over ranks, so after DDP's averaging its parameter gradients are 1/world_size of that. N = 0
    gives a zero loss with a zero gradient (see :mod:`shared.losses.core`). The maths runs in
    fp32 under autocast, fp64 stays fp64. Inputs are not checked for NaN (that would wait for
    the device): the training loop checks the loss.

    Shape:
        embeddings: ``(N, D)``; proxies: ``(N, D)`` holding v_{y_i} for row i; labels: ``(N,)``;
        result: scalar, or ``(N,)`` with ``reduction="none"``.
    """
    check_features(embeddings, "embeddings", ndim=2)
    check_features(proxies, "proxies", ndim=2)
    check_same_shape(embeddings, proxies, "embeddings and proxies")
    y = check_labels(labels, embeddings.shape[0])
    check_positive(temperature, "temperature")
    margin_pos = check_margin(margin_pos, "margin_pos")
    m_n = 1.0 - margin_pos if margin_neg is None else check_margin(margin_neg, "margin_neg")
    check_choice(form, FORMS, "form")
    check_block_size(block_size)
    check_reduction(reduction)
    check_gather(gather)
    equal = gather == "equal"
    with autocast_off(embeddings):
        dtype = torch.float64 if embeddings.dtype == torch.float64 else torch.float32
        f = F.normalize(embeddings.to(dtype), dim=1)  # (N, D)
        v = F.normalize(proxies.to(dtype), dim=1)  # (N, D)
        f_all, offset = gather_with_offset(f, equal_sizes=equal) if gather else (f, 0)  # (Ng, D)
        y_all = gather_no_grad(y, equal_sizes=equal) if gather else y  # (Ng,)
        own = offset + torch.arange(f.shape[0], device=f.device)  # (N,)
        negatives = negative_logsumexp(
            f, f_all, own, y, y_all, temperature=temperature, margin=m_n, block_size=block_size
        )
        positive = F.relu((margin_pos - (f * v).sum(1)) / temperature)  # (N,)
        log_negatives = negatives.lse
        if form == "studiogan":
            log_negatives = log_negatives - negatives.row_max  # (N,)
        per_anchor = positive + torch.logaddexp(-positive, log_negatives)  # (N,)
        return reduce(per_anchor, reduction)


class NegativeSums(NamedTuple):
    """Per anchor: ``lse`` = log Σ_{k: y_k≠y_i} e^{relu((a_i·c_k − m)/τ)} (−inf with no negative);
    ``row_max`` = max_{k≠own} (a_i·c_k − m)/τ, not differentiable (0 with no other column)."""

    lse: Tensor
    row_max: Tensor


def negative_logsumexp(
    anchors: Tensor,
    contrasts: Tensor,
    self_index: Tensor,
    anchor_labels: Tensor,
    contrast_labels: Tensor,
    *,
    temperature: float,
    margin: float,
    block_size: int | None = None,
) -> NegativeSums:
    """The O(N²) part of D2D-CE, dense or blockwise (``block_size`` as for the core).

    The own column has the anchor's label, so it is never a negative; it is left out of the max.

    Shape:
        anchors: ``(M, D)``; contrasts: ``(K, D)``; self_index, anchor_labels: ``(M,)``;
        contrast_labels: ``(K,)``; each field of the result: ``(M,)``.
    """
    M, K = anchors.shape[0], contrasts.shape[0]
    cache = block_size is None and M * K <= core.DENSE_MAX_ELEMENTS
    if block_size is None:  # at least 1: with M = 0 there is no block, not a 0-row one
        rows = common.auto_block_rows(K, anchors.device, core.BLOCK_ELEMENTS)
        block_size = max(M, 1) if cache else rows
    # one tensor in both roles goes in once (autograd functions under torch.compile take no
    # tensor twice); its gradient is then the sum of both roles
    same = contrasts is anchors
    lse, row_max = _NegativeLogSumExp.apply(
        anchors,
        None if same else contrasts,
        1.0 / temperature,
        margin,
        self_index,
        anchor_labels,
        None if contrast_labels is anchor_labels else contrast_labels,
        block_size,
        cache,
    )
    return NegativeSums(lse, row_max)


def _block(
    a: Tensor,
    c: Tensor,
    scale: float,
    margin: float,
    self_index: Tensor,
    ya: Tensor,
    yc: Tensor,
    rows: slice,
) -> tuple[Tensor, Tensor, Tensor]:
    """One block of anchor rows: the lse, the row max and W = ∂lse/∂logit.  # (B,), (B,), (B, K)

    W_ik = softmax over the negatives of relu(x_ik), times relu'(x_ik) = [x_ik > 0].
    """
    x = torch.mm(a[rows], c.T).sub_(margin).mul_(scale)  # (B, K): (a·c − m)/τ
    others = c.shape[0] - 1  # columns besides the own one
    if others > 0:
        own = self_index[rows].unsqueeze(1)  # (B, 1)
        row_max = x.scatter(1, own, -math.inf).amax(1)  # (B,)
    else:
        row_max = x.new_zeros(x.shape[0])
    negative = ya[rows].unsqueeze(1) != yc.unsqueeze(0)  # (B, K), own column excluded
    r = F.relu(x).masked_fill_(~negative, -math.inf)  # (B, K)
    shift = r.amax(1, keepdim=True) if r.shape[1] else r.new_zeros(r.shape[0], 1)  # (B, 1)
    shift = torch.where(torch.isfinite(shift), shift, 0.0)  # rows without negatives: 0
    p = torch.exp(r - shift)  # (B, K), 0 off the negatives
    total = p.sum(1)  # (B,) ≥ 1 where there is a negative, else 0
    lse = total.log() + shift.squeeze(1)  # (B,), −inf without negatives
    inverse = torch.where(total > 0, 1.0 / total.clamp_min(1.0), 0.0)  # (B,)
    weight = p.mul_(inverse.unsqueeze(1)).mul_(x > 0)  # (B, K)
    return lse, row_max, weight


class _NegativeLogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        a: Tensor,
        c_or_none: Tensor | None,
        scale: float,
        margin: float,
        self_index: Tensor,
        ya: Tensor,
        yc_or_none: Tensor | None,
        block_size: int,
        cache: bool,
    ) -> tuple[Tensor, Tensor]:
        c = a if c_or_none is None else c_or_none
        yc = ya if yc_or_none is None else yc_or_none
        M = a.shape[0]
        lse, row_max = a.new_empty(M), a.new_empty(M)
        kept = None
        cache = cache and any(ctx.needs_input_grad[:2])
        for start in range(0, M, block_size):
            rows = slice(start, min(start + block_size, M))
            lse[rows], row_max[rows], weight = _block(a, c, scale, margin, self_index, ya, yc, rows)
            if cache:  # one block: the dense path keeps its weights for backward
                kept = weight
        ctx.scale, ctx.margin, ctx.block_size = scale, margin, block_size
        ctx.same = c_or_none is None
        ctx.save_for_backward(a, c_or_none, self_index, ya, yc_or_none, kept)
        ctx.mark_non_differentiable(row_max)
        return lse, row_max

    @staticmethod
    def backward(ctx: Any, g_lse: Tensor | None, _: Tensor | None) -> tuple[Tensor | None, ...]:
        a, c_or_none, self_index, ya, yc_or_none, kept = ctx.saved_tensors
        c = a if c_or_none is None else c_or_none
        yc = ya if yc_or_none is None else yc_or_none
        M = a.shape[0]
        want_a = ctx.needs_input_grad[0]
        want_c = ctx.needs_input_grad[0] if ctx.same else ctx.needs_input_grad[1]
        grad_a = torch.zeros_like(a) if want_a else None
        grad_c = torch.zeros_like(c) if want_c else None
        if g_lse is not None:
            for start in range(0, M, ctx.block_size):
                rows = slice(start, min(start + ctx.block_size, M))
                weight = kept
                if weight is None:  # blockwise (or a dense forward without grad): recompute
                    weight = _block(a, c, ctx.scale, ctx.margin, self_index, ya, yc, rows)[2]
                G = weight * g_lse[rows].unsqueeze(1)  # (B, K) = ∂loss/∂x
                if grad_a is not None:
                    grad_a[rows] = torch.mm(G, c).mul_(ctx.scale)  # (B, D)
                if grad_c is not None:
                    grad_c.addmm_(G.T, a[rows], alpha=ctx.scale)  # (K, D)
        if ctx.same:  # one tensor in both roles: its gradient is the sum of both
            both = None if grad_a is None or grad_c is None else grad_a + grad_c
            return both, None, None, None, None, None, None, None, None
        return grad_a, grad_c, None, None, None, None, None, None, None


class DataToDataCrossEntropyLoss(nn.Module):
    """Module form of :func:`data_to_data_cross_entropy_loss`; stores the settings only."""

    def __init__(
        self,
        temperature: float = DEFAULT_TEMPERATURE,
        margin_pos: float = DEFAULT_MARGIN_POS,
        margin_neg: float | None = None,
        form: Form = "studiogan",
        gather: Gather = False,
        block_size: int | None = None,
        reduction: Reduction = "mean",
    ) -> None:
        super().__init__()
        self.temperature = check_positive(temperature, "temperature")
        self.margin_pos = check_margin(margin_pos, "margin_pos")
        self.margin_neg = None if margin_neg is None else check_margin(margin_neg, "margin_neg")
        self.form: Form = form
        check_choice(form, FORMS, "form")
        self.gather, self.block_size = check_gather(gather), check_block_size(block_size)
        self.reduction: Reduction = reduction
        check_reduction(reduction)

    def forward(self, embeddings: Tensor, proxies: Tensor, labels: Tensor) -> Tensor:
        return data_to_data_cross_entropy_loss(
            embeddings,
            proxies,
            labels,
            temperature=self.temperature,
            margin_pos=self.margin_pos,
            margin_neg=self.margin_neg,
            form=self.form,
            gather=self.gather,
            block_size=self.block_size,
            reduction=self.reduction,
        )
