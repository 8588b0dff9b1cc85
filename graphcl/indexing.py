"""Index primitives of the batched graph augmentations, with every output size known on the host.

The augmentations (:mod:`graphcl.augment` and the modules behind it) select, count and
renumber nodes and edges of whole batches at once. Every primitive here takes the sizes it
needs from the caller, known on the host (PyG keeps a batch's collation slices on the CPU), so
none waits for the device to learn a size: :func:`true_indices` replaces ``nonzero`` and
``masked_select``, :func:`group_counts` replaces ``bincount`` (which syncs on CUDA), and
:func:`rows_at` / :func:`edge_columns` use ``index_select``, which avoids the slow paths of
advanced indexing on the CPU. :func:`read_to_host` is the one device→host copy of an
augmentation; :func:`host_list`, :func:`host_total` and :func:`host_offsets` work on CPU
metadata only.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import Tensor

__all__ = [
    "edge_columns",
    "group_counts",
    "group_ptr",
    "host_list",
    "host_offsets",
    "host_total",
    "read_to_host",
    "rows_at",
    "to_device",
    "true_indices",
]


def host_list(metadata: Tensor) -> list[Any]:
    """The values of CPU-side metadata as Python numbers: the collation slices and increments
    (PyG keeps them on the CPU whatever the batch's device) and what is computed from them or
    from :func:`read_to_host`. Reading them is no device wait."""
    values: list[Any] = metadata.tolist()
    return values


def read_to_host(values: Tensor) -> Tensor:
    """Copy a small device tensor to the host: the device→host wait of an augmentation.

    The new graph sizes of a view depend on the random draw, and a PyG ``Batch`` keeps them
    on the host (its collation slices, ``num_nodes``), so every augmentation that changes
    sizes reads them here once (with the flag of any unfinished random choice); every
    other index size is derived on the host from the slices.
    """
    return values.cpu()


def to_device(host: Tensor, device: torch.device) -> Tensor:
    """A host-built index tensor on ``device`` without a wait (pinned, non-blocking copy)."""
    if host.device == device:
        return host
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


def group_counts(group: Tensor, size: int, weight: Tensor | None = None) -> Tensor:
    """Occurrences (or the summed ``weight``) of each of ``size`` groups, with no host sync
    (``bincount`` syncs on CUDA).

    Shape:
        group: ``(n,)`` ids in ``[0, size)``; weight: ``(n,)`` bool or integer; returns
        ``(size,)`` long.
    """
    ones = torch.ones_like(group) if weight is None else weight.long()
    return group.new_zeros(size).index_add_(0, group, ones)


def rows_at(values: Tensor, index: Tensor) -> Tensor:
    """``values[index]`` along dim 0, as an ``index_select`` (advanced indexing takes a slower
    path on the CPU)."""
    return values.index_select(0, index)


def true_indices(mask: Tensor, count: int) -> Tensor:
    """The positions of the ``count`` true entries of a 1-D mask, ascending, with ``count``
    known on the host: a scatter of each true entry's rank, where ``nonzero`` and
    ``masked_select`` would wait for the device to learn the size.

    Shape:
        mask: ``(n,)`` bool with ``count`` true entries; returns ``(count,)`` long.
    """
    rank = torch.where(mask, mask.long().cumsum(0) - 1, count)  # (n,) false -> a spare slot
    positions = torch.arange(mask.numel(), device=mask.device)
    return positions.new_empty(count + 1).scatter_(0, rank, positions)[:count]


def edge_columns(edge_index: Tensor, index: Tensor) -> Tensor:
    """``edge_index[:, index]`` as two 1-D index_selects (cheaper than selecting along dim 1).

    Shape:
        edge_index: ``(2, E)``; index: ``(E',)``; returns ``(2, E')``.
    """
    return torch.stack([rows_at(edge_index[0], index), rows_at(edge_index[1], index)])


def group_ptr(sorted_group: Tensor, num_groups: int) -> Tensor:
    """Offsets ``(num_groups + 1,)`` of the groups in an ascending group vector."""
    groups = torch.arange(num_groups + 1, device=sorted_group.device)
    return torch.searchsorted(sorted_group, groups)


def host_total(counts: Tensor) -> int:
    """The sum of CPU counts as a Python int (host metadata: no device wait)."""
    return cast(int, counts.sum().tolist())  # a 0-d tensor: one Python number


def host_offsets(counts: Tensor) -> Tensor:
    """Slices ``(G + 1,)`` of CPU per-graph counts ``(G,)``."""
    return torch.cat([counts.new_zeros(1), counts.cumsum(0)])
