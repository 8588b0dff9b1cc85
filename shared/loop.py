"""The training loop itself: epochs of updater steps, logging, evaluation, checkpoints, resume.

:func:`run_loop` is what :func:`shared.train.fit` and :func:`shared.train.fit_updater` run (the
public entry points, documented there). Per step it hands ``updater.batches_per_step`` batches
to :meth:`~shared.updaters.Updater.step`; after the step that completes an epoch it calls
:meth:`~shared.updaters.Updater.end_epoch`; then it logs, evaluates and checkpoints, reading the
device-side finiteness flag (:class:`~shared.updaters.FiniteGuard`) only on those steps.
Checkpoints and resume are :class:`~shared.resume.LoopCheckpoints`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import torch
from torch import Tensor
from tqdm.auto import tqdm

from shared.checkpoint import rng_state, set_rng_state
from shared.distributed import all_gather_object
from shared.loop_config import Evaluate, FitResult, LoopConfig, PipelineConfig, SizedIterable
from shared.resume import LoopCheckpoints, Progress, resolved_config
from shared.runs import MetricsLogger, RunDir
from shared.runtime import DistEnv, autocast_dtype, eval_mode, set_epoch
from shared.updaters import FiniteGuard, StepContext, Updater

__all__ = ["run_loop"]

T = TypeVar("T")


def _is_better(value: float, best: float | None, mode: Literal["min", "max"]) -> bool:
    if not math.isfinite(value):
        return False
    return best is None or (value < best if mode == "min" else value > best)


def _scalar(value: Tensor | float) -> float:
    return float(value.detach()) if isinstance(value, Tensor) else float(value)


@dataclass
class _Loop:
    """What stays fixed during a run of the loop; its methods step, log, evaluate and save."""

    updater: Updater
    cfg: LoopConfig
    run_dir: RunDir
    evaluate: Evaluate | None
    evaluate_on_all_ranks: bool
    dtype: torch.dtype | None
    device: torch.device
    steps_per_epoch: int
    total: int
    env: DistEnv
    guard: FiniteGuard
    checkpoints: LoopCheckpoints

    @property
    def main(self) -> bool:
        return self.env.rank == 0

    def start_epoch(
        self, loader: SizedIterable, progress: Progress, ckpt: dict[str, Any] | None
    ) -> tuple[Iterator[Any], dict[str, Tensor]]:
        """Return the epoch's batch iterator, positioned after ``progress.batch`` micro-batches,
        and the RNG state at the epoch's start.

        Resuming mid-epoch (``ckpt`` given), the loader is rebuilt from the epoch-start RNG
        state (``iter`` may draw from it), the consumed batches are drawn again and dropped, and
        the checkpoint's RNG state is restored. At an epoch boundary the checkpoint's state is
        the epoch-start state.
        """
        mid_epoch = ckpt is not None and progress.batch > 0
        if ckpt is not None:
            set_rng_state(ckpt["epoch_rng"] if mid_epoch else ckpt["rng"])
        epoch_rng = rng_state()
        set_epoch(loader, progress.epoch)
        batches = iter(loader)
        for _ in range(progress.batch):
            next(batches)
        if ckpt is not None and mid_epoch:
            set_rng_state(ckpt["rng"])
        return batches, epoch_rng

    @property
    def batches_per_step(self) -> int:
        return self.updater.batches_per_step

    def step(self, batches: Iterator[Any], progress: Progress) -> dict[str, Tensor | float]:
        """One updater step over ``batches_per_step`` batches; return its metrics."""
        ctx = StepContext(progress.step + 1, self.device, self.dtype, guard=self.guard)
        try:
            metrics = self.updater.step(itertools.islice(batches, self.batches_per_step), ctx)
        except Exception:
            # a NaN earlier (unread so far) may be the cause: name it rather than its symptom
            self.guard.raise_if_bad(collective=False)
            raise
        progress.step += 1
        progress.batch += self.batches_per_step
        return metrics

    def end_epoch(self, progress: Progress) -> dict[str, float]:
        """Run the updater's epoch-end update for the epoch the last step completed."""
        ended = self.updater.end_epoch(progress.epoch)
        return {key: _scalar(value) for key, value in ended.items()}

    def on_main(self, write: Callable[[], T], *, agree: bool = True) -> T | None:
        """Run ``write`` (a file written by rank 0 alone) on rank 0; return what it returned.

        Rank 0 alone writes the metrics rows, the checkpoints and, when it evaluates alone, the
        evaluation's files. A write that fails (a full disk) raises an ``OSError`` there, and
        the other ranks would go on to the next collective and wait for a rank that has gone
        (gloo ends that wait with "Connection closed by peer" and a traceback, NCCL only at its
        timeout). With ``agree`` (every rank calls this at the same point), the outcome is
        exchanged, one small gather under DDP and nothing on one process, and every rank raises
        rank 0's error: one line, the same on every rank.
        """
        result: T | None = None
        failure: OSError | None = None
        if self.main:
            try:
                result = write()
            except OSError as exc:
                if not (agree and self.env.is_distributed):
                    raise
                failure = exc
        if agree and self.env.is_distributed:
            told = None if failure is None else (failure.errno, failure.strerror or str(failure))
            outcome = all_gather_object(told)[0]
            if failure is not None:
                raise failure
            if outcome is not None:
                raise OSError(outcome[0], outcome[1])
        return result

    def checkpoint_last(self, progress: Progress, epoch_rng: dict[str, Tensor]) -> None:
        """Gather every rank's RNG states (a collective: all ranks call it), save on rank 0."""
        per_rank = all_gather_object({"rng": rng_state(), "epoch_rng": epoch_rng})
        last = self.run_dir.last_checkpoint
        self.on_main(lambda: self.checkpoints.save(last, progress, epoch_rng, per_rank))

    def run_evaluation(self, progress: Progress, epoch_rng: dict[str, Tensor]) -> dict[str, float]:
        """Evaluate in eval mode; keep ``best.pt`` for ``cfg.best_metric``.

        Every rank evaluates unless ``evaluate_on_all_ranks`` is off: then rank 0 alone does
        (other ranks return nothing; only rank 0 logs and writes files).
        """
        assert self.evaluate is not None
        if not (self.main or self.evaluate_on_all_ranks):
            return {}
        with ExitStack() as stack:
            for module in self.updater.modules().values():
                stack.enter_context(eval_mode(module))
            results = {
                key: float(value) for key, value in self.evaluate(self.updater.evaluated()).items()
            }
        metric = self.cfg.best_metric
        if metric is None:
            return results
        if metric not in results:
            raise ValueError(f"best_metric {metric!r} is not among evaluate's {sorted(results)}")
        if _is_better(results[metric], progress.best, self.cfg.best_mode):
            progress.best, progress.best_step = results[metric], progress.step
            best = self.run_dir.best_checkpoint
            # every rank is here when every rank evaluates; else after_step agrees for rank 0
            self.on_main(
                lambda: self.checkpoints.save(best, progress, epoch_rng),
                agree=self.evaluate_on_all_ranks,
            )
        return results

    def after_step(
        self,
        progress: Progress,
        metrics: dict[str, Tensor | float],
        epoch_rng: dict[str, Tensor],
        logger: MetricsLogger | None,
        epoch_metrics: Mapping[str, float] | None = None,
    ) -> dict[str, float]:
        """Log, evaluate, then checkpoint after step ``progress.step``; return the logged row.

        ``epoch_metrics`` (what :meth:`Updater.end_epoch` returned, on the step that completed
        an epoch) join the row, and a row is logged whenever there are any. The checkpoint
        comes last so its RNG state includes whatever evaluation drew. On any
        of these steps the finiteness flag of every loss since the last one is read first
        (gathered over ranks): a NaN raises before it is logged, evaluated or saved. Other
        steps read nothing on the host.
        """
        step, last = progress.step, progress.step == self.total
        ended = dict(epoch_metrics or {})
        log = step % self.cfg.log_every == 0 or last or bool(ended)
        every = self.cfg.eval_every
        evaluate = self.evaluate is not None and ((every is not None and step % every == 0) or last)
        every = self.cfg.checkpoint_every
        checkpoint = (every is not None and step % every == 0) or last
        if log or evaluate or checkpoint:
            self.guard.raise_if_bad()
        row: dict[str, float] = {}
        if log:
            row = {"epoch": progress.epoch}
            row.update({key: _scalar(value) for key, value in metrics.items()})
            clash = sorted(set(ended) & {"epoch", *metrics})
            if clash:
                raise ValueError(f"end_epoch returned {clash}, which clash with training metrics")
            row.update(ended)
        if evaluate:
            if self.evaluate_on_all_ranks:  # its collectives, if any, are every rank's
                results = self.run_evaluation(progress, epoch_rng)
            else:  # rank 0 alone: its files (a sample grid, best.pt) are agreed on as one write
                results = self.on_main(lambda: self.run_evaluation(progress, epoch_rng)) or {}
            clash = sorted(set(results) & {"epoch", *metrics, *ended})
            if clash:
                raise ValueError(f"evaluate returned {clash}, which clash with training metrics")
            row.update(results)
        if row:
            progress.metrics = row
        if log or evaluate:  # every rank agrees on rank 0's metrics row (only it has a logger)
            self.on_main(lambda: logger.log(step, row) if logger is not None and row else None)
        if checkpoint:
            self.checkpoint_last(progress, epoch_rng)
        return row


def run_loop(
    updater: Updater,
    loader: SizedIterable,
    *,
    loop_cfg: LoopConfig,
    run_dir: RunDir,
    device: torch.device,
    evaluate: Evaluate | None,
    evaluate_on_all_ranks: bool,
    resume: bool,
    env: DistEnv,
    config: PipelineConfig | None,
    may_change: Collection[str],
) -> FitResult:
    """The loop of :func:`shared.train.fit` and :func:`shared.train.fit_updater` (see there):
    epochs of ``updater`` steps over ``loader``, each followed by the epoch-end update when it
    completes an epoch, then logging, evaluation and checkpoints; resume from ``last.pt``."""
    if loop_cfg.best_metric is not None and evaluate is None:
        raise ValueError(f"best_metric={loop_cfg.best_metric!r} needs an evaluate function")
    per_step = updater.batches_per_step
    steps_per_epoch = len(loader) // per_step
    if steps_per_epoch == 0:
        raise ValueError(
            f"the loader has {len(loader)} batches, fewer than the {per_step} one step consumes"
        )
    total = loop_cfg.total_steps(steps_per_epoch)
    loop = _Loop(
        updater=updater,
        cfg=loop_cfg,
        run_dir=run_dir,
        evaluate=evaluate,
        evaluate_on_all_ranks=evaluate_on_all_ranks,
        dtype=autocast_dtype(loop_cfg.amp, device),
        device=device,
        steps_per_epoch=steps_per_epoch,
        total=total,
        env=env,
        guard=FiniteGuard(device),
        checkpoints=LoopCheckpoints(
            updater=updater,
            steps_per_epoch=steps_per_epoch,
            batches_per_step=per_step,
            grad_accum_steps=loop_cfg.grad_accum_steps,
            total=total,
            env=env,
            config=resolved_config(loop_cfg, config),
            may_change=frozenset(may_change),
        ),
    )
    restored = loop.checkpoints.restore(run_dir.last_checkpoint) if resume else None
    progress, ckpt = restored or (Progress(), None)
    logger = None
    if loop.main:
        logger = MetricsLogger(
            run_dir.metrics_path,
            resume_step=progress.step if resume else None,
            tensorboard_dir=run_dir.tensorboard_dir if loop_cfg.tensorboard else None,
        )
    show = loop.main and loop_cfg.progress
    bar = tqdm(total=loop.total, initial=progress.step, unit="step", disable=not show)
    for module in updater.modules().values():
        module.train()
    epoch_batches = steps_per_epoch * per_step
    try:
        while progress.step < loop.total:
            batches, epoch_rng = loop.start_epoch(loader, progress, ckpt)
            ckpt = None
            while progress.batch < epoch_batches and progress.step < loop.total:
                metrics = loop.step(batches, progress)
                bar.update(1)
                # the epoch's last step: its update lands before this step's log and checkpoint
                ended = loop.end_epoch(progress) if progress.batch == epoch_batches else {}
                row = loop.after_step(progress, metrics, epoch_rng, logger, ended)
                if "loss" in row:
                    bar.set_postfix(loss=f"{row['loss']:.4g}", refresh=False)
            if progress.batch == epoch_batches:
                progress.epoch, progress.batch = progress.epoch + 1, 0
    finally:
        bar.close()
        if logger is not None:
            logger.close()
    return FitResult(
        progress.step, progress.epoch, dict(progress.metrics), progress.best, progress.best_step
    )
