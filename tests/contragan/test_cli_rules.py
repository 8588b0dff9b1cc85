"""contragan's command rules: ``evaluate`` refuses an output folder that already holds files
(as every command does), and ``--arch auto`` chooses the networks by data set, refusing with one
line an image size it has no network for."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from contragan.cli import main as cli_main
from contragan.commands.train import main as train_main
from contragan.config import Config
from contragan.models import build_arch
from imagecl.data import ImageData, TensorImageDataset

TINY = [
    "--data",
    "digits",
    "--image-size",
    "16",
    "--arch",
    "digits",
    "--width",
    "8",
    "--batch-size",
    "16",
    "--n-dis",
    "1",
    "--max-steps",
    "1",
    "--log-every",
    "1",
    "--eval-every",
    "1",
    "--device",
    "cpu",
    "--amp",
    "off",
    "--no-progress",
]


def test_evaluate_refuses_an_existing_evaluation_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    train_main([*TINY, "--out", str(run)])
    earlier = run / "evaluation" / "summary.json"
    earlier.parent.mkdir()
    earlier.write_text('{"fd": 1.0}\n')
    cache = tmp_path / "cache"
    args = [
        "evaluate",
        "--checkpoint",
        str(run / "checkpoints" / "last.pt"),
        "--device",
        "cpu",
        "--cache-dir",
        str(cache),
        "--seeds",
        "1",
        "--extractor-epochs",
        "1",
        "--cas-epochs",
        "1",
        "--min-extractor-accuracy",
        "0",
    ]
    assert cli_main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already holds files" in err and "--out" in err
    assert str((run / "evaluation").resolve()) in err
    assert earlier.read_text() == '{"fd": 1.0}\n'  # untouched
    assert not cache.exists()  # refused before any work
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    assert cli_main([*args, "--out", str(other)]) == 2
    assert "already holds files" in capsys.readouterr().err
    assert sorted(p.name for p in other.iterdir()) == ["notes.txt"]


def _data(name: str, size: int, channels: int = 3) -> ImageData:
    images = torch.zeros((4, channels, size, size), dtype=torch.uint8)
    split = TensorImageDataset(images, torch.tensor([0, 1, 0, 1]))
    stats = (0.5,) * channels
    return ImageData(name, split, split, split, 2, channels, size, stats, stats, ())


@pytest.mark.parametrize(
    ("data", "size", "arch"),
    [
        ("digits", 32, "digits"),
        ("digits", 16, "digits"),
        ("digits-m", 64, "digits"),
        ("cifar10", 32, "resnet32"),
        ("cifar100", 32, "resnet32"),
        ("imagefolder", 32, "resnet32"),
    ],
)
def test_auto_chooses_the_networks_by_data_set(data: str, size: int, arch: str) -> None:
    chosen = build_arch(Config(data=data, arch="auto"), _data(data, size))  # type: ignore[arg-type]
    assert chosen.name == arch and chosen.image_size == size


@pytest.mark.parametrize(("data", "size"), [("imagefolder", 16), ("cifar10", 64)])
def test_auto_refuses_sizes_the_cifar_networks_cannot_take(data: str, size: int) -> None:
    with pytest.raises(ValueError, match=rf"--arch auto picks resnet32 .* got {size}×{size}"):
        build_arch(Config(data=data, arch="auto"), _data(data, size))  # type: ignore[arg-type]
    explicit = build_arch(Config(data=data, arch="digits"), _data(data, size))  # type: ignore[arg-type]
    assert explicit.name == "digits"


def test_the_cli_refuses_an_auto_size_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = np.random.default_rng(0)
    for name in ("a", "b"):
        (tmp_path / "images" / name).mkdir(parents=True)
        for i in range(8):
            pixels = rng.integers(0, 256, (16, 16, 3), np.uint8)
            Image.fromarray(pixels).save(tmp_path / "images" / name / f"{i}.png")
    args = [
        "train",
        "--data",
        "imagefolder",
        "--data-root",
        str(tmp_path / "images"),
        "--image-size",
        "16",
        "--batch-size",
        "4",
        "--n-dis",
        "1",
        "--max-steps",
        "1",
        "--device",
        "cpu",
        "--out",
        str(tmp_path / "run"),
    ]
    assert cli_main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--arch auto picks resnet32" in err and "16×16" in err
    # digits at a size the digits networks cannot take (the later flags win)
    odd = ["train", *TINY, "--image-size", "30", "--arch", "auto", "--out", str(tmp_path / "odd")]
    assert cli_main(odd) == 2
    assert "arch 'digits' takes image_size" in capsys.readouterr().err
