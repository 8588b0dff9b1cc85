"""imagecl studies: the SimCLR pipeline's losses, the augmentation study's branch views, smoke
runs of every study on a tiny grid, resuming an interrupted grid, and the CLI."""

from __future__ import annotations

import csv
import importlib
import itertools
import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

# needs the image extra (kornia): skipped without it, not a collection error
pytest.importorskip("kornia")

from imagecl import cli, config, models, steps
from imagecl.augment import to_float
from imagecl.data import load_data
from imagecl.losses import margin_triplet_loss, nt_xent
from imagecl.studies import STUDIES, runner
from imagecl.studies.augmentations import OPS, BranchViews
from shared.losses import nt_xent_loss, triplet_loss
from shared.runs import RunDir

F64 = torch.float64
# two cells (plus the random-init baseline) of a few steps of batch 32 each
TINY = ["--quick", "--device", "cpu", "--steps", "2", "--batch-size", "32", "--limit", "2"]


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny models on a shared 2-core machine: one thread avoids oversubscribed barriers."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ---------------------------------------------------------------- the SimCLR pipeline's losses


def _pair(N: int, D: int, seed: int) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(N, D, generator=g, dtype=F64), torch.randn(N, D, generator=g, dtype=F64)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("N", [1, 3])
def test_nt_xent_without_normalisation_matches_a_loop(seed: int, N: int) -> None:
    z1, z2 = _pair(N, 4, seed)
    rows = [v.tolist() for n in range(N) for v in (z1[n], z2[n])]  # row n·2 + view
    tau = 0.7
    losses = []
    for i, anchor in enumerate(rows):
        logits = [sum(a * b for a, b in zip(anchor, other, strict=True)) / tau for other in rows]
        others = [logits[k] for k in range(len(rows)) if k != i]
        losses.append(math.log(sum(math.exp(v) for v in others)) - logits[i ^ 1])
    got = nt_xent(z1, z2, temperature=tau, normalize=False)
    assert got.item() == pytest.approx(sum(losses) / len(losses), rel=1e-10)
    unit1, unit2 = F.normalize(z1, dim=1), F.normalize(z2, dim=1)
    raw_on_unit = nt_xent(unit1, unit2, temperature=tau, normalize=False)
    torch.testing.assert_close(raw_on_unit, nt_xent_loss(z1, z2, temperature=tau))


@pytest.mark.parametrize("normalize", [True, False])
def test_margin_triplet_is_the_shared_triplet_over_every_triple(normalize: bool) -> None:
    z1, z2 = _pair(4, 3, 2)
    rows = torch.stack([z1, z2], dim=1).flatten(0, 1)  # (8, D), row n·2 + v
    anchors, positives, negatives = [], [], []
    for i, j in itertools.product(range(8), range(8)):
        if i // 2 != j // 2:  # every view of another sample is a negative
            anchors.append(rows[i])
            positives.append(rows[i ^ 1])
            negatives.append(rows[j])
    expected = triplet_loss(
        torch.stack(anchors),
        torch.stack(positives),
        torch.stack(negatives),
        margin=0.5,
        normalize=normalize,
    )
    got = margin_triplet_loss(z1, z2, margin=0.5, normalize=normalize)
    torch.testing.assert_close(got, expected)
    z1.requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda a: margin_triplet_loss(a, z2, margin=0.5, normalize=normalize), (z1,)
    )


def _config(**overrides: Any) -> config.Config:
    return config.Config(
        **{
            **config.QUICK,
            "device": "cpu",
            "width": 8,
            "batch_size": 16,
            "online_probe": False,
            **overrides,
        }
    )


@pytest.mark.parametrize(
    "overrides",
    [
        {"loss": "nt_xent", "normalize": False},
        {"loss": "nt_logistic"},
        {"loss": "triplet", "head": "none"},
        *(
            {"loss": "generalized", "prior": prior, "lam": 0.5}
            for prior in ("uniform_hypersphere", "normal", "uniform_hypercube", "decoupled_nt_xent")
        ),
    ],
    ids=lambda o: "-".join(str(v) for v in o.values()),
)
def test_each_loss_trains_the_simclr_pipeline(overrides: dict[str, Any]) -> None:
    """One step of every loss: finite, and every trained parameter gets a finite gradient."""
    cfg = _config(**overrides)
    data = load_data("digits-m", seed=0)
    built = models.build(cfg, device=torch.device("cpu"), data=data)
    batch = next(iter(built.loader))
    out = steps.train_step(built.model, batch, cfg=cfg, views=built.views, gather=False)
    assert torch.isfinite(out["loss"])
    out["loss"].backward()
    for name, param in built.model.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), name


def test_simclr_loss_dispatches_on_the_config() -> None:
    z = torch.randn(6, 2, 5)
    for overrides, expected in [
        ({}, nt_xent_loss(z[:, 0], z[:, 1], temperature=0.2)),
        ({"loss": "triplet", "margin": 0.3}, margin_triplet_loss(z[:, 0], z[:, 1], margin=0.3)),
    ]:
        got = steps.simclr_loss_of(_config(**overrides))(z, gather=False)
        torch.testing.assert_close(got, expected)
    with pytest.raises(ValueError, match="contrasts the local batch only"):
        steps.simclr_loss_of(_config(loss="nt_logistic"))(z, gather=True)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"method": "supcon", "loss": "nt_logistic"}, "applies to method simclr only"),
        ({"loss": "generalized", "queue_size": 64}, "takes no queue"),
        ({"loss": "nt_xent", "normalize": False, "queue_size": 64}, "normalised keys"),
        ({"normalize": False, "adversarial": True}, "adversarial views use the normalised"),
        ({"method": "clae", "normalize": False}, "adversarial views use the normalised"),
        ({"loss": "triplet", "adversarial": True}, "no adversarial views"),
        ({"loss": "generalized", "lam": -1.0}, "lam and margin must be >= 0"),
        ({"loss": "hinge"}, "loss must be one of"),
    ],
)
def test_bad_loss_settings_are_refused(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _config(**overrides)


# ---------------------------------------------------------------- the augmentation study's views


def _images(n: int = 4, size: int = 16) -> Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (n, 3, size, size), generator=g, dtype=torch.uint8)


@pytest.mark.parametrize("first", OPS)
def test_branch_views_keep_branch_one_and_transform_branch_two(first: str) -> None:
    images = _images()
    before = images.clone()
    mean, std = (0.4, 0.5, 0.6), (0.2, 0.25, 0.3)
    views = BranchViews(16, mean, std, first, "noise")
    x = views(images, generator=torch.Generator().manual_seed(1))  # (4, 2, 3, 16, 16)
    assert x.shape == (4, 2, 3, 16, 16) and x.dtype == torch.float32
    assert torch.equal(images, before)
    torch.testing.assert_close(x[:, 0], to_float(images, mean, std))
    assert not torch.allclose(x[:, 1], x[:, 0])
    again = views(images, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(again, x)  # seeded
    pixels = x[:, 1] * torch.tensor(std)[:, None, None] + torch.tensor(mean)[:, None, None]
    assert pixels.min() >= -1e-5 and pixels.max() <= 1 + 1e-5  # still [0, 1] images


def test_branch_view_ops_do_what_they_say() -> None:
    images = _images()
    zero, one = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    g = torch.Generator().manual_seed(0)
    gray = BranchViews(16, zero, one, "grayscale", "grayscale")(images, generator=g)[:, 1]
    assert torch.allclose(gray[:, 0], gray[:, 1]) and torch.allclose(gray[:, 1], gray[:, 2])
    rotated = BranchViews(16, zero, one, "rotation", "rotation")(images, generator=g)[:, 1]
    x = images.float() / 255
    for n in range(4):
        turns = [torch.rot90(x[n], k, dims=(1, 2)) for k in (1, 2, 3)]
        assert any(torch.allclose(rotated[n], t) for t in turns)
    flat = torch.full((2, 3, 16, 16), 77, dtype=torch.uint8)
    sobel = BranchViews(16, zero, one, "sobel", "sobel")(flat, generator=g)[:, 1]
    assert torch.allclose(sobel, torch.zeros_like(sobel))  # no edge, no gradient
    cut = BranchViews(16, zero, one, "cutout", "cutout")(images, generator=g)[:, 1]
    holes = (cut == 0).all(dim=1).sum(dim=(1, 2))  # (4,) zeroed pixels per image
    assert bool(((holes >= 16) & (holes <= 64)).all())  # side from 16/4 to 16/2
    with pytest.raises(ValueError, match="unknown transformation"):
        BranchViews(16, zero, one, "solarize", "crop")


# ---------------------------------------------------------------- smoke runs and resuming


def _results(out: Path) -> list[dict[str, str]]:
    with (out / "results.csv").open(newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.parametrize("name", list(STUDIES))
def test_every_study_runs_a_tiny_grid_and_writes_its_folder(tmp_path: Path, name: str) -> None:
    module = importlib.import_module(f"imagecl.studies.{STUDIES[name][0]}")
    limit = ["--limit", "3"] if name == "feature-suppression" else []  # reach DigitOverlay
    out = tmp_path / name
    summary = module.main([*TINY, *limit, "--out", str(out)])
    cells = 3 if limit else 2
    assert summary["cells"] == cells and summary["failed"] == 0
    assert summary["trained"] == cells + 1  # + the random-init baseline
    rows = _results(out)
    assert rows[0]["cell"] == runner.BASELINE and len(rows) == cells + 1
    assert all(row["status"] == "ok" for row in rows)
    report = (out / "report.md").read_text()
    assert "## Finding" in report and "## Random-init baseline" in report
    if name == "feature-suppression":  # the overlay's labels read by the untrained encoder
        baseline = json.loads((out / "cells" / runner.BASELINE / "result.json").read_text())
        assert {"overlay_image_acc", "overlay_digit_acc"} <= set(baseline["metrics"])
        assert "| (random init) |" in report and "The untrained encoder reads" in report
    assert list((out / "plots").glob("*.png")), "no plot"
    assert json.loads((out / "summary.json").read_text())["study"] == name
    for row in rows:
        result = json.loads((out / "cells" / row["cell"] / "result.json").read_text())
        assert result["status"] == "ok" and result["metrics"]
        # results.csv holds exactly what each cell measured, every number in its own column
        assert {name: float(row[name]) for name in result["metrics"]} == result["metrics"]
        assert not (out / "cells" / row["cell"] / "checkpoints").exists()  # weights dropped


def _counting(calls: list[str]) -> Callable[..., runner.CellResult]:
    real = runner.run_cell

    def run_cell(measure: Any, params: dict[str, Any], ctx: runner.CellContext) -> Any:
        calls.append(ctx.run.path.name)
        return real(measure, params, ctx)

    return run_cell


def test_an_interrupted_study_trains_only_its_missing_cells(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from imagecl.studies import tau_lambda

    out = tmp_path / "study"
    args = [*TINY, "--out", str(out)]
    first = tau_lambda.main(args)
    assert first["trained"] == 3
    rows = _results(out)
    lost = rows[2]["cell"]
    (out / "cells" / lost / "result.json").unlink()  # as if stopped while training this cell
    calls: list[str] = []
    monkeypatch.setattr(runner, "run_cell", _counting(calls))
    second = tau_lambda.main(args)
    assert calls == [lost]
    assert second["trained"] == 1 and second["reused"] == 2
    again = _results(out)
    assert [r["cell"] for r in again] == [r["cell"] for r in rows]
    assert again[1] == rows[1]  # a finished cell is read back as it was
    third = tau_lambda.main(args)  # everything finished: nothing trains
    assert third["trained"] == 0 and calls == [lost]
    tau_lambda.main([*args, "--steps", "3"])  # other settings: no stale result is reused
    assert len(calls) == 1 + 3


def test_the_report_warns_when_no_cell_beats_the_random_init_encoder() -> None:
    cells = [
        runner.CellResult("a", {}, {"probe_acc": 0.3, "other": 0.9}, "ok"),
        runner.CellResult("b", {}, {"probe_acc": 0.35}, "ok"),
    ]
    note = runner._baseline_note(cells, {"probe_acc": 0.4, "other": 0.5})
    assert "probe_acc 40.0 %" in note and "No trained cell beats it on probe_acc:" in note
    assert "other" not in note.split("beats it on")[1]
    assert "beats it" not in runner._baseline_note(cells, {"probe_acc": 0.32})


def test_cell_keys() -> None:
    assert runner.cell_key({"tau": 0.1, "lam": 2.0, "loss": "nt_xent"}) == (
        "tau=0.1_lam=2_loss=nt_xent"
    )


def _tau_lambda_finding(best_lam: dict[float, float], tmp_path: Path) -> str:
    """The tau-lambda finding for cells where λ = best_lam[τ] scores 60 % and the others 40 %."""
    from imagecl.studies import tau_lambda

    cells = [
        runner.CellResult(
            f"{tau}-{lam}",
            {"tau": tau, "lam": lam},
            {"probe_acc": 0.6 if lam == best else 0.4},
            "ok",
        )
        for tau, best in best_lam.items()
        for lam in (0.5, 2.0)
    ]
    return tau_lambda.summarise(cells, {"probe_acc": 0.3}, RunDir(tmp_path))["Finding"]


def test_tau_lambda_ranks_best_lambda_against_tau_with_tied_ranks(tmp_path: Path) -> None:
    # best λ (2, 2, 0.5) has a tie: mean ranks (2.5, 2.5, 1) against τ's (1, 2, 3) give
    # ρ = -1.5 / sqrt(2 · 1.5) = -0.866 (ordinal ranks would give -0.5 or -1)
    finding = _tau_lambda_finding({0.1: 2.0, 0.2: 2.0, 0.5: 0.5}, tmp_path)
    assert "Spearman ρ(τ, best λ) = -0.87: the paper's inverse relation reproduces" in finding
    rising = _tau_lambda_finding({0.1: 0.5, 0.5: 2.0}, tmp_path)
    assert "ρ(τ, best λ) = 1.00: the paper's inverse relation does not reproduce" in rising
    # every τ prefers the same λ, or a single τ: no ranking, no warning (warnings are errors)
    for best_lam in ({0.1: 2.0, 0.2: 2.0}, {0.1: 2.0}):
        finding = _tau_lambda_finding(best_lam, tmp_path)
        assert "= nan: the τ–λ relation cannot be read from these cells" in finding


def test_the_cli_lists_and_dispatches_studies(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["study"]) == 0
    listing = capsys.readouterr().out
    assert all(name in listing for name in STUDIES)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["study", "views", "--help"])
    assert exit_info.value.code == 0
    assert "InfoMin" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["study", "no-such-study"])
    assert exit_info.value.code == 2
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["study", "head", "--steps", "0"])  # a bad value: one line, status 2
    assert exit_info.value.code == 2
