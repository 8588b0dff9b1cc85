"""The per-graph random choices behind :mod:`graphcl.augment`, made for all the graphs of a
batch at once (never in a Python loop over graphs).

Randomness: :func:`_draw` samples from a generator on the generator's own device, so a seed gives
the same augmentation on every device. Choices: :class:`_Choice` takes exactly ``k`` items per
group by vectorised sequential rejection sampling, :func:`_random_rank` ranks the items of every
group uniformly at random, and :func:`_floor_fraction` is the ``⌊p·n⌋`` of every augmentation.
Non-bonds (edge perturbation): :class:`_Bonds` looks up which node pairs are bonded, and
:func:`_enumerate_non_bonds` and :func:`_sample_non_bonds` choose new bonds among the free pairs.
Subgraphs: :class:`_Growth` orders the nodes as a growth from a random seed, one frontier
node at a time, would add them; :func:`_one_hop` is the GraphCL reference's one-hop variant.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch_geometric.data import Batch

from graphcl.batching import _at, _counts, _indices, _ptr, _to_device, _total

# --------------------------------------------------------------------------- randomness


def _draw(
    sample: Callable[..., Tensor], *size: Any, generator: torch.Generator | None,
    device: torch.device, **kwargs: Any,
) -> Tensor:  # fmt: skip
    """``sample(*size)`` (torch.rand, randn, randint) from ``generator`` on its own device, moved
    to ``device``: the same seed gives the same augmentation on every device. Without a
    generator, the global RNG of ``device``."""
    where = device if generator is None else generator.device
    return _to_device(sample(*size, generator=generator, device=where, **kwargs), device)


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


class _Choice:
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
        self, ptr: Tensor, k: Tensor, generator: torch.Generator | None, host_ptr: Tensor,
        host_k: Tensor,
    ) -> None:  # fmt: skip
        self.device, self.num_groups, self.generator = ptr.device, k.numel(), generator
        self.num_items = _total(host_ptr.diff())
        self.ptr, self.size = ptr, ptr.diff()
        self.flip = 2 * k > self.size
        self.missing = torch.where(self.flip, self.size - k, k)  # ≤ size / 2
        self.chosen = torch.zeros(self.num_items, dtype=torch.bool, device=self.device)
        host_size = host_ptr.diff()
        host_wanted = torch.where(2 * host_k > host_size, host_size - host_k, host_k)
        total = _total(torch.where(host_wanted > 0, 2 * host_wanted + 2, 0))
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
        group = torch.repeat_interleave(torch.arange(num_groups, device=device), draws,
                                        output_size=total)  # fmt: skip  # ascending
        uniform = _draw(torch.rand, total, generator=self.generator, device=device,
                        dtype=torch.float64)  # fmt: skip
        n = _at(self.size, group)
        item = _at(self.ptr, group) + (uniform * n).long().minimum(n - 1)  # (total,)
        draw = torch.arange(total, device=device)
        earliest = torch.full((self.num_items,), total, device=device, dtype=torch.long)
        earliest.scatter_reduce_(0, item, draw, "amin")
        fresh = (_at(earliest, item) == draw) & ~_at(self.chosen, item)
        before = torch.cat([draws.new_zeros(1), fresh.long().cumsum(0)])  # (total + 1,)
        rank = before[:-1] - _at(before, _at(draws.cumsum(0) - draws, group))  # in its group
        take = fresh & (rank < _at(self.missing, group))
        self.chosen |= _counts(item, self.num_items, take) > 0  # the taken items are distinct
        self.missing = self.missing - _counts(group, num_groups, take)


def _choose(
    ptr: Tensor, k: Tensor, generator: torch.Generator | None, host_ptr: Tensor, host_k: Tensor
) -> Tensor:
    """The ``(ptr[-1],)`` bool mask of a :class:`_Choice`, finished (its check reads the
    device once when one round sufficed)."""
    return _Choice(ptr, k, generator, host_ptr, host_k).mask()


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
    binary search), else a binary search among the sorted bond keys ``lo·N + hi``.
    ``host_counts`` (CPU) are the graphs' node counts, ``ptr.diff()`` on the host."""

    def __init__(self, keys: Tensor, group: Tensor, ptr: Tensor, host_counts: Tensor) -> None:
        self.keys, self.group, self.ptr, self.counts = keys, group, ptr, ptr.diff()
        self.host_counts = host_counts
        squares = self.counts**2
        self.slot_start = squares.cumsum(0) - squares  # (G,)
        slots = _total(host_counts**2)
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


def _enumerate_non_bonds(
    bonds: _Bonds, wanted: Tensor, host_wanted: Tensor, host_free: Tensor, generator: Any
) -> Tensor:
    """``wanted[g]`` uniformly chosen unbonded pairs of each graph with ``wanted[g] > 0``, by
    listing all its pairs: used for the graphs where rejection would be slow (few free pairs).
    ``host_wanted`` and ``host_free`` (CPU: the wanted and the free pairs per graph) give every
    size on the host, so nothing is read from the device.

    Shape:
        wanted, host_wanted, host_free: ``(G,)``; returns keys ``u·N + v`` (u < v), ``(A,)``.
    """
    ptr, counts, num_nodes, device = bonds.ptr, bonds.counts, bonds.group.numel(), wanted.device
    listed = host_wanted > 0
    graphs = _to_device(_indices(listed, _total(listed.long())), device)  # built on the host
    if graphs.numel() == 0:
        return ptr.new_zeros(0)
    squares = _at(counts, graphs) ** 2  # ordered pairs (i, j) of each listed graph
    total = _total(torch.where(listed, bonds.host_counts, 0) ** 2)
    pair_graph = torch.repeat_interleave(graphs, squares, output_size=total)  # (P,)
    start = torch.repeat_interleave(squares.cumsum(0) - squares, squares, output_size=total)
    local = torch.arange(total, device=device) - start
    n, first = _at(counts, pair_graph), _at(ptr, pair_graph)
    u, v = first + local // n, first + local % n
    free = _indices((u < v) & ~bonds.contains(u, v), _total(torch.where(listed, host_free, 0)))
    keys, pair_graph = _at(u * num_nodes + v, free), _at(pair_graph, free)
    rank = _random_rank(pair_graph, counts.numel(), generator)
    return _at(keys, _indices(rank < _at(wanted, pair_graph), _total(host_wanted)))


def _sample_non_bonds(bonds: _Bonds, wanted: Tensor, host_wanted: Tensor, generator: Any) -> Tensor:
    """``wanted[g]`` distinct uniformly chosen unbonded pairs of each graph with
    ``wanted[g] > 0`` by rejection: draw ordered pairs ``u ≠ v`` of the graph, reject bonds
    and pairs chosen in earlier rounds, and keep the first ``wanted[g]`` distinct pairs in draw
    order (sequential rejection sampling: a uniform subset); repeat for the graphs still short.
    Used where at least half of the pairs are free and at most half of those are wanted, so a
    round almost always suffices. The first round's size comes from ``host_wanted`` (CPU);
    each further round reads its size from the device (the first such read finds none).

    Shape:
        wanted, host_wanted: ``(G,)``; returns keys ``u·N + v`` (u < v), ``(A,)`` ascending.
    """
    ptr, counts, group = bonds.ptr, bonds.counts, bonds.group
    num_nodes, num_graphs, device = group.numel(), wanted.numel(), group.device
    unused = num_nodes * num_nodes  # above every key: marks the draws not taken
    chosen = [ptr.new_zeros(0)]  # every round's draws: the key if taken, else `unused`
    missing = wanted
    total = _total(torch.where(host_wanted > 0, 2 * host_wanted + 2, 0))
    while total:
        draws = torch.where(missing > 0, 2 * missing + 2, 0)  # oversampled
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
        take = valid & (rank < _at(missing, graph))
        chosen.append(torch.where(take, keys, unused))
        missing = missing - _counts(graph, num_graphs, take)
        total = int(torch.where(missing > 0, 2 * missing + 2, 0).sum())  # a further round?
    return torch.sort(torch.cat(chosen)).values[: _total(host_wanted)]


# --------------------------------------------------------------------------- subgraph growth


EXPONENTIAL_BITS = 20  # growth times are integers: Exp(1) in units of 2^-20 (exact sums)
# the largest weight: -log1p(-u)·2^20 for the largest float64 u below 1 is 53·ln 2·2^20 < 37·2^20
MAX_WEIGHT = 37 * 2**EXPONENTIAL_BITS
# relaxation rounds between convergence checks: the bundled molecules need 17 to 78 rounds
# (median 28) in batches of 256, fewer in the halves that random_choice grows
RELAX_ROUNDS = 32


class _Growth:
    """When each node joins a subgraph grown from a random seed, one uniformly chosen frontier
    node at a time (a new seed in another component when the frontier is empty).

    Node-weighted first passage: every node v draws X_v ~ Exp(1) and joins at
    t_v = X_v + min over its neighbours u of t_u. Memorylessness makes the order of t the order
    of the one-node-at-a-time process: each next node is uniform over the current frontier.
    Every node is also a potential seed starting at π_v·BIG, with π a uniform random
    permutation and BIG above any path's time, so a component starts at its node of smallest
    π: components follow one another as restarts at uniform unchosen nodes would (the order
    within a graph does not depend on BIG beyond that, so BIG is a bound known on the host:
    the largest graph's nodes times the largest weight). Solved by min-plus relaxation: after
    r rounds every time along a path of at most r hops is exact, and a shortest path of a graph
    of n_g nodes has at most n_g − 1 hops, so ``max_nodes − 1`` rounds always suffice. Rounds
    run ``RELAX_ROUNDS`` at a time; :attr:`unsettled` tells on the device whether the last
    round still changed a time (``None``: the bound was reached, the times are final), so the
    check is read with the caller's one device read, and :meth:`settle` reads it per chunk.

    Shape:
        ``times``: ``(num_nodes,)`` long; smaller is earlier.
    """

    def __init__(self, batch: Batch, generator: Any, max_nodes: int) -> None:
        edge_index, device, num_nodes = batch.edge_index, batch.batch.device, batch.num_nodes
        where = device if generator is None else generator.device
        uniform = torch.rand(num_nodes, generator=generator, device=where, dtype=torch.float64)
        weight = (-torch.log1p(-uniform) * 2**EXPONENTIAL_BITS).long().clamp_min(1)
        weight = _to_device(weight, device)
        order = _draw(torch.randperm, num_nodes, generator=generator, device=device)
        big = max_nodes * MAX_WEIGHT + 1
        if num_nodes * big >= 2**62:  # the host bound is too loose: the largest sum, read
            big = int(_counts(batch.batch, batch.num_graphs, weight).max()) + 1 if num_nodes else 1
        if num_nodes * big >= 2**62:
            raise ValueError(
                f"subgraph: graphs too large for int64 growth times ({num_nodes} nodes)"
            )
        self.times: Tensor = order * big  # (N,) every node a potential seed
        # edges followed as stored, as the reference does (molecules list both directions)
        self.source, self.target = edge_index
        self.target_weight = _at(weight, self.target)  # (2E,)
        self.rounds_left = max(max_nodes - 1, 0)
        self.unsettled: Tensor | None = None

    def relax(self) -> None:
        """Up to ``RELAX_ROUNDS`` more rounds of relaxation (never beyond the bound)."""
        rounds = min(RELAX_ROUNDS, self.rounds_left)
        self.rounds_left -= rounds
        for last in range(rounds - 1, -1, -1):
            reached = _at(self.times, self.source) + self.target_weight  # (2E,)
            relaxed = self.times.scatter_reduce(0, self.target, reached, "amin", include_self=True)
            if last == 0 and self.rounds_left:
                self.unsettled = (relaxed != self.times).any()
            self.times = relaxed
        if not self.rounds_left:
            self.unsettled = None

    def settle(self) -> Tensor:
        """The final times: further rounds until a round changes nothing (a read per chunk)."""
        while self.unsettled is not None and bool(self.unsettled):
            self.relax()
        return self.times


def _one_hop(batch: Batch, target: Tensor, generator: Any) -> Tensor:
    """GraphCL's one-hop subgraph: a uniform seed per graph and ``target − 1`` uniformly chosen
    of its neighbours (all of them if fewer). The number of neighbours is read from the device
    (the random ranking draws one score per neighbour).

    Shape:
        target: ``(G,)``; returns the chosen nodes as a ``(num_nodes,)`` bool mask.
    """
    group, edge_index, num_graphs = batch.batch, batch.edge_index, batch.num_graphs
    num_nodes = batch.num_nodes
    order = _draw(torch.randperm, num_nodes, generator=generator, device=group.device)
    first = order.new_full((num_graphs,), num_nodes).scatter_reduce(0, group, order, "amin")
    seed = order == _at(first, group)  # (N,) one node per graph
    hits = torch.zeros_like(order)
    for end, other in ((0, 1), (1, 0)):  # both directions: the seed's neighbours
        hits.index_add_(0, edge_index[other], _at(seed, edge_index[end]).long())
    is_neighbour = (hits > 0) & ~seed
    neighbours = _indices(is_neighbour, int(is_neighbour.sum()))  # the device read
    graph = _at(group, neighbours)
    rank = _random_rank(graph, num_graphs, generator)
    chosen = torch.zeros_like(seed).index_put_((neighbours,), rank < _at(target, graph) - 1)
    return seed | chosen
