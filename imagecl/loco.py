"""Local contrastive learning: LoCo (Xiong, Ren & Urtasun 2020) and Greedy InfoMax, the loss
and the training step.

The model is :class:`imagecl.loco_model.LoCoModel`: the backbone cut into local units, each
with its own head, disjoint for Greedy InfoMax (``overlap=0``, Löwe et al. 2019), overlapping for
LoCo (``overlap=1``), or one unit for the end-to-end baseline (its module docstring has the
details). Each unit contrasts its own projection with NT-Xent. LoCo's point is that the feedback
from the upper unit closes most of GIM's gap to end-to-end training.

The loss is Σ_k w_k · NT-Xent_k (unit weights ``w_k``, default 1; a sum, not a mean, so each
stage gets the gradient its unit would get alone).

Memory — two training paths (``benchmarks/loco_memory.py`` measures their peaks):

(a) :func:`loco_train_step`, a step for ``shared.train.fit``: one forward, one total loss, one
    ``backward`` by ``fit``. Correct gradients, but autograd keeps *every* unit's activations
    until that backward: not local learning's memory saving, and LoCo's second pass of each
    shared stage adds to the peak.
(b) :func:`local_backward_step`, what ``imagecl train --method loco`` runs (through
    :class:`LocalUpdater`, DDP included): each unit's loss is back-propagated as soon as it is
    computed, so its activations are freed before the next unit runs; the peak is that of one
    unit (one stage for GIM, two for LoCo) plus the unit's output, which the next unit needs.
    It gains nothing where the first stage holds most of the activations (there (a) can peak
    lower: its backward frees the upper units before it reaches the first). Same gradients as
    (a) (tested).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import LRScheduler

# the model's public names stay importable from here, the method's entry point
from imagecl.loco_model import (
    LocalUnit,
    LoCoModel,
    LoCoOutput,
    UnitOutput,
    check_unit_weights,
    split_stages,
    unstack_views,
)
from shared.distributed import all_reduce_mean, world_size
from shared.losses import nt_xent_loss
from shared.runtime import unwrap
from shared.updaters import OptimizerUpdater, StepContext

__all__ = [
    "LoCoModel",
    "LoCoOutput",
    "LocalUnit",
    "LocalUpdater",
    "UnitOutput",
    "average_gradients",
    "local_backward_step",
    "loco_loss",
    "loco_train_step",
    "split_stages",
    "unstack_views",
]


def loco_loss(
    out1: LoCoOutput,
    out2: LoCoOutput,
    *,
    temperature: float = 0.5,  # SimCLR's CIFAR τ, nt_xent_loss's default
    weights: Sequence[float] | None = None,
    gather: bool = False,
) -> tuple[Tensor, list[Tensor]]:
    """Σ_k w_k · NT-Xent(z_k of view 1, z_k of view 2): the local losses of every unit.

    Each unit contrasts only its own projections (Xiong et al. 2020, Sec. 3); ``weights=None``
    weighs every unit 1. ``gather`` uses every rank's samples as negatives (see
    :func:`shared.losses.nt_xent_loss`).

    Shape:
        out1, out2: ``projections[k]`` of shape ``(N, D)``; result: a scalar, and the K
        unweighted unit losses (scalars, attached to the graph).
    """
    if len(out1.projections) != len(out2.projections):
        raise ValueError(
            f"the two views have {len(out1.projections)} and {len(out2.projections)} units"
        )
    w = check_unit_weights(weights, len(out1.projections))
    per_unit = [
        nt_xent_loss(z1, z2, temperature=temperature, gather=gather)
        for z1, z2 in zip(out1.projections, out2.projections, strict=True)
    ]
    total = per_unit[0] * w[0]
    for weight, loss in zip(w[1:], per_unit[1:], strict=True):
        total = total + weight * loss
    return total, per_unit


def _loco_model(model: nn.Module) -> LoCoModel:
    inner = unwrap(model)
    if not isinstance(inner, LoCoModel):
        raise TypeError(f"expected a LoCoModel (possibly DDP-wrapped), got {type(inner).__name__}")
    return inner


def _two_views(views: Callable[[Tensor], Tensor], images: Tensor) -> Tensor:
    x = views(images)  # (N, V, C, S, S)
    if x.ndim != 5 or x.shape[1] != 2:
        raise ValueError(f"LoCo contrasts exactly 2 views (N, 2, C, S, S), got {tuple(x.shape)}")
    return x


def loco_train_step(
    model: nn.Module,
    batch: tuple[Tensor, Tensor],
    *,
    views: Callable[[Tensor], Tensor],
    temperature: float,
    gather: bool,
) -> dict[str, Tensor]:
    """One step's LoCo/GIM/end-to-end loss, for ``shared.train.fit`` (path (a)).

    One forward of both views stacked (2N rows), the weighted sum of the unit losses as
    ``"loss"`` (``fit`` back-propagates it), each unit's loss as ``"unit{k}_loss"``. Every
    unit's activations are kept until that backward (see the module docstring).

    Shape:
        batch: images ``(N, C, H, W)`` uint8 and labels ``(N,)`` (unused);
        ``views(images)``: ``(N, 2, C, S, S)``.
    """
    images, _ = batch
    loco = _loco_model(model)
    x = _two_views(views, images)  # (N, 2, C, S, S)
    out = model(x.flatten(0, 1))  # rows n·2 + v
    out1, out2 = unstack_views(out, 2)
    loss, per_unit = loco_loss(
        out1, out2, temperature=temperature, weights=loco.unit_weights, gather=gather
    )
    metrics = {f"unit{k}_loss": unit_loss.detach() for k, unit_loss in enumerate(per_unit)}
    return {"loss": loss, **metrics}


def local_backward_step(
    model: nn.Module,
    batch: tuple[Tensor, Tensor],
    *,
    views: Callable[[Tensor], Tensor],
    temperature: float,
    gather: bool = False,
    ctx: StepContext | None = None,
) -> dict[str, Tensor]:
    """Forward *and backward* of one step, unit by unit (path (b)): local learning's memory.

    Unit k's weighted loss is back-propagated as soon as it is computed, which frees unit k's
    activations before unit k+1 runs on its detached output; the gradients are those of
    :func:`loco_train_step`'s total loss. Everything returned is detached (``"loss"`` too): the
    caller steps the optimizer and zeroes the gradients (:class:`LocalUpdater` does), not
    ``fit``. ``ctx`` gives the autocast region of the forwards and ``backward`` (which checks
    each unit's loss first); without it, fp32 and a check at once. ``gather`` contrasts every
    rank's samples; the model must not be DDP-wrapped (DDP's reducer expects one backward per
    forward): :class:`LocalUpdater` averages the gradients over ranks itself.

    Shape:
        as :func:`loco_train_step`.
    """
    if isinstance(model, DistributedDataParallel):
        raise ValueError(
            "local_backward_step takes the plain LoCoModel; under DDP use LocalUpdater, which "
            "averages the gradients over ranks after the per-unit backwards"
        )
    loco = _loco_model(model)
    images, _ = batch
    N = images.shape[0]
    if ctx is None:
        ctx = StepContext(step=0, device=images.device, dtype=None)
    h = _two_views(views, images).flatten(0, 1)  # (2N, C, S, S), rows n·2 + v; fp32 views
    total = torch.zeros((), device=h.device)
    metrics: dict[str, Tensor] = {}
    for unit, weight in enumerate(loco.unit_weights):
        with ctx.autocast():
            h, _, z = loco.forward_unit(unit, h)
            z = z.view(N, 2, -1)  # (N, 2, D)
            loss = nt_xent_loss(z[:, 0], z[:, 1], temperature=temperature, gather=gather)
        ctx.backward(loss * weight, f"unit{unit}_loss")  # the unit's graph is freed here
        h = h.detach()  # keep the output's values, drop the freed graph
        metrics[f"unit{unit}_loss"] = loss.detach()
        total = total + weight * loss.detach()
    return {"loss": total, **metrics}


def average_gradients(parameters: Iterable[nn.Parameter]) -> None:
    """Replace every gradient by its mean over ranks, in one all-reduce (DDP's averaging).

    Every rank must call it at the same point with the same parameters holding gradients; the
    identity on one process.

    Shape:
        the gradients are flattened into one ``(P,)`` buffer for the collective.
    """
    if world_size() == 1:
        return
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return
    flat = all_reduce_mean(torch.cat([g.reshape(-1) for g in grads]))  # (P,)
    for grad, part in zip(grads, torch.split(flat, [g.numel() for g in grads]), strict=True):
        grad.copy_(part.view_as(grad))


class LocalUpdater(OptimizerUpdater):
    """The training step of ``imagecl train --method loco``: per-unit backward, DDP included.

    Each step runs :func:`local_backward_step` on the plain :class:`LoCoModel` (each unit
    back-propagated as soon as its loss exists, path (b)), then, under DDP, averages the
    gradients over ranks with one all-reduce (:func:`average_gradients`), steps the optimizer
    and the scheduler and zeroes the gradients. DDP's own reducer cannot serve here: it expects
    one backward per forward of the wrapper, and the per-unit path makes one per unit. With
    ``gather`` each unit's NT-Xent contrasts every rank's samples, so the parameters get the
    gradients of one process holding the whole batch (as DDP would give). Batch-norm buffers
    stay each rank's own (rank 0's are the ones saved, as under DDP).

    An :class:`~shared.updaters.OptimizerUpdater` in everything but the step: the same
    checkpoint keys (``model``, ``optimizer``, ``scheduler``) and metrics (``lr``, ``loss``,
    ``unit{k}_loss``); one batch per step, no gradient accumulation or clipping.

    Args:
        model: a :class:`LoCoModel`, possibly DDP-wrapped.
        optimizer, scheduler: stepped once per step.
        views: uint8 images ``(N, C, H, W)`` to 2 views ``(N, 2, C, S, S)``.
        temperature: τ of every unit's NT-Xent.
        gather: contrast every rank's samples (under DDP).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        views: Callable[[Tensor], Tensor],
        temperature: float,
        gather: bool,
        scheduler: LRScheduler | None = None,
    ) -> None:
        _loco_model(model)  # fail early on anything else
        single = functools.partial(
            loco_train_step, views=views, temperature=temperature, gather=gather
        )
        super().__init__(model, optimizer, single, scheduler=scheduler)
        self.views, self.temperature, self.gather = views, temperature, gather

    def step(self, batches: Iterator[Any], ctx: StepContext) -> dict[str, Tensor | float]:
        loco = _loco_model(self.model)
        batch = ctx.to_device(next(batches))
        metrics = local_backward_step(
            loco, batch, views=self.views, temperature=self.temperature, gather=self.gather, ctx=ctx
        )
        average_gradients(loco.parameters())
        lr = float(self.optimizer.param_groups[0]["lr"])  # the rate this step uses
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"lr": lr, **metrics}
