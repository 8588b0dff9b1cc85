"""Kill a pipeline's command at seeded random moments, resume it, compare with an unbroken run.

``python tests/reliability/kill_driver.py --pipeline NAME --kills N --seed S [--work DIR] [--fork]``

The command runs the way a user runs it: the console script (``graphcl``, ``imagecl``,
``contragan``, or ``torchrun --nproc-per-node 2 --no-python imagecl``) as a subprocess in a
session of its own, with tiny settings and a checkpoint every few steps (with ``--fork``, and in
the tests, a one-process start is a fork of a :class:`Zygote` that imported the commands once
and runs what the console script runs). It is SIGKILLed, every process of it (torchrun's
launcher and each rank, which torchrun puts in sessions of their own), at the moments of a
seeded plan, and after each kill the same command is started again, as a user would: with
``--resume`` once the run folder exists (also when the kill came before the first checkpoint,
so there is nothing to resume yet), without it when the kill came before the folder was made.
The last start runs to the end. Then the run is compared with an uninterrupted run of the same
command, made once per pipeline and work folder (``<work>/<pipeline>/reference/``):

* every checkpoint of :attr:`Pipeline.compare` (``last.pt``, finetune's ``best.pt``), loaded
  with the repository's ``load_checkpoint`` (``weights_only=True``): every tensor bit for bit
  (weights, optimizer and scheduler states, RNG states, queues, EMA ...) and every other value
  equal, except the stored config's ``out`` and ``resume``, which name the folder and the start;
* ``metrics.csv`` byte for byte (its columns are step, epoch and the logged numbers: there is no
  wall-clock column to leave out), ``summary.json`` (finetune: also ``result.json``) byte for
  byte, and the exported model byte for byte (its header's metadata in sorted order);
* the list of files in the run folder (a kill during an atomic write must not leave its
  temporary file behind once the run has been resumed).

After every kill, ``last.pt`` (if any) must load and be at a step no earlier than after the
kill before: a crash never destroys the previous checkpoint.

Kill moments (:class:`Moment`): ``start`` (a seeded delay after launch: imports, data loading),
``step`` (once ``metrics.csv`` shows a seeded step, 0 = the loop has started it, plus a seeded
delay of up to 40 ms), ``checkpoint`` (during a write of ``last.pt``: the process is stopped the
moment the temporary file of ``shared.checkpoint.atomic_write`` appears, and killed if the file
is still there, so the write is known to be cut; let go to try the next write otherwise),
``last-step`` (the moment ``metrics.csv`` shows the last step: the final checkpoint, evaluation
and report are still to come) and ``report`` (the moment the report phase's first file appears,
e.g. ``encoder.safetensors``); from the row before the last on, the process runs in slices of
half a millisecond between two looks for these two (:func:`_in_slices`). A plan of N kills
holds, in this order of priority, a ``checkpoint`` kill, a ``report`` kill, a ``step`` kill at
least one step before the first checkpoint, and a ``last-step`` kill; any more are seeded
``start`` (before the loop: within the time the reference took to write ``skipped.csv``),
``step`` and ``checkpoint`` kills. The kills happen in the order of the run (:func:`plan_kills`).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):  # run as a script: the repository's packages must import
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from shared.checkpoint import load_checkpoint
from tests.processes import process_groups
from tests.reliability._commands import GAN as TINY_GAN

__all__ = [
    "PIPELINES",
    "Kill",
    "Moment",
    "Pipeline",
    "Report",
    "compare_runs",
    "kill_and_resume",
    "plan_kills",
    "reference_run",
]

LAUNCH_TIMEOUT_S = 240  # one start of a command; a hang ends here as a failure
MOLECULES = 96  # FreeSolv's first molecules, the data of both graphcl pipelines

GRAPH = ["--device", "cpu", "--num-layers", "2", "--hidden", "16", "--amp", "off"]
GRAPH_DATA = ["--data", "{molecules}", "--smiles-column", "smiles"]
IMAGE = [
    "--quick",
    "--device",
    "cpu",
    "--data",
    "digits",
    "--image-size",
    "8",
    "--width",
    "4",
    "--head-dim",
    "8",
    "--log-every",
    "1",
    "--eval-every",
    "none",
    "--amp",
    "off",
    "--batch-size",
    "64",
    "--num-workers",
    "0",
]
GAN = [*TINY_GAN, "--log-every", "1"]  # the tiny networks of the other reliability tests


@dataclass(frozen=True)
class Pipeline:
    """One command under test: how to start it and what its run folder must hold at the end.

    ``argv`` may name ``{molecules}`` (a CSV of :data:`MOLECULES` FreeSolv molecules) and
    ``{encoder}`` (the encoder of the uninterrupted ``graphcl-pretrain`` run); paths in the
    other fields are relative to the run folder (``--out``).
    """

    name: str
    script: str  # the console script
    argv: tuple[str, ...]  # the command and its options, without --out / --resume
    checkpoint_every: int  # the steps between two checkpoints (a kill before the first: nothing)
    log_every: int = 1  # the steps between two rows of metrics.csv
    run: str = ""  # the folder of the training loop inside --out (finetune: its sub-run)
    report_marker: str = "encoder.safetensors"  # the report phase's first file
    compare: tuple[str, ...] = ("checkpoints/last.pt",)
    same_bytes: tuple[str, ...] = ("metrics.csv", "encoder.safetensors", "summary.json")
    ranks: int = 1  # > 1: under torchrun --nproc-per-node ranks (gloo on the CPU)


_TINY_STEPS = "--log-every 1 --checkpoint-every 3".split()
PIPELINES: dict[str, Pipeline] = {
    pipe.name: pipe
    for pipe in (
        Pipeline(
            "graphcl-pretrain",
            "graphcl",
            (
                "pretrain",
                *GRAPH,
                *GRAPH_DATA,
                *"--batch-size 16 --epochs 2 --adaptive".split(),
                *_TINY_STEPS,
            ),
            checkpoint_every=3,
        ),
        Pipeline(
            "graphcl-finetune",
            "graphcl",
            (
                "finetune",
                *GRAPH[:2],
                *GRAPH[-2:],
                *GRAPH_DATA,
                "--target",
                "expt",
                "--encoder",
                "{encoder}",
                *"--epochs 4 --seeds 0".split(),
            ),
            checkpoint_every=3,  # every epoch: 76 training molecules in batches of 32
            log_every=3,
            run="pretrained-seed0",
            report_marker="pretrained-seed0/result.json",
            compare=tuple(f"pretrained-seed0/checkpoints/{n}.pt" for n in ("last", "best")),
            same_bytes=(
                *(f"pretrained-seed0/{n}" for n in ("metrics.csv", "result.json")),
                "summary.json",
            ),
        ),
        Pipeline(
            "imagecl-simclr",
            "imagecl",
            ("train", "--method", "simclr", *IMAGE, "--max-steps", "10", *_TINY_STEPS[2:]),
            checkpoint_every=3,
        ),
        Pipeline(
            "imagecl-clae",
            "imagecl",
            ("train", "--method", "clae", *IMAGE, "--max-steps", "10", *_TINY_STEPS[2:]),
            checkpoint_every=3,
        ),
        Pipeline(
            "contragan",
            "contragan",
            ("train", *GAN, *"--max-steps 8 --checkpoint-every 2 --eval-every 3".split()),
            checkpoint_every=2,
            report_marker="generator.safetensors",
            same_bytes=("metrics.csv", "generator.safetensors", "summary.json"),
        ),
        Pipeline(
            "imagecl-simclr-ddp",
            "imagecl",
            ("train", "--method", "simclr", *IMAGE, "--max-steps", "9", *_TINY_STEPS[2:]),
            checkpoint_every=3,
            ranks=2,
        ),
    )
}

KINDS = ("start", "step", "checkpoint", "last-step", "report")


@dataclass(frozen=True)
class Moment:
    """When to kill: ``kind`` (see the module's docstring), at or after ``step``, ``delay`` s
    later (``start``: after launch)."""

    kind: str
    step: int = 0
    delay: float = 0.0

    def __str__(self) -> str:
        if self.kind in ("start", "step"):
            where = f" {self.step}" if self.kind == "step" else ""
            return f"{self.kind}{where} +{self.delay * 1000:.0f} ms"
        return f"{self.kind} (from step {self.step})" if self.kind == "checkpoint" else self.kind


@dataclass
class Kill:
    """What one planned kill did."""

    moment: Moment
    landed: bool  # the process was alive and got SIGKILL (not: it had ended before)
    cut_write: bool  # a temporary file of an atomic write was left behind
    checkpoint_step: int | None  # the step of last.pt after the kill (None: there is none)
    resumed: bool  # the start it interrupted had --resume


@dataclass
class Report:
    """The outcome of :func:`kill_and_resume`; ``differences`` empty means the same result."""

    pipeline: str
    kills: list[Kill] = field(default_factory=list)
    starts: int = 0  # starts of the command after the reference (the killed ones and the last)
    empty_resumes: int = 0  # starts with --resume in a folder without a checkpoint yet
    differences: list[str] = field(default_factory=list)

    @property
    def landed(self) -> int:
        return sum(kill.landed for kill in self.kills)

    def lines(self) -> list[str]:
        out = [
            f"{self.pipeline}: {self.landed} kills landed of {len(self.kills)}, {self.starts} "
            f"starts, {self.empty_resumes} with --resume before any checkpoint"
        ]
        for kill in self.kills:
            flags = ("landed" if kill.landed else "missed (the process had ended)") + (
                ", cut an atomic write" if kill.cut_write else ""
            )
            resumed = "--resume" if kill.resumed else "fresh start"
            out.append(
                f"  kill at {kill.moment}: {flags}; {resumed}; last.pt then at step "
                f"{kill.checkpoint_step}"
            )
        out += [f"  DIFFERENCE: {text}" for text in self.differences] or ["  same result"]
        return out


def plan_kills(
    pipe: Pipeline, total: int, kills: int, rng: random.Random, startup_s: float = 3.0
) -> list[Moment]:
    """``kills`` moments in the order they happen along the run (a run of ``total`` steps
    whose loop starts ``startup_s`` after launch: ``start`` kills come before)."""
    every = pipe.checkpoint_every
    last_ckpt = (total - 1) // every * every  # the last checkpoint before the final one
    first = [Moment("checkpoint", rng.randint(1, max(1, last_ckpt))), Moment("report")]
    # before the first checkpoint (a step at least one step before it: 0 = the loop's start),
    # so the restart has nothing to resume
    early = range(0, max(1, every - 1), pipe.log_every)
    first.append(Moment("step", rng.choice(early), rng.uniform(0, 0.02)))
    first.append(Moment("last-step"))
    chosen = first[:kills]
    while len(chosen) < kills:
        kind = rng.choice(("start", "step", "step", "checkpoint"))
        if kind == "start":
            chosen.append(Moment("start", 0, rng.uniform(0, startup_s)))
        elif kind == "step":
            chosen.append(Moment("step", rng.randint(1, total - 1), rng.uniform(0, 0.04)))
        else:
            chosen.append(Moment("checkpoint", rng.randint(1, max(1, last_ckpt))))
    order = {"start": 0, "step": 1, "checkpoint": 1, "last-step": 2, "report": 3}
    return sorted(chosen, key=lambda m: (order[m.kind], m.step, m.kind))


# ---------------------------------------------------------------------------------------------
# Starting and watching a command


def _script(name: str) -> str:
    """The console script ``name`` installed beside this python (``pip install -e .``)."""
    path = Path(sys.executable).with_name(name)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: install the package (pip install -e .)")
    return str(path)


_TORCHRUN_VARS = {
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
}


def _command(pipe: Pipeline, work: Path, out: Path, resume: bool) -> list[str]:
    values = {"molecules": str(_molecules(work)), "encoder": str(_encoder(work))}
    argv = [arg.format(**values) if "{" in arg else arg for arg in pipe.argv]
    argv += ["--out", str(out), *(["--resume"] if resume else [])]
    if pipe.ranks == 1:
        return [_script(pipe.script), *argv]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={pipe.ranks}",
        "--no-python",
        _script(pipe.script),
        *argv,
    ]


def _environment(work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _TORCHRUN_VARS}
    env.update(
        OMP_NUM_THREADS="1",  # 2 cores, possibly 2 pytest workers: no oversubscription
        PYTHONUNBUFFERED="1",
        MPLBACKEND="Agg",
        CONTRASTKIT_CACHE=str(work / "cache"),  # parsed molecules, shared by every start
    )
    return env


class Zygote:
    """A process that has imported the commands once and forks one child per start.

    Importing torch, PyG, rdkit, kornia and the commands takes seconds of CPU, most of a tiny
    run; a forked child skips that and runs exactly what the console script runs
    (``<cli>.main(argv)``, then exit with its status) in a process of its own, in its own
    session, SIGKILLed the same way. The tests use it for the one-process pipelines; the
    script without ``--fork`` starts the console scripts themselves, and torchrun's starts are
    always the console script. What a fork cannot show is whatever differs between fresh
    interpreters (a different ``PYTHONHASHSEED`` per start, for one): the torchrun pipeline and
    the script without ``--fork`` cover that.
    """

    PRELOAD = (
        "graphcl.cli",
        "imagecl.cli",
        "contragan.cli",
        "graphcl.commands.pretrain",
        "graphcl.commands.finetune",
        "imagecl.commands.train",
        "contragan.commands.train",
        "matplotlib.pyplot",
        "sklearn.manifold",
        "sklearn.linear_model",
        "sklearn.svm",
    )

    def __init__(self, work: Path) -> None:
        work.mkdir(parents=True, exist_ok=True)
        self._exits: dict[int, int] = {}
        self._pids: queue.Queue[int] = queue.Queue()
        self._cond = threading.Condition()
        self._closed = False
        with (work / "zygote.log").open("w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "--serve"],
                cwd=work,
                env=_environment(work),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                bufsize=1,
            )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if self._pids.get(timeout=LAUNCH_TIMEOUT_S) != 0:
            raise RuntimeError("the zygote did not start")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            kind, *values = line.split()
            if kind in ("ready", "pid"):
                self._pids.put(int(values[0]) if values else 0)
            elif kind == "exit":
                with self._cond:
                    self._exits[int(values[0])] = int(values[1])
                    self._cond.notify_all()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._pids.put(-1)

    def fork(self, args: list[str], cwd: Path, log: Path) -> int:
        """Start ``args`` (a console script's path and its arguments); return the child's pid."""
        assert self.proc.stdin is not None
        request = {"args": args, "cwd": str(cwd), "log": str(log)}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        pid = self._pids.get(timeout=60)
        if pid <= 0:
            raise RuntimeError(f"the zygote could not start {args[:2]}")
        return pid

    def exit_code(self, pid: int) -> int | None:
        with self._cond:
            return self._exits.get(pid)

    def wait(self, pid: int, timeout: float | None) -> int:
        with self._cond:
            self._cond.wait_for(lambda: pid in self._exits or self._closed, timeout)
            if pid not in self._exits:
                raise TimeoutError(f"process {pid} did not end in {timeout} s")
            return self._exits[pid]

    def close(self) -> None:
        """End the zygote (its children have ended: every start is waited for)."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self._reader.join(timeout=60)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _serve() -> None:
    """The zygote (``--serve``): import, say ``ready``, fork a child per request line on stdin
    (``pid <pid>``), and report every child's end (``exit <pid> <status>``, -9 for SIGKILL)."""
    import importlib
    import select

    for module in Zygote.PRELOAD:
        importlib.import_module(module)

    def say(text: str) -> None:
        os.write(1, (text + "\n").encode())

    say("ready")
    pending = b""
    while True:
        readable, _, _ = select.select([0], [], [], 0.005)
        while True:  # reap the children that have ended
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            say(f"exit {pid} {os.waitstatus_to_exitcode(status)}")
        if not readable:
            continue
        chunk = os.read(0, 1 << 16)
        if not chunk:
            return
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(request["args"], Path(request["cwd"]), Path(request["log"]))
            say(f"pid {pid}")


def _child(args: list[str], cwd: Path, log: Path) -> None:
    """A forked start: what the console script ``args[0]`` does with ``args[1:]``; never returns."""
    import importlib
    import traceback

    code = 1
    try:
        os.setsid()
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        os.close(null)
        os.chdir(cwd)
        script = Path(args[0]).name
        sys.argv = [script, *args[1:]]
        code = importlib.import_module(f"{script}.cli").main(args[1:])
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class Started:
    """One start of the command, in its own process group (session), its output in ``log``: a
    subprocess, or a child of ``zygote``."""

    def __init__(self, args: list[str], work: Path, log: Path, zygote: Zygote | None) -> None:
        self.args, self.log, self.zygote = args, log, zygote
        log.parent.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen[bytes] | None = None
        if zygote is not None and pipe_ranks(args) == 1:
            self.pid = zygote.fork(args, work, log)
        else:
            with log.open("w") as handle:
                self.proc = subprocess.Popen(
                    args,
                    cwd=work,
                    env=_environment(work),
                    stdout=handle,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            self.pid = self.proc.pid
        self.t0 = time.monotonic()
        self._groups: list[int] = []

    @property
    def returncode(self) -> int | None:
        if self.proc is not None:
            return self.proc.poll()
        assert self.zygote is not None
        return self.zygote.exit_code(self.pid)

    def alive(self) -> bool:
        return self.returncode is None

    def signal(self, sig: signal.Signals) -> bool:
        """Send ``sig`` to the process group of the start and of every process under it.

        torchrun starts each rank in a session of its own, so the launcher's group alone
        would leave the ranks running on (and writing into the run folder) after a "kill";
        the groups are collected on the first signal and kept, as the ranks of a killed
        launcher are no longer its children. False when the start has ended already.
        """
        if not self._groups:
            self.collect_groups()
        sent = False
        for group in self._groups:
            try:
                os.killpg(group, sig)
                sent = True
            except (ProcessLookupError, PermissionError):
                continue
        if not sent:
            try:  # a forked child a moment before its setsid
                os.kill(self.pid, sig)
            except ProcessLookupError:
                return False
        return True

    def collect_groups(self) -> None:
        """Note the process groups :meth:`signal` reaches: the start's and its processes'."""
        self._groups = [self.pid, *process_groups(self.pid)]

    def kill(self) -> bool:
        """SIGKILL every process of the start (torchrun's launcher and every rank); True if it
        was alive."""
        alive = self.alive()
        self.signal(signal.SIGKILL)
        self._wait(None)
        return alive

    def _wait(self, timeout: float | None) -> int:
        if self.proc is not None:
            return self.proc.wait(timeout=timeout)
        assert self.zygote is not None
        return self.zygote.wait(self.pid, timeout)

    def wait(self) -> int:
        try:
            return self._wait(max(1.0, LAUNCH_TIMEOUT_S - self.elapsed()))
        except (subprocess.TimeoutExpired, TimeoutError):
            self.kill()
            raise TimeoutError(
                f"{' '.join(self.args[:3])} did not end in {LAUNCH_TIMEOUT_S} s"
            ) from None

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def tail(self, lines: int = 25) -> str:
        text = self.log.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


def pipe_ranks(args: list[str]) -> int:
    """1 for a console script's command line, more for a torchrun one."""
    return 2 if "torch.distributed.run" in args else 1


def _file_id(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except FileNotFoundError:
        return None


def _tmp_files(folder: Path, target: str = "last.pt") -> set[str]:
    """The temporary files of ``atomic_write(folder / target)`` present now."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return set()
    prefix = f".{target}."
    return {name for name in names if name.startswith(prefix) and name.endswith(".tmp")}


def _any_tmp(folder: Path) -> list[str]:
    """Every temporary file of an atomic write under ``folder`` (``.<name>.<random>.tmp``)."""
    if not folder.is_dir():
        return []
    return sorted(str(p.relative_to(folder)) for p in folder.rglob(".*.tmp") if p.is_file())


class Watch:
    """What a start has written so far, ignoring what earlier starts left in the folder."""

    def __init__(self, pipe: Pipeline, out: Path) -> None:
        run = out / pipe.run
        self.metrics, self.checkpoints = run / "metrics.csv", run / "checkpoints"
        self.marker = out / pipe.report_marker
        self.metrics_id0, self.marker_id0 = _file_id(self.metrics), _file_id(self.marker)
        self.tmp0 = _tmp_files(self.checkpoints)
        self._size, self._step, self._fresh = -1, 0, self.metrics_id0 is None

    def metrics_started(self) -> bool:
        """Whether this start has written its own ``metrics.csv`` yet (the loop's first act).

        The file of the killed start counts until its inode changes (``MetricsLogger``
        rewrites it atomically at once); from then on a later inode may be the old number
        again (the file system reuses freed ones), so the first change is remembered."""
        if not self._fresh:
            now = _file_id(self.metrics)
            self._fresh = now is not None and now != self.metrics_id0
        return self._fresh and self.metrics.is_file()

    def last_step(self) -> int:
        """The last step in this start's ``metrics.csv`` (a new file: it rewrites it first)."""
        if not self.metrics_started():
            return 0  # none yet, or still the file of the killed start
        try:
            stat = self.metrics.stat()
        except FileNotFoundError:
            return self._step
        if stat.st_size != self._size:
            self._size = stat.st_size
            try:
                lines = self.metrics.read_text().splitlines()
            except FileNotFoundError:
                return self._step
            rows = [line for line in lines[1:] if line.strip()]
            if rows:
                head = rows[-1].split(",", 1)[0]
                self._step = int(head) if head.isdigit() else self._step
        return self._step

    def report_started(self) -> bool:
        now = _file_id(self.marker)
        return now is not None and now != self.marker_id0

    def new_tmp(self) -> bool:
        return bool(_tmp_files(self.checkpoints) - self.tmp0)


def _poll(started: Started, ready: Any, interval: float) -> bool:
    """Wait until ``ready()`` is true (True) or the process has ended (False)."""
    while started.alive():
        if ready():
            return True
        if started.elapsed() > LAUNCH_TIMEOUT_S:
            started.kill()
            raise TimeoutError(f"{' '.join(started.args[:3])} did not end in {LAUNCH_TIMEOUT_S} s")
        time.sleep(interval)
    return False


def _in_slices(started: Started, ready: Any, slice_s: float = 0.0005) -> None:
    """Let the stopped-and-continued process run in slices of ``slice_s`` until ``ready()``;
    it is left stopped. The last few milliseconds of a run (finetune: its report files, then
    the exit) cannot pass unseen between two looks of a watcher starved of CPU."""
    started.collect_groups()
    started.signal(signal.SIGSTOP)
    while not ready() and started.alive():
        started.signal(signal.SIGCONT)
        time.sleep(slice_s)
        started.signal(signal.SIGSTOP)


def _kill_at(
    started: Started, watch: Watch, moment: Moment, total: int, log_every: int = 1
) -> bool:
    """Kill ``started`` at ``moment``; True if it was alive when killed."""
    near_end = max(1, total - log_every)  # the row before the last: watched in slices from here
    if moment.kind == "start":
        if not _poll(started, lambda: started.elapsed() >= moment.delay, 0.01):
            return False
    elif moment.kind == "step":  # step 0: as soon as the loop has started its metrics.csv
        ready = (lambda: watch.last_step() >= moment.step) if moment.step else watch.metrics_started
        if not _poll(started, ready, 0.002):
            return False
        time.sleep(moment.delay)
    elif moment.kind in ("last-step", "report"):
        if not _poll(started, lambda: watch.last_step() >= near_end, 0.001):
            return False
        if moment.kind == "last-step":
            _in_slices(started, lambda: watch.last_step() >= total)
        else:
            _in_slices(started, watch.report_started)
    elif moment.kind == "checkpoint":
        if not _poll(started, lambda: watch.last_step() >= moment.step, 0.002):
            return False
        started.collect_groups()  # now, so that stopping it takes a moment only
        while True:  # stop it the moment a write begins; kill it if the write is still on
            if not _poll(started, watch.new_tmp, 0.0005):
                return False
            started.signal(signal.SIGSTOP)
            if watch.new_tmp():
                break
            started.signal(signal.SIGCONT)  # the write had ended: try the next one
            watch.tmp0 = _tmp_files(watch.checkpoints)
    else:
        raise ValueError(f"unknown kill moment {moment.kind!r}; one of {KINDS}")
    return started.kill()


# ---------------------------------------------------------------------------------------------
# Inputs shared by the pipelines


def _molecules(work: Path) -> Path:
    """A CSV of FreeSolv's first :data:`MOLECULES` molecules with their target ``expt``."""
    path = work / "molecules.csv"
    if not path.is_file():
        from graphcl.data import load_molecules

        data = load_molecules("freesolv")
        assert data.targets is not None
        work.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["smiles", "expt"])
            targets = data.targets[:MOLECULES, 0].tolist()
            writer.writerows(zip(data.smiles[:MOLECULES], targets, strict=True))
    return path


def _encoder(work: Path) -> Path:
    """The encoder of the uninterrupted ``graphcl-pretrain`` run (:func:`reference_run` makes
    it first for a pipeline that names ``{encoder}``)."""
    return work / "graphcl-pretrain" / "reference" / "encoder.safetensors"


def reference_run(name: str, work: Path, zygote: Zygote | None = None) -> Path:
    """The uninterrupted run of pipeline ``name`` in ``work/<name>/reference`` (made once)."""
    pipe = PIPELINES[name]
    folder = work / name
    done, out = folder / "reference.done", folder / "reference"
    if done.is_file():
        return out
    if "{encoder}" in pipe.argv:
        reference_run("graphcl-pretrain", work, zygote)
    shutil.rmtree(out, ignore_errors=True)  # an earlier reference that did not finish
    args = _command(pipe, work, out, resume=False)
    started = Started(args, work, folder / "logs" / "reference", zygote)
    code = started.wait()
    if code != 0:
        raise RuntimeError(f"the uninterrupted {name} run failed ({code}):\n{started.tail()}")
    # the loop starts right after skipped.csv (every command writes it once its data is read)
    startup = (out / "skipped.csv").stat().st_mtime - (time.time() - started.elapsed())
    done.write_text(json.dumps({"seconds": started.elapsed(), "startup_s": startup}) + "\n")
    return out


def _total_steps(pipe: Pipeline, reference: Path) -> int:
    with (reference / pipe.run / "metrics.csv").open(newline="") as handle:
        return max(int(row["step"]) for row in csv.DictReader(handle))


def _checkpoint_step(pipe: Pipeline, out: Path, differences: list[str]) -> int | None:
    """The step of ``last.pt`` now; a checkpoint that does not load is a difference."""
    path = out / pipe.run / "checkpoints" / "last.pt"
    if not path.is_file():
        return None
    try:
        return int(load_checkpoint(path)["step"])
    except ValueError as error:
        differences.append(f"a kill left a checkpoint that does not load: {error}")
        return None


def kill_and_resume(
    name: str, work: Path, kills: int, seed: int, zygote: Zygote | None = None
) -> Report:
    """Run pipeline ``name`` killed ``kills`` times (seeded plan), resumed to the end, and
    compare it with the uninterrupted run; see the module's docstring. With ``zygote`` the
    one-process starts are its forks (see :class:`Zygote`)."""
    pipe = PIPELINES[name]
    reference = reference_run(name, work, zygote)
    total = _total_steps(pipe, reference)
    startup = json.loads((work / name / "reference.done").read_text())["startup_s"]
    moments = plan_kills(pipe, total, kills, random.Random(f"{name}:{seed}"), startup)
    out = work / name / f"killed-seed{seed}"
    logs = work / name / "logs" / f"killed-seed{seed}"
    shutil.rmtree(out, ignore_errors=True)  # an earlier try with this seed
    report = Report(name)
    previous: int | None = None
    for moment in [*moments, None]:
        # a user's restart: --resume once the folder exists (before the first checkpoint too)
        resume = out.is_dir()
        report.empty_resumes += resume and not (out / pipe.run / "checkpoints/last.pt").is_file()
        tmp_before = set(_any_tmp(out))
        args = _command(pipe, work, out, resume)
        started = Started(args, work, logs / f"{report.starts}", zygote)
        report.starts += 1
        if moment is None:
            code = started.wait()
            if code != 0:
                report.differences.append(f"the last start ended with {code}:\n{started.tail()}")
                return report
            break
        watch = Watch(pipe, out)
        landed = _kill_at(started, watch, moment, total, pipe.log_every)
        cut = bool(set(_any_tmp(out)) - tmp_before)
        step = _checkpoint_step(pipe, out, report.differences)
        report.kills.append(Kill(moment, landed, cut, step, resume))
        if not landed and started.returncode != 0:
            report.differences.append(
                f"the start before the kill at {moment} ended with {started.returncode}:\n"
                f"{started.tail()}"
            )
            return report
        if previous is not None and (step is None or step < previous):
            report.differences.append(
                f"the kill at {moment} lost the checkpoint of step {previous} (now {step})"
            )
        previous = step
    report.differences += compare_runs(pipe, reference, out)
    return report


# ---------------------------------------------------------------------------------------------
# Comparing two runs


def _same(a: Any, b: Any, where: str, out: list[str]) -> None:
    """Append to ``out`` where ``a`` and ``b`` differ: tensors bit for bit, containers by key."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            out.append(f"{where}: {type(a).__name__} against {type(b).__name__}")
        elif a.dtype != b.dtype or a.shape != b.shape:
            out.append(f"{where}: {a.dtype}{tuple(a.shape)} against {b.dtype}{tuple(b.shape)}")
        elif not torch.equal(_bits(a), _bits(b)):
            out.append(f"{where}: values differ")
    elif isinstance(a, Mapping) and isinstance(b, Mapping):
        if a.keys() != b.keys():
            out.append(f"{where}: keys {sorted(map(str, a.keys() ^ b.keys()))} in one only")
        for key in a.keys() & b.keys():
            _same(a[key], b[key], f"{where}.{key}" if where else str(key), out)
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            out.append(f"{where}: {len(a)} items against {len(b)}")
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            _same(x, y, f"{where}[{i}]", out)
    elif a != b and not (a != a and b != b):  # NaN == NaN here
        out.append(f"{where}: {a!r} against {b!r}")


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes (so -0.0 differs from 0.0 and NaN equals the same NaN)."""
    flat = t.detach().cpu().reshape(-1).contiguous()
    return flat.view(torch.uint8) if flat.dtype != torch.bool else flat


def _drop_run_names(config: Any) -> Any:
    """The stored config without ``out`` and ``resume``, the two keys that name the start."""
    if isinstance(config, Mapping):
        return {k: _drop_run_names(v) for k, v in config.items() if k not in ("out", "resume")}
    return config


def _files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def compare_runs(pipe: Pipeline, reference: Path, resumed: Path) -> list[str]:
    """Every difference between the uninterrupted and the killed-and-resumed run folders."""
    differences: list[str] = []
    for name in pipe.compare:
        a, b = reference / name, resumed / name
        if not (a.is_file() and b.is_file()):
            differences.append(f"{name}: present in {'reference' if a.is_file() else 'resumed'}")
            continue
        ca, cb = load_checkpoint(a), load_checkpoint(b)
        ca["config"], cb["config"] = _drop_run_names(ca["config"]), _drop_run_names(cb["config"])
        found: list[str] = []
        _same(ca, cb, "", found)
        differences += [f"{name}: {text}" for text in sorted(found)]
    for name in pipe.same_bytes:
        a, b = reference / name, resumed / name
        if not a.is_file() or not b.is_file() or a.read_bytes() != b.read_bytes():
            differences.append(f"{name}: {_first_difference(a, b)}")
    ours, theirs = _files(resumed), _files(reference)
    if ours != theirs:
        differences.append(
            f"files only in the resumed run: {sorted(ours - theirs)}; only in the reference: "
            f"{sorted(theirs - ours)}"
        )
    return differences


def _first_difference(a: Path, b: Path) -> str:
    if not a.is_file() or not b.is_file():
        return f"missing from the {'resumed' if a.is_file() else 'reference'} run"
    try:
        ta, tb = a.read_text().splitlines(), b.read_text().splitlines()
    except UnicodeDecodeError:
        return "the bytes differ"
    for i, (x, y) in enumerate(zip(ta, tb, strict=False)):
        if x != y:
            return f"line {i + 1} differs: {x!r} (reference) against {y!r} (resumed)"
    return f"{len(ta)} lines (reference) against {len(tb)} (resumed)"


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None and sys.argv[1:] == ["--serve"]:
        _serve()
        return 0
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--pipeline", choices=sorted(PIPELINES), required=True)
    parser.add_argument("--kills", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=Path("runs") / "kill-driver")
    parser.add_argument(
        "--fork",
        action="store_true",
        help="fork every one-process start from a zygote that imported the commands once (as "
        "the tests do) instead of starting the console script",
    )
    args = parser.parse_args(argv)
    work = args.work.resolve()
    zygote = Zygote(work) if args.fork else None
    try:
        report = kill_and_resume(args.pipeline, work, args.kills, args.seed, zygote)
    finally:
        if zygote is not None:
            zygote.close()
    print("\n".join(report.lines()))
    print(f"run folders and logs: {work / args.pipeline}")
    return 0 if not report.differences and report.landed == args.kills else 1


if __name__ == "__main__":
    sys.exit(main())
