"""Unreadable image files are reported by every command that reads images: one console line
(how many, and where the list is), ``skipped.csv`` (file, reason) in the run folder, the count in
``summary.json`` and in ``report.md``. Each command runs through its ``main([...])`` on a tiny
image folder holding a truncated PNG, a zero-byte file and a text file named ``.png``."""

from __future__ import annotations

import contextlib
import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("kornia")

from contragan.commands import evaluate as gan_evaluate
from contragan.commands import train as gan_train
from imagecl.commands import eval as eval_command
from imagecl.commands import finetune, train
from imagecl.data import load_data, report_skipped_images, skipped_summary
from shared.skipped import report_skipped, skipped_line, write_skipped

COLOURS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (40, 50, 230)}
PER_CLASS = 44  # 11 test images per class: t-SNE of the test split needs more than 30
READABLE = len(COLOURS) * PER_CLASS
CPU = ["--device", "cpu"]


def _bad_files(root: Path) -> set[str]:
    """A truncated PNG, a zero-byte file and a text file named .png; returns their paths."""
    noise = np.random.default_rng(0).integers(0, 256, (48, 48, 3), np.uint8)
    truncated = root / "red" / "truncated.png"
    Image.fromarray(noise).save(truncated)
    truncated.write_bytes(truncated.read_bytes()[:300])
    empty = root / "green" / "empty.png"
    empty.write_bytes(b"")
    text = root / "blue" / "notes.png"
    text.write_text("this is not an image\n")
    return {str(truncated), str(empty), str(text)}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, set[str]]:
    """Three colour classes of noisy 20×20 images plus the three unreadable files."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(1)
    for name, colour in COLOURS.items():
        (root / name).mkdir()
        for i in range(PER_CLASS):
            pixels = np.clip(np.array(colour) + rng.normal(0, 20, (20, 20, 3)), 0, 255)
            Image.fromarray(pixels.astype(np.uint8)).save(root / name / f"{i}.png")
    return root, _bad_files(root)


def _check_reported(
    run: Path, bad: set[str], summary: dict[str, object], printed: str, *, report: bool = True
) -> None:
    """The four places a run reports its skipped files."""
    line = f"skipped 3 of {READABLE + 3} image files"
    assert line in printed and str(run.resolve() / "skipped.csv") in printed
    with (run / "skipped.csv").open(newline="") as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == ["file", "reason"]
    assert {file for file, _ in rows[1:]} == bad and all(reason for _, reason in rows[1:])
    assert summary["skipped"] == 3
    assert json.loads((run / "summary.json").read_text())["skipped"] == 3
    if report:
        text = (run / "report.md").read_text()
        assert "| skipped | 3 |" in text and line in text and "skipped.csv" in text


def test_the_data_layer_collects_the_three_bad_files(folder: tuple[Path, set[str]]) -> None:
    root, bad = folder
    data = load_data("imagefolder", root=root, image_size=16)
    assert {file for file, _ in data.skipped} == bad
    assert len(data.train) + len(data.test) == READABLE
    line = skipped_summary(data, "runs/x/skipped.csv")
    assert line is not None and line.startswith(f"skipped 3 of {READABLE + 3} image files (")
    assert line.endswith("; the list is in runs/x/skipped.csv")


@pytest.fixture(scope="module")
def imagecl_run(
    folder: tuple[Path, set[str]], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, object], str]:
    root, _ = folder
    out = tmp_path_factory.mktemp("imagecl") / "run"
    printed = io.StringIO()  # module-scoped fixtures cannot use capsys
    with contextlib.redirect_stdout(printed):
        summary = train.main(
            [
                "--quick",
                *CPU,
                "--data",
                "imagefolder",
                "--data-root",
                str(root),
                "--image-size",
                "16",
                "--batch-size",
                "8",
                "--max-steps",
                "2",
                "--width",
                "8",
                "--out",
                str(out),
            ]
        )
    return out, summary, printed.getvalue()


def test_imagecl_train_reports_them(
    imagecl_run: tuple[Path, dict[str, object], str], folder: tuple[Path, set[str]]
) -> None:
    out, summary, printed = imagecl_run
    _check_reported(out, folder[1], summary, printed)


def test_imagecl_eval_reports_them(
    imagecl_run: tuple[Path, dict[str, object], str],
    folder: tuple[Path, set[str]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    checkpoint = str(imagecl_run[0] / "checkpoints" / "last.pt")
    out = tmp_path / "eval"
    summary = eval_command.main(
        [
            "--checkpoint",
            checkpoint,
            *CPU,
            "--no-corruptions",
            "--labels-per-class",
            "1",
            "--knn-k",
            "5",
            "--out",
            str(out),
        ]
    )
    _check_reported(out, folder[1], summary, capsys.readouterr().out)


def test_imagecl_finetune_reports_them(
    imagecl_run: tuple[Path, dict[str, object], str],
    folder: tuple[Path, set[str]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    checkpoint = str(imagecl_run[0] / "checkpoints" / "last.pt")
    out = tmp_path / "finetune"
    summary = finetune.main(
        [
            "--checkpoint",
            checkpoint,
            *CPU,
            "--label-fraction",
            "0.5",
            "--steps",
            "2",
            "--batch-size",
            "4",
            "--no-compare-scratch",
            "--out",
            str(out),
        ]
    )
    _check_reported(out, folder[1], summary, capsys.readouterr().out)


GAN = [
    "--data",
    "imagefolder",
    "--image-size",
    "16",
    "--arch",
    "digits",
    "--width",
    "8",
    "--batch-size",
    "4",
    "--n-dis",
    "1",
    "--max-steps",
    "2",
    "--log-every",
    "1",
    "--eval-every",
    "2",
    "--amp",
    "off",
    "--no-progress",
    *CPU,
]


def test_contragan_train_and_evaluate_report_them(
    folder: tuple[Path, set[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, bad = folder
    run = tmp_path / "gan"
    summary = gan_train.main([*GAN, "--data-root", str(root), "--out", str(run)])
    _check_reported(run, bad, summary, capsys.readouterr().out)
    numbers = gan_evaluate.main(
        [
            "--checkpoint",
            str(run / "checkpoints" / "last.pt"),
            *CPU,
            "--seeds",
            "1",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--extractor-epochs",
            "1",
            "--cas-epochs",
            "1",
            "--min-extractor-accuracy",
            "0",
        ]
    )
    _check_reported(run / "evaluation", bad, numbers, capsys.readouterr().out)


def test_nothing_unreadable_writes_an_empty_list_and_no_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = load_data("digits", image_size=8)
    assert report_skipped_images(data, tmp_path) is None
    assert capsys.readouterr().out == ""
    assert (tmp_path / "skipped.csv").read_text() == "file,reason\n"
    assert skipped_summary(data) is None


def test_skipped_line_counts_the_reasons(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [
        ("a.png", "OSError: truncated"),
        ("b.png", "UnidentifiedImageError: x"),
        ("c.png", "UnidentifiedImageError: y"),
    ]
    line = report_skipped(tmp_path, rows, total=10, noun="image files")
    assert line == (
        "skipped 3 of 10 image files (UnidentifiedImageError: 2, OSError: 1); the list is in "
        f"{tmp_path / 'skipped.csv'}"
    )
    assert capsys.readouterr().out == line + "\n"
    assert skipped_line([], total=4, noun="molecules", listing="x") == "skipped 0 of 4 molecules"
    with pytest.raises(ValueError, match="2 columns"):
        write_skipped(tmp_path / "bad.csv", [("a.png",)])
