"""The MOSES sources (1.58 M ZINC molecules from the molsets wheel) through the shard store:
a seeded subset, featurised once and reused, through load_molecules and graphcl pretrain."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from graphcl import moses
from graphcl.commands import pretrain
from graphcl.data import load_molecules, subset_molecules
from graphcl.features import featurize
from graphcl.moses import MOSES, moses_file, read_moses_rows, store_line
from graphcl.sharded import ShardedGraphs

installed = pytest.mark.skipif(
    importlib.util.find_spec("moses") is None,
    reason="molsets is not installed (make's setup installs it: pip install --no-deps "
    "molsets==0.3.1)",
)


@installed
def test_the_moses_files_hold_the_published_row_counts() -> None:
    # Polykovskiy et al. 2020: 1,584,663 train, 176,074 test, 176,226 scaffold-test molecules
    # (the scaffold file holds 176,225 rows after its header)
    expected = {"moses": 1_584_663, "moses-test": 176_074, "moses-scaffolds": 176_225}
    for name in ("moses-test", "moses-scaffolds"):
        assert len(read_moses_rows(moses_file(name))) == expected[name]
    assert set(MOSES) == set(expected)


@installed
def test_a_seeded_subset_is_featurised_once_then_read_back(tmp_path: Path) -> None:
    first = load_molecules("moses-test", max_molecules=300, seed=3, cache_dir=tmp_path)
    assert isinstance(first.graphs, ShardedGraphs)
    assert len(first.graphs) + len(first.skipped) == 300
    assert first.targets is None and first.task is None and first.name == "moses-test"
    assert first.store is not None and first.store["shards_built"] == 1
    rows = read_moses_rows(moses_file("moses-test"))
    # the graphs are featurize's of the rows of numpy's seeded draw, in file order
    drawn = np.sort(np.random.default_rng(3).choice(len(rows), size=300, replace=False))
    expected = [g for g in (featurize(rows[i]) for i in drawn.tolist()) if g is not None]
    assert [g.smiles for g in expected] == list(first.smiles)
    for ours, theirs in zip(first.graphs, expected, strict=True):
        assert torch.equal(ours.x, theirs.x) and torch.equal(ours.edge_attr, theirs.edge_attr)
    again = load_molecules("moses-test", max_molecules=300, seed=3, cache_dir=tmp_path)
    assert again.store is not None and again.store["shards_built"] == 0
    assert again.store["shards_reused"] == 1 and again.store["folder"] == first.store["folder"]
    assert list(again.smiles) == list(first.smiles)
    assert "all found finished" in store_line(again.store)
    other = load_molecules("moses-test", max_molecules=300, seed=4, cache_dir=tmp_path)
    assert list(other.smiles) != list(first.smiles)
    assert other.store is not None and other.store["folder"] != first.store["folder"]


def test_without_molsets_one_line_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps molsets==0\.3\.1"):
        load_molecules("moses", max_molecules=10, cache_dir=False)
    assert moses.MOSES_INSTALL == "pip install --no-deps molsets==0.3.1"


def test_moses_has_no_targets_to_ask_for() -> None:
    with pytest.raises(ValueError, match="moses holds SMILES only"):
        load_molecules("moses", targets=["logp"], cache_dir=False)


def test_subset_of_an_in_memory_set_is_seeded_and_keeps_targets_aligned(tmp_path: Path) -> None:
    data = load_molecules("freesolv", cache_dir=tmp_path)
    part = subset_molecules(data, 100, seed=1)
    assert len(part.graphs) == len(part.smiles) == 100
    assert part.targets is not None and data.targets is not None
    for graph, smiles, target in zip(part.graphs, part.smiles, part.targets, strict=True):
        i = data.smiles.index(smiles)
        assert graph is data.graphs[i] and float(target[0]) == float(data.targets[i, 0])
    assert list(subset_molecules(data, 100, seed=1).smiles) == list(part.smiles)
    assert list(subset_molecules(data, 100, seed=2).smiles) != list(part.smiles)
    assert subset_molecules(data, 10_000, seed=1) is data
    assert load_molecules("freesolv", cache_dir=tmp_path, max_molecules=100, seed=1).smiles == (
        part.smiles
    )


@installed
def test_pretrain_on_moses_reports_its_store_and_reuses_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CONTRASTKIT_CACHE", str(tmp_path / "cache"))
    argv = ["--data", "moses", "--max-molecules", "200", "--quick", "--batch-size", "64"]
    argv += ["--max-steps", "2", "--device", "cpu"]
    summary = pretrain.main([*argv, "--out", str(tmp_path / "first")])
    assert summary["molecules"] + summary["skipped"] == 200 and summary["steps"] == 2
    assert summary["store"]["shards_built"] == 1
    assert "molecule store: 200 rows in 1 shards (1 built now" in capsys.readouterr().out
    written = json.loads((tmp_path / "first" / "summary.json").read_text())
    assert written["store"]["rows"] == 200
    second = pretrain.main([*argv, "--out", str(tmp_path / "second")])
    assert second["store"]["shards_reused"] == 1 and second["store"]["shards_built"] == 0
    assert "all found finished" in capsys.readouterr().out
    assert (tmp_path / "second" / "encoder.safetensors").is_file()
