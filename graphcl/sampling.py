"""The per-graph random choices behind :mod:`graphcl.augment`, made for all the graphs of a
batch at once (never in a Python loop over graphs).

Randomness: :func:`draw` samples from a generator on the generator's own device, so a seed gives
the same augmentation on every device. Choices: :class:`Choice` takes exactly ``k`` items per
group by vectorised sequential rejection sampling, :func:`random_rank` ranks the items of every
group uniformly at random, and :func:`floor_fraction` is the ``⌊p·n⌋`` of every augmentation
(:func:`check_fraction` checks its ``p``). The choices of new bonds live in
:mod:`graphcl.edge_perturbation`, the growth of subgraphs in :mod:`graphcl.subgraph_growth`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from graphcl.indexing import group_counts, group_ptr, host_total, rows_at, to_device

__all__ = ["Choice", "check_fraction", "choose", "draw", "floor_fraction", "random_rank"]

# --------------------------------------------------------------------------- randomness


def draw(
    sample: Callable[..., Tensor],
    *size: Any,
    generator: torch.Generator | None,
    device: torch.device,
    **kwargs: Any,
) -> Tensor:
    """``sample(*size)`` (torch.rand, randn, randint) from ``generator`` on its own device, moved
    to ``device``: the same seed gives the same augmentation on every device. Without a
    generator, the global RNG of ``device``."""
    where = device if generator is None else generator.device
    return to_device(sample(*size, generator=generator, device=where, **kwargs), device)


SCORE_BITS = 31  # random scores are integers in [0, 2^31): int64 keys sort fastest


def _rank_within(group: Tensor, num_groups: int, score: Tensor) -> Tensor:
    """Rank (0, 1, ...) of each element among the elements of its group, by ascending score
    (ties by position).

    Shape:
        group: ``(n,)`` long, ascending; score: ``(n,)`` long in [0, 2^31); returns ``(n,)``.
    """
    order = torch.sort((group << SCORE_BITS) | score, stable=True).indices  # by (group, score)
    start = group_ptr(group, num_groups)  # first position of each group, also in sorted order
    position = torch.arange(order.numel(), device=group.device)
    return torch.empty_like(order).scatter_(0, order, position - rows_at(start, group))


def _random_scores(count: int, generator: torch.Generator | None, device: torch.device) -> Tensor:
    return draw(torch.randint, 2**SCORE_BITS, (count,), generator=generator, device=device)


def random_rank(group: Tensor, num_groups: int, generator: torch.Generator | None) -> Tensor:
    """A uniformly random ranking of the elements of each group."""
    return _rank_within(group, num_groups, _random_scores(group.numel(), generator, group.device))


class Choice:
    """Exactly ``k[g]`` items chosen uniformly among the items ``ptr[g] .. ptr[g+1] − 1`` of
    every group g, without sorting: sequential rejection sampling, all groups at once. Each
    round draws items uniformly in their group, skips those already chosen or drawn earlier in
    the round, and keeps the first ones in draw order (a uniform subset, as drawing one at a
    time would give). A group where k exceeds half its size chooses its complement instead,
    so at least half of the draws succeed; one round almost always suffices.

    The first round is drawn on construction, its size computed on the host from ``host_ptr``
    and ``host_k`` (CPU copies of ``ptr`` and ``k``), so it reads nothing from the device.
    ``unfinished`` (a 0-d bool on the device) tells whether some group is still short: a
    caller reads it with its own device read and asks for :meth:`mask` only when it is
    true; :meth:`mask` draws the further rounds, reading each round's size.

    Shape:
        ptr, host_ptr: ``(G + 1,)``; k, host_k: ``(G,)`` with ``0 ≤ k ≤ size``; the mask is
        ``(ptr[-1],)`` bool.
    """

    def __init__(
        self,
        ptr: Tensor,
        k: Tensor,
        generator: torch.Generator | None,
        host_ptr: Tensor,
        host_k: Tensor,
    ) -> None:
        self.device, self.num_groups, self.generator = ptr.device, k.numel(), generator
        self.num_items = host_total(host_ptr.diff())
        self.ptr, self.size = ptr, ptr.diff()
        self.flip = 2 * k > self.size
        self.missing = torch.where(self.flip, self.size - k, k)  # ≤ size / 2
        self.chosen = torch.zeros(self.num_items, dtype=torch.bool, device=self.device)
        host_size = host_ptr.diff()
        host_wanted = torch.where(2 * host_k > host_size, host_size - host_k, host_k)
        total = host_total(torch.where(host_wanted > 0, 2 * host_wanted + 2, 0))
        if total:
            self._round(torch.where(self.missing > 0, 2 * self.missing + 2, 0), total)

    @property
    def unfinished(self) -> Tensor:
        """Whether some group still misses items (0-d bool on the device; not read)."""
        return (self.missing > 0).any()

    def mask(self, *, finish: bool = True) -> Tensor:
        """The chosen items, after the further rounds still needed (``finish=False``: as the
        rounds so far left them, for a caller that reads :attr:`unfinished` itself)."""
        while finish:
            draws = torch.where(self.missing > 0, 2 * self.missing + 2, 0)  # oversampled
            total = int(draws.sum())  # the device read of a further round
            if total == 0:
                break
            self._round(draws, total)
        item_flip = torch.repeat_interleave(self.flip, self.size, output_size=self.num_items)
        return self.chosen ^ item_flip

    def _round(self, draws: Tensor, total: int) -> None:
        """One round of ``total`` draws (``draws[g]`` for group g)."""
        device, num_groups = self.device, self.num_groups
        group = torch.repeat_interleave(
            torch.arange(num_groups, device=device), draws, output_size=total
        )  # ascending
        uniform = draw(
            torch.rand, total, generator=self.generator, device=device, dtype=torch.float64
        )
        n = rows_at(self.size, group)
        item = rows_at(self.ptr, group) + (uniform * n).long().minimum(n - 1)  # (total,)
        order = torch.arange(total, device=device)  # each draw's position in the round
        earliest = torch.full((self.num_items,), total, device=device, dtype=torch.long)
        earliest.scatter_reduce_(0, item, order, "amin")
        fresh = (rows_at(earliest, item) == order) & ~rows_at(self.chosen, item)
        before = torch.cat([draws.new_zeros(1), fresh.long().cumsum(0)])  # (total + 1,)
        group_start = rows_at(before, rows_at(draws.cumsum(0) - draws, group))
        rank = before[:-1] - group_start  # in its group
        take = fresh & (rank < rows_at(self.missing, group))
        self.chosen |= group_counts(item, self.num_items, take) > 0  # the taken items are distinct
        self.missing = self.missing - group_counts(group, num_groups, take)


def choose(
    ptr: Tensor, k: Tensor, generator: torch.Generator | None, host_ptr: Tensor, host_k: Tensor
) -> Tensor:
    """The ``(ptr[-1],)`` bool mask of a :class:`Choice`, finished (its check reads the
    device once when one round sufficed)."""
    return Choice(ptr, k, generator, host_ptr, host_k).mask()


def floor_fraction(p: float, counts: Tensor) -> Tensor:
    """``⌊p·n⌋`` per graph, computed as Python's ``int(p * n)`` (float64 product)."""
    return torch.floor(counts.double() * p).long()


def check_fraction(name: str, p: float, *, allow_one: bool) -> None:
    """Refuse a ``p`` outside ``[0, 1]`` (``[0, 1)`` without ``allow_one``), naming ``name``."""
    ok = isinstance(p, (int, float)) and not isinstance(p, bool) and 0 <= p <= 1
    if not ok or (p == 1 and not allow_one):
        interval = "[0, 1]" if allow_one else "[0, 1)"
        raise ValueError(f"{name}: p must be in {interval}, got p={p!r}")
