"""The per-graph random choices behind :mod:`graphcl.augment`, made for all the graphs of a
batch at once (never in a Python loop over graphs).

Randomness: :func:`_draw` samples from a generator on the generator's own device, so a seed gives
the same augmentation on every device. Choices: :func:`_choose` takes exactly ``k`` items per
group by vectorised sequential rejection sampling, :func:`_random_rank` ranks the items of every
group uniformly at random, and :func:`_floor_fraction` is the ``⌊p·n⌋`` of every augmentation.
Non-bonds (edge perturbation): :class:`_Bonds` looks up which node pairs are bonded, and
:func:`_enumerate_non_bonds` and :func:`_sample_non_bonds` choose new bonds among the free pairs.
Subgraphs: :func:`_growth_times` orders the nodes as a growth from a random seed, one frontier
node at a time, would add them; :func:`_one_hop` is the GraphCL reference's one-hop variant.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch_geometric.data import Batch

from graphcl.batching import _at, _counts, _indices, _ptr

# --------------------------------------------------------------------------- randomness


def _draw(
    sample: Callable[..., Tensor], *size: Any, generator: torch.Generator | None,
    device: torch.device, **kwargs: Any,
) -> Tensor:  # fmt: skip
    """``sample(*size)`` (torch.rand, randn, randint) from ``generator`` on its own device, moved
    to ``device``: the same seed gives the same augmentation on every device. Without a
    generator, the global RNG of ``device``."""
    where = device if generator is None else generator.device
    return sample(*size, generator=generator, device=where, **kwargs).to(device)


SCORE_BITS = 31  # random scores are integers in [0, 2^31): int64 keys sort fastest


def _rank_within(group: Tensor, num_groups: int, score: Tensor) -> Tensor:
    """Rank (0, 1, ...) of each element among the elements of its group, by ascending score
    (ties by position).

    Shape:
        group: ``(n,)`` long, ascending; score: ``(n,)`` long in [0, 2^31); returns ``(n,)``.
    """
    order = torch.sort((group << SCORE_BITS) | score, stable=True).indices  # by (group, score)
    start = _ptr(group, num_groups)  # first position of each group, also in sorted order
    position = torch.arange(order.numel(), device=group.device)
    return torch.empty_like(order).scatter_(0, order, position - _at(start, group))


def _random_scores(count: int, generator: torch.Generator | None, device: torch.device) -> Tensor:
    return _draw(torch.randint, 2**SCORE_BITS, (count,), generator=generator, device=device)


def _random_rank(group: Tensor, num_groups: int, generator: torch.Generator | None) -> Tensor:
    """A uniformly random ranking of the elements of each group."""
    return _rank_within(group, num_groups, _random_scores(group.numel(), generator, group.device))


def _choose(ptr: Tensor, k: Tensor, generator: torch.Generator | None) -> Tensor:
    """Exactly ``k[g]`` items chosen uniformly among the items ``ptr[g] .. ptr[g+1] − 1`` of
    every group g, without sorting: sequential rejection sampling, all groups at once. Each
    round draws items uniformly in their group, skips those already chosen or drawn earlier in
    the round, and keeps the first ones in draw order (a uniform subset, as drawing one at a
    time would give). A group where k exceeds half its size chooses its complement instead,
    so at least half of the draws succeed; one round almost always suffices.

    Shape:
        ptr: ``(G + 1,)``; k: ``(G,)`` with ``0 ≤ k ≤ size``; returns ``(ptr[-1],)`` bool.
    """
    device, num_groups, num_items = ptr.device, k.numel(), int(ptr[-1])
    size = ptr.diff()
    flip = 2 * k > size
    wanted = torch.where(flip, size - k, k)  # ≤ size / 2
    chosen = torch.zeros(num_items, dtype=torch.bool, device=device)
    missing = wanted
    while True:
        draws = torch.where(missing > 0, 2 * missing + 2, 0)  # oversampled
        total = int(draws.sum())
        if total == 0:
            break
        group = torch.repeat_interleave(torch.arange(num_groups, device=device), draws,
                                        output_size=total)  # fmt: skip  # ascending
        uniform = _draw(torch.rand, total, generator=generator, device=device,
                        dtype=torch.float64)  # fmt: skip
        n = _at(size, group)
        item = _at(ptr, group) + (uniform * n).long().minimum(n - 1)  # (total,)
        draw = torch.arange(total, device=device)
        earliest = torch.full((num_items,), total, device=device, dtype=torch.long)
        earliest.scatter_reduce_(0, item, draw, "amin")
        fresh = (_at(earliest, item) == draw) & ~_at(chosen, item)
        before = torch.cat([draws.new_zeros(1), fresh.long().cumsum(0)])  # (total + 1,)
        rank = before[:-1] - _at(before, _at(draws.cumsum(0) - draws, group))  # in its group
        take = fresh & (rank < _at(missing, group))
        chosen.index_fill_(0, item.masked_select(take), True)
        missing = missing - _counts(group, num_groups, take)
    item_flip = torch.repeat_interleave(flip, size, output_size=num_items)
    return chosen ^ item_flip


def _floor_fraction(p: float, counts: Tensor) -> Tensor:
    """``⌊p·n⌋`` per graph, computed as Python's ``int(p * n)`` (float64 product)."""
    return torch.floor(counts.double() * p).long()


# --------------------------------------------------------------------------- non-bonds


def _isin_sorted(keys: Tensor, sorted_keys: Tensor) -> Tensor:
    """Membership of ``keys`` in the ascending ``sorted_keys`` (binary search)."""
    if sorted_keys.numel() == 0:
        return torch.zeros_like(keys, dtype=torch.bool)
    pos = torch.searchsorted(sorted_keys, keys).clamp_max(sorted_keys.numel() - 1)
    return _at(sorted_keys, pos) == keys


BITMAP_BUDGET = 64  # bitmap slots allowed per node and bond of the batch (~1 MB for 1024 mols)


class _Bonds:
    """Which node pairs ``lo ≤ hi`` (global indices, same graph) are bonded: a bitmap over
    the n_g² pair slots of every graph when that is small (molecules: ~100× faster than a
    binary search), else a binary search among the sorted bond keys ``lo·N + hi``."""

    def __init__(self, keys: Tensor, group: Tensor, ptr: Tensor) -> None:
        self.keys, self.group, self.ptr, self.counts = keys, group, ptr, ptr.diff()
        squares = self.counts**2
        self.slot_start = squares.cumsum(0) - squares  # (G,)
        slots = int(squares.sum())
        self.bitmap: Tensor | None = None
        if slots <= BITMAP_BUDGET * (group.numel() + keys.numel()):
            lo, hi = keys // group.numel(), keys % group.numel()
            self.bitmap = torch.zeros(slots, dtype=torch.bool, device=keys.device)
            self.bitmap.index_fill_(0, self._slot(lo, hi), True)

    def _slot(self, lo: Tensor, hi: Tensor) -> Tensor:
        graph = _at(self.group, lo)
        start, n = _at(self.ptr, graph), _at(self.counts, graph)
        return _at(self.slot_start, graph) + (lo - start) * n + (hi - start)

    def contains(self, lo: Tensor, hi: Tensor) -> Tensor:
        if self.bitmap is not None:
            return _at(self.bitmap, self._slot(lo, hi))
        return _isin_sorted(lo * self.group.numel() + hi, self.keys)


def _enumerate_non_bonds(bonds: _Bonds, wanted: Tensor, generator: Any) -> Tensor:
    """``wanted[g]`` uniformly chosen unbonded pairs of each graph with ``wanted[g] > 0``, by
    listing all its pairs: used for the graphs where rejection would be slow (few free pairs).

    Shape:
        wanted: ``(G,)``; returns keys ``u·N + v`` (u < v), ``(A,)``.
    """
    ptr, counts, num_nodes, device = bonds.ptr, bonds.counts, bonds.group.numel(), wanted.device
    graphs = _indices(wanted > 0)
    if graphs.numel() == 0:
        return ptr.new_zeros(0)
    squares = _at(counts, graphs) ** 2  # ordered pairs (i, j) of each listed graph
    total = int(squares.sum())
    pair_graph = torch.repeat_interleave(graphs, squares, output_size=total)  # (P,)
    start = torch.repeat_interleave(squares.cumsum(0) - squares, squares, output_size=total)
    local = torch.arange(total, device=device) - start
    n, first = _at(counts, pair_graph), _at(ptr, pair_graph)
    u, v = first + local // n, first + local % n
    free = (u < v) & ~bonds.contains(u, v)
    keys, pair_graph = (u * num_nodes + v).masked_select(free), pair_graph.masked_select(free)
    rank = _random_rank(pair_graph, counts.numel(), generator)
    return keys.masked_select(rank < _at(wanted, pair_graph))


def _sample_non_bonds(bonds: _Bonds, wanted: Tensor, generator: Any) -> Tensor:
    """``wanted[g]`` distinct uniformly chosen unbonded pairs of each graph with
    ``wanted[g] > 0`` by rejection: draw ordered pairs ``u ≠ v`` of the graph, reject bonds
    and pairs chosen in earlier rounds, and keep the first ``wanted[g]`` distinct pairs in draw
    order (sequential rejection sampling: a uniform subset); repeat for the graphs still short.
    Used where at least half of the pairs are free and at most half of those are wanted, so a
    round almost always suffices.

    Shape:
        wanted: ``(G,)``; returns keys ``u·N + v`` (u < v), ``(A,)``.
    """
    ptr, counts, group = bonds.ptr, bonds.counts, bonds.group
    num_nodes, num_graphs, device = group.numel(), wanted.numel(), group.device
    chosen = [ptr.new_zeros(0)]  # keys accepted in each round
    missing = wanted
    while True:
        draws = torch.where(missing > 0, 2 * missing + 2, 0)  # oversampled
        total = int(draws.sum())
        if total == 0:
            return torch.cat(chosen)
        graph = torch.repeat_interleave(torch.arange(num_graphs, device=device), draws,
                                        output_size=total)  # fmt: skip  # ascending
        n, start = _at(counts, graph), _at(ptr, graph)
        uniform = _draw(torch.rand, total, generator=generator, device=device,
                        dtype=torch.float64)  # fmt: skip
        span = n * (n - 1)  # ordered pairs i ≠ j
        pick = (uniform * span).long().minimum(span - 1)
        i, j = pick // (n - 1), pick % (n - 1)
        j = j + (j >= i).long()  # j ≠ i, uniform over the other n − 1 nodes
        lo, hi = start + torch.minimum(i, j), start + torch.maximum(i, j)
        keys = lo * num_nodes + hi
        valid = ~bonds.contains(lo, hi)
        if len(chosen) > 1:
            valid &= ~_isin_sorted(keys, torch.sort(torch.cat(chosen)).values)
        # the first draw of each pair: sort by key, a stable sort keeps draw order among equals
        sorted_keys, order = torch.sort(keys, stable=True)
        first = torch.ones_like(valid)
        first[1:] = sorted_keys[1:] != sorted_keys[:-1]
        valid &= torch.empty_like(first).scatter_(0, order, first)
        # rank of each valid draw among its graph's valid draws, in draw order
        before = torch.cat([draws.new_zeros(1), valid.long().cumsum(0)])  # (total + 1,)
        graph_start = _at(before, _at(draws.cumsum(0) - draws, graph))
        rank = before[:-1] - graph_start
        chosen.append(keys.masked_select(valid & (rank < _at(missing, graph))))
        missing = wanted - _counts(_at(group, torch.cat(chosen) // num_nodes), num_graphs)


# --------------------------------------------------------------------------- subgraph growth


EXPONENTIAL_BITS = 20  # growth times are integers: Exp(1) in units of 2^-20 (exact sums)


def _growth_times(batch: Batch, generator: Any) -> Tensor:
    """When each node joins a subgraph grown from a random seed, one uniformly chosen frontier
    node at a time (a new seed in another component when the frontier is empty).

    Node-weighted first passage: every node v draws X_v ~ Exp(1) and joins at
    t_v = X_v + min over its neighbours u of t_u. Memorylessness makes the order of t the order
    of the one-node-at-a-time process: each next node is uniform over the current frontier.
    Every node is also a potential seed starting at π_v·BIG, with π a uniform random
    permutation and BIG above any path's time, so a component starts at its node of smallest
    π: components follow one another as restarts at uniform unchosen nodes would. Solved by
    min-plus relaxation (as many rounds as the longest shortest path has hops).

    Shape:
        returns ``(num_nodes,)`` long; smaller is earlier.
    """
    edge_index, device, num_nodes = batch.edge_index, batch.batch.device, batch.num_nodes
    where = device if generator is None else generator.device
    uniform = torch.rand(num_nodes, generator=generator, device=where, dtype=torch.float64)
    weight = (-torch.log1p(-uniform) * 2**EXPONENTIAL_BITS).long().clamp_min(1).to(device)
    order = _draw(torch.randperm, num_nodes, generator=generator, device=device)
    big = int(_counts(batch.batch, batch.num_graphs, weight).max()) + 1 if num_nodes else 1
    if num_nodes * big >= 2**62:
        raise ValueError(f"subgraph: graphs too large for int64 growth times ({num_nodes} nodes)")
    times = order * big  # (N,) every node a potential seed
    source, target = edge_index  # followed as stored, as the reference does (molecules list
    target_weight = _at(weight, target)  # both directions of a bond)
    while True:
        reached = _at(times, source) + target_weight  # (2E,)
        relaxed = times.scatter_reduce(0, target, reached, "amin", include_self=True)
        if torch.equal(relaxed, times):
            return times
        times = relaxed


def _one_hop(batch: Batch, target: Tensor, generator: Any) -> Tensor:
    """GraphCL's one-hop subgraph: a uniform seed per graph and ``target − 1`` uniformly chosen
    of its neighbours (all of them if fewer).

    Shape:
        target: ``(G,)``; returns the chosen nodes as a ``(num_nodes,)`` bool mask.
    """
    group, edge_index, num_graphs = batch.batch, batch.edge_index, batch.num_graphs
    order = _draw(torch.randperm, batch.num_nodes, generator=generator, device=group.device)
    first = order.new_full((num_graphs,), batch.num_nodes).scatter_reduce(0, group, order, "amin")
    seed = order == _at(first, group)  # (N,) one node per graph
    neighbour = torch.zeros_like(seed)
    for end, other in ((0, 1), (1, 0)):  # both directions: the seed's neighbours
        neighbour.index_fill_(0, edge_index[other].masked_select(_at(seed, edge_index[end])), True)
    neighbours = _indices(neighbour & ~seed)
    graph = _at(group, neighbours)
    rank = _random_rank(graph, num_graphs, generator)
    chosen = neighbours.masked_select(rank < _at(target, graph) - 1)
    return seed.index_fill_(0, chosen, True)
