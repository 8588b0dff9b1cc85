"""Run folders, metrics.csv growth and resume truncation, summary.json and report.md."""

from __future__ import annotations

import csv
import json
import math
import os
import re
import tempfile
from pathlib import Path

import pytest
import torch

from shared.checkpoint import writable_folder
from shared.runs import (
    MetricsLogger,
    RunDir,
    discard_unused_runs,
    open_run,
    write_report,
    write_summary,
)


def _rows(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        return list(reader.fieldnames or []), list(reader)


def test_create_layout_and_default_timestamp_name(tmp_path: Path) -> None:
    run = RunDir.create("simclr", root=tmp_path)
    assert run.path.parent == tmp_path / "simclr"
    assert re.fullmatch(r"\d{8}-\d{6}", run.path.name)
    assert run.checkpoints.is_dir() and run.plots.is_dir()
    assert run.last_checkpoint == run.path / "checkpoints" / "last.pt"
    assert run.best_checkpoint.name == "best.pt" and run.metrics_path.name == "metrics.csv"
    second = RunDir.create("simclr", root=tmp_path)  # same second: a suffix, not a clash
    assert second.path != run.path


def test_non_empty_folder_is_not_reused_silently(tmp_path: Path) -> None:
    run = RunDir.create("graphcl", "exp", root=tmp_path)
    assert RunDir.create("graphcl", "exp", root=tmp_path) == run  # empty sub-folders only
    (run.path / "metrics.csv").write_text("step\n1\n")
    with pytest.raises(FileExistsError, match=r"exp.*resume=True.*overwrite=True"):
        RunDir.create("graphcl", "exp", root=tmp_path)
    fresh = RunDir.create("graphcl", "exp", root=tmp_path, overwrite=True)
    assert not fresh.metrics_path.exists() and fresh.checkpoints.is_dir()


def test_resume_needs_last_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"last\.pt"):
        RunDir.create("gan", "a", root=tmp_path, resume=True)
    run = RunDir.create("gan", "a", root=tmp_path)
    run.last_checkpoint.write_bytes(b"x")
    (run.path / "metrics.csv").write_text("step\n")
    assert RunDir.create("gan", "a", root=tmp_path, resume=True) == run
    assert run.metrics_path.exists()  # resuming keeps the files
    with pytest.raises(ValueError, match="contradict"):
        RunDir.create("gan", "a", root=tmp_path, resume=True, overwrite=True)
    with pytest.raises(ValueError, match="name"):
        RunDir.create("gan", root=tmp_path, resume=True)


@pytest.mark.parametrize("name", ["", "..", "a/b"])
def test_bad_names(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="plain folder name"):
        RunDir.create("p", name, root=tmp_path)


def test_metrics_columns_grow_and_keep_old_rows(tmp_path: Path) -> None:
    path = tmp_path / "metrics.csv"
    with MetricsLogger(path) as logger:
        logger.log(1, {"loss": 2.0, "lr": 0.1})
        logger.log(2, {"loss": torch.tensor(1.5), "lr": 0.1})
        logger.log(3, {"loss": 1.25, "val_acc": 0.5})  # a new column appears
        logger.log(4, {"lr": 0.05})
    header, rows = _rows(path)
    assert header == ["step", "loss", "lr", "val_acc"]
    assert [r["step"] for r in rows] == ["1", "2", "3", "4"]
    assert rows[0] == {"step": "1", "loss": "2.0", "lr": "0.1", "val_acc": ""}
    assert rows[2] == {"step": "3", "loss": "1.25", "lr": "", "val_acc": "0.5"}
    assert rows[3]["loss"] == ""


def test_metrics_keep_full_precision(tmp_path: Path) -> None:
    path = tmp_path / "metrics.csv"
    value = 1 / 3
    with MetricsLogger(path) as logger:
        logger.log(1, {"loss": value})
    assert float(_rows(path)[1][0]["loss"]) == value


def test_metrics_resume_drops_rows_after_the_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "metrics.csv"
    with MetricsLogger(path) as logger:
        for step in range(1, 6):
            logger.log(step, {"loss": float(step)})
        logger.log(5, {"loss": 5.0, "val": 1.0})
    with MetricsLogger(path, resume_step=3) as logger:
        _, rows = _rows(path)
        assert [r["step"] for r in rows] == ["1", "2", "3"]
        logger.log(4, {"loss": 40.0})
    header, rows = _rows(path)
    assert header == ["step", "loss", "val"]  # the header of the first run is kept
    assert [(r["step"], r["loss"]) for r in rows] == [
        ("1", "1.0"),
        ("2", "2.0"),
        ("3", "3.0"),
        ("4", "40.0"),
    ]


def test_metrics_new_run_starts_a_new_file(tmp_path: Path) -> None:
    path = tmp_path / "metrics.csv"
    path.write_text("step,old\n1,2\n")
    with MetricsLogger(path) as logger:
        logger.log(1, {"loss": 1.0})
    assert _rows(path) == (["step", "loss"], [{"step": "1", "loss": "1.0"}])


def test_metrics_reject_bad_values(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path / "m.csv") as logger:
        with pytest.raises(ValueError, match="one value"):
            logger.log(1, {"loss": torch.ones(2)})
        with pytest.raises(ValueError, match="'step'"):
            logger.log(1, {"step": 1.0})


def test_tensorboard_only_when_asked(tmp_path: Path) -> None:
    tb = tmp_path / "tb"
    with MetricsLogger(tmp_path / "a.csv") as logger:
        logger.log(1, {"loss": 1.0})
    assert not tb.exists()
    with MetricsLogger(tmp_path / "b.csv", tensorboard_dir=tb) as logger:
        logger.log(1, {"loss": 1.0})
    assert any(p.name.startswith("events.out.tfevents") for p in tb.iterdir())


def test_write_summary_is_json_with_numbers(tmp_path: Path) -> None:
    path = write_summary(tmp_path, {"acc": torch.tensor(0.75), "sizes": (1, 2), "bad": math.nan})
    assert path == tmp_path / "summary.json"
    loaded = json.loads(path.read_text())
    assert loaded["acc"] == 0.75 and loaded["sizes"] == [1, 2] and math.isnan(loaded["bad"])
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_report_shows_plots_summary_and_sections(tmp_path: Path) -> None:
    run = RunDir.create("simclr", "r", root=tmp_path)
    for name in ("loss.png", "acc.png"):
        (run.plots / name).write_bytes(b"\x89PNG")
    write_summary(run.summary_path, {"linear_acc": 0.912345, "note": "a|b"})
    path = write_report(run, "SimCLR on digits", {"Setup": "Two views, *s* = 0.5."})
    text = path.read_text()
    assert path == run.path / "report.md"
    assert text.startswith("# SimCLR on digits\n")
    assert "| linear_acc | 0.9123 |" in text and "| note | a\\|b |" in text
    assert "![acc](plots/acc.png)" in text and "![loss](plots/loss.png)" in text
    assert text.index("plots/acc.png") < text.index("plots/loss.png")
    assert "## Setup\n\nTwo views, *s* = 0.5." in text


def test_report_with_explicit_summary_and_no_plots(tmp_path: Path) -> None:
    path = write_report(tmp_path, "T", summary={"x": 1})
    text = path.read_text()
    assert "| x | 1 |" in text and "## Plots" not in text


def test_open_run_names_creates_and_resumes(tmp_path: Path) -> None:
    run = open_run(None, tmp_path / "runs" / "imagecl" / "simclr")
    assert run.path.parent == (tmp_path / "runs" / "imagecl").resolve()
    assert run.path.name.startswith("simclr-") and run.checkpoints.is_dir()
    chosen = open_run(tmp_path / "mine" / "a", "unused")
    assert chosen.path == (tmp_path / "mine" / "a").resolve() and chosen.plots.is_dir()
    with pytest.raises(ValueError, match="--resume needs --out"):
        open_run(None, "x", resume=True)
    with pytest.raises(FileNotFoundError, match="cannot resume"):
        open_run(tmp_path / "mine" / "typo", "unused", resume=True)  # no such folder
    # stopped before its first checkpoint: --resume starts it over in place
    (chosen.path / "config.json").write_text("{}")
    (chosen.checkpoints / ".last.pt.abc123.tmp").write_bytes(b"cut")  # a write cut short
    again = open_run(tmp_path / "mine" / "a", "unused", resume=True)
    assert again == chosen and not again.last_checkpoint.exists()
    assert sorted(p.name for p in again.path.rglob("*") if p.is_file()) == ["config.json"]
    assert open_run(tmp_path / "other", "unused", rank=1).path == (tmp_path / "other").resolve()
    assert not (tmp_path / "other").exists()  # only rank 0 creates the folder


def test_a_probe_file_left_by_a_kill_is_removed_on_resume(tmp_path: Path) -> None:
    """writable_folder's probe has the temporary files' pattern, so the resume cleanup finds a
    probe that a kill left behind (here: made the way the probe makes it)."""
    run = RunDir.create("p", "r", root=tmp_path)
    (run.checkpoints / "last.pt").write_bytes(b"x")
    writable_folder(run.plots)
    assert not list(run.path.rglob(".write-check-*"))  # the probe removes its own file
    fd, probe = tempfile.mkstemp(dir=run.plots, prefix=".write-check-", suffix=".tmp")
    os.close(fd)
    RunDir.create("p", "r", root=tmp_path, resume=True)
    assert not Path(probe).exists() and (run.checkpoints / "last.pt").is_file()


def test_discard_unused_runs_removes_only_folders_without_files(tmp_path: Path) -> None:
    before = RunDir.create("p", "before", root=tmp_path)  # made outside the block: kept
    existing = tmp_path / "p" / "existed"
    existing.mkdir()
    with pytest.raises(KeyError, match="stop"), discard_unused_runs():
        empty = RunDir.create("p", "empty", root=tmp_path)
        (empty.path / "config.json").write_text("{}")  # written at the start: not a result
        used = RunDir.create("p", "used", root=tmp_path)
        (used.plots / "a.png").write_bytes(b"png")
        RunDir.create("p", "existed", root=tmp_path)  # it was there before the block
        raise KeyError("stop")
    assert not empty.path.exists()
    assert (used.plots / "a.png").is_file() and existing.is_dir() and before.path.is_dir()
    with discard_unused_runs():  # no error: nothing is removed
        kept = RunDir.create("p", "kept", root=tmp_path)
    assert kept.path.is_dir()
