"""A NaN or inf loss injected at a chosen step of every domain's training command.

The run stops with one line naming the step and the loss (exit status 2, no traceback), keeps
the last good checkpoint (a step before the bad one, loadable) and the metrics logged before
it, and ``--resume`` from that checkpoint, without the injection, finishes the run. Under
``torchrun`` a NaN on one rank stops every rank with the same line (imagecl's case is in
tests/test_torchrun.py; contragan's is here).
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.reliability._commands import (
    Command,
    command,
    data_for,
    error_line,
    last_step,
    metric_steps,
    summary,
)

pytestmark = pytest.mark.reliability

BAD_STEP = 3  # between the checkpoints of steps 2 and 4


def _poison(value: float) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def poison(out: dict[str, Any]) -> dict[str, Any]:
        return {**out, "loss": out["loss"] + value}

    return poison


def _graphcl(monkeypatch: pytest.MonkeyPatch, bad: Callable[[int], bool], value: float) -> None:
    from graphcl.commands import pretrain

    step, calls = pretrain.pretrain_step, [0]

    def pretrain_step(*args: Any, **kwargs: Any) -> dict[str, Any]:
        calls[0] += 1
        out = step(*args, **kwargs)
        return _poison(value)(out) if bad(calls[0]) else out

    monkeypatch.setattr(pretrain, "pretrain_step", pretrain_step)


def _imagecl(monkeypatch: pytest.MonkeyPatch, bad: Callable[[int], bool], value: float) -> None:
    from imagecl.commands import train

    make_step, calls = train.make_step, [0]

    def poisoned_make_step(*args: Any, **kwargs: Any) -> Callable[..., dict[str, Any]]:
        step = make_step(*args, **kwargs)

        def train_step(*args: Any, **kwargs: Any) -> dict[str, Any]:
            calls[0] += 1
            out = step(*args, **kwargs)
            return _poison(value)(out) if bad(calls[0]) else out

        return train_step

    monkeypatch.setattr(train, "make_step", poisoned_make_step)


def _contragan(monkeypatch: pytest.MonkeyPatch, bad: Callable[[int], bool], value: float) -> None:
    """D's loss, through the method's row of ``contragan.steps.GAN_LOSSES`` (2 D steps a step)."""
    from contragan import steps

    fns, calls = steps.GAN_LOSSES["contra"], [0]

    def d_loss(*args: Any) -> dict[str, Any]:
        calls[0] += 1
        out = fns.discriminator(*args)
        return _poison(value)(out) if bad((calls[0] + 1) // 2) else out

    monkeypatch.setitem(steps.GAN_LOSSES, "contra", steps.GanLossFns(d_loss, fns.generator))


INJECT = {"graphcl": _graphcl, "imagecl": _imagecl, "contragan": _contragan}
LOSS = {"graphcl": "loss", "imagecl": "loss", "contragan": "d_loss"}


@pytest.mark.parametrize(
    ("domain", "value"),
    [("graphcl", math.nan), ("imagecl", math.inf), ("contragan", math.nan)],
)
def test_a_bad_loss_stops_with_one_line_keeps_the_last_good_checkpoint_and_resumes(
    domain: str,
    value: float,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cmd: Command = command(domain)
    data, run = data_for(domain, tmp_path), tmp_path / "run"
    INJECT[domain](monkeypatch, lambda step: step == BAD_STEP, value)
    capsys.readouterr()
    status = cmd.main(cmd.argv(run, data))
    line = error_line(cmd.prog, capsys.readouterr().err)
    assert status == 2
    shown = "nan" if math.isnan(value) else "inf"
    assert f"{LOSS[domain]} is {shown} at step {BAD_STEP}; training stopped" in line, line
    assert last_step(run) == 2  # the last good checkpoint, loadable
    assert metric_steps(run) == [1, 2]  # nothing logged from the bad step
    assert not (run / "summary.json").exists()

    monkeypatch.undo()
    assert cmd.main(cmd.argv(run, data, "--resume")) == 0
    assert last_step(run) == 4 and metric_steps(run) == [1, 2, 3, 4]
    assert summary(run)["steps"] == 4


@pytest.mark.slow
def test_contragan_nan_on_one_rank_stops_both_ranks_with_the_same_line(tmp_path: Path) -> None:
    """Rank 1's D loss is NaN at step 2: both ranks print the same line and exit; step 1's
    checkpoint stays."""
    from tests.test_torchrun import GAN, WORLD, torchrun

    script = tmp_path / "nan_on_rank1.py"
    script.write_text(
        textwrap.dedent(
            """
            import os
            import sys

            from contragan import steps
            from contragan.cli import main

            if os.environ["RANK"] == "1":
                fns, calls = steps.GAN_LOSSES["contra"], [0]

                def d_loss(*args):  # 2 D steps a step: call 3 is step 2's first
                    calls[0] += 1
                    out = fns.discriminator(*args)
                    return {**out, "loss": out["loss"] * float("nan")} if calls[0] == 3 else out

                steps.GAN_LOSSES["contra"] = steps.GanLossFns(d_loss, fns.generator)
            sys.exit(main())
            """
        )
    )
    argv = ["train", *GAN, "--max-steps", "3", "--checkpoint-every", "1", "--out", "run"]
    work = tmp_path / "work"
    job = torchrun([str(script), *argv], work, tmp_path / "logs", "--monitor-interval=3")
    assert job.returncode != 0
    line = "contragan train: error: d_loss is nan at step 2 on rank 1; training stopped"
    for rank in range(WORLD):
        assert line in job.ranks[rank], (rank, job.ranks[rank][-3000:])
        assert "Traceback" not in job.ranks[rank], (rank, job.ranks[rank][-3000:])
    assert last_step(work / "run") == 1
