"""The shard store of featurised molecules (graphcl.shards): the flat arrays give back the graphs
featurize makes, collate gives back Batch.from_data_list's batch, an interrupted build resumes
from its finished shards, a damaged shard is found and rebuilt, never read."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch_geometric.data import Batch, Data

from graphcl import shards
from graphcl.collation import collation_increments, collation_slices
from graphcl.data import collate_graphs, load_molecules
from graphcl.features import featurize
from graphcl.sharded import ShardedGraphs, open_store
from graphcl.shards import build_store, verify_shard

# aromatic rings, charges, stereo, a lone atom (no edges), two fragments, explicit H, a halogen,
# and three rows that do not parse (bad valence, unclosed ring, empty)
SMILES = [
    "CCO",
    "c1ccccc1N",
    "C",
    "[NH4+]",
    "C[C@H](N)C(=O)O",
    "CC(=O)[O-].[Na+]",
    "F/C=C/F",
    "[2H]OC",
    "ClC1=CC=CC=C1Br",
    "C1CC1C(F)(F)F",
    "CN(C)(C)(C)C",
    "c1cc(O)ccc1C2CC2",
    "C1CC",
    "",
    "O=C1NC(=O)c2ccccc21",
    "S(=O)(=O)(N)c1ccc(cc1)C(=O)O",
    "[Cl-]",
]
GOOD = [s for s in SMILES if featurize(s) is not None]


def _build(folder: Path, texts: list[str] = SMILES, **kwargs: Any) -> shards.BuildStats:
    lines = list(range(2, len(texts) + 2))
    options: dict[str, Any] = {"per_shard": 5, "workers": 1, "progress": False, **kwargs}
    return build_store(folder, texts, lines, "rows.csv", "pyg", **options)


def _same_graph(a: Data, b: Data) -> None:
    assert a.smiles == b.smiles and a.num_nodes == b.num_nodes
    for key in ("x", "edge_index", "edge_attr"):
        assert a[key].dtype == b[key].dtype == torch.long, key
        assert torch.equal(a[key], b[key]), key


def _same_batch(ours: Batch, reference: Batch) -> None:
    assert set(ours.keys()) == set(reference.keys())
    for key in ("x", "edge_index", "edge_attr", "batch", "ptr"):
        assert ours[key].dtype == reference[key].dtype, key
        assert torch.equal(ours[key], reference[key]), key
    assert ours.smiles == reference.smiles
    assert ours.num_graphs == reference.num_graphs and ours.num_nodes == reference.num_nodes
    assert ours._store._num_nodes == reference._store._num_nodes
    ref_slices, ref_incs = collation_slices(reference), collation_increments(reference)
    assert collation_slices(ours).keys() == ref_slices.keys()
    for key, value in ref_slices.items():
        assert torch.equal(collation_slices(ours)[key], value), key
    for key, value in ref_incs.items():
        mine = collation_increments(ours)[key]
        assert (mine is None) == (value is None), key
        if value is not None:
            assert mine is not None and torch.equal(mine, value), key


@pytest.fixture
def store(tmp_path: Path) -> ShardedGraphs:
    _build(tmp_path / "store")
    graphs, _ = open_store(tmp_path / "store")
    return graphs


def test_store_holds_the_graphs_featurize_makes_and_lists_what_failed(tmp_path: Path) -> None:
    stats = _build(tmp_path / "store")
    assert (stats.built, stats.reused, stats.molecules) == (4, 0, len(GOOD))  # 17 rows, 5/shard
    graphs, skipped = open_store(tmp_path / "store")
    assert len(graphs) == len(GOOD)
    for graph, text in zip(graphs, GOOD, strict=True):
        expected = featurize(text)
        assert expected is not None
        _same_graph(graph, expected)
    # the failures, where they are (line = row + 2, after a header) and why
    assert [(where, text) for where, text, _ in skipped] == [
        ("rows.csv:12", "CN(C)(C)(C)C"),
        ("rows.csv:14", "C1CC"),
        ("rows.csv:15", ""),
    ]
    assert "valence" in skipped[0][2].lower() and skipped[2][2].startswith("missing SMILES")
    assert list(graphs.smiles) == [g.smiles for g in graphs]
    assert graphs[-1].smiles == graphs.smiles[-1] == graphs[len(graphs) - 1].smiles
    with pytest.raises(IndexError):
        graphs[len(graphs)]


def test_arrays_are_memory_mapped_in_the_smallest_unsigned_type(tmp_path: Path) -> None:
    _build(tmp_path / "store")
    meta = json.loads((tmp_path / "store" / "shard-00000" / "meta.json").read_text())
    assert meta["files"]["x"]["dtype"] == "|u1"  # atom codes fit one byte
    assert meta["files"]["node_ptr"]["dtype"] == "<i8"
    x = np.load(tmp_path / "store" / "shard-00000" / "x.npy", mmap_mode="r")
    assert isinstance(x, np.memmap)


@pytest.mark.parametrize("positions", [[0, 1, 2], [5, 2, 2, 0, 13], list(range(14))[::-1]])
def test_collate_equals_batch_from_data_list(store: ShardedGraphs, positions: list[int]) -> None:
    """Oracle: PyG's own collation of the graphs the store gives back one by one."""
    reference = Batch.from_data_list([store[i] for i in positions])
    ours = store.collate(positions)
    _same_batch(ours, reference)
    # and it splits back into the same graphs
    for mine, theirs in zip(ours.to_data_list(), reference.to_data_list(), strict=True):
        _same_graph(mine, theirs)


def test_subset_views_and_collate_graphs_of_a_store(store: ShardedGraphs) -> None:
    view = store.subset([7, 3, 9])
    assert len(view) == 3 and [g.smiles for g in view] == [store[i].smiles for i in (7, 3, 9)]
    _same_batch(view.collate([2, 0]), Batch.from_data_list([store[9], store[7]]))
    _same_batch(collate_graphs(store[4:8]), Batch.from_data_list([store[i] for i in range(4, 8)]))


def test_a_store_equals_the_in_memory_path_on_the_same_file(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text("smiles\n" + "\n".join(f'"{s}"' for s in SMILES) + "\n")
    memory = load_molecules(path, cache_dir=False)
    _build(tmp_path / "store")
    graphs, skipped = open_store(tmp_path / "store")
    assert len(graphs) == len(memory.graphs)
    for ours, theirs in zip(graphs, memory.graphs, strict=True):
        _same_graph(ours, theirs)
    assert [(w, t) for w, t, _ in skipped] == [(w, t) for w, t, _ in memory.skipped]
    _same_batch(graphs.collate(range(len(graphs))), collate_graphs(memory.graphs))


def test_an_interrupted_build_resumes_from_its_finished_shards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "store"
    real = shards._featurise_rows
    calls: list[str] = []

    def dies_on_the_third(texts: list[str], *args: Any) -> Any:
        calls.append(texts[0])
        if len(calls) == 3:
            raise KeyboardInterrupt  # the user's ^C, mid-build
        return real(texts, *args)

    monkeypatch.setattr(shards, "_featurise_rows", dies_on_the_third)
    with pytest.raises(KeyboardInterrupt):
        _build(folder)
    finished = sorted(p.name for p in folder.glob("shard-*"))
    assert finished == ["shard-00000", "shard-00001"]
    assert not list(folder.glob(".shard-*"))  # no half-written shard left behind
    with pytest.raises(ValueError, match="shard-00002 is missing"):
        open_store(folder)
    calls.clear()
    monkeypatch.setattr(shards, "_featurise_rows", real)
    stats = _build(folder)
    assert (stats.built, stats.reused, stats.damaged) == (2, 2, ())
    graphs, _ = open_store(folder)
    assert [g.smiles for g in graphs] == [featurize(s).smiles for s in GOOD]  # type: ignore[union-attr]


def test_a_partial_shard_of_a_killed_build_is_removed(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    _build(folder)
    stale = folder / ".shard-00001.partial-deadbeef"
    stale.mkdir()
    (stale / "x.npy").write_bytes(b"half")
    assert _build(folder).built == 0
    assert not stale.exists()


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        ("flip", "x.npy does not match its digest"),
        ("truncate", "edge_attr.npy does not match its digest"),
        ("delete", "smiles.npy is missing"),
        ("meta", "meta.json is unreadable"),
    ],
)
def test_a_damaged_shard_is_detected_never_read_and_rebuilt(
    tmp_path: Path, damage: str, reason: str
) -> None:
    folder = tmp_path / "store"
    _build(folder)
    before, _ = open_store(folder)
    reference = before.collate(range(len(before)))  # read now: the damage rewrites the files
    shard = folder / "shard-00001"
    if damage == "flip":  # one bit of one atom's features: the shapes are still right
        data = bytearray((shard / "x.npy").read_bytes())
        data[-3] ^= 0x01
        (shard / "x.npy").write_bytes(bytes(data))
    elif damage == "truncate":
        (shard / "edge_attr.npy").write_bytes((shard / "edge_attr.npy").read_bytes()[:-4])
    elif damage == "delete":
        (shard / "smiles.npy").unlink()
    else:
        (shard / "meta.json").write_text("{not json")
    assert verify_shard(shard, (5, 10)).startswith(reason)
    with pytest.raises(ValueError, match=f"shard-00001 is {reason}"):
        open_store(folder)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stats = _build(folder)
    assert stats.damaged == ("shard-00001",) and (stats.built, stats.reused) == (1, 3)
    assert any("shard-00001 is damaged" in str(w.message) for w in caught)
    after, _ = open_store(folder)
    _same_batch(after.collate(range(len(after))), reference)


def test_worker_processes_build_the_same_store(tmp_path: Path) -> None:
    alone = _build(tmp_path / "one", workers=1)
    pooled = _build(tmp_path / "two", workers=2)
    assert math.isnan(alone.worker_peak_rss_mib)  # no worker ran: no worker's memory to report
    assert pooled.worker_peak_rss_mib > 0
    one, skipped_one = open_store(tmp_path / "one")
    two, skipped_two = open_store(tmp_path / "two")
    assert skipped_one == skipped_two
    _same_batch(two.collate(range(len(two))), one.collate(range(len(one))))
    for name in ("x", "edge_index", "node_ptr", "smiles"):
        for shard in ("shard-00000", "shard-00003"):
            a = np.load(tmp_path / "one" / shard / f"{name}.npy")
            b = np.load(tmp_path / "two" / shard / f"{name}.npy")
            assert a.dtype == b.dtype and np.array_equal(a, b)


def test_an_unknown_layout_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown feature layout 'tu'"):
        build_store(tmp_path, ["C"], [2], "rows.csv", "tu", progress=False)
