"""Edge perturbation (GraphCL, You et al. 2020, §3.1) on a collated batch: every graph loses
exactly ``⌊p·m_g⌋`` uniformly chosen bonds and gains as many new ones among its unbonded pairs.

:func:`perturb_edges` is re-exported by :mod:`graphcl.augment` (its public home); this module
also holds the choice of the new bonds. Which pairs are bonded is looked up by :class:`_Bonds`
(a bitmap over every graph's pair slots when that is small, else a binary search), and the new
bonds are chosen per graph either by listing its free pairs (:func:`_enumerate_non_bonds`,
for graphs with few free pairs or most of them wanted) or by rejection
(:func:`_sample_non_bonds`), all graphs at once.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor
from torch_geometric.data import Batch

from graphcl.batching import assemble, merge_sorted, read_counts
from graphcl.collation import batch_layout, node_edge_slices
from graphcl.indexing import (
    edge_columns,
    group_counts,
    group_ptr,
    host_offsets,
    host_total,
    read_to_host,
    rows_at,
    to_device,
    true_indices,
)
from graphcl.sampling import Choice, check_fraction, draw, floor_fraction, random_rank

__all__ = ["perturb_edges"]


def perturb_edges(
    batch: Batch,
    p: float = 0.2,
    *,
    edge_attr_sampler: Literal["empirical", "zeros"] = "empirical",
    generator: torch.Generator | None = None,
) -> Batch:
    """Edge perturbation: remove exactly ``⌊p·m_g⌋`` uniformly chosen bonds of every graph g
    (m_g undirected bonds) and add as many new bonds between unbonded distinct nodes of the same
    graph (GraphCL §3.1; aug ratio 0.2).

    Bonds are undirected: the directed edges ``u→v`` and ``v→u`` form one bond, removed or added
    together; added bonds appear in both directions with the same attributes. New bonds are
    drawn uniformly among the pairs not bonded in the input (never a self-loop, a duplicate or
    a pair across graphs); a graph with fewer free pairs than ``⌊p·m_g⌋`` (a nearly complete
    graph) gets all of them. ``edge_attr`` and every other edge-level attribute stay aligned
    with ``edge_index``: kept edges keep theirs, and added bonds get, with
    ``edge_attr_sampler="empirical"``, the attributes of one directed edge drawn uniformly from
    the whole input batch, or zeros with ``"zeros"``. (The reference code instead misaligns
    about half of the kept bonds' attributes and may add self-loops and duplicates.) Each
    graph's edges are its kept edges in their order, then its added bonds.

    Shape:
        batch.edge_index: ``(2, num_edges)``; the output has the same nodes and
        ``num_edges − 2·Σ_g ⌊p·m_g⌋ + 2·(bonds added)`` edges.
    """
    check_fraction("perturb_edges", p, allow_one=True)
    if edge_attr_sampler not in ("empirical", "zeros"):
        raise ValueError(
            f"edge_attr_sampler must be 'empirical' or 'zeros', got {edge_attr_sampler!r}"
        )
    layout = batch_layout(batch)
    edge_index, batch_vector, ptr = batch.edge_index, batch.batch, batch.ptr
    device, num_nodes, num_graphs = edge_index.device, batch.num_nodes, batch.num_graphs
    counts = ptr.diff()  # (G,)

    # bonds: the distinct unordered pairs {u, v}, grouped by graph in ascending key order
    lo, hi = torch.minimum(edge_index[0], edge_index[1]), torch.maximum(*edge_index)
    keys, order = torch.sort(lo * num_nodes + hi, stable=True)  # (E,)
    first = torch.ones_like(keys, dtype=torch.bool)
    first[1:] = keys[1:] != keys[:-1]
    bond_of_edge = torch.empty_like(order).scatter_(0, order, first.long().cumsum(0) - 1)
    key_graph = rows_at(batch_vector, keys // num_nodes)  # (E,)
    per_graph = torch.stack(
        [  # (2, G): m_g, and the bonds that are no self-loop
            group_counts(key_graph, num_graphs, first),
            group_counts(key_graph, num_graphs, first & (keys // num_nodes != keys % num_nodes)),
        ]
    )
    bonds, proper = per_graph
    host_bonds, host_proper = read_to_host(per_graph)  # device read 1: the bonds of every graph
    host_ptr, _ = node_edge_slices(batch)
    perturbed, wanted, listed = _perturbation(p, counts, bonds, proper)  # (G,) each
    host_perturbed, host_wanted, host_listed = _perturbation(
        p, host_ptr.diff(), host_bonds, host_proper
    )
    bond_keys = rows_at(keys, true_indices(first, host_total(host_bonds)))  # (M,) ascending
    bond_graph = rows_at(batch_vector, bond_keys // num_nodes)
    choice = Choice(
        group_ptr(bond_graph, num_graphs),
        perturbed,
        generator,
        host_offsets(host_bonds),
        host_perturbed,
    )

    def kept_edges() -> tuple[Tensor, Tensor | None]:
        kept = ~rows_at(choice.mask(finish=False), bond_of_edge)
        return kept, choice.unfinished

    # device read 2: the edges each graph keeps (with the choice's check)
    edge_graph = rows_at(batch_vector, edge_index[0])  # (E,)
    kept_mask, unfinished = kept_edges()
    host_kept = read_counts(edge_graph, num_graphs, kept_mask, unfinished)
    if host_kept is None:
        choice.mask()
        kept_mask, _ = kept_edges()
        host_kept = read_counts(edge_graph, num_graphs, kept_mask)
        assert host_kept is not None
    kept = true_indices(kept_mask, host_total(host_kept))  # (E_kept,) grouped by graph

    # additions among the free pairs; each graph by enumeration or rejection (see docstrings)
    bonded = _Bonds(bond_keys, batch_vector, ptr, host_ptr.diff())
    host_free = _pairs(host_ptr.diff()) - host_proper
    new_keys = (
        torch.cat(
            [
                _enumerate_non_bonds(
                    bonded,
                    torch.where(listed, wanted, 0),
                    torch.where(host_listed, host_wanted, 0),
                    host_free,
                    generator,
                ),
                _sample_non_bonds(
                    bonded,
                    torch.where(listed, 0, wanted),
                    torch.where(host_listed, 0, host_wanted),
                    generator,
                ),  # read 3
            ]
        )
        .sort()
        .values
    )  # (A,) grouped by graph
    u, v = new_keys // num_nodes, new_keys % num_nodes
    added = torch.stack([torch.stack([u, v], 1).view(-1), torch.stack([v, u], 1).view(-1)])
    num_added = new_keys.numel()  # = Σ_g wanted_g, known on the host

    # each graph's kept edges, then its added bonds (both directions): a merge by graph
    kept_edges_index = edge_columns(edge_index, kept)  # (2, E_kept)
    at_kept, at_added = merge_sorted(
        rows_at(batch_vector, kept_edges_index[0]), rows_at(batch_vector, added[0]), num_graphs
    )
    size = kept.numel() + added.size(1)
    out_edges = edge_index.new_empty(2, size)
    for row in (0, 1):
        out_edges[row].index_copy_(0, at_kept, kept_edges_index[row])
        out_edges[row].index_copy_(0, at_added, added[row])
    if edge_attr_sampler == "empirical" and num_added:
        source = draw(
            torch.randint, edge_index.size(1), (num_added,), generator=generator, device=device
        ).repeat_interleave(2, output_size=2 * num_added)
    values = {}
    for key, dim in layout.edge.items():
        value = batch[key]
        shape = list(value.shape)
        shape[dim] = size
        out = value.new_zeros(shape).index_copy_(dim, at_kept, value.index_select(dim, kept))
        if edge_attr_sampler == "empirical" and num_added:
            out.index_copy_(dim, at_added, value.index_select(dim, source))
        values[key] = out
    edge_slices = host_offsets(host_kept + 2 * host_wanted)  # the graphs' new edge counts
    return assemble(batch, layout, values, edge_index=out_edges, edge_slices=edge_slices)


def _pairs(counts: Tensor) -> Tensor:
    """Unordered pairs of distinct nodes per graph, ``n_g (n_g − 1) / 2``."""
    return counts * (counts - 1) // 2


def _perturbation(
    p: float, counts: Tensor, bonds: Tensor, proper: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Per graph: the bonds removed ``⌊p·m_g⌋``, the bonds wanted among the free pairs, and
    whether they are chosen by listing the pairs (few free pairs, or most of them wanted);
    the same on the host and on the device.

    Shape:
        counts (n_g), bonds (m_g), proper (bonds that are no self-loop): ``(G,)``.
    """
    pairs = _pairs(counts)
    free = pairs - proper
    perturbed = floor_fraction(p, bonds)
    wanted = torch.minimum(perturbed, free)
    listed = (wanted > 0) & ((2 * free < pairs) | (free < 2 * wanted))
    return perturbed, wanted, listed


# --------------------------------------------------------------------------- non-bonds


def _isin_sorted(keys: Tensor, sorted_keys: Tensor) -> Tensor:
    """Membership of ``keys`` in the ascending ``sorted_keys`` (binary search)."""
    if sorted_keys.numel() == 0:
        return torch.zeros_like(keys, dtype=torch.bool)
    pos = torch.searchsorted(sorted_keys, keys).clamp_max(sorted_keys.numel() - 1)
    return rows_at(sorted_keys, pos) == keys


BITMAP_BUDGET = 64  # bitmap slots allowed per node and bond of the batch (~1 MB for 1024 mols)


class _Bonds:
    """Which node pairs ``lo ≤ hi`` (global indices, same graph) are bonded: a bitmap over
    the n_g² pair slots of every graph when that is small (one gather per lookup instead of
    a binary search), else a binary search among the sorted bond keys ``lo·N + hi``.
    ``host_counts`` (CPU) are the graphs' node counts, ``ptr.diff()`` on the host."""

    def __init__(self, keys: Tensor, group: Tensor, ptr: Tensor, host_counts: Tensor) -> None:
        self.keys, self.group, self.ptr, self.counts = keys, group, ptr, ptr.diff()
        self.host_counts = host_counts
        squares = self.counts**2
        self.slot_start = squares.cumsum(0) - squares  # (G,)
        slots = host_total(host_counts**2)
        self.bitmap: Tensor | None = None
        if slots <= BITMAP_BUDGET * (group.numel() + keys.numel()):
            lo, hi = keys // group.numel(), keys % group.numel()
            self.bitmap = torch.zeros(slots, dtype=torch.bool, device=keys.device)
            self.bitmap.index_fill_(0, self._slot(lo, hi), True)

    def _slot(self, lo: Tensor, hi: Tensor) -> Tensor:
        graph = rows_at(self.group, lo)
        start, n = rows_at(self.ptr, graph), rows_at(self.counts, graph)
        return rows_at(self.slot_start, graph) + (lo - start) * n + (hi - start)

    def contains(self, lo: Tensor, hi: Tensor) -> Tensor:
        if self.bitmap is not None:
            return rows_at(self.bitmap, self._slot(lo, hi))
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
    graphs = to_device(true_indices(listed, host_total(listed.long())), device)  # built on the host
    if graphs.numel() == 0:
        return ptr.new_zeros(0)
    squares = rows_at(counts, graphs) ** 2  # ordered pairs (i, j) of each listed graph
    total = host_total(torch.where(listed, bonds.host_counts, 0) ** 2)
    pair_graph = torch.repeat_interleave(graphs, squares, output_size=total)  # (P,)
    start = torch.repeat_interleave(squares.cumsum(0) - squares, squares, output_size=total)
    local = torch.arange(total, device=device) - start
    n, first = rows_at(counts, pair_graph), rows_at(ptr, pair_graph)
    u, v = first + local // n, first + local % n
    free = true_indices(
        (u < v) & ~bonds.contains(u, v), host_total(torch.where(listed, host_free, 0))
    )
    keys, pair_graph = rows_at(u * num_nodes + v, free), rows_at(pair_graph, free)
    rank = random_rank(pair_graph, counts.numel(), generator)
    return rows_at(keys, true_indices(rank < rows_at(wanted, pair_graph), host_total(host_wanted)))


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
    total = host_total(torch.where(host_wanted > 0, 2 * host_wanted + 2, 0))
    while total:
        draws = torch.where(missing > 0, 2 * missing + 2, 0)  # oversampled
        graph = torch.repeat_interleave(
            torch.arange(num_graphs, device=device), draws, output_size=total
        )  # ascending
        n, start = rows_at(counts, graph), rows_at(ptr, graph)
        uniform = draw(torch.rand, total, generator=generator, device=device, dtype=torch.float64)
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
        graph_start = rows_at(before, rows_at(draws.cumsum(0) - draws, graph))
        rank = before[:-1] - graph_start
        take = valid & (rank < rows_at(missing, graph))
        chosen.append(torch.where(take, keys, unused))
        missing = missing - group_counts(graph, num_graphs, take)
        total = int(torch.where(missing > 0, 2 * missing + 2, 0).sum())  # a further round?
    return torch.sort(torch.cat(chosen)).values[: host_total(host_wanted)]
