"""GraphCL's graph augmentations (You et al. 2020) on a collated batch, with exact per-graph
semantics (DESIGN.md decision 7).

Every augmentation takes a collated PyG ``Batch`` (``Batch.from_data_list`` or a DataLoader) on
any device and returns a NEW ``Batch`` with the same graphs in the same order; the input is
never modified (attributes an augmentation leaves as they are are shared with it, as PyG's
transforms do). ``p`` is always the fraction of each graph that is removed or changed: graph g
with ``n_g`` nodes and ``m_g`` undirected bonds loses (or has masked) exactly ``⌊p·n_g⌋`` nodes,
or has exactly ``⌊p·m_g⌋`` bonds perturbed (``⌊·⌋`` of the float64 product, as Python's
``int(p * n)`` in the reference code). All graphs are augmented at once, never in a Python loop
over graphs: exact-size uniform choices per graph come from vectorised sequential rejection
sampling (:func:`_choose`), growth from a first-passage relaxation (:func:`_growth_times`).

Node-level attributes (``x``, ``pos``, ...), edge-level attributes (``edge_attr``, ...) and
graph-level ones (``y``, ``smiles``, ...) are told apart by their collation slices; dropped
nodes disappear from all node-level attributes, ``batch``, ``ptr`` and ``num_nodes``, and the
result still splits with ``get_example``/``to_data_list``.

Randomness comes from ``generator`` when given, drawn on the generator's device and moved to the
batch's (so a seed gives the same augmentation on the CPU and on a GPU, and the global RNG is
untouched), else from torch's global RNG of the batch's device. Output sizes depend on the draw,
so each call synchronises with the device a few times (a handful, plus one per relaxation round
in ``subgraph``), never once per graph.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple

import torch
from torch import Tensor
from torch_geometric.data import Batch
from torch_geometric.transforms import BaseTransform

__all__ = [
    "AUGMENTATIONS",
    "DropNodes",
    "MaskAttributes",
    "PerturbEdges",
    "Subgraph",
    "drop_nodes",
    "identity",
    "mask_attributes",
    "perturb_edges",
    "random_choice",
    "subgraph",
]

# GraphCL TU code replaces masked continuous features with N(0.5, 0.5²) samples
NOISE_MEAN, NOISE_STD = 0.5, 0.5


# --------------------------------------------------------------------------- batch plumbing


class _Layout(NamedTuple):
    """Which attributes of a batch are node-, edge- or graph-level, with their cat dims."""

    node: dict[str, int]
    edge: dict[str, int]
    graph: dict[str, int | None]  # None: not a tensor (e.g. a list of SMILES)


def _layout(batch: Batch) -> _Layout:
    """Classify the attributes of a collated batch by their collation slices."""
    if not isinstance(batch, Batch) or not hasattr(batch, "_slice_dict"):
        raise ValueError(
            "expected a collated torch_geometric Batch (Batch.from_data_list or a DataLoader), "
            f"got {type(batch).__name__}"
        )
    if batch.edge_index is None:
        raise ValueError("the batch has no edge_index")
    slices, incs = batch._slice_dict, batch._inc_dict
    # node slices from CPU metadata (edge_index is incremented by the nodes of earlier graphs)
    node_slices = torch.cat([incs["edge_index"].view(-1), torch.tensor([batch.num_nodes])])
    edge_slices = slices["edge_index"]
    node: dict[str, int] = {}
    edge: dict[str, int] = {}
    graph: dict[str, int | None] = {}
    for key in batch.keys():
        if key in ("batch", "ptr", "edge_index", "num_nodes"):
            continue
        if key not in slices:
            raise ValueError(f"attribute {key!r} was not made by collation; remove it first")
        value = batch[key]
        if not isinstance(value, Tensor):
            graph[key] = None
            continue
        inc = incs.get(key)
        if inc is not None and bool((inc != 0).any()):
            raise ValueError(f"attribute {key!r} is incremented on collation (an index); only "
                             "edge_index is supported")  # fmt: skip
        dim = batch.__cat_dim__(key, value)
        is_node = torch.equal(slices[key], node_slices)
        is_edge = torch.equal(slices[key], edge_slices)
        if is_node and is_edge:  # n_g == 2 m_g for every graph: PyG's naming rule decides
            is_node = "edge" not in key
        if is_node:
            node[key] = dim
        elif is_edge:
            edge[key] = dim
        else:
            graph[key] = dim
    return _Layout(node, edge, graph)


def _counts(group: Tensor, size: int, weight: Tensor | None = None) -> Tensor:
    """Occurrences of each of ``size`` groups (no host sync, unlike ``bincount`` on CUDA)."""
    ones = torch.ones_like(group) if weight is None else weight.long()
    return group.new_zeros(size).index_add_(0, group, ones)


def _at(values: Tensor, index: Tensor) -> Tensor:
    """``values[index]`` along dim 0 (index_select: several times faster than advanced
    indexing on the CPU)."""
    return values.index_select(0, index)


def _indices(mask: Tensor) -> Tensor:
    """``mask.nonzero()`` of a 1-D mask, as a 1-D tensor (masked_select: faster on the CPU)."""
    return torch.arange(mask.numel(), device=mask.device).masked_select(mask)


def _columns(edge_index: Tensor, index: Tensor) -> Tensor:
    """``edge_index[:, index]`` (two 1-D index_selects: faster than selecting along dim 1)."""
    return torch.stack([_at(edge_index[0], index), _at(edge_index[1], index)])


def _ptr(sorted_group: Tensor, num_groups: int) -> Tensor:
    """Offsets ``(num_groups + 1,)`` of the groups in an ascending group vector."""
    groups = torch.arange(num_groups + 1, device=sorted_group.device)
    return torch.searchsorted(sorted_group, groups)


def _zero_inc(inc: Tensor | None, num_graphs: int) -> Tensor | None:
    return None if inc is None else inc.new_zeros((num_graphs, *inc.shape[1:]))


def _assemble(
    batch: Batch,
    layout: _Layout,
    values: dict[str, Any],
    edge_index: Tensor | None = None,
    batch_vector: Tensor | None = None,
    graph_slices: dict[str, Tensor] | None = None,
) -> Batch:
    """A new batch like ``batch`` with ``values`` (and ``edge_index``, ``batch_vector`` when
    given: the edges or the nodes changed) replaced, ``ptr``, ``num_nodes`` and the collation
    slices recomputed accordingly (``graph_slices``: the graphs were selected or reordered).
    Attributes not replaced are shared with ``batch``, as PyG's transforms do."""
    num_graphs = batch.num_graphs if graph_slices is None else graph_slices["__graphs__"].numel()
    out = copy.copy(batch)
    for key, value in values.items():
        out[key] = value
    slices, incs = dict(batch._slice_dict), dict(batch._inc_dict)
    if batch_vector is not None:
        assert edge_index is not None
        edge_graph = _at(batch_vector, edge_index[0])  # ascending: edges are grouped by graph
        ptrs = torch.stack([_ptr(batch_vector, num_graphs), _ptr(edge_graph, num_graphs)])
        out.batch, out.ptr = batch_vector, ptrs[0].clone()  # ptrs: (2, G + 1)
        node_slices, edge_slices = ptrs.cpu()  # the one host sync of the assembly
        if "num_nodes" in batch._store:
            out.num_nodes = int(node_slices[-1])
            out._store._num_nodes = node_slices.diff().tolist()
        incs["edge_index"] = node_slices[:-1]
        slices.update(dict.fromkeys(layout.node, node_slices))
    elif edge_index is not None:  # the same nodes, other edges
        edge_slices = _ptr(_at(batch.batch, edge_index[0]), num_graphs).cpu()
    if edge_index is not None:
        out.edge_index = edge_index
        slices.update(dict.fromkeys([*layout.edge, "edge_index"], edge_slices))
    if graph_slices is not None:
        slices.update({key: graph_slices[key] for key in layout.graph})
        for key, inc in incs.items():
            if key != "edge_index":
                incs[key] = _zero_inc(inc, num_graphs)
    out._slice_dict, out._inc_dict, out._num_graphs = slices, incs, num_graphs
    return out


def _graph_rows(slices: Tensor, graphs: Tensor) -> tuple[Tensor, Tensor]:
    """Rows of a graph-level attribute holding ``graphs`` (CPU), and their new slices."""
    sizes = slices.diff()[graphs]  # (G',)
    new_slices = torch.cat([sizes.new_zeros(1), sizes.cumsum(0)])
    starts = torch.repeat_interleave(slices[graphs] - new_slices[:-1], sizes)
    return starts + torch.arange(int(new_slices[-1])), new_slices


def _take(value: Any, dim: int | None, rows: Tensor) -> Any:
    if dim is None:
        return [value[i] for i in rows.tolist()]  # graph metadata (SMILES): a list, reordered
    return value.index_select(dim, rows.to(value.device))


def _select(
    batch: Batch, layout: _Layout, node_mask: Tensor, graphs: Tensor | None = None
) -> Batch:
    """Keep the nodes of ``node_mask`` and the edges between them; with ``graphs`` (CPU
    indices), keep only those graphs, ``node_mask`` then being exactly their nodes."""
    node_index = _indices(node_mask)  # (N',)
    new_id = node_mask.long().cumsum(0) - 1  # old node -> new node
    edge_index = batch.edge_index
    ends_kept = _at(node_mask, edge_index.reshape(-1)).view(2, -1)  # (2, E)
    edge_index_kept = _indices(ends_kept[0] & ends_kept[1])
    values: dict[str, Any] = {}
    for key, dim in layout.node.items():
        values[key] = batch[key].index_select(dim, node_index)
    for key, dim in layout.edge.items():
        values[key] = batch[key].index_select(dim, edge_index_kept)
    batch_vector = _at(batch.batch, node_index)
    graph_slices = None
    if graphs is not None:
        renumber = torch.full((batch.num_graphs,), -1, dtype=torch.long)
        renumber[graphs] = torch.arange(graphs.numel())
        batch_vector = _at(renumber.to(batch_vector.device), batch_vector)
        graph_slices = {"__graphs__": graphs}
        for key, graph_dim in layout.graph.items():
            rows, graph_slices[key] = _graph_rows(batch._slice_dict[key], graphs)
            values[key] = _take(batch[key], graph_dim, rows)
    out_edges = _at(new_id, _columns(edge_index, edge_index_kept).view(-1)).view(2, -1)
    return _assemble(batch, layout, values, out_edges, batch_vector, graph_slices)


def _merge(batch: Batch, layout: _Layout, parts: list[Batch], graph_ids: list[Tensor]) -> Batch:
    """Interleave ``parts`` back into one batch: graph j of part k becomes graph
    ``graph_ids[k][j]`` (CPU indices covering every graph of ``batch`` once)."""
    for part in parts:
        if set(part.keys()) != set(batch.keys()):
            raise ValueError(f"an augmentation changed the attributes: {sorted(part.keys())}")
    device = batch.batch.device
    ids = [g.to(device) for g in graph_ids]
    node_graph = torch.cat([_at(g, part.batch) for g, part in zip(ids, parts, strict=True)])
    node_order = torch.argsort(node_graph, stable=True)
    positions = torch.arange(node_order.numel(), device=device)
    inverse = torch.empty_like(node_order).scatter_(0, node_order, positions)
    offsets = torch.tensor([0, *[part.num_nodes for part in parts]]).cumsum(0).tolist()
    edges = torch.cat(
        [part.edge_index + off for part, off in zip(parts, offsets[:-1], strict=True)], dim=1
    )
    edge_order = torch.argsort(_at(node_graph, edges[0]), stable=True)
    values: dict[str, Any] = {}
    for key, dim in layout.node.items():
        values[key] = torch.cat([part[key] for part in parts], dim).index_select(dim, node_order)
    for key, dim in layout.edge.items():
        values[key] = torch.cat([part[key] for part in parts], dim).index_select(dim, edge_order)
    all_ids = torch.cat(graph_ids)
    graph_slices = {"__graphs__": all_ids}
    for key, graph_dim in layout.graph.items():
        sizes = [part._slice_dict[key].diff() for part in parts]
        row_graph = torch.cat(
            [g.repeat_interleave(s) for g, s in zip(graph_ids, sizes, strict=True)]
        )
        per_graph = torch.zeros(all_ids.numel(), dtype=torch.long)
        per_graph[all_ids] = torch.cat(sizes)
        graph_slices[key] = torch.cat([per_graph.new_zeros(1), per_graph.cumsum(0)])
        joined = (
            [v for part in parts for v in part[key]]
            if graph_dim is None
            else torch.cat([part[key] for part in parts], graph_dim)
        )
        values[key] = _take(joined, graph_dim, torch.argsort(row_graph, stable=True))
    edge_index = _at(inverse, _columns(edges, edge_order).view(-1)).view(2, -1)
    batch_vector = _at(node_graph, node_order)
    return _assemble(batch, layout, values, edge_index, batch_vector, graph_slices)


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


def _check_p(name: str, p: float, *, allow_one: bool) -> None:
    ok = isinstance(p, (int, float)) and not isinstance(p, bool) and 0 <= p <= 1
    if not ok or (p == 1 and not allow_one):
        interval = "[0, 1]" if allow_one else "[0, 1)"
        raise ValueError(f"{name}: p must be in {interval}, got p={p!r}")


def _nodes_per_graph(batch: Batch) -> Tensor:
    ptr: Tensor = batch.ptr
    return ptr.diff()  # (G,)


# --------------------------------------------------------------------------- augmentations


def drop_nodes(batch: Batch, p: float = 0.2, *, generator: torch.Generator | None = None) -> Batch:
    """Node dropping: remove exactly ``⌊p·n_g⌋`` uniformly chosen nodes of every graph g,
    with their edges (GraphCL, You et al. 2020, §3.1; aug ratio 0.2).

    Dropped nodes really disappear: from every node-level attribute, ``batch``, ``ptr`` and the
    ``edge_index``/``edge_attr`` of their edges (renumbered). Since ``p < 1`` a graph keeps at
    least one node.

    Shape:
        batch: ``num_nodes`` nodes in G graphs; returns G graphs with
        ``Σ_g (n_g − ⌊p·n_g⌋)`` nodes.
    """
    _check_p("drop_nodes", p, allow_one=False)
    layout = _layout(batch)
    dropped = _choose(batch.ptr, _floor_fraction(p, _nodes_per_graph(batch)), generator)
    return _select(batch, layout, ~dropped)


def mask_attributes(
    batch: Batch,
    p: float = 0.2,
    *,
    mask_index: Sequence[int] | Tensor | None = None,
    mode: str = "mask",
    generator: torch.Generator | None = None,
) -> Batch:
    """Attribute masking: exactly ``⌊p·n_g⌋`` uniformly chosen atoms of every graph g get
    masked features ``x`` (GraphCL §3.1; aug ratio 0.2).

    Modes:
        ``"mask"``: every column of a masked row is set to its ``mask_index`` (one value per
        column of ``x``: the mask index of each categorical atom feature; GraphCL's chem code);
        ``"zero"`` (float ``x``): masked rows are zeros;
        ``"noise"`` (float ``x``): masked rows are replaced by N(0.5, 0.5²) samples, as GraphCL's
        TU code does.

    Shape:
        batch.x: ``(num_nodes, F)``; mask_index: ``(F,)``; the output has the input's shapes.
    """
    _check_p("mask_attributes", p, allow_one=True)
    if mode not in ("mask", "zero", "noise"):
        raise ValueError(f"mode must be 'mask', 'zero' or 'noise', got {mode!r}")
    layout = _layout(batch)
    x = batch.x
    if x is None:
        raise ValueError("mask_attributes needs node features x")
    width = x[0].numel() if x.size(0) else int(torch.Size(x.shape[1:]).numel())
    if mode == "mask":
        if mask_index is None:
            raise ValueError("mode='mask' needs mask_index: one mask value per column of x")
        value = torch.as_tensor(mask_index).to(device=x.device, dtype=x.dtype)
        if value.numel() != width:
            raise ValueError(f"mask_index has {value.numel()} values for {width} columns of x")
        value = value.view(x.shape[1:])
    elif not x.is_floating_point():
        raise ValueError(f"mode={mode!r} needs float x; categorical x is masked with mode='mask'")
    masked = _choose(batch.ptr, _floor_fraction(p, _nodes_per_graph(batch)), generator)
    rows = _indices(masked)  # (M,) masked atoms
    if mode == "zero":
        value = x.new_zeros(x.shape[1:])
    elif mode == "noise":
        noise = _draw(torch.randn, rows.numel(), *x.shape[1:], generator=generator,
                      device=x.device, dtype=x.dtype)  # fmt: skip
        value = noise * NOISE_STD + NOISE_MEAN  # (M, F)
    new_x = x.clone().index_copy_(0, rows, value.expand(rows.numel(), *x.shape[1:]))
    return _assemble(batch, layout, {"x": new_x})


def identity(batch: Batch, p: float = 0.0, *, generator: torch.Generator | None = None) -> Batch:
    """No augmentation: a new batch sharing the input's tensors (``p`` and ``generator`` are
    accepted and unused, so it mixes with the others in :func:`random_choice` and JOAO's
    pairs)."""
    return _assemble(batch, _layout(batch), {})


def random_choice(
    augmentations: Sequence[Callable[..., Batch]],
    batch: Batch,
    p: float = 0.2,
    *,
    generator: torch.Generator | None = None,
    **kwargs: Any,
) -> Batch:
    """Apply one augmentation per graph, chosen uniformly and independently for every graph
    (GraphCL's chem "random" view is ``[drop_nodes, subgraph]``: 50/50 per graph per view).

    The graphs that drew augmentation k are augmented together as one sub-batch; ``p`` and
    ``kwargs`` go to every augmentation (bind per-augmentation options with
    ``functools.partial``).
    """
    if len(augmentations) == 0:
        raise ValueError("random_choice needs at least one augmentation")
    layout = _layout(batch)
    device = batch.batch.device
    choice = torch.randint(
        len(augmentations), (batch.num_graphs,), generator=generator,
        device=device if generator is None else generator.device,
    ).cpu()  # fmt: skip
    parts, graph_ids = [], []
    for k, augmentation in enumerate(augmentations):
        graphs = (choice == k).nonzero().view(-1)
        if graphs.numel() == 0:
            continue
        node_mask = _at((choice == k).to(device), batch.batch)
        part = _select(batch, layout, node_mask, graphs)
        parts.append(augmentation(part, p, generator=generator, **kwargs))
        graph_ids.append(graphs)
    return _merge(batch, layout, parts, graph_ids)


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


def _merge_sorted(first: Tensor, second: Tensor, num_graphs: int) -> tuple[Tensor, Tensor]:
    """Positions that interleave two graph-ascending sequences into one, graph by graph, with
    ``first``'s items before ``second``'s (a merge without sorting).

    Shape:
        first: ``(a,)``, second: ``(b,)`` graph ids, ascending; returns ``(a,)``, ``(b,)``.
    """
    ptr_first, ptr_second = _ptr(first, num_graphs), _ptr(second, num_graphs)
    position_first = torch.arange(first.numel(), device=first.device) + _at(ptr_second, first)
    position_second = torch.arange(second.numel(), device=first.device) + _at(ptr_first, second + 1)
    return position_first, position_second


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
    _check_p("perturb_edges", p, allow_one=True)
    if edge_attr_sampler not in ("empirical", "zeros"):
        raise ValueError(f"edge_attr_sampler must be 'empirical' or 'zeros', got "
                         f"{edge_attr_sampler!r}")  # fmt: skip
    layout = _layout(batch)
    edge_index, batch_vector, ptr = batch.edge_index, batch.batch, batch.ptr
    device, num_nodes, num_graphs = edge_index.device, batch.num_nodes, batch.num_graphs
    counts = ptr.diff()  # (G,)

    # bonds: the distinct unordered pairs {u, v}, grouped by graph in ascending key order
    lo, hi = torch.minimum(edge_index[0], edge_index[1]), torch.maximum(*edge_index)
    keys, order = torch.sort(lo * num_nodes + hi, stable=True)  # (E,)
    first = torch.ones_like(keys, dtype=torch.bool)
    first[1:] = keys[1:] != keys[:-1]
    bond_of_edge = torch.empty_like(order).scatter_(0, order, first.long().cumsum(0) - 1)
    bond_keys = keys.masked_select(first)  # (M,) ascending
    bond_lo, bond_hi = bond_keys // num_nodes, bond_keys % num_nodes
    bond_graph = _at(batch_vector, bond_lo)
    bonds = _counts(bond_graph, num_graphs)  # m_g
    perturbed = _floor_fraction(p, bonds)  # (G,)
    removed = _choose(_ptr(bond_graph, num_graphs), perturbed, generator)  # (M,)
    kept = _indices(~_at(removed, bond_of_edge))  # (E_kept,) grouped by graph

    # additions among the free pairs; each graph by enumeration or rejection (see docstrings)
    pairs = counts * (counts - 1) // 2
    free = pairs - _counts(bond_graph, num_graphs, bond_lo != bond_hi)
    wanted = torch.minimum(perturbed, free)
    listed = (wanted > 0) & ((2 * free < pairs) | (free < 2 * wanted))
    bonded = _Bonds(bond_keys, batch_vector, ptr)
    new_keys = torch.cat([
        _enumerate_non_bonds(bonded, torch.where(listed, wanted, 0), generator),
        _sample_non_bonds(bonded, torch.where(listed, 0, wanted), generator),
    ]).sort().values  # fmt: skip  # (A,) grouped by graph
    u, v = new_keys // num_nodes, new_keys % num_nodes
    added = torch.stack([torch.stack([u, v], 1).view(-1), torch.stack([v, u], 1).view(-1)])

    # each graph's kept edges, then its added bonds (both directions): a merge by graph
    kept_edges = _columns(edge_index, kept)  # (2, E_kept)
    at_kept, at_added = _merge_sorted(
        _at(batch_vector, kept_edges[0]), _at(batch_vector, added[0]), num_graphs
    )
    size = kept.numel() + added.size(1)
    out_edges = edge_index.new_empty(2, size)
    out_edges[0].index_copy_(0, at_kept, kept_edges[0]).index_copy_(0, at_added, added[0])
    out_edges[1].index_copy_(0, at_kept, kept_edges[1]).index_copy_(0, at_added, added[1])
    if edge_attr_sampler == "empirical" and new_keys.numel():
        source = _draw(torch.randint, edge_index.size(1), (new_keys.numel(),),
                       generator=generator, device=device).repeat_interleave(2)  # fmt: skip
    values = {}
    for key, dim in layout.edge.items():
        value = batch[key]
        shape = list(value.shape)
        shape[dim] = size
        out = value.new_zeros(shape).index_copy_(dim, at_kept, value.index_select(dim, kept))
        if edge_attr_sampler == "empirical" and new_keys.numel():
            out.index_copy_(dim, at_added, value.index_select(dim, source))
        values[key] = out
    return _assemble(batch, layout, values, out_edges)


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
    spreads over many hops; all graphs are grown at once (see :func:`_growth_times`). If the
    seed's connected component is smaller than the target (a salt, an isolated atom), the
    whole component is taken and growth restarts from a uniformly chosen unchosen node, which
    lies in another component.

    ``graphcl_compat=True`` reproduces the reference's behaviour: its set union is discarded
    (``idx_neigh.union(...)`` without assignment, GraphCL issue #24), so only the seed's
    neighbours are ever added; it keeps ``min(n_g − ⌊p·n_g⌋, 1 + deg(seed))`` nodes.

    Shape:
        batch: ``num_nodes`` nodes in G graphs; returns G graphs with
        ``Σ_g (n_g − ⌊p·n_g⌋)`` nodes (fewer with ``graphcl_compat``).
    """
    _check_p("subgraph", p, allow_one=False)
    layout = _layout(batch)
    counts = _nodes_per_graph(batch)
    target = counts - _floor_fraction(p, counts)  # (G,)
    if graphcl_compat:
        return _select(batch, layout, _one_hop(batch, target, generator))
    times = _growth_times(batch, generator)
    order = torch.sort(times, stable=True).indices
    order = _at(order, torch.sort(_at(batch.batch, order), stable=True).indices)  # (graph, t)
    start = _ptr(batch.batch, batch.num_graphs)
    rank_sorted = torch.arange(batch.num_nodes, device=times.device) - _at(start, batch.batch)
    chosen = torch.zeros_like(batch.batch, dtype=torch.bool).scatter_(
        0, order, rank_sorted < _at(target, batch.batch)
    )
    return _select(batch, layout, chosen)


AUGMENTATIONS: dict[str, Callable[..., Batch]] = {
    "drop_nodes": drop_nodes,
    "perturb_edges": perturb_edges,
    "mask_attributes": mask_attributes,
    "subgraph": subgraph,
    "identity": identity,
}


# --------------------------------------------------------------------------- transforms


class _PerGraph(BaseTransform):  # type: ignore[misc]  # PyG is untyped
    """Apply a batch augmentation to one ``Data`` (batched alone) or to a ``Batch``; the
    randomness is torch's global RNG (seeded per DataLoader worker)."""

    def _augment(self, batch: Batch) -> Batch:
        raise NotImplementedError

    def forward(self, data: Any) -> Any:
        if isinstance(data, Batch):
            return self._augment(data)
        return self._augment(Batch.from_data_list([data])).get_example(0)


class DropNodes(_PerGraph):
    """:func:`drop_nodes` as a transform."""

    def __init__(self, p: float = 0.2) -> None:
        _check_p("DropNodes", p, allow_one=False)
        self.p = p

    def _augment(self, batch: Batch) -> Batch:
        return drop_nodes(batch, self.p)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(p={self.p})"


class PerturbEdges(_PerGraph):
    """:func:`perturb_edges` as a transform."""

    def __init__(
        self, p: float = 0.2, edge_attr_sampler: Literal["empirical", "zeros"] = "empirical"
    ) -> None:
        _check_p("PerturbEdges", p, allow_one=True)
        self.p, self.edge_attr_sampler = p, edge_attr_sampler

    def _augment(self, batch: Batch) -> Batch:
        return perturb_edges(batch, self.p, edge_attr_sampler=self.edge_attr_sampler)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(p={self.p}, edge_attr_sampler={self.edge_attr_sampler!r})"


class MaskAttributes(_PerGraph):
    """:func:`mask_attributes` as a transform."""

    def __init__(
        self,
        p: float = 0.2,
        mask_index: Sequence[int] | Tensor | None = None,
        mode: Literal["mask", "zero", "noise"] = "mask",
    ) -> None:
        _check_p("MaskAttributes", p, allow_one=True)
        if mode == "mask" and mask_index is None:
            raise ValueError("mode='mask' needs mask_index: one mask value per column of x")
        self.p, self.mode = p, mode
        self.mask_index = None if mask_index is None else torch.as_tensor(mask_index).clone()

    def _augment(self, batch: Batch) -> Batch:
        return mask_attributes(batch, self.p, mask_index=self.mask_index, mode=self.mode)

    def __repr__(self) -> str:
        mask = None if self.mask_index is None else self.mask_index.tolist()
        return f"{type(self).__name__}(p={self.p}, mask_index={mask}, mode={self.mode!r})"


class Subgraph(_PerGraph):
    """:func:`subgraph` as a transform."""

    def __init__(self, p: float = 0.2, graphcl_compat: bool = False) -> None:
        _check_p("Subgraph", p, allow_one=False)
        self.p, self.graphcl_compat = p, graphcl_compat

    def _augment(self, batch: Batch) -> Batch:
        return subgraph(batch, self.p, graphcl_compat=self.graphcl_compat)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(p={self.p}, graphcl_compat={self.graphcl_compat})"
