"""Plots: PNG files are written (parents created), inputs are untouched, pyplot is never used."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import matplotlib.image
import matplotlib.pyplot as plt
import pytest
import torch

from shared.plots import plot_loss_curves, plot_tsne, save_image_grid

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _assert_png(path: Path) -> None:
    assert path.is_file() and path.stat().st_size > len(PNG_SIGNATURE)
    assert path.read_bytes()[: len(PNG_SIGNATURE)] == PNG_SIGNATURE


@pytest.fixture(autouse=True)
def _no_pyplot_figures() -> Iterator[None]:
    before = plt.get_fignums()
    yield
    assert plt.get_fignums() == before  # figures never reach (or stay in) pyplot's registry


def test_loss_curves_from_metrics_csv(tmp_path: Path) -> None:
    csv_path = tmp_path / "metrics.csv"
    # The accuracy column is logged every other step: empty cells must be skipped.
    lines = ["step,loss,lr,val_acc"] + [
        f"{s},{2.0 / (s + 1)},{0.1 * s},{'' if s % 2 else 0.5 + s / 40}" for s in range(20)
    ]
    csv_path.write_text("\n".join(lines) + "\n")
    content = csv_path.read_text()
    out = tmp_path / "run" / "plots" / "loss.png"
    written = plot_loss_curves(csv_path, out)
    assert written == out
    _assert_png(out)
    assert csv_path.read_text() == content
    only_loss = plot_loss_curves(str(csv_path), tmp_path / "loss_only.png", keys=["loss"])
    _assert_png(only_loss)


def test_loss_curves_from_dict_leaves_it_alone(tmp_path: Path) -> None:
    series = {"loss": [3.0, 2.0, 1.5, 1.2], "accuracy": [0.1, 0.3, float("nan"), 0.6]}
    before = copy.deepcopy(series)
    _assert_png(plot_loss_curves(series, tmp_path / "a" / "b.png", log_y=True, keys=["loss"]))
    _assert_png(plot_loss_curves(series, tmp_path / "c.png"))
    assert str(series) == str(before)


@pytest.mark.parametrize(
    ("series", "keys", "bad"),
    [
        ({"loss": [1.0, 2.0]}, ["acc"], "acc"),
        ({"loss": [1.0, 2.0], "acc": [1.0]}, None, "different lengths"),
        ({"loss": [1.0, 2.0], "step": [0.0]}, None, "'step' has 1 values"),
    ],
)
def test_loss_curves_reject_bad_input(
    tmp_path: Path, series: dict[str, list[float]], keys: list[str] | None, bad: str
) -> None:
    with pytest.raises(ValueError, match=bad):
        plot_loss_curves(series, tmp_path / "x.png", keys=keys)
    assert not (tmp_path / "x.png").exists()


def test_tsne_writes_png_and_leaves_inputs_alone(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(0)
    labels = torch.arange(3).repeat_interleave(50)  # (150,)
    features = 4.0 * torch.nn.functional.one_hot(labels, 8).float()
    features = features + torch.randn(150, 8, generator=generator)  # (150, 8)
    features_before, labels_before = features.clone(), labels.clone()
    # One OpenMP thread: the test runs beside others (pytest -n 2 on 2 cores).
    out = plot_tsne(
        features, labels, tmp_path / "plots" / "tsne.png", seed=0, max_points=90, num_threads=1
    )
    _assert_png(out)
    assert torch.equal(features, features_before) and torch.equal(labels, labels_before)


def test_tsne_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="num_threads must be >= 1 or None, got 0"):
        plot_tsne(torch.randn(40, 4), torch.zeros(40), tmp_path / "t.png", seed=0, num_threads=0)
    few = torch.randn(10, 4), torch.zeros(10, dtype=torch.long)
    with pytest.raises(ValueError, match=r"perplexity=30\.0"):
        plot_tsne(*few, tmp_path / "t.png", seed=0, perplexity=30.0)


def test_tsne_of_a_small_set_lowers_the_default_perplexity(tmp_path: Path) -> None:
    # 10 points: scikit-learn's perplexity 30 is impossible; the default becomes (10 - 1) / 3
    features, labels = torch.randn(10, 4), torch.arange(10) % 2
    _assert_png(plot_tsne(features, labels, tmp_path / "t.png", seed=0, num_threads=1))


def _images() -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.rand(5, 3, 6, 7, generator=generator)  # (N, C, H, W)


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("normalize", [False, True])
def test_image_grid_has_make_grids_layout(tmp_path: Path, channels: int, normalize: bool) -> None:
    images = _images()[:, :channels] * (3.0 if normalize else 1.0)
    before = images.clone()
    out = save_image_grid(images, tmp_path / "g" / "grid.png", nrow=3, normalize=normalize)
    _assert_png(out)
    assert torch.equal(images, before)
    # make_grid's layout: 2 rows x 3 columns of 6x7 images with 2 pixels of padding.
    assert matplotlib.image.imread(out).shape[:2] == (2 * 8 + 2, 3 * 9 + 2)


@pytest.mark.parametrize(
    ("images", "nrow", "bad"),
    [
        (torch.rand(2, 2, 4, 4), 2, "C in"),
        (torch.rand(3, 4, 4), 2, "C in"),
        (torch.rand(2, 3, 4, 4), 0, "nrow must be >= 1, got 0"),
    ],
)
def test_image_grid_rejects_bad_input(
    tmp_path: Path, images: torch.Tensor, nrow: int, bad: str
) -> None:
    with pytest.raises(ValueError, match=bad):
        save_image_grid(images, tmp_path / "bad.png", nrow=nrow)
