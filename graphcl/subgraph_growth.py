"""Subgraphs (GraphCL, You et al. 2020, §3.1) on a collated batch: every graph keeps exactly
``n_g − ⌊p·n_g⌋`` connected nodes, grown from a uniformly random seed.

:func:`subgraph` is re-exported by :mod:`graphcl.augment` (its public home); this module also
holds the growth itself: :class:`_Growth` orders the nodes as a growth from a random seed, one
frontier node at a time, would add them (a first-passage relaxation, all graphs at once), and
:func:`_one_hop` is the GraphCL reference's one-hop variant.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch_geometric.data import Batch

from graphcl.batching import kept_edges, select, select_nodes
from graphcl.collation import batch_layout, node_edge_slices
from graphcl.indexing import (
    group_counts,
    group_ptr,
    host_list,
    read_to_host,
    rows_at,
    to_device,
    true_indices,
)
from graphcl.sampling import check_fraction, draw, floor_fraction, random_rank

__all__ = ["subgraph"]


def subgraph(
    batch: Batch,
    p: float = 0.2,
    *,
    graphcl_compat: bool = False,
    generator: torch.Generator | None = None,
) -> Batch:
    """Subgraph: keep exactly ``n_g − ⌊p·n_g⌋`` connected nodes of every graph g, grown from a
    uniformly random seed node (GraphCL §3.1), with the edges among them.

    ``p`` is the fraction REMOVED, as for the other augmentations: ``p=0.2`` keeps 80 % (JOAO's
    setting). The GraphCL reference's ``aug_ratio`` for subgraph is the fraction KEPT (0.2 keeps
    about 20 %): pass ``p = 1 − aug_ratio`` to match it.

    Growth adds one uniformly chosen frontier node (an unchosen neighbour of the set) at a time,
    as the fixed reference code (GraphCL's bio folder) does, so the subgraph is connected and
    spreads over many hops; all graphs are grown at once (see
    :class:`_Growth`). If the seed's connected component is smaller than
    the target (a salt, an isolated atom), the whole component is taken and growth restarts
    from a uniformly chosen unchosen node, which lies in another component.

    ``graphcl_compat=True`` reproduces the reference's behaviour: its set union is discarded
    (``idx_neigh.union(...)`` without assignment, GraphCL issue #24), so only the seed's
    neighbours are ever added; it keeps ``min(n_g − ⌊p·n_g⌋, 1 + deg(seed))`` nodes.

    Shape:
        batch: ``num_nodes`` nodes in G graphs; returns G graphs with
        ``Σ_g (n_g − ⌊p·n_g⌋)`` nodes (fewer with ``graphcl_compat``).
    """
    check_fraction("subgraph", p, allow_one=False)
    layout = batch_layout(batch)
    counts = batch.ptr.diff()
    target = counts - floor_fraction(p, counts)  # (G,)
    host_ptr, _ = node_edge_slices(batch)
    host_counts = host_ptr.diff()
    host_target = host_counts - floor_fraction(p, host_counts)  # (G,) on the host
    if graphcl_compat:
        chosen = _one_hop(batch, target, generator)
        host_kept = read_to_host(
            group_counts(batch.batch, batch.num_graphs, chosen)
        )  # fewer than target
        edge_counts = kept_edges(batch, chosen)
        assert edge_counts is not None
        return select(batch, layout, chosen, host_kept, edge_counts)
    growth = _Growth(batch, generator, max(host_list(host_counts), default=0))
    growth.relax()

    def first_nodes() -> tuple[Tensor, Tensor | None]:  # each graph's first `target` nodes
        times = growth.times
        order = torch.sort(times, stable=True).indices
        order = rows_at(order, torch.sort(rows_at(batch.batch, order), stable=True).indices)
        start = group_ptr(batch.batch, batch.num_graphs)
        rank_sorted = torch.arange(batch.num_nodes, device=times.device) - rows_at(
            start, batch.batch
        )
        chosen = torch.zeros_like(batch.batch, dtype=torch.bool).scatter_(
            0, order, rank_sorted < rows_at(target, batch.batch)
        )
        return chosen, growth.unsettled

    return select_nodes(batch, layout, first_nodes, growth.settle, host_target)


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
        weight = to_device(weight, device)
        order = draw(torch.randperm, num_nodes, generator=generator, device=device)
        big = max_nodes * MAX_WEIGHT + 1
        if num_nodes * big >= 2**62:  # the host bound is too loose: the largest sum, read
            big = (
                int(group_counts(batch.batch, batch.num_graphs, weight).max()) + 1
                if num_nodes
                else 1
            )
        if num_nodes * big >= 2**62:
            raise ValueError(
                f"subgraph: graphs too large for int64 growth times ({num_nodes} nodes)"
            )
        self.times: Tensor = order * big  # (N,) every node a potential seed
        # edges followed as stored, as the reference does (molecules list both directions)
        self.source, self.target = edge_index
        self.target_weight = rows_at(weight, self.target)  # (2E,)
        self.rounds_left = max(max_nodes - 1, 0)
        self.unsettled: Tensor | None = None

    def relax(self) -> None:
        """Up to ``RELAX_ROUNDS`` more rounds of relaxation (never beyond the bound)."""
        rounds = min(RELAX_ROUNDS, self.rounds_left)
        self.rounds_left -= rounds
        for last in range(rounds - 1, -1, -1):
            reached = rows_at(self.times, self.source) + self.target_weight  # (2E,)
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
    order = draw(torch.randperm, num_nodes, generator=generator, device=group.device)
    first = order.new_full((num_graphs,), num_nodes).scatter_reduce(0, group, order, "amin")
    seed = order == rows_at(first, group)  # (N,) one node per graph
    hits = torch.zeros_like(order)
    for end, other in ((0, 1), (1, 0)):  # both directions: the seed's neighbours
        hits.index_add_(0, edge_index[other], rows_at(seed, edge_index[end]).long())
    is_neighbour = (hits > 0) & ~seed
    neighbours = true_indices(is_neighbour, int(is_neighbour.sum()))  # the device read
    graph = rows_at(group, neighbours)
    rank = random_rank(graph, num_graphs, generator)
    chosen = torch.zeros_like(seed).index_put_((neighbours,), rank < rows_at(target, graph) - 1)
    return seed | chosen
