"""LARS and the warm-up + cosine learning-rate schedule of SimCLR.

`LARS` is SGD with momentum and weight decay whose step is rescaled per parameter tensor by a
trust ratio (You, Gitman, Ginsburg 2017, "Large Batch Training of Convolutional Networks",
Algorithm 1). SimCLR trains with it at every batch size (Chen et al. 2020, Sec. 3) and its
reference code excludes batch-norm parameters and biases from both weight decay and the
adaptation; `lars_param_groups` builds the two parameter groups that do that.

`warmup_cosine_schedule` is SimCLR's schedule: linear warm-up from 0, then cosine decay. A run
resumed with a longer horizon (more epochs) continues on the new schedule, not the saved one.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

__all__ = ["LARS", "WarmupCosineLR", "lars_param_groups", "warmup_cosine_schedule"]


def _default_exclude(name: str, param: nn.Parameter) -> bool:
    # Batch-norm weights and biases and every bias are vectors (ndim 1); scalars (ndim 0) such as
    # learnable temperatures are treated alike.
    return param.ndim <= 1


def lars_param_groups(
    model: nn.Module,
    weight_decay: float,
    *,
    exclude: Callable[[str, nn.Parameter], bool] = _default_exclude,
) -> list[dict[str, Any]]:
    """Split `model`'s trainable parameters into the two LARS groups used by SimCLR.

    Parameters for which `exclude(name, param)` is true (default: `param.ndim <= 1`, i.e. biases
    and batch-norm affine parameters) get `weight_decay=0.0` and `lars_adapt=False`: plain SGD
    with momentum. All others get `weight_decay` and `lars_adapt=True`. Parameters with
    `requires_grad=False` are left out; empty groups are dropped.

    Returns a list to pass to `LARS(groups, lr=...)` (or any torch optimizer, which ignores the
    extra `lars_adapt` key).
    """
    if not weight_decay >= 0.0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
    adapted: list[nn.Parameter] = []
    excluded: list[nn.Parameter] = []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (excluded if exclude(name, param) else adapted).append(param)
    groups = [
        {"params": adapted, "weight_decay": weight_decay, "lars_adapt": True},
        {"params": excluded, "weight_decay": 0.0, "lars_adapt": False},
    ]
    return [group for group in groups if group["params"]]


class LARS(Optimizer):
    """Layer-wise Adaptive Rate Scaling on top of SGD with momentum (You et al. 2017).

    For each parameter tensor w with gradient g, in a group with `lars_adapt=True`:

        trust = trust_coefficient * ||w|| / (||g|| + weight_decay * ||w||)   (Algorithm 1)
        d     = trust * (g + weight_decay * w)
        v     = momentum * v + d
        w     = w - lr * v              (nesterov: w = w - lr * (d + momentum * v))

    `trust` is 1 where ||w|| = 0 (fresh zero-initialised tensors) or where the denominator is 0.
    By the triangle inequality ||d|| <= trust_coefficient * ||w||: a step never moves a tensor by
    more than lr * trust_coefficient times its norm (before momentum). In a group with
    `lars_adapt=False` the trust ratio is 1 and the update is exactly `torch.optim.SGD`'s
    (with the group's `weight_decay`, which `lars_param_groups` sets to 0).

    Two conventions differ between public implementations; we chose:
    - the denominator is ||g|| + weight_decay * ||w|| as in the paper (the SimCLR TF code uses
      ||g + weight_decay * w||; the two agree when weight_decay = 0);
    - lr multiplies the momentum buffer on the way out, as in `torch.optim.SGD` (the SimCLR TF
      code folds lr into the buffer; identical under a constant lr).

    Args:
        params: parameters or parameter groups; groups may set `lars_adapt` (default True),
            `weight_decay`, `lr`, `momentum`, `trust_coefficient`, `nesterov`.
        lr: learning rate; SimCLR uses 0.3 * batch_size / 256 (Chen et al. 2020, Sec. 3).
        momentum: 0.9 (SimCLR reference code default).
        weight_decay: 1e-6 (SimCLR ImageNet, Sec. 3).
        trust_coefficient: eta = 1e-3 (You et al. 2017; SimCLR's `eeta`).
        nesterov: Nesterov momentum (off in SimCLR).
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float,
        momentum: float = 0.9,  # SimCLR reference code default
        weight_decay: float = 1e-6,  # SimCLR ImageNet (Chen et al. 2020, Sec. 3)
        trust_coefficient: float = 1e-3,  # You et al. 2017; SimCLR `eeta`
        nesterov: bool = False,
    ) -> None:
        if not lr >= 0.0:
            raise ValueError(f"lr must be >= 0, got {lr}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        if not weight_decay >= 0.0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        if not trust_coefficient > 0.0:
            raise ValueError(f"trust_coefficient must be > 0, got {trust_coefficient}")
        if nesterov and momentum == 0.0:
            raise ValueError(f"nesterov needs momentum > 0, got momentum={momentum}")
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "weight_decay": weight_decay,
            "trust_coefficient": trust_coefficient,
            "nesterov": nesterov,
            "lars_adapt": True,
        }
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """Perform one optimisation step; `closure` re-evaluates the loss if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr: float = group["lr"]
            momentum: float = group["momentum"]
            weight_decay: float = group["weight_decay"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad = param.grad
                if grad.is_sparse:
                    raise ValueError("LARS does not support sparse gradients")
                update = grad.add(param, alpha=weight_decay) if weight_decay != 0.0 else grad
                if group["lars_adapt"]:
                    update = update * self._trust_ratio(
                        param, grad, weight_decay, group["trust_coefficient"]
                    )
                if momentum != 0.0:
                    state = self.state[param]
                    if "momentum_buffer" not in state:
                        # First step: the buffer starts at the update, as in torch.optim.SGD.
                        state["momentum_buffer"] = update.clone()
                    else:
                        state["momentum_buffer"].mul_(momentum).add_(update)
                    buffer: Tensor = state["momentum_buffer"]
                    update = update.add(buffer, alpha=momentum) if group["nesterov"] else buffer
                param.add_(update, alpha=-lr)
        return loss

    @staticmethod
    def _trust_ratio(
        param: Tensor, grad: Tensor, weight_decay: float, trust_coefficient: float
    ) -> Tensor:
        # Stays on the device (no .item()): torch.where instead of Python branching.
        param_norm = torch.linalg.vector_norm(param)
        denominator = torch.linalg.vector_norm(grad) + weight_decay * param_norm
        usable = (param_norm > 0) & (denominator > 0)
        ratio = trust_coefficient * param_norm / torch.where(usable, denominator, 1.0)
        return torch.where(usable, ratio, torch.ones_like(ratio))


class _WarmupCosine:
    """Multiplicative lr factor at `step`: a callable object, so LambdaLR checkpoints it."""

    def __init__(self, warmup_steps: int, total_steps: int, final_lr_ratio: float) -> None:
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.final_lr_ratio = final_lr_ratio

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return step / self.warmup_steps
        progress = min(1.0, (step - self.warmup_steps) / (self.total_steps - self.warmup_steps))
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.final_lr_ratio + (1.0 - self.final_lr_ratio) * cosine


class WarmupCosineLR(LambdaLR):
    """The `LambdaLR` of :func:`warmup_cosine_schedule`; a loaded state keeps this schedule.

    `LambdaLR.load_state_dict` also overwrites the schedule's settings with the saved ones, so a
    run extended on resume (more epochs, a later `total_steps`) would keep the old horizon and
    train on at the floor lr (0 for SimCLR). Here the step count and the rest of the state are
    restored, the constructed warm-up, horizon and floor stay, and when they differ from the
    saved ones a warning names both and the lr of the resumed step is set from the new schedule.
    """

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        planned = [dict(fn.__dict__) for fn in self.lr_lambdas]
        super().load_state_dict(state_dict)
        saved = [dict(fn.__dict__) for fn in self.lr_lambdas]
        for fn, settings in zip(self.lr_lambdas, planned, strict=True):
            fn.__dict__.update(settings)
        if saved == planned:
            return
        warnings.warn(
            f"the lr schedule changed on resume at step {self.last_epoch}: saved {saved[0]}, "
            f"now {planned[0]}; training continues on the new schedule",
            stacklevel=2,
        )
        groups = self.optimizer.param_groups
        for group, base, fn in zip(groups, self.base_lrs, self.lr_lambdas, strict=True):
            group["lr"] = base * fn(self.last_epoch)
        self._last_lr = [group["lr"] for group in groups]


def warmup_cosine_schedule(
    optimizer: Optimizer,
    *,
    warmup_steps: int,  # SimCLR: 10 epochs' worth of steps (Chen et al. 2020, Sec. 3)
    total_steps: int,
    final_lr_ratio: float = 0.0,  # SimCLR decays to 0 (cosine without restarts)
) -> WarmupCosineLR:
    """Linear warm-up from 0 to each group's base lr, then cosine decay to `final_lr_ratio` x it.

    With base lr b, warm-up W and total T steps (call `scheduler.step()` once per optimiser step):

        lr(t) = b * t / W                                                   for t < W
        lr(t) = b * (r + (1 - r) * (1 + cos(pi * (t - W) / (T - W))) / 2)  for W <= t <= T
        lr(t) = b * r                                                       for t > T

    so lr(0) = 0 (when W > 0), lr(W) = b, lr((W + T) / 2) = b * (1 + r) / 2, lr(T) = b * r.

    Built on `LambdaLR` rather than `SequentialLR(LinearLR, CosineAnnealingLR)` because the latter
    does not fit: `LinearLR` refuses `start_factor=0` (SimCLR's warm-up starts at 0) and cannot
    express W = 0, and `CosineAnnealingLR`'s `eta_min` is one absolute lr shared by all groups, not
    a ratio of each group's lr; its recursive update also drifts from the closed form. `LambdaLR`
    evaluates the closed form above exactly, per group, and its state dict resumes; a resumed
    run with a different horizon continues on the new one (:class:`WarmupCosineLR`).
    """
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    if total_steps <= warmup_steps:
        raise ValueError(
            f"total_steps must be > warmup_steps, got total_steps={total_steps}, "
            f"warmup_steps={warmup_steps}"
        )
    if not 0.0 <= final_lr_ratio <= 1.0:
        raise ValueError(f"final_lr_ratio must be in [0, 1], got {final_lr_ratio}")
    return WarmupCosineLR(optimizer, _WarmupCosine(warmup_steps, total_steps, final_lr_ratio))
