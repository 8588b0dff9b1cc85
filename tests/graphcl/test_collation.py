"""graphcl.collation against PyG's own collation: the PyG internals it reads and writes.

``graphcl.collation`` is the one module that touches PyG's private ``Batch`` attributes
(``_slice_dict``, ``_inc_dict``, ``_num_graphs`` and the store's ``_num_nodes``). These tests
pin what it reads and what a rebuilt batch carries against ``Batch.from_data_list`` on the
same graphs: the same slices, increments, ``num_nodes`` (per graph too) and number of graphs,
and a ``to_data_list`` round trip. A PyG release that changes its private layout fails here.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch_geometric.data import Batch, Data

from graphcl import collation
from graphcl.augment import drop_nodes, identity, random_choice, subgraph
from graphcl.batching import select_graphs
from tests.graphcl.test_augment import gen, graph


def _graphs(num_nodes: bool) -> list[Data]:
    graphs = [
        graph(4, [(0, 1), (1, 2), (2, 3)], tag=1),
        graph(1, [], tag=2),
        graph(6, [(0, 1), (1, 2), (2, 0), (3, 4)], tag=3),
        graph(3, [(0, 1), (1, 2), (0, 2)], tag=4),
    ]
    if num_nodes:
        for g in graphs:
            g.num_nodes = g.x.size(0)
    return graphs


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if a is None or b is None:
            return a is None and b is None
        return bool(a.shape == b.shape and torch.equal(a, b))
    return bool(a == b)


def assert_same_collation(ours: Batch, reference: Batch) -> None:
    """Everything PyG keeps for splitting a batch, equal to ``Batch.from_data_list``'s."""
    assert _equal(collation.collation_slices(ours), reference._slice_dict)
    assert _equal(collation.collation_slices(ours), ours._slice_dict)
    increments, expected = collation.collation_increments(ours), reference._inc_dict
    assert increments.keys() == expected.keys()
    for key, value in expected.items():
        mine = increments[key]
        assert (mine is None) == (value is None), key
        if value is not None:  # zeros of another shape are fine for non-index attributes
            assert torch.equal(mine.view(-1), value.view(-1)) or not bool(value.any()), key
    assert torch.equal(ours._inc_dict["edge_index"].view(-1), expected["edge_index"].view(-1))
    assert ours.num_graphs == reference.num_graphs == ours._num_graphs
    assert ours.num_nodes == reference.num_nodes
    assert collation.keeps_node_counts(ours) == collation.keeps_node_counts(reference)
    if collation.keeps_node_counts(reference):
        assert list(ours._store._num_nodes) == list(reference._store._num_nodes)
    assert torch.equal(ours.ptr, reference.ptr) and torch.equal(ours.batch, reference.batch)
    for a, b in zip(ours.to_data_list(), reference.to_data_list(), strict=True):
        assert a.keys() == b.keys()
        for key in a.keys():
            assert _equal(a[key], b[key]), key


@pytest.mark.parametrize("num_nodes", [False, True], ids=["inferred", "stored"])
def test_readers_see_what_from_data_list_stores(num_nodes: bool) -> None:
    graphs = _graphs(num_nodes)
    batch = Batch.from_data_list(graphs)
    assert collation.is_collated(batch)
    assert not collation.is_collated(graphs[0]) and not collation.is_collated(Batch())
    nodes = torch.tensor([0, *torch.tensor([g.num_nodes for g in graphs]).cumsum(0).tolist()])
    edges = torch.tensor([0, *torch.tensor([g.num_edges for g in graphs]).cumsum(0).tolist()])
    node_slices, edge_slices = collation.node_edge_slices(batch)
    assert torch.equal(node_slices, nodes) and torch.equal(edge_slices, edges)
    slices = collation.collation_slices(batch)
    assert torch.equal(slices["x"], nodes) and torch.equal(slices["pos"], nodes)
    assert torch.equal(slices["edge_attr"], edges) and torch.equal(slices["edge_index"], edges)
    assert torch.equal(slices["labels"], torch.arange(5) * 3)  # 3 rows per graph
    assert torch.equal(slices["y"], torch.arange(5))
    increments = collation.collation_increments(batch)
    assert torch.equal(increments["edge_index"].view(-1), nodes[:-1])
    assert all(
        value is None or not bool(value.any())
        for key, value in increments.items()
        if key != "edge_index"
    )
    assert all(value.device.type == "cpu" for value in slices.values())
    assert collation.keeps_node_counts(batch) == num_nodes
    layout = collation.batch_layout(batch)
    assert set(layout.node) == {"x", "pos"} and set(layout.edge) == {"edge_attr"}
    assert set(layout.graph) == {"y", "labels", "smiles"} and layout.graph["smiles"] is None


@pytest.mark.parametrize("num_nodes", [False, True], ids=["inferred", "stored"])
@pytest.mark.parametrize("kept", [[0, 2], [1], [1, 3], [0, 1, 2, 3]])
def test_a_selected_sub_batch_equals_collating_its_graphs(num_nodes: bool, kept: list[int]) -> None:
    """Writers: set_collation, set_node_counts and the slices of a rebuilt batch."""
    graphs = _graphs(num_nodes)
    batch = Batch.from_data_list(graphs)
    chosen = torch.tensor(sorted(kept))
    node_mask = torch.isin(batch.batch, chosen)
    ours = select_graphs(batch, collation.batch_layout(batch), node_mask, chosen)
    assert_same_collation(ours, Batch.from_data_list([graphs[i] for i in chosen.tolist()]))


@pytest.mark.parametrize("num_nodes", [False, True], ids=["inferred", "stored"])
@pytest.mark.parametrize("augmentation", [drop_nodes, subgraph, identity, "random"])
def test_an_augmented_batch_equals_collating_its_graphs(num_nodes: bool, augmentation: Any) -> None:
    """A view (nodes dropped, graphs split and merged again) carries exactly the collation
    metadata that collating its own graphs gives."""
    batch = Batch.from_data_list(_graphs(num_nodes) * 3)
    if augmentation == "random":
        view = random_choice([drop_nodes, subgraph], batch, 0.4, generator=gen(0))
    else:
        view = augmentation(batch, 0.4, generator=gen(0))
    assert_same_collation(view, Batch.from_data_list(view.to_data_list()))


def test_replace_slices_leaves_the_source_batch_alone() -> None:
    batch = Batch.from_data_list(_graphs(False))
    out = batch.clone()
    new = torch.tensor([0, 2, 2, 4, 6])
    collation.replace_slices(out, {"edge_index": new})
    assert torch.equal(out._slice_dict["edge_index"], new)
    assert torch.equal(batch._slice_dict["edge_index"], torch.tensor([0, 6, 6, 14, 20]))
    assert torch.equal(out._slice_dict["x"], batch._slice_dict["x"])
