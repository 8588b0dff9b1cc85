"""Which task a target gets: only 0/1 labels are guessed as classes; ``--task`` overrides."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("rdkit")
from rdkit import Chem

from graphcl.commands import finetune, pretrain, probe
from graphcl.data import load_molecules
from graphcl.tasks import choose_task, infer_task

NAN = math.nan
TINY = [
    "--device",
    "cpu",
    "--num-layers",
    "2",
    "--hidden",
    "16",
    "--epochs",
    "1",
    "--seeds",
    "0",
    "--batch-size",
    "16",
    "--flips",
    "1",
]


def test_only_zero_one_labels_are_guessed_as_classification() -> None:
    train = torch.arange(4)
    count = torch.tensor([[0.0], [3.0], [6.0], [2.0]])  # a count 0..6: not 7 classes
    scores = torch.tensor([[0.0], [3.0], [9.0], [3.0]])  # {0, 3, 9}: not 10 classes
    for targets in (count, scores):
        assert infer_task(targets, train).kind == "regression"
        assert choose_task(targets)[0] == "regression"
    binary = torch.tensor([[0.0, 1.0], [1.0, NAN], [NAN, 0.0], [1.0, 1.0]])  # 2 tasks, missing
    assert infer_task(binary, train)[:2] == ("binary", 2)
    assert choose_task(binary) == ("classification", choose_task(binary)[1])
    assert "0 or 1" in choose_task(binary)[1]
    assert infer_task(torch.tensor([[0.5], [1.0], [2.0], [0.0]]), train).kind == "regression"


def test_the_hint_and_the_documented_task_win_over_the_guess() -> None:
    train = torch.arange(4)
    count = torch.tensor([[0.0], [3.0], [6.0], [2.0]])
    assert infer_task(count, train, "classification")[:2] == ("multiclass", 7)
    assert infer_task(torch.tensor([[0.0], [1.0]]), train[:2], "regression").kind == "regression"
    assert choose_task(count, "classification")[0] == "classification"
    assert choose_task(count, "auto", "classification")[0] == "classification"  # class names
    assert choose_task(torch.tensor([[0.0], [1.0]]), "auto", "regression")[0] == "regression"
    with pytest.raises(ValueError, match="ranking"):
        choose_task(count, "ranking")
    with pytest.raises(ValueError, match="0/1 labels"):
        infer_task(torch.tensor([[0.0, 2.0], [1.0, 0.0]]), train[:2], "classification")


def _csv(path: Path, count: int = 60) -> Path:
    """FreeSolv molecules with an integer count (hetero atoms, 0..6+) and a 0/1 label (a ring)."""
    lines = ["smiles,hetero,ring"]
    for smiles in load_molecules("freesolv").smiles[:count]:
        mol = Chem.MolFromSmiles(smiles)
        hetero = sum(atom.GetSymbol() not in ("C", "H") for atom in mol.GetAtoms())
        lines.append(f"{smiles},{hetero},{int(mol.GetRingInfo().NumRings() > 0)}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _finetune(data: Path, target: str, out: Path, *extra: str) -> dict[str, Any]:
    return finetune.main(
        [*TINY, "--data", str(data), "--target", target, "--out", str(out), *extra]
    )


def test_finetune_an_integer_count_as_regression_and_01_labels_as_classes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _csv(tmp_path / "mols.csv")
    values = {int(line.split(",")[1]) for line in data.read_text().splitlines()[1:]}
    assert len(values) > 2  # a real count, not a 0/1 label
    counted = _finetune(data, "hetero", tmp_path / "count")
    assert "scratch/final_rmse" in counted and "scratch/final_roc_auc" not in counted
    assert "task regression for hetero: integral targets" in capsys.readouterr().out
    labelled = _finetune(data, "ring", tmp_path / "ring")
    assert "scratch/final_roc_auc" in labelled and "scratch/final_rmse" not in labelled
    assert "task classification for ring: every label is 0 or 1" in capsys.readouterr().out


def test_task_flag_overrides_the_guess(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _csv(tmp_path / "mols.csv")
    classes = _finetune(data, "hetero", tmp_path / "cls", "--task", "classification")
    assert "scratch/final_accuracy" in classes and "scratch/final_rmse" not in classes
    assert "requested with --task classification" in capsys.readouterr().out
    numbers = _finetune(data, "ring", tmp_path / "reg", "--task", "regression")
    assert "scratch/final_rmse" in numbers and "scratch/final_roc_auc" not in numbers


def test_probe_takes_the_same_task(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _csv(tmp_path / "mols.csv", 40)
    tiny = ["--device", "cpu", "--num-layers", "2", "--hidden", "16", "--batch-size", "16"]
    pretrain.main([*tiny, "--data", str(data), "--epochs", "1", "--out", str(tmp_path / "pre")])
    encoder = str(tmp_path / "pre" / "encoder.safetensors")
    argv = ["--encoder", encoder, "--data", str(data), "--device", "cpu", "--split", "random"]
    counted = probe.main([*argv, "--target", "hetero", "--out", str(tmp_path / "p1")])
    assert "pretrained/hetero/ridge_rmse" in counted
    assert "task regression for hetero" in capsys.readouterr().out
    ring = probe.main([*argv, "--target", "ring", "--out", str(tmp_path / "p2")])
    assert "pretrained/ring/svm_accuracy" in ring
