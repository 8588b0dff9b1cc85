"""The seed-by-seed comparison of ``benchmarks/contragan_results.py`` (the table that says
whether a gap between two variants is larger than the seeds' spread)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def script() -> ModuleType:
    path = ROOT / "benchmarks" / "contragan_results.py"
    spec = importlib.util.spec_from_file_location("contragan_results", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["contragan_results"] = module
    spec.loader.exec_module(module)
    return module


def _runs(**by_seed: float) -> dict[int, dict[str, Any]]:
    return {int(seed[1:]): {"cas_acc": v, "fd": v} for seed, v in by_seed.items()}


def test_paired_uses_the_shared_seeds_only(script: ModuleType) -> None:
    ours = _runs(s0=0.90, s1=0.80, s2=1.00)  # seed 2 has no partner
    base = _runs(s0=0.85, s1=0.85, s3=0.10)
    mean, error, n, wins = script.paired(ours, base, "cas_acc", "higher")
    # differences +0.05 and -0.05: mean 0, std 0.05·√2, standard error 0.05
    assert n == 2 and wins == 1
    assert mean == pytest.approx(0.0, abs=1e-12)
    assert error == pytest.approx(0.05)


def test_paired_counts_wins_in_the_figure_s_direction(script: ModuleType) -> None:
    ours = _runs(s0=1.0, s1=2.0, s2=3.0)
    base = _runs(s0=2.0, s1=2.0, s2=2.0)  # ours is lower, equal, higher
    assert script.paired(ours, base, "fd", "lower")[3] == 2  # lower and equal
    assert script.paired(ours, base, "cas_acc", "higher")[3] == 2  # equal and higher
    mean, error, n, _ = script.paired(ours, base, "fd", "lower")
    assert (mean, n) == (0.0, 3) and error == pytest.approx(1 / math.sqrt(3))


def test_paired_with_one_seed_has_no_error_bar(script: ModuleType) -> None:
    assert script.paired(_runs(s4=0.7), _runs(s4=0.5), "cas_acc", "higher")[:3] == (
        pytest.approx(0.2),
        0.0,
        1,
    )


def test_paired_refuses_what_it_cannot_compare(script: ModuleType) -> None:
    with pytest.raises(ValueError, match="no seed in common"):
        script.paired(_runs(s0=1.0), _runs(s1=1.0), "cas_acc", "higher")
    with pytest.raises(ValueError, match="'higher' or 'lower'"):
        script.paired(_runs(s0=1.0), _runs(s0=1.0), "cas_acc", "up")


def test_the_paired_table_needs_proj_and_names_every_partner(script: ModuleType) -> None:
    figures = {
        "gan_test_acc": 0.9,
        "cas_acc": 0.9,
        "fd": 1.0,
        "precision": 0.9,
        "recall": 0.8,
        "density": 1.0,
        "coverage": 0.9,
    }
    assert script._paired_lines("digits", {"contra": {0: figures}}) == []
    lines = script._paired_lines(
        "digits",
        {
            "contra": {0: figures, 1: figures},
            "ac": {7: figures},  # no seed shared with ProjGAN: left out
            "proj": {0: {**figures, "cas_acc": 0.95}, 1: figures},
        },
    )
    assert "| figure | better | contra |" in lines
    cas = next(line for line in lines if line.startswith("| cas_acc |"))
    assert "-0.0250 ± 0.0250 (1/2)" in cas
    rows = [line.split(" |")[0].removeprefix("| ") for line in lines if line.startswith("| ")]
    assert rows[1:] == [*figures]  # after the header: every figure, diversity's two included


def test_more_generated_sets_evaluate_into_their_own_folder(script: ModuleType) -> None:
    # one set keeps the folder earlier tables were read from; more sets never overwrite it
    def folder(eval_seeds: int, cas_samples: str = "test") -> str:
        args = SimpleNamespace(eval_seeds=eval_seeds, cas_samples=cas_samples)
        return str(script._evaluation_folder(args))

    assert folder(1) == "evaluation"
    assert folder(3) == "evaluation-x3"
    # a CAS trained on a train-split-sized set is a different figure: never read back as the other
    assert folder(3, "train") == "evaluation-x3-cas-train"
    assert folder(1, "train") == "evaluation-cas-train"


def test_a_run_is_finished_only_at_the_table_s_budget(script: ModuleType, tmp_path: Path) -> None:
    # --report-only evaluates finished runs only: a shorter or cut-short run is left alone
    assert not script._finished(tmp_path, 12000)  # no summary yet
    (tmp_path / "summary.json").write_text(json.dumps({"steps": 6000}))
    assert not script._finished(tmp_path, 12000)
    assert script._finished(tmp_path, 6000)


def test_every_variant_is_a_valid_train_command(
    script: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each variant's options, as the script passes them, parse into contragan train's
    settings; a value written HALF_RUN (THIRD_RUN) becomes half (a third of) the run's G steps."""
    from contragan.config import QUICK, Config
    from shared.config import parse_config

    passed: list[list[str]] = []
    monkeypatch.setattr(script, "train_main", lambda argv: passed.append(argv))
    args = SimpleNamespace(image_size=16, n_dis=2, steps=3000, device="cpu", amp="off")
    for variant in script.VARIANTS:
        script._train(tmp_path / variant, "digits", variant, 0, 3000, args)
    assert len(passed) == len(script.VARIANTS)
    for argv in passed:
        assert script.HALF_RUN not in argv and script.THIRD_RUN not in argv
        parse_config(Config, argv, prog="contragan train", presets={"quick": QUICK})
    decayed = passed[list(script.VARIANTS).index("contra-proxy-t0.2-l0.25-pa-decay")]
    assert decayed[decayed.index("--lambda-2c-decay") + 1] == "1500"
    decayed = passed[list(script.VARIANTS).index("contra-proxy-t0.2-l0.25-g0-pa-decay3")]
    assert decayed[decayed.index("--lambda-2c-decay") + 1] == "1000"
    assert decayed[decayed.index("--g-lambda-2c") + 1] == "0"
