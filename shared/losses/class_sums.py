"""SupCon's positive sums through class sums, without reading the number of classes back.

``L_out`` needs ``Σ_{p ∈ P(i)} a_i·c_p`` for every anchor: with ``S_y`` the sum of the contrast
rows of class ``y`` it is ``a_i · S_{y_i}`` minus the anchor's own term, O((M + K)·D) instead of
an N×N mask. The class count C lives on the device (``torch.unique`` would read it back), so the
class sums get a bound known on the host, the number of samples, as their row count. A custom
autograd function keeps memory at what the inputs already hold: it saves no gathered ``(M, D)``
rows and no class sums for backward, and recomputes what it needs there.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["class_ids", "positive_logit_sums"]

# rows of gathered class sums held at once (2**18 elements: 1 MiB in fp32)
_CHUNK_ELEMENTS = 2**18


def class_ids(labels: Tensor) -> Tensor:
    """Labels renumbered ``0 … C−1`` in sorted order, without reading C back to the host.

    The same numbering as ``torch.unique(labels, return_inverse=True)[1]``, from a sort and a
    cumulative sum (``unique`` must learn its output size on the host).

    Shape:
        labels: ``(N,)``; result: ``(N,)``, long, values in ``[0, N)``.
    """
    sorted_labels, order = torch.sort(labels)  # (N,) each
    starts = torch.ones_like(sorted_labels, dtype=torch.long)  # (N,) 1 where a class begins
    starts[1:] = (sorted_labels[1:] != sorted_labels[:-1]).long()
    ids = starts.cumsum(0) - 1  # (N,) class of each sorted label
    return torch.empty_like(ids).scatter_(0, order, ids)  # (N,) back in input order


def positive_logit_sums(
    anchors: Tensor, contrasts: Tensor, own: Tensor, ya: Tensor, yc: Tensor, classes: int
) -> tuple[Tensor, Tensor]:
    """``Σ_{p ∈ P(i)} a_i·c_p`` and ``|P(i)|`` through class sums, in O((M + K)·D).

    ``ya``/``yc`` are class indices in ``[0, classes)``, ``classes`` a bound known on the host;
    ``own`` holds each anchor's own contrast row, which is taken out of its class sum.

    Shape:
        anchors, own: ``(M, D)``; contrasts: ``(K, D)``; ya: ``(M,)``; yc: ``(K,)``;
        results: ``(M,)`` each.
    """
    counts = _add_rows(
        torch.zeros(classes, dtype=torch.long, device=yc.device), yc, torch.ones_like(yc)
    )  # (C_max,) rows per class
    same = contrasts is anchors  # one tensor in both roles goes in once (see core.py)
    to_class = _DotWithClassSum.apply(anchors, None if same else contrasts, ya, yc, classes)
    return to_class - (anchors * own).sum(1), counts[ya] - 1


def _add_rows(table: Tensor, ids: Tensor, rows: Tensor) -> Tensor:
    """``table[ids_k] += rows_k`` in place (``index_add_``: no sort, atomics on CUDA)."""
    return table.index_add_(0, ids, rows)


def _class_sums(rows: Tensor, ids: Tensor, classes: int) -> Tensor:
    """``S_y = Σ_{k: ids_k = y} rows_k``.  # (C_max, D)"""
    return _add_rows(rows.new_zeros(classes, rows.shape[1]), ids, rows)


def _rowwise_dot_gathered(a: Tensor, table: Tensor, ids: Tensor) -> Tensor:
    """``a_i · table[ids_i]``, gathering a chunk of rows at a time.  # (M,)"""
    M, D = a.shape
    out = a.new_empty(M)  # (M,)
    chunk = max(1, _CHUNK_ELEMENTS // max(D, 1))
    for start in range(0, M, chunk):
        r = slice(start, start + chunk)
        out[r] = (a[r] * table.index_select(0, ids[r])).sum(1)  # (chunk,)
    return out


class _DotWithClassSum(torch.autograd.Function):
    """``a_i · S_{ya_i}`` with ``S`` the class sums of the contrasts ``c`` (``None``: ``c = a``)."""

    @staticmethod
    def forward(
        ctx: Any, a: Tensor, c_or_none: Tensor | None, ya: Tensor, yc: Tensor, classes: int
    ) -> Tensor:
        c = a if c_or_none is None else c_or_none
        ctx.classes, ctx.same = classes, c_or_none is None
        ctx.save_for_backward(a, c_or_none, ya, yc)
        return _rowwise_dot_gathered(a, _class_sums(c, yc, classes), ya)  # (M,)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, ...]:
        a, c_or_none, ya, yc = ctx.saved_tensors
        c = a if c_or_none is None else c_or_none
        want_a = ctx.needs_input_grad[0]
        want_c = want_a if ctx.same else ctx.needs_input_grad[1]
        grad_a = grad_c = None
        if want_c:  # ∂/∂c_k = Σ_{i: ya_i = yc_k} g_i a_i, one class table alive at a time
            weighted = a.new_zeros(ctx.classes, a.shape[1])  # (C_max, D)
            chunk = max(1, _CHUNK_ELEMENTS // max(a.shape[1], 1))
            for start in range(0, a.shape[0], chunk):
                r = slice(start, start + chunk)
                _add_rows(weighted, ya[r], a[r] * g[r].unsqueeze(1))
            grad_c = weighted.index_select(0, yc)  # (K, D)
            del weighted
        if want_a:  # ∂/∂a_i = g_i S_{ya_i}
            grad_a = _class_sums(c, yc, ctx.classes).index_select(0, ya).mul_(g.unsqueeze(1))
        if ctx.same:
            both = None if grad_a is None or grad_c is None else grad_a + grad_c
            return both, None, None, None, None
        return grad_a, grad_c, None, None, None
