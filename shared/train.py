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

This module is the public face of the loop; the pieces live by concept in
:mod:`shared.loop_config` (:class:`LoopConfig`, :class:`FitResult`), :mod:`shared.loop` (the
loop), :mod:`shared.resume` (checkpoints, resume, :data:`RESUME_MAY_CHANGE`) and
:mod:`shared.updaters` (what one step does).

:func:`fit_updater` is the same loop around any :class:`~shared.updaters.Updater`, the object
that owns one training step (several models and optimizers, ``n_dis`` discriminator steps, an
EMA copy: a GAN); :func:`fit` is :func:`fit_updater` with an
:class:`~shared.updaters.OptimizerUpdater`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import LRScheduler

from shared.loop import run_loop
from shared.loop_config import Evaluate, FitResult, LoopConfig, PipelineConfig, SizedIterable
from shared.resume import RESUME_MAY_CHANGE
from shared.runs import RunDir
from shared.runtime import SINGLE_PROCESS, DistEnv, autocast_dtype, move_to_device, unwrap, wrap_ddp
from shared.updaters import OptimizerUpdater, StepContext, TrainStep, Updater, check_finite

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
    evaluate_on_all_ranks: bool = True,
    end_epoch: Callable[[int], Mapping[str, float]] | None = None,
) -> FitResult:
    """Train ``model`` with ``train_step`` over ``loader`` and keep the run folder up to date.

    Per step: micro-batches are moved to ``device``, ``train_step`` runs under the autocast
    decided once by ``loop_cfg.amp``, losses are checked and back-propagated, gradients are
    clipped, then the optimizer and the scheduler step (the scheduler once per optimizer step).
    Every ``log_every`` steps a row goes to ``metrics.csv`` (the step's mean over micro-batches,
    ``lr`` and ``epoch``); every ``eval_every`` steps ``evaluate(unwrapped_model)`` runs in eval
    mode on every rank (on rank 0 alone without ``evaluate_on_all_ranks``) and its metrics join
    the row (``best.pt`` follows ``best_metric``); every ``checkpoint_every`` steps and at the
    end ``last.pt`` is written. ``end_epoch(epoch)`` (0-based), when given, runs in train mode
    after the step that completes each epoch, before that step's logging, evaluation and
    checkpoint; the metrics it returns join that step's row (see
    :meth:`shared.updaters.Updater.end_epoch`). Only rank 0 writes files,
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
        end_epoch=end_epoch,
    )
    return run_loop(
        updater,
        loader,
        loop_cfg=loop_cfg,
        run_dir=run_dir,
        device=device,
        evaluate=evaluate,
        evaluate_on_all_ranks=evaluate_on_all_ranks,
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
    evaluate_on_all_ranks: bool = True,
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
    it on resume, and ``updater.end_epoch(epoch)`` runs after the step that completes each epoch.
    ``evaluate(updater.evaluated())`` runs with every module of the updater in eval mode, on
    every rank, or on rank 0 alone with ``evaluate_on_all_ranks=False`` (an expensive
    evaluation, FD of a GAN, runs once). ``loop_cfg.grad_accum_steps`` and ``clip_grad_norm``
    belong to :func:`fit`'s updater: here they must keep their defaults (the updater decides
    both).
    """
    if loop_cfg.grad_accum_steps != 1 or loop_cfg.clip_grad_norm is not None:
        raise ValueError(
            "fit_updater: grad_accum_steps and clip_grad_norm are the updater's settings; leave "
            f"them at 1 and None in LoopConfig (got {loop_cfg.grad_accum_steps} and "
            f"{loop_cfg.clip_grad_norm})"
        )
    return run_loop(
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
