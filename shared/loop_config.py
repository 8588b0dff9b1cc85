"""The loop's settings and result (:class:`LoopConfig`, :class:`FitResult`), and its inputs' types.

A pipeline hands :func:`shared.train.fit` a loader (:class:`SizedIterable`), an ``evaluate``
function (:data:`Evaluate`) and its own config (:data:`PipelineConfig`: stored in every
checkpoint and compared on resume).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol

from torch import Tensor, nn

__all__ = ["Evaluate", "FitResult", "LoopConfig", "PipelineConfig", "SizedIterable"]

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    PipelineConfig = DataclassInstance | Mapping[str, Any]
else:
    PipelineConfig = Any

Evaluate = Callable[[nn.Module], Mapping[str, Tensor | float]]


class SizedIterable(Protocol):
    """What the loop needs of a loader: iteration and a length (a ``DataLoader``)."""

    def __iter__(self) -> Iterator[Any]: ...

    def __len__(self) -> int: ...


@dataclass(frozen=True)
class LoopConfig:
    """Settings of :func:`~shared.train.fit`. ``epochs`` and/or ``max_steps`` bound the run
    (first one wins).

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
    """Where :func:`~shared.train.fit` stopped: the step, the epoch (counting finished ones), the
    last logged row, and the best value of ``loop_cfg.best_metric`` with its step (``None``
    without one)."""

    step: int
    epoch: int
    metrics: dict[str, float]
    best: float | None
    best_step: int | None
