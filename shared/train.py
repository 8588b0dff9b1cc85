"""The one training loop every pipeline uses: precision, accumulation, DDP, logging, resume.

See docs/architecture.md, "Training loop" and "Run folders". A pipeline provides
``train_step(model, batch) -> dict`` (with ``"loss"``) and calls :func:`fit`, which does once what
nanoGPT's ``train.py`` does: bf16 autocast on GPU (fp32 on CPU), gradient accumulation with DDP's
``no_sync``, clipping, optimizer and scheduler steps, a finiteness check of every loss (kept on
the device and read on logging and checkpoint steps, every rank together),
``metrics.csv`` (+ TensorBoard), evaluation with ``best.pt``, and ``last.pt``, from which
``resume=True`` reaches bit for bit the weights and metrics of an uninterrupted run with the same
seed: the checkpoint holds the weights, optimizer and scheduler states, the position in the
epoch, every rank's RNG states right after the checkpoint and at the start of its epoch, and the
resolved config, which a resume must match.

:func:`fit_updater` is the same loop around any :class:`~shared.updaters.Updater`, the object
that owns one training step (several models and optimizers, ``n_dis`` discriminator steps, an
EMA copy: a GAN); :func:`fit` is :func:`fit_updater` with an
:class:`~shared.updaters.OptimizerUpdater`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol

import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import LRScheduler
from tqdm.auto import tqdm

from shared.checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from shared.config import _jsonable, config_to_dict
from shared.distributed import all_gather_object
from shared.runs import MetricsLogger, RunDir
from shared.runtime import (
    SINGLE_PROCESS,
    DistEnv,
    autocast_dtype,
    eval_mode,
    move_to_device,
    set_epoch,
    unwrap,
    wrap_ddp,
)
from shared.updaters import (
    FiniteGuard,
    OptimizerUpdater,
    StepContext,
    TrainStep,
    Updater,
    check_finite,
)

__all__ = [
    "RESUME_MAY_CHANGE",
    "FitResult",
    "LoopConfig",
    "OptimizerUpdater",
    "StepContext",
    "Updater",
    "autocast_dtype",
    "check_finite",
    "fit",
    "fit_updater",
    "move_to_device",
    "unwrap",
    "wrap_ddp",
]

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    PipelineConfig = DataclassInstance | Mapping[str, Any]
else:
    PipelineConfig = Any

Evaluate = Callable[[nn.Module], Mapping[str, Tensor | float]]

# Config keys (at any nesting level) that may differ on resume: they extend or observe a run
# without changing what its steps compute. Everything else must match the checkpoint's config.
RESUME_MAY_CHANGE = frozenset(
    {
        "epochs",
        "max_steps",
        "log_every",
        "eval_every",
        "checkpoint_every",
        "progress",
        "tensorboard",
        "resume",
        "out",
        "device",
        "num_workers",
    }
)


class SizedIterable(Protocol):
    """What :func:`fit` needs of a loader: iteration and a length (a ``DataLoader``)."""

    def __iter__(self) -> Iterator[Any]: ...

    def __len__(self) -> int: ...


@dataclass(frozen=True)
class LoopConfig:
    """Settings of :func:`fit`. ``epochs`` and/or ``max_steps`` bound the run (first one wins).

    A step is one optimizer step over ``grad_accum_steps`` micro-batches. ``None`` for
    ``eval_every``/``checkpoint_every`` means only at the last step, where the loop always logs,
    evaluates (when given ``evaluate``) and saves ``last.pt``.
    """

    epochs: int | None = None
    max_steps: int | None = None
    grad_accum_steps: int = 1
    log_every: int = 10
    eval_every: int | None = None
    checkpoint_every: int | None = None
    amp: Literal["auto", "bf16", "off"] = "auto"
    clip_grad_norm: float | None = None
    best_metric: str | None = None
    best_mode: Literal["min", "max"] = "min"
    progress: bool = True
    tensorboard: bool = False

    def __post_init__(self) -> None:
        if self.epochs is None and self.max_steps is None:
            raise ValueError("LoopConfig needs epochs or max_steps")
        for name in ("epochs", "max_steps", "eval_every", "checkpoint_every"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {value}")
        for name in ("grad_accum_steps", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.amp not in ("auto", "bf16", "off"):
            raise ValueError(f"amp must be 'auto', 'bf16' or 'off', got {self.amp!r}")
        if self.best_mode not in ("min", "max"):
            raise ValueError(f"best_mode must be 'min' or 'max', got {self.best_mode!r}")
        if self.clip_grad_norm is not None and not self.clip_grad_norm > 0:
            raise ValueError(f"clip_grad_norm must be > 0 or None, got {self.clip_grad_norm}")

    def total_steps(self, steps_per_epoch: int) -> int:
        bounds = [self.max_steps] if self.max_steps is not None else []
        if self.epochs is not None:
            bounds.append(self.epochs * steps_per_epoch)
        return min(bounds)


class FitResult(NamedTuple):
    """Where :func:`fit` stopped: the step, the epoch (counting finished ones), the last logged
    row, and the best value of ``loop_cfg.best_metric`` with its step (``None`` without one)."""

    step: int
    epoch: int
    metrics: dict[str, float]
    best: float | None
    best_step: int | None


@dataclass
class _Progress:
    step: int = 0
    epoch: int = 0
    batch: int = 0  # micro-batches consumed in the current epoch
    best: float | None = None
    best_step: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)


def _check_parameters(modules: Mapping[str, nn.Module], step: int) -> None:
    """Refuse to checkpoint non-finite weights (a NaN gradient with a finite loss gets here)."""
    for prefix, module in modules.items():
        for name, param in unwrap(module).named_parameters():
            label = name if len(modules) == 1 else f"{prefix}.{name}"
            check_finite(param, f"parameter {label}", step)


def _is_better(value: float, best: float | None, mode: Literal["min", "max"]) -> bool:
    if not math.isfinite(value):
        return False
    return best is None or (value < best if mode == "min" else value > best)


@dataclass
class _Loop:
    """What stays fixed during :func:`fit`; its methods save, restore, log and evaluate."""

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
    config: dict[str, Any]
    may_change: frozenset[str]
    guard: FiniteGuard

    @property
    def main(self) -> bool:
        return self.env.rank == 0

    def start_epoch(
        self, loader: SizedIterable, progress: _Progress, ckpt: dict[str, Any] | None
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

    def step(self, batches: Iterator[Any], progress: _Progress) -> dict[str, Tensor | float]:
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

    def save(
        self,
        path: Path,
        progress: _Progress,
        epoch_rng: dict[str, Tensor],
        per_rank: list[dict[str, dict[str, Tensor]]] | None = None,
    ) -> None:
        """Write a checkpoint holding everything that decides the rest of the run.

        ``per_rank`` holds every rank's RNG states (``last.pt``, gathered by
        :meth:`checkpoint_last`); without it only this process's states are stored.
        """
        _check_parameters(self.updater.modules(), progress.step)
        epoch, batch = progress.epoch, progress.batch
        if batch == self.steps_per_epoch * self.batches_per_step:
            epoch, batch = epoch + 1, 0  # the epoch is complete: resume at the next one
        loop_state = {
            "step": progress.step,
            "epoch": epoch,
            "batch_in_epoch": batch,
            "steps_per_epoch": self.steps_per_epoch,
            "grad_accum_steps": self.cfg.grad_accum_steps,
            "batches_per_step": self.batches_per_step,
            "world_size": self.env.world_size,
            "rng": rng_state(),
            "epoch_rng": epoch_rng,
            "rng_per_rank": per_rank,
            "config": self.config,
            "best": progress.best,
            "best_step": progress.best_step,
            "metrics": dict(progress.metrics),
        }
        state = self.updater.state_dict()
        clash = sorted(set(state) & set(loop_state))
        if clash:
            raise ValueError(f"the updater's state uses the loop's checkpoint keys {clash}")
        save_checkpoint(path, {**state, **loop_state})

    def checkpoint_last(self, progress: _Progress, epoch_rng: dict[str, Tensor]) -> None:
        """Gather every rank's RNG states (a collective: all ranks call it), save on rank 0."""
        per_rank = all_gather_object({"rng": rng_state(), "epoch_rng": epoch_rng})
        if self.main:
            self.save(self.run_dir.last_checkpoint, progress, epoch_rng, per_rank)

    def restore(self) -> tuple[_Progress, dict[str, Any]]:
        """Load ``last.pt`` into the updater (models, optimizers, ...); return the position.

        The returned checkpoint's ``rng``/``epoch_rng`` are this rank's own states.
        """
        path = self.run_dir.last_checkpoint
        ckpt = load_checkpoint(path, map_location="cpu")  # RNG states must stay on the CPU
        per_step = ckpt.get("batches_per_step", ckpt.get("grad_accum_steps"))
        saved = (ckpt.get("steps_per_epoch"), per_step)
        now = (self.steps_per_epoch, self.batches_per_step)
        if saved != now:
            raise ValueError(
                f"{path} was written with (steps_per_epoch, batches_per_step) = {saved}, this "
                f"run has {now}: the position in the epoch would mean different batches"
            )
        self.check_config(path, ckpt)
        if ckpt["step"] > self.total:
            raise ValueError(
                f"{path} is at step {ckpt['step']}, past this run's last step {self.total}: "
                "raise epochs or max_steps to continue it"
            )
        per_rank = ckpt.get("rng_per_rank")
        if per_rank is not None:
            if len(per_rank) != self.env.world_size:
                raise ValueError(
                    f"{path} was written by {len(per_rank)} processes, this run has "
                    f"{self.env.world_size}: each rank's random stream could not be continued"
                )
            ckpt["rng"], ckpt["epoch_rng"] = (
                per_rank[self.env.rank][k] for k in ("rng", "epoch_rng")
            )
        try:
            self.updater.load_state_dict(ckpt)
        except (KeyError, ValueError) as error:
            raise ValueError(f"{path}: {error}") from error
        progress = _Progress(
            step=ckpt["step"],
            epoch=ckpt["epoch"],
            batch=ckpt["batch_in_epoch"],
            best=ckpt["best"],
            best_step=ckpt["best_step"],
            metrics=dict(ckpt["metrics"]),
        )
        return progress, ckpt

    def check_config(self, path: Path, ckpt: Mapping[str, Any]) -> None:
        """Refuse to continue a run whose config differs, except in ``may_change`` keys."""
        saved = ckpt.get("config")
        if saved is None:  # written before checkpoints held their config
            return
        before, now = _flatten(saved), _flatten(self.config)
        differ = sorted(
            key
            for key in before.keys() | now.keys()
            if before.get(key, _MISSING) != now.get(key, _MISSING)
            and key.rsplit(".", 1)[-1] not in self.may_change
        )
        if differ:
            shown = "; ".join(
                f"{key}: {before.get(key, '<absent>')!r} -> {now.get(key, '<absent>')!r}"
                for key in differ
            )
            raise ValueError(
                f"cannot resume {path}: the config differs from the checkpoint's in {shown}. "
                "Resume with the original settings, or start a new run"
            )

    def run_evaluation(self, progress: _Progress, epoch_rng: dict[str, Tensor]) -> dict[str, float]:
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
            if self.main:
                self.save(self.run_dir.best_checkpoint, progress, epoch_rng)
        return results

    def after_step(
        self,
        progress: _Progress,
        metrics: dict[str, Tensor | float],
        epoch_rng: dict[str, Tensor],
        logger: MetricsLogger | None,
    ) -> dict[str, float]:
        """Log, evaluate, then checkpoint after step ``progress.step``; return the logged row.

        The checkpoint comes last so its RNG state includes whatever evaluation drew. On any
        of these steps the finiteness flag of every loss since the last one is read first
        (gathered over ranks): a NaN raises before it is logged, evaluated or saved. Other
        steps read nothing on the host.
        """
        step, last = progress.step, progress.step == self.total
        log = step % self.cfg.log_every == 0 or last
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
        if evaluate:
            results = self.run_evaluation(progress, epoch_rng)
            clash = sorted(set(results) & {"epoch", *metrics})
            if clash:
                raise ValueError(f"evaluate returned {clash}, which clash with training metrics")
            row.update(results)
        if row:
            progress.metrics = row
            if logger is not None:
                logger.log(step, row)
        if checkpoint:
            self.checkpoint_last(progress, epoch_rng)
        return row


_MISSING = object()


def _scalar(value: Tensor | float) -> float:
    return float(value.detach()) if isinstance(value, Tensor) else float(value)


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"loop": {"epochs": 3}}`` -> ``{"loop.epochs": 3}``; lists and tuples compare as lists."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = list(value) if isinstance(value, tuple) else value
    return flat


def _resolved_config(loop_cfg: LoopConfig, config: PipelineConfig | None) -> dict[str, Any]:
    """What the checkpoint stores and a resume compares: the loop's settings and the pipeline's.

    Plain JSON-like values (paths become strings), so ``weights_only`` loading accepts them.
    """
    if config is None:
        pipeline: dict[str, Any] = {}
    elif isinstance(config, Mapping):
        pipeline = _jsonable(dict(config))
    else:
        pipeline = config_to_dict(config)
    return {"loop": asdict(loop_cfg), "pipeline": pipeline}


def fit(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loader: SizedIterable,
    train_step: TrainStep,
    *,
    loop_cfg: LoopConfig,
    run_dir: RunDir,
    device: torch.device,
    scheduler: LRScheduler | None = None,
    evaluate: Evaluate | None = None,
    resume: bool = False,
    dist_env: DistEnv | None = None,
    config: PipelineConfig | None = None,
    may_change: Collection[str] = RESUME_MAY_CHANGE,
) -> FitResult:
    """Train ``model`` with ``train_step`` over ``loader`` and keep the run folder up to date.

    Per step: micro-batches are moved to ``device``, ``train_step`` runs under the autocast
    decided once by ``loop_cfg.amp``, losses are checked and back-propagated, gradients are
    clipped, then the optimizer and the scheduler step (the scheduler once per optimizer step).
    Every ``log_every`` steps a row goes to ``metrics.csv`` (the step's mean over micro-batches,
    ``lr`` and ``epoch``); every ``eval_every`` steps ``evaluate(unwrapped_model)`` runs in eval
    mode on every rank and its metrics join the row (``best.pt`` follows ``best_metric``); every
    ``checkpoint_every`` steps and at the end ``last.pt`` is written. Only rank 0 writes files,
    and the training metrics it logs are its own (reduce them inside ``train_step`` when the
    mean over ranks is wanted). The scheduler is stepped without arguments after every
    optimizer step (per-step schedules; not ``ReduceLROnPlateau``). An incomplete
    accumulation group at the end of an epoch is skipped.

    With ``resume=True`` the loop continues from ``run_dir``'s ``last.pt``. Every rank restores
    its own RNG states (rank 0 gathers them into ``last.pt``), so per-rank randomness continues
    as if never interrupted; the number of processes must be the same. ``config`` is the
    pipeline's config (its dataclass, or a dict of plain values): it is stored in every
    checkpoint with ``loop_cfg``, and a resume whose settings differ from the stored ones is
    refused with the keys that differ, except keys named in ``may_change`` (by default
    :data:`RESUME_MAY_CHANGE`: ``epochs``/``max_steps`` to extend a run, logging, evaluation and
    checkpoint intervals, the output folder and device).

    This is :func:`fit_updater` with an :class:`~shared.updaters.OptimizerUpdater`.
    """
    env = dist_env or SINGLE_PROCESS
    if env.is_distributed and not isinstance(model, DistributedDataParallel):
        raise ValueError("a distributed fit needs the model wrapped with wrap_ddp(model, dist_env)")
    if len(loader) < loop_cfg.grad_accum_steps:
        raise ValueError(
            f"the loader has {len(loader)} batches, fewer than "
            f"grad_accum_steps={loop_cfg.grad_accum_steps}"
        )
    updater = OptimizerUpdater(
        model,
        optimizer,
        train_step,
        scheduler=scheduler,
        grad_accum_steps=loop_cfg.grad_accum_steps,
        clip_grad_norm=loop_cfg.clip_grad_norm,
    )
    return _fit(
        updater,
        loader,
        loop_cfg=loop_cfg,
        run_dir=run_dir,
        device=device,
        evaluate=evaluate,
        evaluate_on_all_ranks=True,
        resume=resume,
        env=env,
        config=config,
        may_change=may_change,
    )


def fit_updater(
    updater: Updater,
    loader: SizedIterable,
    *,
    loop_cfg: LoopConfig,
    run_dir: RunDir,
    device: torch.device,
    evaluate: Evaluate | None = None,
    evaluate_on_all_ranks: bool = False,
    resume: bool = False,
    dist_env: DistEnv | None = None,
    config: PipelineConfig | None = None,
    may_change: Collection[str] = RESUME_MAY_CHANGE,
) -> FitResult:
    """The loop of :func:`fit` around any :class:`~shared.updaters.Updater`.

    The loop keeps epochs, logging, evaluation, checkpoint timing and resume, exactly as in
    :func:`fit`; each step hands ``updater.batches_per_step`` batches of ``loader`` to
    ``updater.step`` with a :class:`~shared.updaters.StepContext` (step number, device, the
    autocast decided once by ``loop_cfg.amp``, and ``backward`` that checks every loss first).
    The updater's ``state_dict`` joins every checkpoint and its ``load_state_dict`` restores
    it on resume. ``evaluate(updater.evaluated())`` runs with every module of the updater in
    eval mode, on rank 0 alone unless ``evaluate_on_all_ranks`` (an expensive evaluation, FD of
    a GAN, runs once). ``loop_cfg.grad_accum_steps`` and ``clip_grad_norm`` belong to
    :func:`fit`'s updater: here they must keep their defaults (the updater decides both).
    """
    if loop_cfg.grad_accum_steps != 1 or loop_cfg.clip_grad_norm is not None:
        raise ValueError(
            "fit_updater: grad_accum_steps and clip_grad_norm are the updater's settings; leave "
            f"them at 1 and None in LoopConfig (got {loop_cfg.grad_accum_steps} and "
            f"{loop_cfg.clip_grad_norm})"
        )
    return _fit(
        updater,
        loader,
        loop_cfg=loop_cfg,
        run_dir=run_dir,
        device=device,
        evaluate=evaluate,
        evaluate_on_all_ranks=evaluate_on_all_ranks,
        resume=resume,
        env=dist_env or SINGLE_PROCESS,
        config=config,
        may_change=may_change,
    )


def _fit(
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
    if loop_cfg.best_metric is not None and evaluate is None:
        raise ValueError(f"best_metric={loop_cfg.best_metric!r} needs an evaluate function")
    per_step = updater.batches_per_step
    steps_per_epoch = len(loader) // per_step
    if steps_per_epoch == 0:
        raise ValueError(
            f"the loader has {len(loader)} batches, fewer than the {per_step} one step consumes"
        )
    loop = _Loop(
        updater=updater,
        cfg=loop_cfg,
        run_dir=run_dir,
        evaluate=evaluate,
        evaluate_on_all_ranks=evaluate_on_all_ranks,
        dtype=autocast_dtype(loop_cfg.amp, device),
        device=device,
        steps_per_epoch=steps_per_epoch,
        total=loop_cfg.total_steps(steps_per_epoch),
        env=env,
        config=_resolved_config(loop_cfg, config),
        may_change=frozenset(may_change),
        guard=FiniteGuard(device),
    )
    progress, ckpt = loop.restore() if resume else (_Progress(), None)
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
                row = loop.after_step(progress, metrics, epoch_rng, logger)
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
