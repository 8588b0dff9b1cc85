"""The epoch-end hook: ``Updater.end_epoch`` once per finished epoch, in train mode, before the
step's log, evaluation and checkpoint; its metrics logged; a resume neither repeats nor skips it."""

from __future__ import annotations

import csv
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn
from torch.utils.data import TensorDataset

from shared.checkpoint import load_checkpoint
from shared.runs import RunDir
from shared.runtime import make_loader, seed_everything
from shared.train import FitResult, LoopConfig, StepContext, Updater, fit, fit_updater

CPU = torch.device("cpu")
STEPS_PER_EPOCH = 5  # 20 rows in batches of 4


def _data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20, 3, generator=g)
    return TensorDataset(x, x.sum(1, keepdim=True))


class ScaledUpdater(Updater):
    """SGD on a linear model whose loss is scaled by a per-epoch ``scale`` (JOAO-like state
    that end_epoch updates and the checkpoint keeps)."""

    def __init__(self) -> None:
        self.model = nn.Sequential(nn.Linear(3, 4), nn.Dropout(0.1), nn.Linear(4, 1))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)
        self.scale = 1.0
        self.calls: list[tuple[int, bool, float]] = []  # (epoch, training, scale before)

    def step(self, batches: Iterator[Any], ctx: StepContext) -> dict[str, Tensor | float]:
        (x, y), *_ = batches
        with ctx.autocast():
            loss = self.scale * nn.functional.mse_loss(self.model(x), y)
        ctx.backward(loss)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"loss": loss.detach()}

    def end_epoch(self, epoch: int) -> Mapping[str, float]:
        self.calls.append((epoch, self.model.training, self.scale))
        self.scale = self.scale * 0.5 + epoch + torch.rand(()).item()  # draws from the RNG
        return {"scale": self.scale}

    def modules(self) -> Mapping[str, nn.Module]:
        return {"model": self.model}

    def evaluated(self) -> nn.Module:
        return self.model

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scale": self.scale,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scale = state["scale"]


def _run(
    run_dir: RunDir, cfg: LoopConfig, *, resume: bool = False, evaluate: Any = None
) -> tuple[ScaledUpdater, FitResult]:
    seed_everything(0)
    updater = ScaledUpdater()
    loader = make_loader(_data(), 4, shuffle=True, seed=0)
    result = fit_updater(
        updater,
        loader,
        loop_cfg=cfg,
        run_dir=run_dir,
        device=CPU,
        evaluate=evaluate,
        resume=resume,
    )
    return updater, result


def _rows(run: RunDir) -> list[dict[str, str]]:
    with run.metrics_path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_end_epoch_runs_once_per_finished_epoch_before_the_steps_log_and_checkpoint(
    tmp_path: Path,
) -> None:
    run = RunDir.create("t", "a", root=tmp_path)
    seen: list[float] = []
    updater: ScaledUpdater | None = None

    def evaluate(model: nn.Module) -> dict[str, float]:
        assert updater is not None
        seen.append(updater.scale)
        return {"val": 0.0}

    seed_everything(0)
    updater = ScaledUpdater()
    cfg = LoopConfig(
        epochs=3, log_every=100, eval_every=STEPS_PER_EPOCH, checkpoint_every=5, progress=False
    )
    fit_updater(
        updater,
        make_loader(_data(), 4, shuffle=True, seed=0),
        loop_cfg=cfg,
        run_dir=run,
        device=CPU,
        evaluate=evaluate,
    )
    assert [epoch for epoch, _, _ in updater.calls] == [0, 1, 2]
    assert all(training for _, training, _ in updater.calls)
    rows = _rows(run)
    # log_every=100: a row only where end_epoch returned metrics (and at the last step)
    assert [row["step"] for row in rows] == ["5", "10", "15"]
    assert [row["epoch"] for row in rows] == ["0", "1", "2"]
    scales = [float(row["scale"]) for row in rows]
    assert scales[-1] == updater.scale and "loss" in rows[0]
    assert seen == scales  # evaluation after the update
    ckpt = load_checkpoint(run.last_checkpoint)
    assert ckpt["scale"] == updater.scale and (ckpt["epoch"], ckpt["batch_in_epoch"]) == (3, 0)


@pytest.mark.parametrize(("max_steps", "epochs"), [(7, [0]), (10, [0, 1]), (4, [])])
def test_an_epoch_cut_by_max_steps_has_no_end(
    tmp_path: Path, max_steps: int, epochs: list[int]
) -> None:
    run = RunDir.create("t", "a", root=tmp_path)
    updater, result = _run(run, LoopConfig(max_steps=max_steps, log_every=100, progress=False))
    assert [epoch for epoch, _, _ in updater.calls] == epochs
    assert result.epoch == len(epochs)


@pytest.mark.parametrize("stop_at", [5, 7, 10])
def test_resume_across_an_epoch_boundary_neither_repeats_nor_skips_an_end(
    tmp_path: Path, stop_at: int
) -> None:
    """Killed via max_steps at or after a boundary, then resumed with more epochs: the same
    calls, the same state and the same metrics.csv as one uninterrupted run."""
    cfg = LoopConfig(epochs=3, log_every=1, checkpoint_every=3, progress=False)
    whole_dir, parts_dir = (RunDir.create("t", name, root=tmp_path) for name in ("whole", "parts"))
    whole, expected = _run(whole_dir, cfg)
    first, _ = _run(parts_dir, LoopConfig(max_steps=stop_at, log_every=1, progress=False))
    resumed, result = _run(parts_dir, cfg, resume=True)
    assert first.calls + resumed.calls == whole.calls
    assert [epoch for epoch, _, _ in whole.calls] == [0, 1, 2]
    assert result == expected and resumed.scale == whole.scale
    for p, q in zip(resumed.model.parameters(), whole.model.parameters(), strict=True):
        assert torch.equal(p, q)
    assert parts_dir.metrics_path.read_bytes() == whole_dir.metrics_path.read_bytes()


def test_fit_passes_end_epoch_to_its_updater(tmp_path: Path) -> None:
    seed_everything(0)
    model = nn.Linear(3, 1)
    calls: list[tuple[int, bool]] = []

    def end_epoch(epoch: int) -> dict[str, float]:
        calls.append((epoch, model.training))
        return {"ended": float(epoch)} if epoch == 1 else {}

    def step(model: nn.Module, batch: tuple[Tensor, Tensor]) -> dict[str, Tensor]:
        return {"loss": nn.functional.mse_loss(model(batch[0]), batch[1])}

    run = RunDir.create("t", "fit", root=tmp_path)
    fit(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        make_loader(_data(), 4, shuffle=True, seed=0),
        step,
        loop_cfg=LoopConfig(epochs=3, log_every=100, progress=False),
        run_dir=run,
        device=CPU,
        end_epoch=end_epoch,
    )
    assert calls == [(0, True), (1, True), (2, True)]
    rows = _rows(run)
    assert [(row["step"], row["ended"]) for row in rows] == [("10", "1.0"), ("15", "")]


def test_end_epoch_metrics_must_not_clash_with_the_steps(tmp_path: Path) -> None:
    class Clashing(ScaledUpdater):
        def end_epoch(self, epoch: int) -> Mapping[str, float]:
            return {"loss": 0.0}

    seed_everything(0)
    with pytest.raises(ValueError, match=r"end_epoch returned \['loss'\]"):
        fit_updater(
            Clashing(),
            make_loader(_data(), 4, shuffle=True, seed=0),
            loop_cfg=LoopConfig(epochs=1, progress=False),
            run_dir=RunDir.create("t", "c", root=tmp_path),
            device=CPU,
        )
