"""The prepared GPU check (benchmarks/gpu_check.sh) runs on the CPU at tiny sizes, so it cannot rot.

The dry run is the same script as the GPU run: every part builds its pipeline with the
pipeline's own ``build`` and steps it with the updater its CLI uses, with rdkit, datamol and
kornia hidden as on the lent GPU machines.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = (
    "## Environment",
    "## Throughput",
    "## Losses",
    "## Host syncs",
    "## Tests (pytest -m cuda)",
    "## Parts",
)
SYNC_PIPELINES = {
    "imagecl simclr",
    "imagecl supcon",
    "imagecl clae",
    "imagecl loco",
    "contragan",
    "graphcl",
}


def _gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks/gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up while being made
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    out = tmp_path_factory.mktemp("gpu_check")
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks/gpu_check.sh"), "--dry-run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "gpu_check.json").read_text(encoding="utf-8"))
    return report, (out / "gpu_check.md").read_text(encoding="utf-8")


def test_dry_run_runs_every_part_and_writes_every_section(
    dry_run: tuple[dict[str, Any], str],
) -> None:
    report, markdown = dry_run
    for section in SECTIONS:
        assert section in markdown, section
    gpu_check = _gpu_check()
    parts = report["parts"]
    assert list(parts) == list(gpu_check.PARTS)  # in order of importance
    status = {name: part["status"] for name, part in parts.items()}
    assert status == {**dict.fromkeys(gpu_check.PARTS, "ok"), "simclr_compile": "skipped"}
    # as on the GPU machines: the check needed none of the packages they lack
    assert report["environment"]["packages"] == {"rdkit": False, "datamol": False, "kornia": False}


def test_dry_run_measures_every_pipeline_and_loss(dry_run: tuple[dict[str, Any], str]) -> None:
    report, _ = dry_run
    parts = {name: part["result"] for name, part in report["parts"].items()}
    sizes = report["sizes"]
    for name, items in (("simclr", sizes["image_batch"]), ("graphcl", sizes["graph_batch"])):
        result = parts[name]
        assert result["per_s"] == pytest.approx(items * 1000 / result["step_ms"], rel=0.01)
    assert 0 < parts["graphcl"]["augment_share"]
    rows = parts["losses"]["rows"]
    names = list(_gpu_check().loss_cases())
    assert [(r["loss"], r["N"]) for r in rows] == [
        (n, N) for N in sizes["loss_sizes"] for n in names
    ]
    for row in rows:
        assert "error" not in row, row
        if "floor_ms" in row:
            assert row["ratio"] == pytest.approx(row["ms"] / row["floor_ms"], rel=0.01, abs=0.01)
    assert {r["loss"] for r in rows if "floor_ms" not in r} == {"triplet", "generalized"}


def test_dry_run_counts_syncs_and_runs_a_cuda_test(dry_run: tuple[dict[str, Any], str]) -> None:
    report, _ = dry_run
    syncs = report["parts"]["syncs"]["result"]
    assert set(syncs) == SYNC_PIPELINES
    for name, result in syncs.items():
        assert "error" not in result, (name, result)
        assert result["passed"] == (result["syncs_per_step"] == 0), (name, result)
    assert report["parts"]["pytest"]["result"]["counts"] == {"passed": 1}


@pytest.mark.parametrize(
    ("output", "counts"),
    [
        ("..\n3 passed, 1 failed, 2 skipped in 4.50s\n", {"passed": 3, "failed": 1, "skipped": 2}),
        ("ERROR collecting: no rdkit\n1 error in 0.10s\n", {"error": 1}),
        ("= 2 passed, 5 deselected, 2 errors in 1s =", {"passed": 2, "deselected": 5, "error": 2}),
        ("collecting ... interrupted\n", {}),
    ],
)
def test_pytest_counts_reads_the_closing_line(output: str, counts: dict[str, int]) -> None:
    assert _gpu_check().pytest_counts(output) == counts


def test_prepared_molecules_load_back_as_featurised(tmp_path: Path) -> None:
    pytest.importorskip("rdkit")
    pytest.importorskip("datamol")
    from graphcl.data import load_molecules

    gpu_check = _gpu_check()
    path = tmp_path / "molecules.pt"
    gpu_check.prepare(path)
    loaded = gpu_check.load_inputs(path)
    original = load_molecules("bundled", layout="pyg")
    assert len(loaded.graphs) == len(original.graphs)
    for i in (0, 1, len(original.graphs) // 2, len(original.graphs) - 1):
        a, b = loaded.graphs[i], original.graphs[i]
        assert a.num_nodes == b.num_nodes
        for key in ("x", "edge_index", "edge_attr"):
            assert a[key].dtype == torch.long
            torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)
