"""A full disk or a read-only run folder, through the training commands of every domain.

A write that fails (``OSError(ENOSPC)`` injected into the file the command opens: the
checkpoint, a metrics row, the summary) must end the command with one line naming the file and
the cause, exit status 2, and leave the previous ``last.pt``, ``metrics.csv`` and
``summary.json`` whole and loadable; a later ``--resume`` (the space freed) must reach the
result of an uninterrupted run. A run folder the process cannot write in is refused with one
line before any training. The failures are injected in-process by wrapping ``io.open`` (what
``os.fdopen`` and ``Path.open`` call), so a write fails exactly as on a full disk: part of the
data reaches the file, then ``ENOSPC``.
"""

from __future__ import annotations

import errno
import io
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.reliability._commands import (
    Command,
    assert_same_checkpoint,
    command,
    data_for,
    error_line,
    last_step,
    metric_steps,
    summary,
)

pytestmark = pytest.mark.reliability

DOMAINS = ["graphcl", "imagecl", "contragan"]
NO_SPACE = os.strerror(errno.ENOSPC)  # "No space left on device"
_REAL_OPEN = io.open


class _NoSpace:
    """A file whose writes fail with ENOSPC once ``room`` more bytes (or characters) went in;
    the part that fits is written first, as a real full disk does."""

    def __init__(self, handle: Any, room: int) -> None:
        self._handle, self._room = handle, room

    def write(self, data: Any) -> int:
        if len(data) > self._room:
            if self._room:
                self._handle.write(data[: self._room])
                self._handle.flush()
            self._room = 0
            raise OSError(errno.ENOSPC, NO_SPACE)
        self._room -= len(data)
        return int(self._handle.write(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)

    def __enter__(self) -> _NoSpace:
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.close()


class FullDisk:
    """The disk fills while the ``fail_on``-th write of a file named ``name`` is opened.

    Matches the file itself (an append) or the temporary file an atomic write renames onto it
    (``.<name>.*.tmp``); ``mode`` narrows the match (``"a"``: appends only). ``room`` bytes of
    that write still reach the file.
    """

    def __init__(self, name: str, *, fail_on: int = 1, room: int = 0, mode: str = "wax+") -> None:
        self.name, self.fail_on, self.room, self.mode = name, fail_on, room, mode
        self.opened = 0

    def _matches(self, file: Any, mode: str) -> bool:
        if not any(flag in mode for flag in self.mode):
            return False
        path = os.readlink(f"/proc/self/fd/{file}") if isinstance(file, int) else os.fspath(file)
        base = os.path.basename(path)
        return base == self.name or (base.startswith(f".{self.name}.") and base.endswith(".tmp"))

    def open(self, file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        handle = _REAL_OPEN(file, mode, *args, **kwargs)
        if self._matches(file, mode):
            self.opened += 1
            if self.opened == self.fail_on:
                return _NoSpace(handle, self.room)
        return handle


@pytest.fixture
def full_disk(monkeypatch: pytest.MonkeyPatch) -> Callable[..., FullDisk]:
    """``full_disk(name, ...)`` installs a :class:`FullDisk` until the test ends (or undo)."""
    if not Path("/proc/self/fd").is_dir():
        pytest.skip("the injection names files through /proc/self/fd (Linux)")

    def install(name: str, **kwargs: Any) -> FullDisk:
        disk = FullDisk(name, **kwargs)
        monkeypatch.setattr(io, "open", disk.open)
        return disk

    return install


def _run(cmd: Command, capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    capsys.readouterr()
    status = cmd.main(argv)
    return status, capsys.readouterr().err


class Finished:
    """An uninterrupted run of one domain's command: its folder and its arguments."""

    def __init__(self, domain: str, folder: Path) -> None:
        self.domain = domain
        self.cmd = command(domain)
        self.data = data_for(domain, folder)
        self.path = folder / "whole"
        assert self.cmd.main(self.argv(self.path)) == 0

    def argv(self, out: Path, *extra: str) -> list[str]:
        return self.cmd.argv(out, self.data, *extra)


@pytest.fixture(scope="module", params=DOMAINS)
def whole(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Finished:
    return Finished(request.param, tmp_path_factory.mktemp(request.param))


def _no_temporary_files(run: Path) -> None:
    left = [p.name for p in run.rglob(".*.tmp")]
    assert not left, left  # a failed atomic write removes its temporary file


def test_a_full_disk_at_a_checkpoint_keeps_the_last_one_and_resume_reaches_the_same_run(
    whole: Finished,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    full_disk: Callable[..., FullDisk],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second ``last.pt`` (step 4) fails half-written: one line, exit 2, step 2's kept."""
    parts = tmp_path / "parts"
    disk = full_disk("last.pt", fail_on=2, room=4096)
    status, err = _run(whole.cmd, capsys, whole.argv(parts))
    assert disk.opened == 2
    line = error_line(whole.cmd.prog, err)
    assert status == 2
    assert str(parts / "checkpoints" / "last.pt") in line and NO_SPACE in line, line
    assert last_step(parts) == 2  # the previous checkpoint, whole and loadable
    assert metric_steps(parts)[:2] == [1, 2]  # rows complete, none torn
    assert not (parts / "summary.json").exists()
    _no_temporary_files(parts)

    monkeypatch.undo()  # the space is freed
    assert whole.cmd.main(whole.argv(parts, "--resume")) == 0
    assert_same_checkpoint(
        whole.path / "checkpoints" / "last.pt", parts / "checkpoints" / "last.pt"
    )
    assert (parts / "metrics.csv").read_bytes() == (whole.path / "metrics.csv").read_bytes()
    assert summary(parts)["steps"] == summary(whole.path)["steps"] == 4


@pytest.mark.filterwarnings("ignore:the lr schedule changed on resume")  # the run is extended
def test_a_full_disk_at_the_summary_keeps_the_previous_summary(
    whole: Finished,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    full_disk: Callable[..., FullDisk],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A finished run extended to 6 steps; its new summary.json fails: the old one stays."""
    run = tmp_path / "run"
    shutil.copytree(whole.path, run)
    before = (run / "summary.json").read_bytes()
    full_disk("summary.json", room=10)
    status, err = _run(whole.cmd, capsys, whole.argv(run, "--resume", "--max-steps", "6"))
    line = error_line(whole.cmd.prog, err)
    assert status == 2
    assert str(run / "summary.json") in line and NO_SPACE in line, line
    assert (run / "summary.json").read_bytes() == before  # intact, still the 4-step run's
    assert summary(run)["steps"] == 4
    assert last_step(run) == 6 and metric_steps(run) == list(range(1, 7))
    _no_temporary_files(run)

    monkeypatch.undo()
    assert whole.cmd.main(whole.argv(run, "--resume", "--max-steps", "6")) == 0
    assert summary(run)["steps"] == 6 and last_step(run) == 6


@pytest.mark.parametrize("whole", ["graphcl"], indirect=True)
def test_a_full_disk_at_a_plot_keeps_the_previous_plot_and_summary(
    whole: Finished,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    full_disk: Callable[..., FullDisk],
) -> None:
    """The loss curves of a run extended to 6 steps fail half-written: the old plot stays."""
    run = tmp_path / "run"
    shutil.copytree(whole.path, run)
    plot = run / "plots" / "training.png"
    before = {path: path.read_bytes() for path in (plot, run / "summary.json")}
    full_disk("training.png", room=100)
    status, err = _run(whole.cmd, capsys, whole.argv(run, "--resume", "--max-steps", "6"))
    line = error_line(whole.cmd.prog, err)
    assert status == 2 and str(plot) in line and NO_SPACE in line, line
    assert {path: path.read_bytes() for path in before} == before
    _no_temporary_files(run)


@pytest.mark.parametrize("domain", ["imagecl"])
def test_a_full_disk_while_appending_a_metrics_row_leaves_no_torn_row(
    domain: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    full_disk: Callable[..., FullDisk],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Step 3's row fails after 5 characters: metrics.csv keeps rows 1-2 only, and a resume
    logs 3 and 4 once each."""
    cmd, data = command(domain), data_for(domain, tmp_path)
    run = tmp_path / "run"
    disk = full_disk("metrics.csv", fail_on=3, room=5, mode="a")
    status, err = _run(cmd, capsys, cmd.argv(run, data))
    assert disk.opened == 3
    line = error_line(cmd.prog, err)
    assert status == 2
    assert str(run / "metrics.csv") in line and NO_SPACE in line, line
    assert metric_steps(run) == [1, 2]  # no torn third row
    assert last_step(run) == 2

    monkeypatch.undo()
    assert cmd.main(cmd.argv(run, data, "--resume")) == 0
    assert metric_steps(run) == [1, 2, 3, 4] and last_step(run) == 4


class ReadOnly:
    """Makes a folder read-only: ``chmod 0o555`` (files 0o444), and where that does not stop
    this process (root), the same refusal injected into every call that would write there."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch
        self.folders: list[Path] = []

    def __call__(self, folder: Path) -> None:
        self.folders.append(folder)
        for path in [folder, *folder.rglob("*")]:
            path.chmod(0o555 if path.is_dir() else 0o444)
        try:
            fd, name = tempfile.mkstemp(dir=folder)
        except PermissionError:
            return  # the permissions hold
        os.close(fd)
        os.unlink(name)  # root: chmod does not stop writes, so refuse them here
        self._inject(folder.resolve())

    def _inject(self, folder: Path) -> None:
        def inside(path: Any) -> bool:
            if isinstance(path, int):
                return False
            resolved = Path(os.path.abspath(os.fspath(path)))
            return resolved == folder or folder in resolved.parents

        def refuse(path: Any) -> None:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))

        real_open, real_os_open = io.open, os.open
        writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

        def open_(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            if any(flag in mode for flag in "wax+") and inside(file):
                refuse(file)
            return real_open(file, mode, *args, **kwargs)

        def os_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            if flags & writes and inside(path):
                refuse(path)
            return real_os_open(path, flags, *args, **kwargs)

        def guard(real: Callable[..., Any]) -> Callable[..., Any]:
            def call(path: Any, *args: Any, **kwargs: Any) -> Any:
                if inside(path):
                    refuse(path)
                return real(path, *args, **kwargs)

            return call

        self.monkeypatch.setattr(io, "open", open_)
        self.monkeypatch.setattr(os, "open", os_open)
        for name in ("mkdir", "unlink", "remove", "rmdir", "replace", "rename"):
            self.monkeypatch.setattr(os, name, guard(getattr(os, name)))

    def restore(self) -> None:
        for folder in self.folders:
            for path in [folder, *folder.rglob("*")]:
                path.chmod(path.stat().st_mode | stat.S_IWUSR)


@pytest.fixture
def read_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[ReadOnly]:
    folders = ReadOnly(monkeypatch)
    yield folders
    monkeypatch.undo()
    folders.restore()


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if a training loop starts (not an error the console script catches)."""

    def started(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("training started in a run folder that cannot be written")

    monkeypatch.setattr("shared.train.run_loop", started)


@pytest.mark.usefixtures("no_training")
def test_a_read_only_run_folder_is_refused_before_training(
    whole: Finished,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    read_only: ReadOnly,
) -> None:
    # a new run inside a read-only folder
    parent = tmp_path / "read-only"
    parent.mkdir()
    read_only(parent)
    status, err = _run(whole.cmd, capsys, whole.argv(parent / "run"))
    line = error_line(whole.cmd.prog, err)
    assert status == 2 and str(parent / "run") in line and "Permission denied" in line, line
    assert not (parent / "run").exists()

    # resuming a finished run whose folder became read-only
    run = tmp_path / "finished"
    shutil.copytree(whole.path, run)
    files = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    read_only(run)
    status, err = _run(whole.cmd, capsys, whole.argv(run, "--resume", "--max-steps", "6"))
    line = error_line(whole.cmd.prog, err)
    assert status == 2 and str(run) in line and "Permission denied" in line, line
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == files

    # only checkpoints/ read-only: refused now, not at the first checkpoint after training
    run = tmp_path / "checkpoints-read-only"
    shutil.copytree(whole.path, run)
    read_only(run / "checkpoints")
    status, err = _run(whole.cmd, capsys, whole.argv(run, "--resume", "--max-steps", "6"))
    line = error_line(whole.cmd.prog, err)
    assert status == 2 and str(run / "checkpoints") in line, line
    assert "Permission denied" in line, line
