"""Run folders, metrics logs, summaries and reports.

Every command writes one folder ``runs/<pipeline>/<name>/`` with ``config.json``,
``metrics.csv`` (one row per logged step), ``checkpoints/last.pt`` (+ ``best.pt``),
``summary.json``, ``plots/*.png`` and ``report.md`` showing plots and summary (see
docs/architecture.md, "Run folders").
"""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from torch import Tensor

from shared.checkpoint import append_whole, atomic_write, writable_folder
from shared.distributed import all_gather_object

__all__ = [
    "MetricsLogger",
    "RunDir",
    "discard_unused_runs",
    "open_run",
    "write_report",
    "write_summary",
]

SKIPPED_FILE = "skipped.csv"


def _check_name(kind: str, name: str) -> None:
    if not name or name in (".", "..") or "/" in name or "\\" in name:
        raise ValueError(f"{kind} must be a plain folder name, got {name!r}")


@dataclass(frozen=True)
class RunDir:
    """The folder of one run; ``RunDir.create`` makes it, ``RunDir(path)`` opens an existing one."""

    path: Path

    @classmethod
    def create(
        cls,
        pipeline: str,
        name: str | None = None,
        *,
        root: str | Path = "runs",
        resume: bool = False,
        overwrite: bool = False,
    ) -> RunDir:
        """Create ``root/pipeline/name/`` with ``checkpoints/`` and ``plots/``.

        ``name`` defaults to a timestamp (``-1``, ``-2`` ... appended if taken). An existing
        folder holding any file is refused unless ``resume=True`` (continue in it; it must hold
        ``checkpoints/last.pt``) or ``overwrite=True`` (delete it first), so a typo never mixes
        two runs' files. A folder this process cannot write in is refused with an ``OSError``.
        """
        _check_name("pipeline", pipeline)
        if resume and overwrite:
            raise ValueError("resume=True and overwrite=True contradict each other")
        base = Path(root) / pipeline
        if name is None:
            if resume:
                raise ValueError("resume=True needs the name of the run to resume")
            stamp = time.strftime("%Y%m%d-%H%M%S")
            name, suffix = stamp, 0
            while (base / name).exists():
                suffix += 1
                name = f"{stamp}-{suffix}"
        _check_name("run name", name)
        path = base / name
        run = cls(path)
        if not path.exists():
            _CREATED.append(path)
        if resume:
            if not run.last_checkpoint.is_file():
                raise FileNotFoundError(f"cannot resume: {run.last_checkpoint} does not exist")
            run.remove_partial_writes()
        elif path.exists() and any(entry.is_file() for entry in path.rglob("*")):
            if not overwrite:
                raise FileExistsError(
                    f"run folder {path} is not empty: continue it with --resume (resume=True) "
                    "or give another --out (overwrite=True replaces it)"
                )
            shutil.rmtree(path)
        for folder in (run.checkpoints, run.plots, path):
            writable_folder(folder)  # refused now, not at the first checkpoint after training
        return run

    def remove_partial_writes(self) -> list[Path]:
        """Delete the temporary files of writes a crash cut short; return them.

        A process killed inside :func:`~shared.checkpoint.atomic_write` leaves its temporary
        file (``.<name>.<random>.tmp``, as large as a checkpoint) beside the intact old file,
        and one killed while :func:`~shared.checkpoint.writable_folder` probes a folder leaves
        its empty ``.write-check-<random>.tmp``; a resumed run calls this first, so kills do not
        pile them up.
        """
        removed = sorted(p for p in self.path.rglob(".*.tmp") if p.is_file())
        for tmp in removed:
            tmp.unlink(missing_ok=True)
        return removed

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def plots(self) -> Path:
        return self.path / "plots"

    @property
    def config_path(self) -> Path:
        return self.path / "config.json"

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.csv"

    @property
    def summary_path(self) -> Path:
        return self.path / "summary.json"

    @property
    def report_path(self) -> Path:
        return self.path / "report.md"

    @property
    def skipped_path(self) -> Path:
        return self.path / SKIPPED_FILE

    @property
    def last_checkpoint(self) -> Path:
        return self.checkpoints / "last.pt"

    @property
    def best_checkpoint(self) -> Path:
        return self.checkpoints / "best.pt"

    @property
    def tensorboard_dir(self) -> Path:
        return self.path / "tensorboard"


# folders RunDir.create made in this process, in order: discard_unused_runs removes the ones a
# failed command made and left without a file
_CREATED: list[Path] = []
# what a command writes before it has trained or computed anything
_START_FILES = frozenset({"config.json", SKIPPED_FILE})


@contextmanager
def discard_unused_runs() -> Iterator[None]:
    """Remove the run folders made inside this block that hold no file when the block fails.

    A command that fails after making its run folder but before it has a result (an unknown
    data set, an invalid molecule file) would leave empty ``checkpoints/`` and ``plots/`` (and
    maybe ``config.json``) behind; the CLI runs every command inside this block. A folder that
    holds anything more (a checkpoint, a metrics row, a plot), or one that existed before, is
    never touched; the error is re-raised.
    """
    start = len(_CREATED)
    try:
        yield
    except BaseException:
        for path in reversed(_CREATED[start:]):
            files = [entry for entry in path.rglob("*") if entry.is_file()]
            if path.is_dir() and all(f.parent == path and f.name in _START_FILES for f in files):
                shutil.rmtree(path, ignore_errors=True)
        raise
    finally:
        del _CREATED[start:]


def open_run(
    out: str | Path | None, default: str | Path, *, resume: bool = False, rank: int = 0
) -> RunDir:
    """The run folder of a command: ``out``, or ``default`` with ``-<time>`` appended.

    Under DDP every rank must call it (all ranks get rank 0's path, time stamp included); only
    rank 0 creates the folder (:meth:`RunDir.create`). ``resume`` needs ``out``; a folder that
    exists without ``checkpoints/last.pt`` (the run was stopped before its first checkpoint) is
    started over in place, with one line saying so: the caller then trains from step 0, i.e.
    passes ``resume=run.last_checkpoint.is_file()`` on to the loop.
    """
    if resume and out is None:
        raise ValueError("--resume needs --out, the folder of the run to continue")
    if out is None:
        out = f"{default}-{time.strftime('%Y%m%d-%H%M%S')}"
    path = Path(all_gather_object(str(out))[0]).resolve()
    run = RunDir(path)
    if rank != 0:
        return run
    if resume and path.is_dir() and not run.last_checkpoint.is_file():
        print(
            f"{run.last_checkpoint} does not exist (the run stopped before its first "
            "checkpoint): nothing to resume, starting it from step 0",
            flush=True,
        )
        run.remove_partial_writes()
        for folder in (run.checkpoints, run.plots):
            writable_folder(folder)
        return run
    return RunDir.create(path.parent.name, path.name, root=path.parent.parent, resume=resume)


def _scalar(value: Any) -> float | int | str:
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(f"metric tensors must hold one value, got shape {tuple(value.shape)}")
        return value.item()
    if isinstance(value, (int, float, str)):
        return value
    raise ValueError(f"metric values must be numbers, strings or 1-element tensors, got {value!r}")


class MetricsLogger:
    """Append one row per logged step to ``metrics.csv`` (and optionally TensorBoard).

    Columns grow safely: when a key appears for the first time the file is rewritten with the
    wider header and the old rows keep their values (new cells empty). With ``resume_step`` the
    existing rows are kept up to and including that step and later ones are dropped: they were
    logged after the checkpoint the run resumes from and will be logged again.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        resume_step: int | None = None,
        tensorboard_dir: str | Path | None = None,
    ) -> None:
        self.path = Path(path)
        self.fieldnames: list[str] = ["step"]
        rows: list[dict[str, str]] = []
        if resume_step is not None and self.path.is_file():
            with self.path.open(newline="", encoding="utf-8") as handle:
                reader = csv.DictReader(handle)
                self.fieldnames = list(reader.fieldnames or ["step"])
                rows = [row for row in reader if int(row["step"]) <= resume_step]
        self._rewrite(rows)
        self._writer: Any = None
        if tensorboard_dir is not None:
            # Imported lazily: tensorboard is an optional dependency, used only when asked.
            from torch.utils.tensorboard import SummaryWriter

            purge = None if resume_step is None else resume_step + 1
            self._writer = SummaryWriter(str(tensorboard_dir), purge_step=purge)

    def _rewrite(self, rows: list[dict[str, str]]) -> None:
        """Write the whole file atomically (header + rows); used when the columns change."""
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=self.fieldnames, restval="", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        with atomic_write(self.path) as handle:
            handle.write(buffer.getvalue().encode("utf-8"))

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Write the row ``{"step": step, **metrics}``; numbers keep full precision (``repr``)."""
        values = {key: _scalar(value) for key, value in metrics.items()}
        if "step" in values:
            raise ValueError("'step' is written by the logger; do not pass it as a metric")
        new_keys = [key for key in values if key not in self.fieldnames]
        if new_keys:
            with self.path.open(newline="", encoding="utf-8") as handle:
                old_rows = list(csv.DictReader(handle))
            self.fieldnames += new_keys
            self._rewrite(old_rows)
        row = io.StringIO()
        writer = csv.DictWriter(row, fieldnames=self.fieldnames, restval="", lineterminator="\n")
        writer.writerow({"step": step, **values})
        append_whole(self.path, row.getvalue().encode("utf-8"))  # no torn row on a full disk
        if self._writer is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)):
                    self._writer.add_scalar(key, value, global_step=step)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def _json_ready(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(v) for v in value]
    if isinstance(value, Tensor):
        return _json_ready(value.tolist())
    if isinstance(value, Path):
        return str(value)
    return value


def write_summary(path: str | Path, summary: Mapping[str, Any]) -> Path:
    """Write the run's final numbers as JSON, atomically (tensors become numbers).

    A folder ``path`` gets ``summary.json`` inside. Non-finite floats are written as ``NaN``/
    ``Infinity`` (Python's JSON reads them back) rather than hidden.
    """
    target = Path(path)
    if target.is_dir():
        target = target / "summary.json"
    text = json.dumps(_json_ready(summary), indent=2) + "\n"
    with atomic_write(target) as handle:
        handle.write(text.encode("utf-8"))
    return target


def _format_value(value: Any) -> str:
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:.4g}"
    text = json.dumps(value) if isinstance(value, (list, dict)) else str(value)
    return text.replace("|", "\\|")


def write_report(
    run_dir: RunDir | str | Path,
    title: str,
    sections: Mapping[str, str] | None = None,
    *,
    summary: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``report.md``: the summary table, every ``plots/*.png``, then free sections.

    ``summary`` defaults to the run's ``summary.json`` when it exists. Plot links are relative
    (``plots/loss.png``), so the report renders wherever the folder is moved. ``sections`` maps
    a heading to markdown text.
    """
    run = run_dir if isinstance(run_dir, RunDir) else RunDir(Path(run_dir))
    if summary is None and run.summary_path.is_file():
        summary = json.loads(run.summary_path.read_text(encoding="utf-8"))
    lines = [f"# {title}", ""]
    if summary:
        lines += ["## Summary", "", "| metric | value |", "|---|---|"]
        lines += [f"| {_format_value(k)} | {_format_value(v)} |" for k, v in summary.items()]
        lines.append("")
    plots = sorted(run.plots.glob("*.png")) if run.plots.is_dir() else []
    if plots:
        lines += ["## Plots", ""]
        for plot in plots:
            lines += [f"![{plot.stem}](plots/{plot.name})", ""]
    for heading, body in (sections or {}).items():
        lines += [f"## {heading}", "", body.strip(), ""]
    with atomic_write(run.report_path) as handle:
        handle.write(("\n".join(lines).rstrip() + "\n").encode("utf-8"))
    return run.report_path
