"""The training steps of the methods that train an :class:`imagecl.networks.ImageModel`.

:func:`simclr_step` (SimCLR; CLAE with an :class:`imagecl.clae.Adversary`), :func:`supcon_step`
(SupCon, also with an adversary) and :func:`ce_step` (cross-entropy). Each takes plain
arguments; :mod:`imagecl.steps` resolves a config into them once, when the step is made. Each
also trains the online linear probe on detached h when the model has one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from imagecl.augment import SimCLRViews
from imagecl.clae import Adversary, adversarial_view
from imagecl.dual_bn import adversarial_rows
from imagecl.networks import ModelOutput
from shared.losses import supcon_loss
from shared.runtime import unwrap

__all__ = ["Batch", "ce_step", "masked_cross_entropy", "simclr_step", "supcon_step"]

Batch = tuple[Tensor, Tensor]  # images (N, C, H, W) uint8, labels (N,) (-1 where unknown)


def masked_cross_entropy(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """Cross-entropy and accuracy over the rows with a label (>= 0); unlabelled rows are -1.

    Shape:
        logits: ``(B, K)``; labels: ``(B,)``; result: two scalars.
    """
    known = labels >= 0
    count = known.sum().clamp(min=1)
    per_row = F.cross_entropy(logits.float(), labels.clamp(min=0), reduction="none")  # (B,)
    loss = (per_row * known).sum() / count
    accuracy = ((logits.argmax(1) == labels) & known).sum() / count
    return loss, accuracy.detach().float()


class _Forward(NamedTuple):
    """One forward of the clean views (and the adversarial rows) of a batch."""

    out: ModelOutput  # the clean rows, n·V + v
    z: Tensor  # (N, V, D) the clean projections
    z_adv: Tensor | None  # (N, D) the adversarial rows' projections
    labels: Tensor  # (N,)


def _contrastive_forward(
    model: nn.Module, batch: Batch, views: SimCLRViews, adversary: Adversary | None
) -> _Forward:
    """The views on the device, x_adv from the first one (CLAE), one forward for all rows."""
    images, labels = batch
    N = images.shape[0]
    x = views(images)  # (N, V, C, S, S) normalised float, augmented on the device
    V = x.shape[1]
    rows = x.flatten(0, 1)  # (N·V, C, S, S), row n·V + v
    adv_rows = 0
    if adversary is not None:  # x_adv rows after the views, through their own BN branch
        inner = unwrap(model)
        x_adv = adversarial_view(
            inner, x[:, 0], labels, adversary=adversary, mean=views.mean, std=views.std
        )
        rows = torch.cat([rows, x_adv])  # (N·V + N, C, S, S)
        adv_rows = N if adversary.dual_bn else 0
    with adversarial_rows(unwrap(model), adv_rows):
        full = model(rows)  # one forward for clean and adversarial rows
    out = ModelOutput(
        full.h[: N * V], *(None if t is None else t[: N * V] for t in full[1:])
    )  # the clean rows; ModelOutput fields after h are optional
    assert out.z is not None and full.z is not None
    z_adv = None if adversary is None else full.z[N * V :]
    return _Forward(out, out.z.view(N, V, -1), z_adv, labels)


def _contrastive_metrics(
    fwd: _Forward, contrastive: Tensor, adversary: Adversary | None, gather: bool
) -> dict[str, Tensor]:
    """The total loss (+ α·adversarial term, + joint classifier, + probe) and the metrics."""
    metrics: dict[str, Tensor] = {"contrastive_loss": contrastive.detach()}
    loss = contrastive
    if adversary is not None and fwd.z_adv is not None:
        adv_loss = adversary.pair_loss(fwd.z[:, 0], fwd.z_adv, fwd.labels, gather)
        metrics["adversarial_loss"] = adv_loss.detach()
        loss = loss + adversary.alpha * adv_loss
    metrics["z_std"] = F.normalize(fwd.z.detach().float(), dim=-1).flatten(0, 1).std(0).mean()
    y = fwd.labels.repeat_interleave(fwd.z.shape[1])  # (N·V,)
    if fwd.out.logits is not None:  # SupCon's joint classifier on stop-gradient h
        classifier_loss, metrics["classifier_acc"] = masked_cross_entropy(fwd.out.logits, y)
        loss = loss + classifier_loss
    return _with_probe(loss, metrics, fwd.out, y)


def _with_probe(
    loss: Tensor, metrics: dict[str, Tensor], out: ModelOutput, y: Tensor
) -> dict[str, Tensor]:
    """Add the online probe's loss (it reads h.detach(), so it trains the probe only)."""
    if out.probe_logits is not None:
        probe_loss, metrics["probe_acc"] = masked_cross_entropy(out.probe_logits, y)
        metrics["probe_loss"] = probe_loss.detach()
        loss = loss + probe_loss
    return {"loss": loss, **metrics}


def simclr_step(
    model: nn.Module,
    batch: Batch,
    *,
    views: SimCLRViews,
    loss: Callable[..., Tensor],
    adversary: Adversary | None,
    gather: bool,
) -> dict[str, Tensor]:
    """SimCLR's step (CLAE's with ``adversary``): ``loss`` of the two views, with the model's
    queue when it has one.

    Args:
        loss: :func:`imagecl.losses.simclr_loss` with its settings (:func:`simclr_loss_of`).
        adversary: CLAE's adversarial view and its weight; none: no adversarial view.
    """
    fwd = _contrastive_forward(model, batch, views, adversary)
    queue = getattr(unwrap(model), "queue", None)
    contrastive = loss(fwd.z, queue=queue, gather=gather)
    return _contrastive_metrics(fwd, contrastive, adversary, gather)


def supcon_step(
    model: nn.Module,
    batch: Batch,
    *,
    views: SimCLRViews,
    temperature: float,
    variant: Literal["out", "in"],
    adversary: Adversary | None,
    gather: bool,
) -> dict[str, Tensor]:
    """SupCon's step: ``L_out`` (or ``L_in``) of the views with the labels (+ CLAE's
    adversarial view with ``adversary``, + the joint classifier when the model has one)."""
    fwd = _contrastive_forward(model, batch, views, adversary)
    contrastive = supcon_loss(
        fwd.z, fwd.labels, temperature=temperature, variant=variant, gather=gather
    )
    return _contrastive_metrics(fwd, contrastive, adversary, gather)


def ce_step(model: nn.Module, batch: Batch, *, views: SimCLRViews) -> dict[str, Tensor]:
    """Cross-entropy of the end-to-end classifier on one augmented view (and the probe)."""
    images, labels = batch
    x = views(images)  # (N, V, C, S, S)
    out = model(x.flatten(0, 1))
    y = labels.repeat_interleave(x.shape[1])  # (N·V,)
    assert out.logits is not None
    loss, train_acc = masked_cross_entropy(out.logits, y)
    return _with_probe(loss, {"train_acc": train_acc}, out, y)
