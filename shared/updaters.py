"""What one training step does, for the loop of :mod:`shared.train`.

The loop (:func:`shared.train.fit_updater`) keeps epochs, logging, evaluation, checkpoint timing
and resume; an :class:`Updater` owns everything inside one step: forward passes, ``backward``
and the optimizer and scheduler steps, over :attr:`Updater.batches_per_step` batches of the
loader. Its :meth:`~Updater.state_dict` is everything the rest of the run depends on besides the
loop's position and the RNG (weights, optimizer and scheduler states, an EMA copy), merged into
every checkpoint.

:class:`OptimizerUpdater` is one model and one optimizer with gradient accumulation and clipping
(what :func:`shared.train.fit` runs); a GAN's updater (``contragan.steps``) steps a discriminator
``n_dis`` times per generator step, each with its own optimizer, and keeps an EMA generator.
See docs/architecture.md, "Training loop".
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import LRScheduler

from shared.distributed import all_gather_object, gather_no_grad, world_size
from shared.runtime import move_to_device, unwrap

__all__ = [
    "FiniteGuard",
    "OptimizerUpdater",
    "StepContext",
    "TrainStep",
    "Updater",
    "check_finite",
]

TrainStep = Callable[[nn.Module, Any], Mapping[str, Tensor | float]]


def check_finite(value: Tensor | float, name: str, step: int) -> None:
    """Raise ``FloatingPointError`` naming ``name`` and ``step`` if ``value`` has a NaN or inf.

    Called on every loss before ``backward``, so a diverged step never reaches the optimizer
    and the loop stops before it could write a checkpoint from poisoned weights.
    """
    if isinstance(value, Tensor):
        value = value.detach()
        finite = bool(torch.isfinite(value).all())
    else:
        finite = math.isfinite(float(value))
    if not finite:
        one = not isinstance(value, Tensor) or value.numel() == 1
        shown = f"{float(value)}" if one else "a tensor with non-finite entries"
        raise FloatingPointError(
            f"{name} is {shown} at step {step}; training stopped so that the last good "
            "checkpoint is not overwritten"
        )


class FiniteGuard:
    """Whether every checked loss was finite, kept on the device and read only when asked.

    ``bool(torch.isfinite(loss).all())`` before every ``backward`` makes the host wait for the
    device at every loss. Instead, like ``torch.amp.GradScaler``'s ``found_inf``, the guard folds
    each value's finiteness into 0-dim device tensors with device-side ops only: the first
    step at which a value was not finite (0 while none was), the index of its name, and the
    value itself. The loop reads them with :meth:`raise_if_bad` on logging, evaluation and
    checkpoint steps (one device→host copy), so a NaN is reported with the step and the loss
    where it first appeared, and no checkpoint is written after it. The steps in between run on
    with non-finite numbers, which changes nothing that is kept.

    Under DDP :meth:`raise_if_bad` first gathers every rank's flag (a collective), so a NaN on
    one rank makes every rank raise the same error at the same step instead of leaving the
    others waiting inside the next collective.

    Args:
        device: where the flag lives: the device the losses are computed on.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._step = torch.zeros((), dtype=torch.long, device=device)  # first bad step; 0: none
        self._name = torch.zeros((), dtype=torch.long, device=device)  # index into _names
        self._value = torch.zeros((), dtype=torch.float64, device=device)
        # which check of its step the first bad value was (0: the step's first): the same code
        # runs on every rank, so a lower order came first (a NaN that DDP's all-reduce spread)
        self._order = torch.zeros((), dtype=torch.long, device=device)
        self._names: list[tuple[str, bool]] = []  # (name, whether the value is one number)
        self._checks = (0, 0)  # (step, values checked in it so far), on the host

    def observe(self, value: Tensor, name: str, step: int) -> None:
        """Record whether ``value`` is finite, without reading it on the host.

        Shape:
            value: any shape; a one-element value is shown in the error, others are not.
        """
        if step < 1:
            raise ValueError(f"steps are counted from 1 (0 means none went bad), got {step}")
        value = value.detach()
        key = (name, value.numel() == 1)
        if key not in self._names:
            self._names.append(key)
        order = self._checks[1] if self._checks[0] == step else 0
        self._checks = (step, order + 1)
        finite = torch.isfinite(value).all().to(self.device, non_blocking=True)
        first = (self._step == 0) & ~finite  # () bool: the first non-finite value so far
        shown = value.reshape(-1)[0] if key[1] else self._value.new_full((), math.nan)
        self._step = torch.where(first, step, self._step)
        self._name = torch.where(first, self._names.index(key), self._name)
        self._value = torch.where(first, shown.to(self._value), self._value)
        self._order = torch.where(first, order, self._order)

    def raise_if_bad(self, *, collective: bool = True) -> None:
        """Raise ``FloatingPointError`` naming the first non-finite value, its step (and rank).

        With ``collective`` (every rank must call it at the same point) the flags of every rank
        are gathered first and the earliest step wins, within it the earliest check (a NaN on
        one rank that DDP's all-reduce spread to the others' next loss is the first rank's),
        then the lowest rank; without, only this rank's flag is read (after an error, when the
        other ranks may not come).
        """
        state = torch.stack(
            [self._step.double(), self._name.double(), self._value, self._order.double()]
        )  # (4,)
        ranks = world_size() if collective else 1
        rows = (gather_no_grad(state[None]) if ranks > 1 else state[None]).tolist()  # (R, 4)
        bad = [(int(row[0]), int(row[3]), rank) for rank, row in enumerate(rows) if row[0] > 0]
        if not bad:
            return
        step, _, rank = min(bad)
        names = all_gather_object(self._names) if ranks > 1 else [self._names]
        name, one = names[rank][int(rows[rank][1])]
        shown = f"{rows[rank][2]}" if one else "a tensor with non-finite entries"
        where = f" on rank {rank}" if ranks > 1 else ""
        raise FloatingPointError(
            f"{name} is {shown} at step {step}{where}; training stopped so that the last good "
            "checkpoint is not overwritten"
        )


@dataclass(frozen=True)
class StepContext:
    """What the loop decides for every step: its number (from 1), the device and the precision.

    ``autocast()`` is the autocast region every forward pass runs in (bf16 on GPU when the
    loop's ``amp`` says so, nothing on the CPU); ``to_device`` moves a batch there. ``guard``
    is the loop's :class:`FiniteGuard`: with it, :meth:`check` records finiteness on the device
    (read at the loop's logging steps); without it (a step run by hand) :meth:`check` raises at
    once.
    """

    step: int
    device: torch.device
    dtype: torch.dtype | None
    guard: FiniteGuard | None = None

    def autocast(self) -> AbstractContextManager[Any]:
        return torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype is not None)

    def to_device(self, batch: Any) -> Any:
        return move_to_device(batch, self.device)

    def check(self, value: Tensor, name: str) -> None:
        """Check that ``value`` is finite: on the device with the loop's guard, else at once."""
        if self.guard is None:
            check_finite(value, name, self.step)
        else:
            self.guard.observe(value, name, self.step)

    def backward(self, loss: Tensor, name: str = "loss", *, scale: float = 1.0) -> None:
        """:meth:`check` then ``backward`` of ``loss / scale``: every loss goes through here."""
        self.check(loss, name)
        torch.autograd.backward(loss.div(scale) if scale != 1.0 else loss)


class Updater(ABC):
    """One training step of :func:`shared.train.fit_updater`.

    ``step`` consumes exactly :attr:`batches_per_step` batches from ``batches`` (fewer only at
    the end of the loader, where the loop never asks), calls ``ctx.backward`` on every loss and
    steps its optimizers and schedulers; it returns the metrics of the step (scalars; ``lr``
    first by convention). ``modules`` names every module whose weights the run trains or keeps
    (checked for finite weights before each checkpoint, put in train mode by the loop, in eval
    mode around evaluation); ``evaluated`` is the one handed to ``evaluate``. ``end_epoch``
    runs once after the step that completes each epoch (see :meth:`end_epoch`).
    """

    batches_per_step: int = 1

    @abstractmethod
    def step(self, batches: Iterator[Any], ctx: StepContext) -> dict[str, Tensor | float]:
        """Run one step over ``batches_per_step`` batches; return its metrics."""

    @abstractmethod
    def modules(self) -> Mapping[str, nn.Module]:
        """Every module of the run by name (as trained: possibly DDP-wrapped)."""

    @abstractmethod
    def evaluated(self) -> nn.Module:
        """The unwrapped module ``evaluate`` receives."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Weights, optimizer and scheduler states: merged into every checkpoint's top level."""

    @abstractmethod
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from a checkpoint (the whole checkpoint dict; read your own keys)."""

    def end_epoch(self, epoch: int) -> Mapping[str, float]:
        """Update whatever changes once per epoch, after the step that completes ``epoch``.

        ``epoch`` counts from 0. The loop calls it with every module in train mode, right after
        the epoch's last full step and before that step's logging, evaluation and checkpoint:
        the checkpoint then holds the updated state (keep it in :meth:`state_dict`), so a
        resume neither repeats nor skips an update. It is not called after an epoch cut short
        by ``max_steps``. The returned metrics join the step's row of ``metrics.csv`` (a row is
        logged on that step whenever there are any). The default does nothing.
        """
        return {}


class OptimizerUpdater(Updater):
    """One model, one optimizer: ``train_step(model, batch) -> {"loss": ..., ...}`` per batch.

    A step runs ``grad_accum_steps`` micro-batches: each loss is divided by their number so the
    accumulated gradient is that of the mean over the step, DDP's all-reduce runs on the last
    micro-batch only (``no_sync``), gradients are clipped to ``clip_grad_norm``, then the
    optimizer and the scheduler step (the scheduler once per optimizer step, without
    arguments). Metrics are ``lr`` (the rate this step used), the mean of ``train_step``'s
    values over micro-batches and ``grad_norm`` when clipping. Checkpoint keys: ``model``,
    ``optimizer``, ``scheduler``. ``end_epoch(epoch)``, when given, is what
    :meth:`Updater.end_epoch` runs (state it changes must reach the checkpoint some other way,
    e.g. through the model's buffers).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        train_step: TrainStep,
        *,
        scheduler: LRScheduler | None = None,
        grad_accum_steps: int = 1,
        clip_grad_norm: float | None = None,
        end_epoch: Callable[[int], Mapping[str, float]] | None = None,
    ) -> None:
        if grad_accum_steps < 1:
            raise ValueError(f"grad_accum_steps must be >= 1, got {grad_accum_steps}")
        self.model = model
        self.optimizer = optimizer
        self.train_step = train_step
        self.scheduler = scheduler
        self.batches_per_step = grad_accum_steps
        self.clip_grad_norm = clip_grad_norm
        self._end_epoch = end_epoch

    def step(self, batches: Iterator[Any], ctx: StepContext) -> dict[str, Tensor | float]:
        accum = self.batches_per_step
        sums: dict[str, Tensor] = {}
        for index, batch in enumerate(batches):
            sync: AbstractContextManager[Any] = nullcontext()
            if isinstance(self.model, DistributedDataParallel) and index < accum - 1:
                sync = self.model.no_sync()
            with sync:
                with ctx.autocast():
                    out = self.train_step(self.model, ctx.to_device(batch))
                loss = out.get("loss")
                if not isinstance(loss, Tensor):
                    raise ValueError(
                        f"train_step must return a tensor 'loss'; it returned {sorted(out)}"
                    )
                ctx.backward(loss, scale=accum)
            for key, value in out.items():
                share = torch.as_tensor(value).detach().float() / accum
                sums[key] = sums[key] + share if key in sums else share
        if self.clip_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_grad_norm)
            ctx.check(norm, "grad_norm")
            sums["grad_norm"] = norm.detach()
        lr = float(self.optimizer.param_groups[0]["lr"])  # the rate this step uses
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"lr": lr, **sums}

    def end_epoch(self, epoch: int) -> Mapping[str, float]:
        return {} if self._end_epoch is None else self._end_epoch(epoch)

    def modules(self) -> Mapping[str, nn.Module]:
        return {"model": self.model}

    def evaluated(self) -> nn.Module:
        return unwrap(self.model)

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": unwrap(self.model).state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": None if self.scheduler is None else self.scheduler.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if (self.scheduler is None) != (state["scheduler"] is None):
            raise ValueError("a scheduler must be given now if and only if it was then")
        unwrap(self.model).load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state["scheduler"])
