"""PyG's collation metadata of a ``Batch``: the one module that reads or writes PyG internals.

``Batch.from_data_list`` keeps, beside the tensors, what splits a batch back into its graphs
(``get_example``, ``to_data_list``, ``index_select``): per attribute the slices ``(G + 1,)``
of its rows, per attribute the increments ``(G, ...)`` added on collation (``edge_index``:
the nodes of the earlier graphs), the number of graphs, and, for graphs that stored
``num_nodes``, the per-graph node counts. PyG keeps them in private attributes, always on the
CPU. A batch rebuilt by an augmentation must carry them again, so they are read and written
here alone, behind public functions, with :func:`batch_layout`, which tells node-, edge- and
graph-level attributes apart by their slices; ``tests/graphcl/test_collation.py`` pins what these
functions see and write against ``Batch.from_data_list`` itself, so a PyG release that
changes the private layout fails there first.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch_geometric.data import Batch

from graphcl.indexing import host_list

__all__ = [
    "Layout",
    "batch_layout",
    "collation_increments",
    "collation_slices",
    "is_collated",
    "keeps_node_counts",
    "node_edge_slices",
    "remember_layout",
    "replace_slices",
    "set_collation",
    "set_node_counts",
]


def is_collated(batch: Any) -> bool:
    """Whether ``batch`` is a ``Batch`` made by collation (it carries the slices)."""
    return isinstance(batch, Batch) and hasattr(batch, "_slice_dict")


def collation_slices(batch: Batch) -> dict[str, Tensor]:
    """Per attribute, the CPU slices ``(G + 1,)`` of its rows (along its cat dim).

    The batch's own dict: copy it before changing it.
    """
    slices: dict[str, Tensor] = batch._slice_dict
    return slices


def collation_increments(batch: Batch) -> dict[str, Tensor | None]:
    """Per attribute, the CPU increments ``(G, ...)`` added on collation (``None`` or zeros
    for attributes that are not indices; ``edge_index``: the nodes before each graph).

    The batch's own dict: copy it before changing it.
    """
    increments: dict[str, Tensor | None] = batch._inc_dict
    return increments


def node_edge_slices(batch: Batch) -> tuple[Tensor, Tensor]:
    """The node and the edge slices ``(G + 1,)`` of a collated batch, from its CPU metadata
    (``edge_index`` is incremented by the nodes of the earlier graphs)."""
    increments = batch._inc_dict["edge_index"].view(-1)  # (G,) nodes before each graph
    return torch.cat([increments, torch.tensor([batch.num_nodes])]), batch._slice_dict["edge_index"]


def keeps_node_counts(batch: Batch) -> bool:
    """Whether the batch's graphs stored ``num_nodes`` (then the batch keeps one count per
    graph, which :func:`set_node_counts` must update with the nodes)."""
    return "num_nodes" in batch._store


def set_node_counts(batch: Batch, sizes: list[int]) -> None:
    """Set ``num_nodes`` of a batch whose graphs stored it to ``sum(sizes)``, with its per-graph
    counts ``sizes`` (what ``to_data_list`` gives each graph)."""
    batch.num_nodes = sum(sizes)
    batch._store._num_nodes = sizes


def set_collation(
    batch: Batch,
    slices: dict[str, Tensor],
    increments: dict[str, Tensor | None],
    num_graphs: int,
) -> None:
    """Give ``batch`` (in place) the collation metadata of ``num_graphs`` graphs: ``slices``
    and ``increments`` per attribute, as :func:`collation_slices` and
    :func:`collation_increments` return them (CPU tensors)."""
    batch._slice_dict, batch._inc_dict, batch._num_graphs = slices, increments, num_graphs


def replace_slices(batch: Batch, updates: dict[str, Tensor]) -> None:
    """Replace (in place) the slices of some attributes of a batch, keeping the others: a new
    dict, so a batch it was copied from keeps its own."""
    batch._slice_dict = {**batch._slice_dict, **updates}


# --------------------------------------------------------------------------- layout


class Layout(NamedTuple):
    """Which attributes of a batch are node-, edge- or graph-level, with their cat dims."""

    node: dict[str, int]
    edge: dict[str, int]
    graph: dict[str, int | None]  # None: not a tensor (e.g. a list of SMILES)


# Where a batch made by this module keeps its layout (a ``_`` name: PyG keeps it out of the
# store), with the attribute names it was derived for.
LAYOUT_KEY = "_graphcl_layout"


def batch_layout(batch: Batch) -> Layout:
    """Classify the attributes of a collated batch by their collation slices: node-level when
    they equal the node slices, edge-level when they equal the edge slices, else graph-level.

    The slices are CPU metadata, compared for all the attributes at once; a batch made by
    :func:`graphcl.batching.assemble` carries its layout (:func:`remember_layout`), so nested
    augmentations do not derive it again.
    """
    if not is_collated(batch):
        raise ValueError(
            "expected a collated torch_geometric Batch (Batch.from_data_list or a DataLoader), "
            f"got {type(batch).__name__}"
        )
    if batch.edge_index is None:
        raise ValueError("the batch has no edge_index")
    names = frozenset(batch.keys())
    cached = batch.__dict__.get(LAYOUT_KEY)
    if cached is not None and cached[0] == names:
        layout: Layout = cached[1]
        return layout
    slices, incs = collation_slices(batch), collation_increments(batch)
    node_slices, edge_slices = node_edge_slices(batch)
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
    flags = torch.zeros(0, 3, dtype=torch.bool)  # (A, 3)
    if dims:
        flags = torch.stack(
            [_slice_flags(slices[key], incs.get(key), node_slices, edge_slices) for key in dims]
        )  # (A, 3)
    node: dict[str, int] = {}
    edge: dict[str, int] = {}
    for (key, dim), (is_node, is_edge, incremented) in zip(
        dims.items(), host_list(flags), strict=True
    ):
        if incremented:
            raise ValueError(
                f"attribute {key!r} is incremented on collation (an index); only "
                "edge_index is supported"
            )
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
    return Layout(node, edge, graph)


def _slice_flags(
    slices: Tensor, inc: Tensor | None, node_slices: Tensor, edge_slices: Tensor
) -> Tensor:
    """``(3,)`` bool, not read: the slices equal the node slices, the edge slices, and the
    attribute is incremented on collation."""
    incremented = torch.tensor(False) if inc is None else (inc != 0).any()
    return torch.stack(
        [_same_slices(slices, node_slices), _same_slices(slices, edge_slices), incremented]
    )


def _same_slices(slices: Tensor, reference: Tensor) -> Tensor:
    """Whether two CPU slice vectors are equal, as a 0-d bool tensor (no host read)."""
    if slices.shape != reference.shape:
        return torch.tensor(False)
    return (slices == reference).all()


def remember_layout(batch: Batch, layout: Layout) -> None:
    """Attach ``layout`` to a batch built from it, for :func:`batch_layout` to return."""
    batch.__dict__[LAYOUT_KEY] = (frozenset(batch.keys()), layout)
