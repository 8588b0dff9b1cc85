"""SIGKILL at random moments through the console scripts, resume, and get the unbroken run's result.

Each pipeline's command (``graphcl pretrain`` / ``finetune``, ``imagecl train --method simclr`` /
``clae``, ``contragan train``, and ``imagecl train`` under ``torchrun --nproc-per-node 2``) is
killed at the moments of a seeded plan (:func:`tests.reliability.kill_driver.plan_kills`: during
a ``last.pt`` write, before the first checkpoint, at a random step, when ``metrics.csv`` shows
the last step, when the report phase starts) and restarted with ``--resume`` until it finishes;
its checkpoints (weights, optimizer, RNG states: bit for bit), ``metrics.csv``, exported model,
``summary.json`` and list of files must equal those of one uninterrupted run of the same command
(see ``kill_driver.py``, which also runs on its own: ``python tests/reliability/kill_driver.py
--pipeline imagecl-simclr --kills 6 --seed 3``).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.reliability.kill_driver import Moment, Pipeline, Zygote, kill_and_resume, plan_kills

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

# 4 kills for each one-process pipeline and 2 for the 2-rank run: 22 in all
KILLS = {
    "graphcl-pretrain": 4,
    "graphcl-finetune": 4,
    "imagecl-simclr": 4,
    "imagecl-clae": 4,
    "contragan": 4,
    "imagecl-simclr-ddp": 2,
}


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One work folder per module: the molecules, the pre-trained encoder finetune reads, and
    each pipeline's uninterrupted reference run."""
    return tmp_path_factory.mktemp("kills")


@pytest.fixture(scope="module")
def zygote(work: Path) -> Iterator[Zygote]:
    """The one-process starts are forks of a process that imported the commands once (the
    seconds of importing torch, PyG and rdkit would be most of every start); torchrun's starts
    are the console script itself."""
    server = Zygote(work)
    yield server
    server.close()


@pytest.mark.parametrize("name", list(KILLS))
def test_killed_and_resumed_run_equals_the_uninterrupted_one(
    work: Path, zygote: Zygote, name: str
) -> None:
    report = kill_and_resume(name, work, KILLS[name], seed=0, zygote=zygote)
    text = "\n".join(report.lines())
    assert not report.differences, text
    assert report.landed == KILLS[name], text  # every planned kill hit a live process
    kinds = [kill.moment.kind for kill in report.kills]
    assert "checkpoint" in kinds and "report" in kinds, text
    # the checkpoint kill stopped the process with last.pt's temporary file open: a cut write
    assert all(k.cut_write for k in report.kills if k.moment.kind == "checkpoint"), text
    if KILLS[name] >= 4:
        # a kill before the first checkpoint, and a --resume start with nothing to resume yet
        assert report.empty_resumes >= 1, text
        assert "last-step" in kinds, text


def test_the_plan_is_seeded_and_holds_the_required_moments() -> None:
    pipe = Pipeline("p", "imagecl", ("train",), checkpoint_every=3)
    plans = [plan_kills(pipe, 10, 6, random.Random(seed)) for seed in (0, 0, 1)]
    assert plans[0] == plans[1] and plans[0] != plans[2]
    for plan in plans:
        kinds = [moment.kind for moment in plan]
        assert {"checkpoint", "report", "last-step"} <= set(kinds) and len(plan) == 6
        assert kinds[-2:] == ["last-step", "report"]  # the final phase comes last
        assert any(m.kind == "step" and m.step < 3 for m in plan)  # before the first checkpoint
        assert all(m.step <= 9 for m in plan if m.kind in ("step", "checkpoint"))
    assert str(Moment("step", 4, 0.012)) == "step 4 +12 ms"
