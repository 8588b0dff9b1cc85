"""Rebuilding a collated PyG ``Batch`` after an augmentation: the batch plumbing of
:mod:`graphcl.augment`.

:func:`_layout` tells node-, edge- and graph-level attributes apart by their collation slices;
:func:`_assemble` makes a new batch with some attributes replaced and ``ptr``, ``num_nodes`` and
the collation slices recomputed, sharing the rest with the input. :func:`_select` keeps some
nodes (and possibly only some graphs) with the edges among them, :func:`_merge` interleaves
sub-batches back into one, and :func:`_merge_sorted` interleaves two graph-grouped sequences.
The index primitives (:func:`_at`, :func:`_indices`, :func:`_columns`, :func:`_ptr`,
:func:`_counts`) avoid host syncs and the slow paths of advanced indexing on the CPU;
:mod:`graphcl.sampling` uses them too.
"""

from __future__ import annotations

import copy
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch_geometric.data import Batch

# --------------------------------------------------------------------------- layout and indexing


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


# --------------------------------------------------------------------------- rebuilding


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
