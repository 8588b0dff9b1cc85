"""Distributed helpers: the only place in the toolkit that calls ``torch.distributed``.

Contrastive losses with ``gather=True`` use every rank's samples as contrasts. The gather must be
gradient-correct: rank ``r`` computes the loss of its *local* anchors against the *global*
contrasts, so the gradient that reaches a sample ``x_j`` through the contrast path comes from every
rank's loss. The backward therefore sums the incoming gradients over ranks (``all_reduce``) and
returns this rank's slice. Together with DDP's gradient averaging, the parameter gradients then
equal those of one process holding the whole batch (tested with 2 gloo processes on CPU).

We write this small autograd function ourselves instead of ``torch.distributed.nn.all_gather``:
that one needs equal batch sizes and its backward uses ``reduce_scatter``, which gloo lacks.

Ranks may hold different numbers of rows: the gathers first exchange the row counts, which the
host must read to cut the padding (one wait for the device per gather on a GPU). A caller that
knows every rank holds the same number of rows (a ``DistributedSampler`` gives each rank
equally many samples, so equal batches) passes ``equal_sizes=True`` and nothing is exchanged or
read back; the rows must then really be equal in number, as for any collective.
"""

from __future__ import annotations

from typing import Any, NamedTuple, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = [
    "Gathered",
    "all_gather_object",
    "all_reduce_mean",
    "all_reduce_sum",
    "gather_no_grad",
    "gather_with_grad",
    "gather_with_offset",
    "is_initialized",
    "rank",
    "world_size",
]

T = TypeVar("T")


def is_initialized() -> bool:
    """Whether a default process group is up (``torchrun`` + ``init_process_group``)."""
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    """Number of processes in the default group; 1 when not distributed."""
    return dist.get_world_size() if is_initialized() else 1


def rank() -> int:
    """This process's rank; 0 when not distributed."""
    return dist.get_rank() if is_initialized() else 0


class Gathered(NamedTuple):
    """Rows of every rank concatenated in rank order, and where this rank's rows start."""

    tensor: Tensor
    offset: int


def _sizes(n: int, device: torch.device, equal_sizes: bool) -> list[int]:
    """Number of rows on every rank: ``n`` each when the caller says so, else exchanged (one
    small all_gather, read on the host)."""
    if equal_sizes:
        return [n] * world_size()
    mine = torch.full((1,), n, dtype=torch.long, device=device)
    all_sizes = [torch.empty_like(mine) for _ in range(world_size())]
    dist.all_gather(all_sizes, mine)
    return [int(s) for s in torch.cat(all_sizes).tolist()]  # one read for all ranks


def _all_gather_rows(x: Tensor, sizes: list[int]) -> Tensor:
    """Concatenate every rank's ``x`` along dim 0; ranks may hold different numbers of rows."""
    longest = max(sizes)
    padded = x
    if x.shape[0] < longest:  # gloo and nccl all_gather need equal shapes: pad, then cut
        padded = torch.cat([x, x.new_zeros((longest - x.shape[0], *x.shape[1:]))])
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded.contiguous())
    return torch.cat([p[:s] for p, s in zip(parts, sizes, strict=True)])


class _GatherWithGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, sizes: list[int], offset: int) -> Tensor:
        ctx.offset, ctx.n = offset, x.shape[0]
        return _all_gather_rows(x, sizes)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        # every rank's loss used our rows as contrasts: sum their gradients, keep our slice
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        return grad[ctx.offset : ctx.offset + ctx.n], None, None


def gather_with_offset(x: Tensor, *, equal_sizes: bool = False) -> Gathered:
    """All-gather ``x`` along dim 0 with gradients, and return this rank's row offset.

    The identity (offset 0) when ``torch.distributed`` is not initialised or has one process.

    Args:
        x: this rank's rows.
        equal_sizes: every rank holds as many rows as this one: skip the size exchange and its
            host read (see the module docstring).

    Shape:
        x: ``(n, *)`` on this rank; result: ``(sum of n over ranks, *)``.
    """
    if world_size() == 1:
        return Gathered(x, 0)
    sizes = _sizes(x.shape[0], x.device, equal_sizes)
    offset = sum(sizes[: rank()])
    return Gathered(_GatherWithGrad.apply(x, sizes, offset), offset)


def gather_with_grad(x: Tensor, *, equal_sizes: bool = False) -> Tensor:
    """Gradient-correct all-gather along dim 0 (see the module docstring); identity on 1 process.

    ``equal_sizes`` as for :func:`gather_with_offset`.

    Shape:
        x: ``(n, *)``; result: ``(sum of n over ranks, *)``, rank 0's rows first.
    """
    return gather_with_offset(x, equal_sizes=equal_sizes).tensor


def gather_no_grad(x: Tensor, *, equal_sizes: bool = False) -> Tensor:
    """All-gather along dim 0 for tensors that need no gradient (labels, ids).

    ``equal_sizes`` as for :func:`gather_with_offset`.

    Shape:
        x: ``(n, *)``; result: ``(sum of n over ranks, *)``, rank 0's rows first.
    """
    if world_size() == 1:
        return x
    return _all_gather_rows(x.detach(), _sizes(x.shape[0], x.device, equal_sizes))


def all_reduce_mean(x: Tensor) -> Tensor:
    """Mean of ``x`` over ranks (for logging a loss); a copy, the identity on 1 process."""
    return all_reduce_sum(x) / world_size()


def all_reduce_sum(x: Tensor) -> Tensor:
    """Sum of ``x`` over ranks (per-rank counts and sums); a copy, the identity on 1 process.

    A collective: every rank must call it at the same point, with ``x`` on a device its
    backend serves (the CPU for gloo, the rank's GPU for NCCL).
    """
    out = x.detach().clone()
    if world_size() > 1:
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def all_gather_object(obj: T) -> list[T]:
    """Every rank's ``obj`` (picklable), in rank order, on every rank; ``[obj]`` on 1 process.

    For small per-rank state such as RNG states, which the checkpoint on rank 0 must hold for
    every rank. A collective: every rank must call it at the same point.
    """
    if world_size() == 1:
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out
