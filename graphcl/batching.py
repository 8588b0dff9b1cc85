"""Rebuilding a collated PyG ``Batch`` after an augmentation: the batch plumbing of
:mod:`graphcl.augment`.

:func:`assemble` makes a new batch with some attributes replaced and ``ptr``, ``num_nodes`` and
the collation slices set from the new sizes, sharing the rest with the input (the attributes'
levels come from :func:`graphcl.collation.batch_layout`). :func:`select` keeps some nodes (and
possibly only some graphs) with the edges among them, :func:`select_nodes` does so for a random
choice that may need further rounds, :func:`merge` interleaves sub-batches back into one, and
:func:`merge_sorted` interleaves two graph-grouped sequences. Sizes live on the host: the
slices are CPU metadata (:mod:`graphcl.collation`), and the one size that depends on a random
draw, the edges each graph keeps, is read from the device once by :func:`read_counts` (through
:func:`graphcl.indexing.read_to_host`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch_geometric.data import Batch

from graphcl.collation import (
    Layout,
    collation_increments,
    collation_slices,
    keeps_node_counts,
    node_edge_slices,
    remember_layout,
    set_collation,
    set_node_counts,
)
from graphcl.indexing import (
    edge_columns,
    group_counts,
    group_ptr,
    host_list,
    host_offsets,
    host_total,
    read_to_host,
    rows_at,
    to_device,
    true_indices,
)

__all__ = [
    "assemble",
    "kept_edges",
    "merge",
    "merge_sorted",
    "read_counts",
    "select",
    "select_graphs",
    "select_nodes",
]

# --------------------------------------------------------------------------- rebuilding


def _zero_inc(inc: Tensor | None, num_graphs: int) -> Tensor | None:
    return None if inc is None else inc.new_zeros((num_graphs, *inc.shape[1:]))


def assemble(
    batch: Batch,
    layout: Layout,
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
    transforms do. The new batch carries its layout (see
    :func:`graphcl.collation.batch_layout`). Nothing is read
    from the device.

    Shape:
        edge_index: ``(2, E')``; batch_vector: ``(N',)``; node_slices, edge_slices: ``(G' + 1,)``.
    """
    num_graphs = batch.num_graphs if graph_slices is None else graph_slices["__graphs__"].numel()
    out = copy.copy(batch)
    for key, value in values.items():
        out[key] = value
    slices, incs = dict(collation_slices(batch)), dict(collation_increments(batch))
    if batch_vector is not None:
        assert edge_index is not None and node_slices is not None
        out.batch, out.ptr = batch_vector, group_ptr(batch_vector, num_graphs)  # ptr: (G' + 1,)
        if keeps_node_counts(batch):
            set_node_counts(out, host_list(node_slices.diff()))
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
    set_collation(out, slices, incs, num_graphs)
    remember_layout(out, layout)
    return out


def _graph_rows(slices: Tensor, graphs: Tensor) -> tuple[Tensor, Tensor]:
    """Rows of a graph-level attribute holding ``graphs`` (CPU), and their new slices."""
    sizes = slices.diff()[graphs]  # (G',)
    new_slices = host_offsets(sizes)
    rows = host_total(sizes)
    starts = torch.repeat_interleave(slices[graphs] - new_slices[:-1], sizes, output_size=rows)
    return starts + torch.arange(rows), new_slices


def _take(value: Any, dim: int | None, rows: Tensor) -> Any:
    if dim is None:
        return [value[i] for i in host_list(rows)]  # graph metadata (SMILES): a list, reordered
    return value.index_select(dim, to_device(rows, value.device))


def _edge_mask(batch: Batch, node_mask: Tensor) -> Tensor:
    """The edges with both ends in ``node_mask``, as a ``(num_edges,)`` bool mask."""
    ends_kept = rows_at(node_mask, batch.edge_index.reshape(-1)).view(2, -1)  # (2, E)
    return ends_kept[0] & ends_kept[1]


def read_counts(
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
    counts = group_counts(group, num_groups, mask)  # (G,)
    flag = counts.new_zeros(1) if unfinished is None else unfinished.view(1).long()
    host = read_to_host(torch.cat([counts, flag]))  # (G + 1,)
    if host_list(host[-1:])[0]:
        return None
    return host[:-1]


def kept_edges(batch: Batch, node_mask: Tensor, unfinished: Tensor | None = None) -> Tensor | None:
    """The edges each graph keeps when only ``node_mask``'s nodes stay (:func:`read_counts`).

    Shape:
        node_mask: ``(num_nodes,)`` bool; returns ``(G,)`` long on the CPU, or ``None``.
    """
    edge_graph = rows_at(batch.batch, batch.edge_index[0])  # (E,)
    return read_counts(edge_graph, batch.num_graphs, _edge_mask(batch, node_mask), unfinished)


def select(
    batch: Batch,
    layout: Layout,
    node_mask: Tensor,
    node_counts: Tensor,
    edge_counts: Tensor,
    graphs: Tensor | None = None,
) -> Batch:
    """Keep the nodes of ``node_mask`` and the edges between them; with ``graphs`` (CPU
    indices), keep only those graphs, ``node_mask`` then being exactly their nodes.

    ``node_counts`` and ``edge_counts`` (CPU) are the nodes and edges each kept graph keeps
    (from the slices, or :func:`kept_edges`): every size is known on the host, so nothing is
    read from the device.

    Shape:
        node_mask: ``(num_nodes,)`` bool; node_counts, edge_counts: ``(G',)`` long.
    """
    node_slices, edge_slices = host_offsets(node_counts), host_offsets(edge_counts)
    node_index = true_indices(node_mask, host_total(node_counts))  # (N',)
    edge_index_kept = true_indices(_edge_mask(batch, node_mask), host_total(edge_counts))  # (E',)
    new_id = node_mask.long().cumsum(0) - 1  # old node -> new node
    values: dict[str, Any] = {}
    for key, dim in layout.node.items():
        values[key] = batch[key].index_select(dim, node_index)
    for key, dim in layout.edge.items():
        values[key] = batch[key].index_select(dim, edge_index_kept)
    batch_vector = rows_at(batch.batch, node_index)
    graph_slices = None
    if graphs is not None:
        renumber = torch.full((batch.num_graphs,), -1, dtype=torch.long)
        renumber[graphs] = torch.arange(graphs.numel())
        batch_vector = rows_at(to_device(renumber, batch_vector.device), batch_vector)
        graph_slices = {"__graphs__": graphs}
        slices = collation_slices(batch)
        for key, graph_dim in layout.graph.items():
            rows, graph_slices[key] = _graph_rows(slices[key], graphs)
            values[key] = _take(batch[key], graph_dim, rows)
    edges = edge_columns(batch.edge_index, edge_index_kept).view(-1)
    out_edges = rows_at(new_id, edges).view(2, -1)
    return assemble(
        batch,
        layout,
        values,
        edge_index=out_edges,
        edge_slices=edge_slices,
        batch_vector=batch_vector,
        node_slices=node_slices,
        graph_slices=graph_slices,
    )


def select_nodes(
    batch: Batch,
    layout: Layout,
    choose: Callable[[], tuple[Tensor, Tensor | None]],
    finish: Callable[[], object],
    host_counts: Tensor,
) -> Batch:
    """Keep the nodes ``choose()`` returns (with its device flag: the choice may be
    unfinished), ``host_counts`` (CPU) per graph: the view's one device read, the edges each
    graph keeps with the flag; when the flag was set, ``finish()`` and choose again."""
    node_mask, unfinished = choose()
    edge_counts = kept_edges(batch, node_mask, unfinished)
    if edge_counts is None:
        finish()
        node_mask, _ = choose()
        edge_counts = kept_edges(batch, node_mask)
        assert edge_counts is not None
    return select(batch, layout, node_mask, host_counts, edge_counts)


def select_graphs(batch: Batch, layout: Layout, node_mask: Tensor, graphs: Tensor) -> Batch:
    """The sub-batch of the graphs ``graphs`` (CPU indices, ascending; ``node_mask``: exactly
    their nodes), its sizes taken from the CPU slices."""
    node_slices, edge_slices = node_edge_slices(batch)
    node_counts, edge_counts = node_slices.diff()[graphs], edge_slices.diff()[graphs]
    return select(batch, layout, node_mask, node_counts, edge_counts, graphs)


def merge(batch: Batch, layout: Layout, parts: list[Batch], graph_ids: list[Tensor]) -> Batch:
    """Interleave ``parts`` back into one batch: graph j of part k becomes graph
    ``graph_ids[k][j]`` (CPU indices covering every graph of ``batch`` once). The sizes come
    from the parts' CPU slices: nothing is read from the device."""
    for part in parts:
        if set(part.keys()) != set(batch.keys()):
            raise ValueError(f"an augmentation changed the attributes: {sorted(part.keys())}")
    device = batch.batch.device
    ids = [to_device(g, device) for g in graph_ids]
    node_graph = torch.cat([rows_at(g, part.batch) for g, part in zip(ids, parts, strict=True)])
    node_order = torch.argsort(node_graph, stable=True)
    positions = torch.arange(node_order.numel(), device=device)
    inverse = torch.empty_like(node_order).scatter_(0, node_order, positions)
    offsets = [0]
    for part in parts:
        offsets.append(offsets[-1] + part.num_nodes)
    edges = torch.cat(
        [part.edge_index + off for part, off in zip(parts, offsets[:-1], strict=True)], dim=1
    )
    edge_order = torch.argsort(rows_at(node_graph, edges[0]), stable=True)
    values: dict[str, Any] = {}
    for key, dim in layout.node.items():
        values[key] = torch.cat([part[key] for part in parts], dim).index_select(dim, node_order)
    for key, dim in layout.edge.items():
        values[key] = torch.cat([part[key] for part in parts], dim).index_select(dim, edge_order)
    all_ids = torch.cat(graph_ids)

    def merged_slices(sizes: list[Tensor]) -> Tensor:  # each part's per-graph sizes, in order
        per_graph = torch.zeros(all_ids.numel(), dtype=torch.long)
        per_graph[all_ids] = torch.cat(sizes)
        return host_offsets(per_graph)

    graph_slices = {"__graphs__": all_ids}
    for key, graph_dim in layout.graph.items():
        sizes = [collation_slices(part)[key].diff() for part in parts]
        row_graph = torch.cat(
            [
                torch.repeat_interleave(g, s, output_size=host_total(s))
                for g, s in zip(graph_ids, sizes, strict=True)
            ]
        )
        graph_slices[key] = merged_slices(sizes)
        joined = (
            [v for part in parts for v in part[key]]
            if graph_dim is None
            else torch.cat([part[key] for part in parts], graph_dim)
        )
        values[key] = _take(joined, graph_dim, torch.argsort(row_graph, stable=True))
    part_slices = [node_edge_slices(part) for part in parts]
    node_slices = merged_slices([nodes.diff() for nodes, _ in part_slices])
    edge_slices = merged_slices([edges.diff() for _, edges in part_slices])
    edge_index = rows_at(inverse, edge_columns(edges, edge_order).view(-1)).view(2, -1)
    batch_vector = rows_at(node_graph, node_order)
    return assemble(
        batch,
        layout,
        values,
        edge_index=edge_index,
        edge_slices=edge_slices,
        batch_vector=batch_vector,
        node_slices=node_slices,
        graph_slices=graph_slices,
    )


def merge_sorted(first: Tensor, second: Tensor, num_graphs: int) -> tuple[Tensor, Tensor]:
    """Positions that interleave two graph-ascending sequences into one, graph by graph, with
    ``first``'s items before ``second``'s (a merge without sorting).

    Shape:
        first: ``(a,)``, second: ``(b,)`` graph ids, ascending; returns ``(a,)``, ``(b,)``.
    """
    ptr_first, ptr_second = group_ptr(first, num_graphs), group_ptr(second, num_graphs)
    arange_first = torch.arange(first.numel(), device=first.device)
    arange_second = torch.arange(second.numel(), device=first.device)
    position_first = arange_first + rows_at(ptr_second, first)
    position_second = arange_second + rows_at(ptr_first, second + 1)
    return position_first, position_second
