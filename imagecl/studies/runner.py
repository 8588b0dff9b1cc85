"""The common runner of ``imagecl study <name>``: a grid of small, independent, resumable runs.

A :class:`Study` is a grid of cells (one dict of parameters each), a function that trains and
measures one cell, and a function that turns the measured table into plots and report sections.
The runner gives every cell a folder ``cells/<key>/`` (the training loop's ``metrics.csv``) and
writes its ``result.json`` atomically once the cell is measured. Run again with the same
settings, a study reads the finished cells instead of training them: one interrupted halfway
continues where it stopped (a cell interrupted mid-training starts that cell again). A result is
reused only when its recorded settings — study, parameters, seed and budget — equal the current
ones, so ``--steps`` or ``--seed`` never mix runs. After every cell ``results.csv`` is rewritten;
at the end the study's plots, ``summary.json`` and ``report.md``.

Budgets: ``--quick`` is a tiny grid of short runs (a small CNN of width 16, 40 steps of batch
64); the default is the study's full grid, 300 steps of batch 128 on width 32 per cell. A cell
whose loss diverges (non-finite) is recorded as failed, with its reason, rather than stopping
the study: instability is one of the things studies measure.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

import torch

from imagecl.evaluate import CollapseError
from shared.checkpoint import atomic_write
from shared.config import config_to_dict, parse_config, save_config
from shared.probes import DEFAULT_WEIGHT_DECAYS
from shared.runs import RunDir, write_report, write_summary
from shared.runtime import seed_everything, select_device

__all__ = [
    "BASELINE",
    "FULL_BUDGET",
    "QUICK_BUDGET",
    "Budget",
    "CellContext",
    "CellResult",
    "Params",
    "Study",
    "StudyConfig",
    "cell_key",
    "run_cell",
    "run_study",
]


class Budget(NamedTuple):
    """What one cell trains: steps, batch, the small CNN's width, the probe's weight decays."""

    steps: int
    batch_size: int
    width: int
    probe_weight_decays: tuple[float, ...]  # one value: fixed, no held-out search


QUICK_BUDGET = Budget(steps=40, batch_size=64, width=16, probe_weight_decays=(1e-3,))
FULL_BUDGET = Budget(steps=300, batch_size=128, width=32, probe_weight_decays=DEFAULT_WEIGHT_DECAYS)


@dataclass(frozen=True)
class StudyConfig:
    """Run a study: train small models on its grid, write results.csv, plots and report.md."""

    # group: run
    quick: bool = field(
        default=False,
        metadata={"help": "a tiny grid of short runs (about a minute on 2 CPU cores)"},
    )
    out: Path | None = field(
        default=None,
        metadata={"help": "run folder (default runs/imagecl/study-<name>/<quick|full>-seed<seed>)"},
    )
    seed: int = 0  # random seed of every cell (data, initialisation, augmentations)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto: CUDA when available, else CPU; or force cpu / cuda"""
    # group: optimisation
    steps: int | None = field(default=None, metadata={"help": "training steps per cell"})
    batch_size: int | None = field(default=None, metadata={"help": "batch size per cell"})
    # group: run
    limit: int | None = field(
        default=None, metadata={"help": "run only the first N cells of the grid (smoke checks)"}
    )
    threads: int | None = field(
        default=None,
        metadata={"help": "torch CPU threads (1 is faster on a busy shared machine)"},
    )

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "limit", "threads"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")

    @property
    def budget(self) -> Budget:
        base = QUICK_BUDGET if self.quick else FULL_BUDGET
        return base._replace(
            steps=self.steps or base.steps, batch_size=self.batch_size or base.batch_size
        )


@dataclass(frozen=True)
class CellContext:
    """What a cell's function gets besides its parameters."""

    run: RunDir  # the cell's own folder
    device: torch.device
    seed: int
    budget: Budget


class CellResult(NamedTuple):
    """One measured cell: its parameters, its numbers (fractions for accuracies) and status."""

    key: str
    params: dict[str, Any]
    metrics: dict[str, float]
    status: str  # "ok", or "failed: <reason>"


Params = dict[str, Any]
BASELINE = "random-init"  # the key of the untrained encoder's cell


@dataclass(frozen=True)
class Study:
    """A study: its grid, how one cell is trained and measured, how the table is summarised."""

    name: str
    title: str
    question: str  # the paper's claim the study checks (the report's first section)
    grid: Callable[[bool], list[Params]]  # quick -> cells
    measure: Callable[[Params, CellContext], dict[str, float]]
    # (grid results, random-init metrics or {}, run) -> report sections; writes the plots
    summarise: Callable[[list[CellResult], dict[str, float], RunDir], dict[str, str]]
    # the same measurements of an untrained encoder: the number every cell must beat
    baseline: Callable[[Params, CellContext], dict[str, float]] | None = None


def cell_key(params: Params) -> str:
    """A folder name for a cell: ``name=value`` pairs joined by ``_`` (e.g. ``tau=0.1_lam=2``)."""
    parts = []
    for name, value in params.items():
        text = f"{value:g}" if isinstance(value, float) else str(value)
        parts.append(f"{name}={text}".replace("/", "-").replace(" ", ""))
    return "_".join(parts)


# --------------------------------------------------------------------------- the grid


def run_cell(
    measure: Callable[[Params, CellContext], dict[str, float]], params: Params, ctx: CellContext
) -> CellResult:
    """Train and measure one cell in a fresh folder; a diverged or collapsed run is a result."""
    if ctx.run.path.exists():
        shutil.rmtree(ctx.run.path)  # an interrupted attempt: start the cell again
    ctx.run.checkpoints.mkdir(parents=True)
    ctx.run.plots.mkdir()
    seed_everything(ctx.seed)
    key = ctx.run.path.name
    try:
        metrics = measure(params, ctx)
    except (FloatingPointError, CollapseError) as err:  # the loss diverged / features collapsed
        return CellResult(key, params, {}, f"failed: {str(err).splitlines()[0]}")
    finally:
        shutil.rmtree(ctx.run.checkpoints, ignore_errors=True)  # the weights are not needed
    return CellResult(key, params, {k: float(v) for k, v in metrics.items()}, "ok")


def _fingerprint(study: Study, key: str, params: Params, cfg: StudyConfig) -> dict[str, Any]:
    return {
        "study": study.name,
        "cell": key,
        "params": params,
        "seed": cfg.seed,
        **cfg.budget._asdict(),
    }


def _read_result(path: Path, fingerprint: dict[str, Any]) -> CellResult | None:
    """The stored result if it was measured with these very settings, else ``None``."""
    if not path.is_file():
        return None
    stored = json.loads(path.read_text(encoding="utf-8"))
    if json.loads(json.dumps(fingerprint)) != stored.get("settings"):
        return None
    return CellResult(stored["key"], stored["params"], stored["metrics"], stored["status"])


def _write_result(path: Path, result: CellResult, fingerprint: dict[str, Any]) -> None:
    record = {**result._asdict(), "settings": fingerprint}
    with atomic_write(path) as handle:
        handle.write((json.dumps(record, indent=2) + "\n").encode("utf-8"))


def _write_table(path: Path, results: Sequence[CellResult]) -> None:
    params = list(dict.fromkeys(name for r in results for name in r.params))
    metrics = list(dict.fromkeys(name for r in results for name in r.metrics))
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["cell", *params, "status", *metrics])
    for r in results:
        cells = [r.params.get(name, "") for name in params]
        numbers = [repr(r.metrics[name]) if name in r.metrics else "" for name in metrics]
        writer.writerow([r.key, *cells, r.status, *numbers])
    with atomic_write(path) as handle:
        handle.write(buffer.getvalue().encode("utf-8"))


def run_study(study: Study, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """``imagecl study <name> [options]``: every cell of the grid (finished ones read back),
    then ``results.csv``, plots, ``summary.json`` and ``report.md``; returns the summary."""
    # a subclass per study, so that --help describes the study itself
    described = dataclasses.make_dataclass(
        "StudyConfig",
        [],
        bases=(StudyConfig,),
        frozen=True,
        namespace={"__doc__": f"{study.title}. {study.question}"},
    )
    cfg: StudyConfig = parse_config(
        described, list(argv) if argv is not None else None, prog=f"imagecl study {study.name}"
    )
    threads = torch.get_num_threads()
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    try:
        return _run_grid(study, cfg)
    finally:
        torch.set_num_threads(threads)


def _run_grid(study: Study, cfg: StudyConfig) -> dict[str, Any]:
    device = select_device(cfg.device)
    default = (
        Path("runs")
        / "imagecl"
        / f"study-{study.name}"
        / (f"{'quick' if cfg.quick else 'full'}-seed{cfg.seed}")
    )
    run = RunDir(cfg.out or default)
    run.plots.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run.path)
    cells = study.grid(cfg.quick)[: cfg.limit]
    keys = [cell_key(params) for params in cells]
    if len(set(keys)) != len(keys) or BASELINE in keys:
        raise ValueError(f"study {study.name!r} has duplicate or reserved cell keys: {keys}")
    jobs = [(key, params, study.measure) for key, params in zip(keys, cells, strict=True)]
    if study.baseline is not None:
        jobs.insert(0, (BASELINE, {}, study.baseline))
    results: list[CellResult] = []
    trained = 0
    for key, params, measure in jobs:
        folder = run.path / "cells" / key
        fingerprint = _fingerprint(study, key, params, cfg)
        result = _read_result(folder / "result.json", fingerprint)
        if result is None:
            ctx = CellContext(RunDir(folder), device, cfg.seed, cfg.budget)
            result = run_cell(measure, params, ctx)
            _write_result(folder / "result.json", result, fingerprint)
            trained += 1
        results.append(result)
        _write_table(run.path / "results.csv", results)
    grid_results = [r for r in results if r.key != BASELINE]
    baseline = [r for r in results if r.key == BASELINE]
    sections = study.summarise(grid_results, baseline[0].metrics if baseline else {}, run)
    if baseline:
        sections["Random-init baseline"] = _baseline_note(grid_results, baseline[0].metrics)
    summary = {
        "study": study.name,
        "quick": cfg.quick,
        "cells": len(grid_results),
        "trained": trained,
        "reused": len(results) - trained,
        "failed": sum(r.status != "ok" for r in results),
        **cfg.budget._asdict(),
        **{f"random_init_{k}": v for r in baseline for k, v in r.metrics.items()},
    }
    write_summary(run.summary_path, summary)
    protocol = _protocol(cfg)
    write_report(
        run,
        f"imagecl study {study.name}: {study.title}",
        {"Question": study.question, **sections, "Protocol": protocol},
        summary=summary,
    )
    return summary


def _baseline_note(results: Sequence[CellResult], baseline: dict[str, float]) -> str:
    """The untrained encoder's numbers, and a warning for metrics no trained cell beats."""
    text = (
        "The same measurements of the untrained encoder (the number every cell must beat): "
        + ", ".join(f"{name} {100 * value:.1f} %" for name, value in baseline.items())
        + "."
    )
    unbeaten = []
    for name, value in baseline.items():
        trained = [r.metrics[name] for r in results if name in r.metrics]
        if trained and all(not v > value for v in trained):
            unbeaten.append(name)
    if unbeaten:
        text += (
            f" No trained cell beats it on {', '.join(unbeaten)}: on that measurement training "
            "has not improved on the initialisation at this budget, so directions read from it "
            "compare representations that are all worse than a random encoder."
        )
    return text


def _protocol(cfg: StudyConfig) -> str:
    budget = cfg.budget
    probe_text = (
        f"weight decay fixed at {budget.probe_weight_decays[0]:g}"
        if len(budget.probe_weight_decays) == 1
        else "weight decay chosen on a held-out 10 % of train"
    )
    return (
        f"Each cell trains a small CNN (width {budget.width}) for {budget.steps} steps of batch "
        f"{budget.batch_size} with Adam (lr 2e-3 unless the grid sets it, 10 % warm-up, cosine), "
        f"seed {cfg.seed}, then fits a linear probe on frozen features of the un-augmented "
        f"training split ({probe_text}) and scores it once on the test split. Settings: "
        f"`{json.dumps(config_to_dict(cfg))}`."
    )
