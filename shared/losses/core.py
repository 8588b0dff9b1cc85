"""The contrastive core: masked log-sum-exp over anchors × contrasts, dense or blockwise.

Every contrastive loss of the toolkit is a masked log-softmax over similarity logits
``L_ik = a_i · c_k / τ`` (anchors × contrasts). Its only part that costs O(N²) is the log of the
denominator, ``log Σ_{k ∈ A(i)} exp(L_ik)``, and for ``L_in``-style losses the log of the positive
sum, ``log Σ_{k ∈ P(i)} exp(L_ik)``. This module computes both exactly, in one custom autograd
function with two paths:

* **dense** (one block, the exponentials kept for backward): 3 matrix products and 1 exponential
  over the N×K logits for forward + backward, plus two elementwise passes;
* **blockwise** (``block_size`` anchor rows at a time, recomputed in backward): extra memory
  O(block·K + (N + K)·D), so batches far beyond what fits as an N×K matrix work.

Numerics. Logits are fp32 (fp64 stays fp64). Instead of a row max (an extra pass over N×K) the
core uses a bound on every logit, ``|L_ik| ≤ max‖a‖·max‖c‖/τ`` (``1/τ`` for normalised rows): while
every ``exp(L_ik − shift)`` stays a normal float and the sums cannot overflow, the plain
exponentials are exact (no shift at all for τ ≥ 0.025 in fp32, a constant shift up to τ ≈ 0.017).
For a smaller τ the core falls back to max-shifted ``logsumexp`` with ``finfo.min`` masking.
The bound picks a path on the host, so the callers that normalise pass ``norm_bound=1.0``; only
without it does the core measure the norms, the one read of a device value in this module (and
none while compiling: an unknown bound then takes the max-shifted path).

Compilation. The dense and blockwise paths trace under ``torch.compile(fullgraph=True)``: the
symmetric case is told by the arguments (the same tensor as anchors and contrasts, own columns
on the diagonal), never by comparing values, and the reusable CPU buffer is left out while
compiling (the compiler plans its own memory).

Empty batches (the rule every loss of :mod:`shared.losses` follows). A batch with zero rows is a
zero loss with a zero gradient, not an error: with ``reduction="mean"`` or ``"sum"`` the result is
a scalar 0 still attached to the autograd graph of the input, so ``.backward()`` runs and gives
zero gradients (under DDP every rank must run its backward, whatever its batch); with
``reduction="none"`` it is an empty per-row tensor of the usual trailing shape. With
``gather=True`` a rank without rows still joins every collective, forward and backward. Here,
M = 0 anchors gives empty results and K = 0 contrasts gives sums over nothing: ``-inf``.
"""

from __future__ import annotations

import math
from typing import Any, Literal, NamedTuple

import torch
from torch import Tensor

from shared.losses.common import auto_block_rows, autocast_off, check_block_size

SelfIndex = Tensor | Literal["diagonal"] | None

__all__ = ["DENSE_MAX_ELEMENTS", "LogSumExps", "masked_logsumexp"]

# Auto mode keeps the dense path while the N×K matrix holds at most this many elements
# (2**24 fp32 = 64 MiB, N = K = 4096); above it, blocks of about BLOCK_ELEMENTS elements
# (8 MiB in fp32: below glibc's 32 MiB mmap threshold, so a block's buffer is reused without
# fresh page faults).
DENSE_MAX_ELEMENTS = 2**24
BLOCK_ELEMENTS = 2**21
# on CUDA: common.auto_block_rows
# exp(-x) is a normal float for x below ~87 (fp32) and ~708 (fp64); the largest exponent kept,
# e^40 (fp32) or e^350 (fp64), leaves room for sums over 10^20 contrasts without overflow.
_SAFE_EXP_RANGE = {torch.float32: 80.0, torch.float64: 700.0}
_EXP_HEADROOM = {torch.float32: 40.0, torch.float64: 350.0}


def _fixed_shift(bound: float, dtype: torch.dtype) -> float | None:
    """A constant shift that keeps every exponential in range, or ``None`` if none does."""
    shift = max(0.0, bound - _EXP_HEADROOM[dtype])
    return shift if bound + shift <= _SAFE_EXP_RANGE[dtype] else None


class LogSumExps(NamedTuple):
    """Row-wise log-sum-exps of the logits of each anchor.

    ``all``: over every contrast except the anchor's own column (``-inf`` when none is left).
    ``positive``: over the contrasts with the anchor's label, own column excluded (``-inf`` for an
    anchor without positives); ``None`` when no labels were given.
    """

    all: Tensor
    positive: Tensor | None


def masked_logsumexp(
    anchors: Tensor,
    contrasts: Tensor,
    *,
    temperature: float,
    self_index: SelfIndex = None,
    anchor_labels: Tensor | None = None,
    contrast_labels: Tensor | None = None,
    block_size: int | None = None,
    norm_bound: float | None = None,
) -> LogSumExps:
    """Log-sum-exp of ``anchors @ contrasts.T / temperature`` per anchor, masked, exactly.

    Args:
        anchors: rows ``a_i`` (usually L2-normalised).
        contrasts: rows ``c_k`` (usually L2-normalised).
        temperature: τ > 0.
        self_index: column of each anchor's own row in ``contrasts``, left out of every sum;
            ``"diagonal"`` is column ``i`` for anchor ``i`` (M = K). Passing the same tensor as
            ``anchors`` and ``contrasts`` with ``"diagonal"`` and no labels makes the similarity
            matrix symmetric, and backward then needs one matrix product less.
        anchor_labels, contrast_labels: when given, also the sum over same-label columns.
        block_size: ``None`` picks the dense path up to ``DENSE_MAX_ELEMENTS`` logits and blocks
            above; an int forces the memory-bounded blockwise path with that many anchor rows.
        norm_bound: a bound on ``‖a_i‖·‖c_k‖`` known on the host, 1.0 for L2-normalised rows
            (their norms are 1 up to rounding, which the exponent headroom absorbs). ``None``
            measures it, which reads a device value back to the host (a sync on a GPU); under
            ``torch.compile`` the max-shifted path runs instead (exact, no read).

    M = 0 or K = 0 is allowed (see the module docstring): empty results, or ``-inf`` sums.

    Shape:
        anchors: ``(M, D)``; contrasts: ``(K, D)``; self_index, anchor_labels: ``(M,)``;
        contrast_labels: ``(K,)``; each field of the result: ``(M,)``.
    """
    M, K = anchors.shape[0], contrasts.shape[0]
    check_block_size(block_size)
    if (anchor_labels is None) != (contrast_labels is None):
        raise ValueError("anchor_labels and contrast_labels must be given together")
    if isinstance(self_index, str) and (self_index != "diagonal" or M != K):
        raise ValueError(
            f"self_index must be a tensor, None or 'diagonal' (M = K), got {self_index!r} "
            f"with M = {M}, K = {K}"
        )
    if norm_bound is not None and not (isinstance(norm_bound, (int, float)) and norm_bound >= 0):
        raise ValueError(f"norm_bound must be a number >= 0 or None, got {norm_bound!r}")
    dtype = torch.float64 if torch.float64 in (anchors.dtype, contrasts.dtype) else torch.float32
    # One set of rows contrasted with itself (SupCon "all", NT-Xent without gather): E is
    # symmetric, and backward needs no product with a transposed N×K matrix (see _backward_sym).
    # Told by the arguments alone: comparing index values would wait for the device.
    diagonal = isinstance(self_index, str)
    symmetric = diagonal and anchors is contrasts and anchor_labels is None
    if diagonal:
        self_index = torch.arange(M, device=anchors.device)  # (M,)
    with autocast_off(anchors):
        a = anchors.to(dtype)
        c = a if symmetric else contrasts.to(dtype)
        if not M * K:
            bound = 0.0
        elif norm_bound is not None:
            bound = norm_bound / temperature
        elif torch.compiler.is_compiling():  # no host read in a graph: the max-shifted path
            bound = math.inf
        else:  # measured: one device-to-host read
            with torch.no_grad():
                bound = float(a.norm(dim=1).max() * c.norm(dim=1).max()) / temperature
        shift = _fixed_shift(bound, dtype)
        cache = block_size is None and M * K <= DENSE_MAX_ELEMENTS
        if block_size is None:  # at least 1: with M = 0 there is no block, not a 0-row one
            block_size = max(M, 1) if cache else auto_block_rows(K, anchors.device, BLOCK_ELEMENTS)
        # the same rows (labels) on both sides go in once, as None: autograd functions under
        # torch.compile take no tensor twice, and the gradient of both roles is then summed
        lse_all, lse_pos = _MaskedLogSumExp.apply(
            a,
            None if c is a else c,
            1.0 / temperature,
            shift,
            self_index,
            anchor_labels,
            None if contrast_labels is anchor_labels else contrast_labels,
            block_size,
            cache,
            symmetric,
        )
    return LogSumExps(lse_all, lse_pos if anchor_labels is not None else None)


class _Block(NamedTuple):
    """One block of anchor rows and what both passes need of it."""

    rows: slice
    self_cols: Tensor | None  # (B, 1) own column per row
    positive: Tensor | None  # (B, K) bool, own column excluded


def _blocks(
    M: int, block_size: int, self_index: Tensor | None, ya: Tensor | None, yc: Tensor | None
) -> list[_Block]:
    out = []
    for start in range(0, M, block_size):
        rows = slice(start, min(start + block_size, M))
        self_cols = None if self_index is None else self_index[rows].unsqueeze(1)  # (B, 1)
        positive = None
        if ya is not None and yc is not None:
            positive = ya[rows].unsqueeze(1) == yc.unsqueeze(0)  # (B, K)
            if self_cols is not None:
                positive.scatter_(1, self_cols, False)
        out.append(_Block(rows, self_cols, positive))
    return out


class _Workspace:
    """One reusable buffer per CPU device and dtype for the dense path's N×K exponentials.

    A fresh 64 MiB tensor on CPU is returned to the OS when freed, and touching it again next
    step page-faults on every page. The buffer taken by a forward comes back after its
    backward, so consecutive steps reuse it. It holds at most ``DENSE_MAX_ELEMENTS`` elements
    per dtype; CUDA has its caching allocator.
    """

    def __init__(self) -> None:
        self._free: dict[tuple[str, torch.dtype], Tensor] = {}

    def take(self, rows: int, cols: int, like: Tensor) -> Tensor:
        if like.device.type != "cpu" or torch.compiler.is_compiling():
            return like.new_empty(rows, cols)
        buffer = self._free.pop((str(like.device), like.dtype), None)
        if buffer is None or buffer.numel() < rows * cols:
            buffer = like.new_empty(rows * cols)
        return buffer[: rows * cols].view(rows, cols)

    def give_back(self, view: Tensor) -> None:
        if view.device.type != "cpu" or torch.compiler.is_compiling():
            return
        buffer = view._base if view._base is not None else view
        key = (str(view.device), view.dtype)
        current = self._free.get(key)
        if current is None or current.numel() < buffer.numel():
            self._free[key] = buffer


_WORKSPACE = _Workspace()


def _shifted_exp(
    a: Tensor, c: Tensor, scale: float, shift: float, block: _Block, out: Tensor | None = None
) -> Tensor:
    """``exp(a c^T · scale − shift)`` for one block, own column zeroed.  # (B, K)"""
    if shift == 0.0:  # the common case: one matrix product, one in-place exponential
        E = torch.mm(a[block.rows] * scale, c.T, out=out).exp_()  # (B, K)
    else:
        bias = torch.full((), -shift, dtype=a.dtype, device=a.device)  # no host-to-device copy
        E = torch.addmm(bias, a[block.rows], c.T, alpha=scale, out=out).exp_()  # (B, K)
    if block.self_cols is not None:
        E.scatter_(1, block.self_cols, 0.0)
    return E


def _logits(a: Tensor, c: Tensor, scale: float, block: _Block) -> Tensor:
    """Logits of one block with the own column at ``finfo.min``.  # (B, K)"""
    L = torch.mm(a[block.rows], c.T).mul_(scale)  # (B, K)
    if block.self_cols is not None:
        L.scatter_(1, block.self_cols, torch.finfo(L.dtype).min)
    return L


def _empty_rows_to_neg_inf(lse: Tensor, count: Tensor) -> Tensor:
    """A sum over an empty set is 0: its log is -inf, not ``finfo.min + log(1)``."""
    return torch.where(count > 0, lse, torch.full_like(lse, -math.inf))


def _softmax_weight(grad: Tensor, shift: float, lse: Tensor) -> Tensor:
    """``grad · exp(shift − lse)``: turns the shifted exponentials into softmax gradients.

    Rows whose sum is empty (``lse = -inf``) have no softmax and get no gradient.
    """
    return torch.where(torch.isfinite(lse), grad * torch.exp(shift - lse), 0.0)


class _MaskedLogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        a: Tensor,
        c_or_none: Tensor | None,
        scale: float,
        shift: float | None,
        self_index: Tensor | None,
        ya: Tensor | None,
        yc_or_none: Tensor | None,
        block_size: int,
        cache: bool,
        symmetric: bool,
    ) -> tuple[Tensor, Tensor]:
        c = a if c_or_none is None else c_or_none
        yc = ya if yc_or_none is None else yc_or_none
        M, K = a.shape[0], c.shape[0]
        blocks = _blocks(M, block_size, self_index, ya, yc)
        lse_all = a.new_empty(M)
        lse_pos = a.new_empty(M if ya is not None else 0)
        kept: Tensor | None = None
        cache = cache and shift is not None and any(ctx.needs_input_grad[:2])
        for block in blocks:
            if shift is not None:
                out = _WORKSPACE.take(M, K, a) if cache else None
                E = _shifted_exp(a, c, scale, shift, block, out)  # (B, K)
                lse_all[block.rows] = E.sum(1).log_().add_(shift)
                if block.positive is not None:
                    lse_pos[block.rows] = (E * block.positive).sum(1).log_().add_(shift)
                if cache:
                    kept = E
            else:
                L = _logits(a, c, scale, block)  # (B, K)
                n_valid = K - (0 if block.self_cols is None else 1)
                lse_all[block.rows] = _empty_rows_to_neg_inf(
                    torch.logsumexp(L, 1), torch.full_like(L[:, 0], n_valid)
                )
                if block.positive is not None:
                    Lp = L.masked_fill(~block.positive, torch.finfo(L.dtype).min)  # (B, K)
                    lse_pos[block.rows] = _empty_rows_to_neg_inf(
                        torch.logsumexp(Lp, 1), block.positive.sum(1)
                    )
        ctx.scale, ctx.shift, ctx.block_size = scale, shift, block_size
        ctx.same = c_or_none is None
        ctx.symmetric = symmetric and shift is not None
        # The dense path keeps its exponentials outside save_for_backward: the first backward
        # turns them into the gradient in place (no second N×K buffer); a repeated backward
        # (retain_graph=True) finds the cache gone and recomputes, like the blockwise path.
        ctx.kept = kept
        ctx.save_for_backward(a, c_or_none, self_index, ya, yc_or_none, lse_all, lse_pos)
        if ya is None:
            ctx.mark_non_differentiable(lse_pos)
        return lse_all, lse_pos

    @staticmethod
    def backward(ctx: Any, g_all: Tensor | None, g_pos: Tensor | None) -> tuple[Tensor | None, ...]:
        a, c_or_none, self_index, ya, yc_or_none, lse_all, lse_pos = ctx.saved_tensors
        c = a if c_or_none is None else c_or_none
        yc = ya if yc_or_none is None else yc_or_none
        kept, ctx.kept = ctx.kept, None
        if ctx.symmetric and g_all is not None:
            grad = _backward_sym(
                a, self_index, lse_all, g_all, ctx.scale, ctx.shift, ctx.block_size, kept
            )
            if kept is not None:
                _WORKSPACE.give_back(kept)
            return grad, None, None, None, None, None, None, None, None, None
        scale, shift = ctx.scale, ctx.shift
        M = a.shape[0]
        if g_all is None:
            g_all = torch.zeros_like(lse_all)
        has_pos = ya is not None and g_pos is not None
        want_a = ctx.needs_input_grad[0]
        want_c = ctx.needs_input_grad[0] if ctx.same else ctx.needs_input_grad[1]
        grad_a = torch.zeros_like(a) if want_a else None
        grad_c = torch.zeros_like(c) if want_c else None
        for block in _blocks(M, ctx.block_size, self_index, ya, yc):
            r = block.rows
            # G_ik = dLoss/dL_ik = g_all_i·softmax_all_ik + g_pos_i·softmax_pos_ik
            if shift is not None:
                E = kept if kept is not None else _shifted_exp(a, c, scale, shift, block)  # (B, K)
                weight = _softmax_weight(g_all[r], shift, lse_all[r]).unsqueeze(1)  # (B, 1)
                if has_pos and block.positive is not None:
                    assert g_pos is not None
                    w_pos = _softmax_weight(g_pos[r], shift, lse_pos[r]).unsqueeze(1)  # (B, 1)
                    weight = weight + block.positive * w_pos  # (B, K)
                G = E.mul_(weight)  # (B, K), E is ours to overwrite
            else:
                L = _logits(a, c, scale, block)  # (B, K)
                lse = lse_all[r].clamp_min(torch.finfo(L.dtype).min).unsqueeze(1)  # (B, 1)
                G = torch.exp(L - lse) * g_all[r].unsqueeze(1)  # (B, K)
                if has_pos and block.positive is not None:
                    assert g_pos is not None
                    Lp = torch.where(block.positive, L - lse_pos[r].unsqueeze(1), -math.inf)
                    G = G + torch.exp(Lp) * g_pos[r].unsqueeze(1)  # (B, K)
                if block.self_cols is not None:
                    G.scatter_(1, block.self_cols, 0.0)
            if grad_a is not None:
                grad_a[r] = torch.mm(G, c).mul_(scale)  # (B, D)
            if grad_c is not None:
                grad_c.addmm_(G.T, a[r], alpha=scale)  # (K, D)
        if kept is not None:
            _WORKSPACE.give_back(kept)
        if ctx.same:  # one tensor in both roles: its gradient is the sum of both
            both = None if grad_a is None or grad_c is None else grad_a + grad_c
            return both, None, None, None, None, None, None, None, None, None
        return grad_a, grad_c, None, None, None, None, None, None, None, None


def _backward_sym(
    z: Tensor,
    self_index: Tensor,
    lse: Tensor,
    g: Tensor,
    scale: float,
    shift: float,
    block_size: int,
    kept: Tensor | None,
) -> Tensor:
    """Gradient for rows contrasted with themselves, from one product per block.

    With G_ik = w_i E_ik and E symmetric, the gradient reaching row j through both the anchor
    and the contrast side is w_j (E z)_j + (E (w ∘ z))_j: a single product of E with the
    concatenation [z, w ∘ z], and no elementwise pass over E.

    Shape:
        z: ``(N, D)``; lse, g: ``(N,)``; result: ``(N, D)``.
    """
    N, D = z.shape
    w = _softmax_weight(g, shift, lse)  # (N,)
    right = torch.cat([z, z * w.unsqueeze(1)], dim=1)  # (N, 2D)
    grad = torch.empty_like(z)
    for block in _blocks(N, block_size, self_index, None, None):
        E = kept if kept is not None else _shifted_exp(z, z, scale, shift, block)  # (B, N)
        out = torch.mm(E, right)  # (B, 2D)
        r = block.rows
        grad[r] = (out[:, :D] * w[r].unsqueeze(1) + out[:, D:]) * scale  # (B, D)
    return grad
