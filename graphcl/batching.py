"""Rebuilding a collated PyG ``Batch`` after an augmentation: the batch plumbing of
:mod:`graphcl.augment`.

:func:`_layout` tells node-, edge- and graph-level attributes apart by their collation slices;
:func:`_assemble` makes a new batch with some attributes replaced and ``ptr``, ``num_nodes`` and
the collation slices set from the new sizes, sharing the rest with the input. :func:`_select`
keeps some nodes (and possibly only some graphs) with the edges among them, :func:`_merge`
interleaves sub-batches back into one, and :func:`_merge_sorted` interleaves two graph-grouped
sequences. Sizes live on the host: the slices are CPU metadata (:func:`_on_host`), and the one
size that depends on a random draw, the edges each graph keeps, is read from the device once
by :func:`_read_counts` (:func:`_read` is the only device→host copy). The index primitives
(:func:`_at`, :func:`_indices`, :func:`_columns`, :func:`_ptr`, :func:`_counts`) take sizes
known on the host, so they never wait for the device, and avoid the slow paths of advanced
indexing on the CPU; :mod:`graphcl.sampling` uses them too.
"""

from __future__ import annotations

import copy
from typing import Any, NamedTuple, cast

import torch
from torch import Tensor
from torch_geometric.data import Batch

# --------------------------------------------------------------------------- layout and indexing


class _Layout(NamedTuple):
    """Which attributes of a batch are node-, edge- or graph-level, with their cat dims."""

    node: dict[str, int]
    edge: dict[str, int]
    graph: dict[str, int | None]  # None: not a tensor (e.g. a list of SMILES)


# Where a batch made by this module keeps its layout (a ``_`` name: PyG keeps it out of the
# store), with the attribute names it was derived for.
_LAYOUT_KEY = "_graphcl_layout"


def _on_host(metadata: Tensor) -> list[Any]:
    """The values of CPU-side metadata as Python numbers: the collation slices and increments
    (PyG keeps ``_slice_dict`` and ``_inc_dict`` on the CPU whatever the batch's device) and
    what is computed from them or from :func:`_read`. Reading them is no device wait."""
    values: list[Any] = metadata.tolist()
    return values


def _read(values: Tensor) -> Tensor:
    """Copy a small device tensor to the host: the device→host wait of an augmentation.

    The new graph sizes of a view depend on the random draw, and a PyG ``Batch`` keeps them
    on the host (its collation slices, ``num_nodes``), so every augmentation that changes
    sizes reads them here once (with the flag of any unfinished random choice); every
    other index size is derived on the host from the slices.
    """
    return values.cpu()


def _to_device(host: Tensor, device: torch.device) -> Tensor:
    """A host-built index tensor on ``device`` without a wait (pinned, non-blocking copy)."""
    if host.device == device:
        return host
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


def _layout(batch: Batch) -> _Layout:
    """Classify the attributes of a collated batch by their collation slices: node-level when
    they equal the node slices, edge-level when they equal the edge slices, else graph-level.

    The slices are CPU metadata, compared for all the attributes at once; a batch made by
    :func:`_assemble` carries its layout, so nested augmentations do not derive it again.
    """
    if not isinstance(batch, Batch) or not hasattr(batch, "_slice_dict"):
        raise ValueError(
            "expected a collated torch_geometric Batch (Batch.from_data_list or a DataLoader), "
            f"got {type(batch).__name__}"
        )
    if batch.edge_index is None:
        raise ValueError("the batch has no edge_index")
    names = frozenset(batch.keys())
    cached = batch.__dict__.get(_LAYOUT_KEY)
    if cached is not None and cached[0] == names:
        layout: _Layout = cached[1]
        return layout
    slices, incs = batch._slice_dict, batch._inc_dict
    node_slices, edge_slices = _node_edge_slices(batch)
    graph: dict[str, int | None] = {}
    dims: dict[str, int] = {}
    for key in batch.keys():
        if key in ("batch", "ptr", "edge_index", "num_nodes"):
            continue
        if key not in slices:
            raise ValueError(f"attribute {key!r} was not made by collation; remove it first")
        value = batch[key]
        if isinstance(value, Tensor):
            dims[key] = batch.__cat_dim__(key, value)
        else:
            graph[key] = None
    # per attribute: equal to the node slices, to the edge slices, incremented (one CPU read)
    flags = torch.stack(
        [
            torch.stack([
                _same_slices(slices[key], node_slices),
                _same_slices(slices[key], edge_slices),
                torch.tensor(False) if incs.get(key) is None else (incs[key] != 0).any(),
            ])
            for key in dims
        ]
    ) if dims else torch.zeros(0, 3, dtype=torch.bool)  # fmt: skip  # (A, 3)
    node: dict[str, int] = {}
    edge: dict[str, int] = {}
    for (key, dim), (is_node, is_edge, incremented) in zip(
        dims.items(), _on_host(flags), strict=True
    ):
        if incremented:
            raise ValueError(f"attribute {key!r} is incremented on collation (an index); only "
                             "edge_index is supported")  # fmt: skip
        if is_node and is_edge:  # n_g == 2 m_g for every graph: PyG's naming rule decides
            is_node = "edge" not in key
        if is_node:
            node[key] = dim
        elif is_edge:
            edge[key] = dim
        else:
            graph[key] = dim
    # the attributes in the batch's order, as one loop over the keys would give
    order = {key: i for i, key in enumerate(batch.keys())}
    graph = dict(sorted(graph.items(), key=lambda item: order[item[0]]))
    return _Layout(node, edge, graph)


def _same_slices(slices: Tensor, reference: Tensor) -> Tensor:
    """Whether two CPU slice vectors are equal, as a 0-d bool tensor (no host read)."""
    if slices.shape != reference.shape:
        return torch.tensor(False)
    return (slices == reference).all()


def _counts(group: Tensor, size: int, weight: Tensor | None = None) -> Tensor:
    """Occurrences of each of ``size`` groups (no host sync, unlike ``bincount`` on CUDA)."""
    ones = torch.ones_like(group) if weight is None else weight.long()
    return group.new_zeros(size).index_add_(0, group, ones)


def _at(values: Tensor, index: Tensor) -> Tensor:
    """``values[index]`` along dim 0 (index_select: several times faster than advanced
    indexing on the CPU)."""
    return values.index_select(0, index)


def _indices(mask: Tensor, count: int) -> Tensor:
    """The positions of the ``count`` true entries of a 1-D mask, ascending, with ``count``
    known on the host: a scatter of each true entry's rank, where ``nonzero`` and
    ``masked_select`` would wait for the device to learn the size.

    Shape:
        mask: ``(n,)`` bool with ``count`` true entries; returns ``(count,)`` long.
    """
    rank = torch.where(mask, mask.long().cumsum(0) - 1, count)  # (n,) false -> a spare slot
    positions = torch.arange(mask.numel(), device=mask.device)
    return positions.new_empty(count + 1).scatter_(0, rank, positions)[:count]


def _columns(edge_index: Tensor, index: Tensor) -> Tensor:
    """``edge_index[:, index]`` (two 1-D index_selects: faster than selecting along dim 1)."""
    return torch.stack([_at(edge_index[0], index), _at(edge_index[1], index)])


def _ptr(sorted_group: Tensor, num_groups: int) -> Tensor:
    """Offsets ``(num_groups + 1,)`` of the groups in an ascending group vector."""
    groups = torch.arange(num_groups + 1, device=sorted_group.device)
    return torch.searchsorted(sorted_group, groups)


# --------------------------------------------------------------------------- rebuilding


def _zero_inc(inc: Tensor | None, num_graphs: int) -> Tensor | None:
    return None if inc is None else inc.new_zeros((num_graphs, *inc.shape[1:]))


def _total(counts: Tensor) -> int:
    """The sum of CPU counts as a Python int (host metadata: no device wait)."""
    return cast(int, counts.sum().tolist())  # a 0-d tensor: one Python number


def _offsets(counts: Tensor) -> Tensor:
    """Slices ``(G + 1,)`` of CPU per-graph counts ``(G,)``."""
    return torch.cat([counts.new_zeros(1), counts.cumsum(0)])


def _node_edge_slices(batch: Batch) -> tuple[Tensor, Tensor]:
    """The node and the edge slices ``(G + 1,)`` of a collated batch, from its CPU metadata
    (``edge_index`` is incremented by the nodes of the earlier graphs)."""
    increments = batch._inc_dict["edge_index"].view(-1)  # (G,) nodes before each graph
    return torch.cat([increments, torch.tensor([batch.num_nodes])]), batch._slice_dict["edge_index"]


def _assemble(
    batch: Batch,
    layout: _Layout,
    values: dict[str, Any],
    *,
    edge_index: Tensor | None = None,
    edge_slices: Tensor | None = None,
    batch_vector: Tensor | None = None,
    node_slices: Tensor | None = None,
    graph_slices: dict[str, Tensor] | None = None,
) -> Batch:
    """A new batch like ``batch`` with ``values`` replaced, and ``edge_index`` with its CPU
    ``edge_slices`` when the edges changed, ``batch_vector`` with its CPU ``node_slices`` when
    the nodes changed (``ptr``, ``num_nodes`` follow), ``graph_slices`` when the graphs were
    selected or reordered. Attributes not replaced are shared with ``batch``, as PyG's
    transforms do. The new batch carries its layout (see :func:`_layout`). Nothing is read
    from the device.

    Shape:
        edge_index: ``(2, E')``; batch_vector: ``(N',)``; node_slices, edge_slices: ``(G' + 1,)``.
    """
    num_graphs = batch.num_graphs if graph_slices is None else graph_slices["__graphs__"].numel()
    out = copy.copy(batch)
    for key, value in values.items():
        out[key] = value
    slices, incs = dict(batch._slice_dict), dict(batch._inc_dict)
    if batch_vector is not None:
        assert edge_index is not None and node_slices is not None
        out.batch, out.ptr = batch_vector, _ptr(batch_vector, num_graphs)  # ptr: (G' + 1,)
        if "num_nodes" in batch._store:
            sizes = _on_host(node_slices.diff())
            out.num_nodes = sum(sizes)
            out._store._num_nodes = sizes
        incs["edge_index"] = node_slices[:-1]
        slices.update(dict.fromkeys(layout.node, node_slices))
    if edge_index is not None:
        assert edge_slices is not None
        out.edge_index = edge_index
        slices.update(dict.fromkeys([*layout.edge, "edge_index"], edge_slices))
    if graph_slices is not None:
        slices.update({key: graph_slices[key] for key in layout.graph})
        for key, inc in incs.items():
            if key != "edge_index":
                incs[key] = _zero_inc(inc, num_graphs)
    out._slice_dict, out._inc_dict, out._num_graphs = slices, incs, num_graphs
    out.__dict__[_LAYOUT_KEY] = (frozenset(out.keys()), layout)
    return out


def _graph_rows(slices: Tensor, graphs: Tensor) -> tuple[Tensor, Tensor]:
    """Rows of a graph-level attribute holding ``graphs`` (CPU), and their new slices."""
    sizes = slices.diff()[graphs]  # (G',)
    new_slices = _offsets(sizes)
    rows = _total(sizes)
    starts = torch.repeat_interleave(slices[graphs] - new_slices[:-1], sizes, output_size=rows)
    return starts + torch.arange(rows), new_slices


def _take(value: Any, dim: int | None, rows: Tensor) -> Any:
    if dim is None:
        return [value[i] for i in _on_host(rows)]  # graph metadata (SMILES): a list, reordered
    return value.index_select(dim, _to_device(rows, value.device))


def _edge_mask(batch: Batch, node_mask: Tensor) -> Tensor:
    """The edges with both ends in ``node_mask``, as a ``(num_edges,)`` bool mask."""
    ends_kept = _at(node_mask, batch.edge_index.reshape(-1)).view(2, -1)  # (2, E)
    return ends_kept[0] & ends_kept[1]


def _read_counts(
    group: Tensor, num_groups: int, mask: Tensor, unfinished: Tensor | None = None
) -> Tensor | None:
    """The entries of ``mask`` in each group, read from the device: the one device→host wait
    of an augmentation that changes sizes. ``unfinished`` (a 0-d bool on the device: the
    caller's random choice may still change ``mask``) is read with them; when it is true,
    ``None`` is returned and the caller finishes its choice and asks again.

    Shape:
        group: ``(n,)`` ids in ``[0, num_groups)``; mask: ``(n,)`` bool; returns
        ``(num_groups,)`` long on the CPU, or ``None``.
    """
    counts = _counts(group, num_groups, mask)  # (G,)
    flag = counts.new_zeros(1) if unfinished is None else unfinished.view(1).long()
    host = _read(torch.cat([counts, flag]))  # (G + 1,)
    if _on_host(host[-1:])[0]:
        return None
    return host[:-1]


def _kept_edges(batch: Batch, node_mask: Tensor, unfinished: Tensor | None = None) -> Tensor | None:
    """The edges each graph keeps when only ``node_mask``'s nodes stay (:func:`_read_counts`).

    Shape:
        node_mask: ``(num_nodes,)`` bool; returns ``(G,)`` long on the CPU, or ``None``.
    """
    edge_graph = _at(batch.batch, batch.edge_index[0])  # (E,)
    return _read_counts(edge_graph, batch.num_graphs, _edge_mask(batch, node_mask), unfinished)


def _select(
    batch: Batch,
    layout: _Layout,
    node_mask: Tensor,
    node_counts: Tensor,
    edge_counts: Tensor,
    graphs: Tensor | None = None,
) -> Batch:
    """Keep the nodes of ``node_mask`` and the edges between them; with ``graphs`` (CPU
    indices), keep only those graphs, ``node_mask`` then being exactly their nodes.

    ``node_counts`` and ``edge_counts`` (CPU) are the nodes and edges each kept graph keeps
    (from the slices, or :func:`_kept_edges`): every size is known on the host, so nothing is
    read from the device.

    Shape:
        node_mask: ``(num_nodes,)`` bool; node_counts, edge_counts: ``(G',)`` long.
    """
    node_slices, edge_slices = _offsets(node_counts), _offsets(edge_counts)
    node_index = _indices(node_mask, _total(node_counts))  # (N',)
    edge_index_kept = _indices(_edge_mask(batch, node_mask), _total(edge_counts))  # (E',)
    new_id = node_mask.long().cumsum(0) - 1  # old node -> new node
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
        batch_vector = _at(_to_device(renumber, batch_vector.device), batch_vector)
        graph_slices = {"__graphs__": graphs}
        for key, graph_dim in layout.graph.items():
            rows, graph_slices[key] = _graph_rows(batch._slice_dict[key], graphs)
            values[key] = _take(batch[key], graph_dim, rows)
    edge_index = batch.edge_index
    out_edges = _at(new_id, _columns(edge_index, edge_index_kept).view(-1)).view(2, -1)
    return _assemble(
        batch, layout, values, edge_index=out_edges, edge_slices=edge_slices,
        batch_vector=batch_vector, node_slices=node_slices, graph_slices=graph_slices,
    )  # fmt: skip


def _select_graphs(batch: Batch, layout: _Layout, node_mask: Tensor, graphs: Tensor) -> Batch:
    """The sub-batch of the graphs ``graphs`` (CPU indices, ascending; ``node_mask``: exactly
    their nodes), its sizes taken from the CPU slices."""
    node_slices, edge_slices = _node_edge_slices(batch)
    node_counts, edge_counts = node_slices.diff()[graphs], edge_slices.diff()[graphs]
    return _select(batch, layout, node_mask, node_counts, edge_counts, graphs)


def _merge(batch: Batch, layout: _Layout, parts: list[Batch], graph_ids: list[Tensor]) -> Batch:
    """Interleave ``parts`` back into one batch: graph j of part k becomes graph
    ``graph_ids[k][j]`` (CPU indices covering every graph of ``batch`` once). The sizes come
    from the parts' CPU slices: nothing is read from the device."""
    for part in parts:
        if set(part.keys()) != set(batch.keys()):
            raise ValueError(f"an augmentation changed the attributes: {sorted(part.keys())}")
    device = batch.batch.device
    ids = [_to_device(g, device) for g in graph_ids]
    node_graph = torch.cat([_at(g, part.batch) for g, part in zip(ids, parts, strict=True)])
    node_order = torch.argsort(node_graph, stable=True)
    positions = torch.arange(node_order.numel(), device=device)
    inverse = torch.empty_like(node_order).scatter_(0, node_order, positions)
    offsets = [0]
    for part in parts:
        offsets.append(offsets[-1] + part.num_nodes)
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

    def merged_slices(sizes: list[Tensor]) -> Tensor:  # each part's per-graph sizes, in order
        per_graph = torch.zeros(all_ids.numel(), dtype=torch.long)
        per_graph[all_ids] = torch.cat(sizes)
        return _offsets(per_graph)

    graph_slices = {"__graphs__": all_ids}
    for key, graph_dim in layout.graph.items():
        sizes = [part._slice_dict[key].diff() for part in parts]
        row_graph = torch.cat([
            torch.repeat_interleave(g, s, output_size=_total(s))
            for g, s in zip(graph_ids, sizes, strict=True)
        ])  # fmt: skip
        graph_slices[key] = merged_slices(sizes)
        joined = (
            [v for part in parts for v in part[key]]
            if graph_dim is None
            else torch.cat([part[key] for part in parts], graph_dim)
        )
        values[key] = _take(joined, graph_dim, torch.argsort(row_graph, stable=True))
    part_slices = [_node_edge_slices(part) for part in parts]
    node_slices = merged_slices([nodes.diff() for nodes, _ in part_slices])
    edge_slices = merged_slices([edges.diff() for _, edges in part_slices])
    edge_index = _at(inverse, _columns(edges, edge_order).view(-1)).view(2, -1)
    batch_vector = _at(node_graph, node_order)
    return _assemble(
        batch, layout, values, edge_index=edge_index, edge_slices=edge_slices,
        batch_vector=batch_vector, node_slices=node_slices, graph_slices=graph_slices,
    )  # fmt: skip


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
