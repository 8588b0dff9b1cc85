"""One training step per method, and ``METHODS``, the registry ``imagecl train --method`` reads.

Each :class:`Method` entry holds all that is particular to one method: its defaults (τ, views
per image, whether it trains on labels), its settings check (which ``Config`` calls on
construction), the model it trains around the backbone, and its step, a function for
``shared.train.fit`` (LoCo also has an updater for ``fit_updater``). An entry resolves the
config once, when the step is made, into the plain arguments of its step function, so a loss
call shows what it uses. Adding a method is one entry here and its module.

The methods themselves are described in :mod:`imagecl.commands.train`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
from torch import Tensor, nn
from torch.optim.lr_scheduler import LRScheduler

from imagecl.augment import SimCLRViews
from imagecl.backbones import Backbone
from imagecl.clae import Adversary, PairLoss, nt_xent_pair, supcon_pair
from imagecl.dual_bn import convert_dual_bn
from imagecl.image_steps import Batch, ce_step, simclr_step, supcon_step
from imagecl.loco import LocalUpdater, loco_train_step
from imagecl.loco_model import LoCoModel
from imagecl.losses import LossName, simclr_loss
from imagecl.networks import Head, ImageModel, build_head
from shared.losses import MemoryQueue
from shared.losses.generalized import Prior
from shared.updaters import Updater

__all__ = [
    "METHODS",
    "Method",
    "Settings",
    "StepFn",
    "adversary_of",
    "make_step",
    "simclr_loss_of",
    "train_step",
]

StepFn = Callable[[nn.Module, Batch], dict[str, Tensor]]


class Settings(Protocol):
    """The fields of a training config the methods read (:class:`imagecl.config.Config`)."""

    @property
    def method(self) -> str: ...
    @property
    def tau(self) -> float: ...
    @property
    def views(self) -> int: ...
    @property
    def head(self) -> Head: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def online_probe(self) -> bool: ...
    @property
    def queue_size(self) -> int: ...
    @property
    def loss(self) -> LossName: ...
    @property
    def normalize(self) -> bool: ...
    @property
    def prior(self) -> Prior: ...
    @property
    def lam(self) -> float: ...
    @property
    def margin(self) -> float: ...
    @property
    def variant(self) -> Literal["out", "in"]: ...
    @property
    def joint_classifier(self) -> bool: ...
    @property
    def adversarial(self) -> bool: ...
    @property
    def is_adversarial(self) -> bool: ...
    @property
    def adv_alpha(self) -> float: ...
    @property
    def adv_eps(self) -> float: ...
    @property
    def adv_steps(self) -> int: ...
    @property
    def adv_bn(self) -> bool: ...
    @property
    def stages(self) -> int: ...
    @property
    def overlap(self) -> int: ...
    @property
    def decoder_depth(self) -> int: ...
    @property
    def end_to_end(self) -> bool: ...


class UpdaterFactory(Protocol):
    """Makes the updater of a method trained by ``fit_updater`` (LoCo's per-unit backward)."""

    def __call__(
        self,
        cfg: Settings,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        views: SimCLRViews,
        gather: bool,
        scheduler: LRScheduler,
    ) -> Updater: ...


@dataclass(frozen=True)
class Method:
    """One ``--method``: its defaults, its settings check, its model and its step."""

    check: Callable[[Settings], None]  # raise ValueError for settings the method cannot honour
    model: Callable[[Settings, Backbone, int], nn.Module]  # (cfg, backbone, classes) -> model
    step: Callable[[Settings, SimCLRViews, bool], StepFn]  # (cfg, views, gather) -> fit's step
    temperature: float = 1.0  # τ unless --temperature is given
    labels: bool = False  # trains on the labelled split (and refuses data without labels)
    views: int | None = None  # views per image; none: --views
    # the loss between two views that CLAE's attack climbs and adds (none: no adversarial views)
    pair_loss: Callable[[Settings], PairLoss] | None = None
    adversarial: bool = False  # always with adversarial views (else --adversarial decides)
    updater: UpdaterFactory | None = None  # trained by fit_updater with this, not by fit


def make_step(cfg: Settings, *, views: SimCLRViews, gather: bool) -> StepFn:
    """The training step of ``cfg.method``, its settings resolved once.

    Args:
        cfg: the training config.
        views: the on-device augmentation (its ``views`` views per image).
        gather: contrast against every rank's samples (DDP).
    """
    return METHODS[cfg.method].step(cfg, views, gather)


def train_step(
    model: nn.Module, batch: Batch, *, cfg: Settings, views: SimCLRViews, gather: bool
) -> dict[str, Tensor]:
    """One step's loss and metrics for ``cfg.method``: :func:`make_step` for a single batch.

    Shape:
        batch: images ``(N, C, H, W)`` uint8 and labels ``(N,)`` (-1 where unknown).
    """
    return make_step(cfg, views=views, gather=gather)(model, batch)


# --- resolving a config into a step's arguments -------------------------------------------


def simclr_loss_of(cfg: Settings) -> Callable[..., Tensor]:
    """:func:`imagecl.losses.simclr_loss` with ``cfg``'s loss settings: ``(z, queue, gather)``."""
    return functools.partial(
        simclr_loss,
        loss=cfg.loss,
        temperature=cfg.tau,
        normalize=cfg.normalize,
        prior=cfg.prior,
        lam=cfg.lam,
        margin=cfg.margin,
    )


def adversary_of(cfg: Settings) -> Adversary | None:
    """CLAE's adversarial view as ``cfg``'s method makes it (with its pair loss); none when the
    run has no adversarial views."""
    pair_loss = METHODS[cfg.method].pair_loss
    if pair_loss is None or not cfg.is_adversarial:
        return None
    return Adversary(
        pair_loss(cfg),
        eps=cfg.adv_eps,
        steps=cfg.adv_steps,
        alpha=cfg.adv_alpha,
        dual_bn=cfg.adv_bn,
    )


def _nt_xent_pair(cfg: Settings) -> PairLoss:
    return functools.partial(nt_xent_pair, temperature=cfg.tau)


def _supcon_pair(cfg: Settings) -> PairLoss:
    return functools.partial(supcon_pair, temperature=cfg.tau, variant=cfg.variant)


def _simclr(cfg: Settings, views: SimCLRViews, gather: bool) -> StepFn:
    return functools.partial(
        simclr_step,
        views=views,
        loss=simclr_loss_of(cfg),
        adversary=adversary_of(cfg),
        gather=gather,
    )


def _supcon(cfg: Settings, views: SimCLRViews, gather: bool) -> StepFn:
    return functools.partial(
        supcon_step,
        views=views,
        temperature=cfg.tau,
        variant=cfg.variant,
        adversary=adversary_of(cfg),
        gather=gather,
    )


def _ce(cfg: Settings, views: SimCLRViews, gather: bool) -> StepFn:
    return functools.partial(ce_step, views=views)


def _loco(cfg: Settings, views: SimCLRViews, gather: bool) -> StepFn:
    return functools.partial(loco_train_step, views=views, temperature=cfg.tau, gather=gather)


def _loco_updater(
    cfg: Settings,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    views: SimCLRViews,
    gather: bool,
    scheduler: LRScheduler,
) -> Updater:
    """LoCo's per-unit backward: each unit frees its activations before the next runs."""
    return LocalUpdater(
        model, optimizer, views=views, temperature=cfg.tau, gather=gather, scheduler=scheduler
    )


# --- the models ---------------------------------------------------------------------------


def _image_model(
    cfg: Settings,
    backbone: Backbone,
    num_classes: int,
    *,
    classifier: Literal["none", "end_to_end", "detached"] = "none",
) -> nn.Module:
    """Backbone + head (none for cross-entropy) + classifier, online probe and queue."""
    head = None
    if classifier != "end_to_end":
        head = build_head(cfg.head, backbone.feature_dim, cfg.head_dim)
    queue = None
    if cfg.queue_size:
        dim = backbone.feature_dim if cfg.head == "none" else cfg.head_dim
        queue = MemoryQueue(cfg.queue_size, dim)
    if cfg.is_adversarial and cfg.adv_bn:
        convert_dual_bn(backbone)  # CLAE's separate batch norm for adversarial rows
    return ImageModel(
        backbone,
        head=head,
        num_classes=num_classes,
        classifier=classifier,
        online_probe=cfg.online_probe and num_classes >= 2,
        queue=queue,
    )


def _supcon_model(cfg: Settings, backbone: Backbone, num_classes: int) -> nn.Module:
    classifier: Literal["none", "detached"] = "detached" if cfg.joint_classifier else "none"
    return _image_model(cfg, backbone, num_classes, classifier=classifier)


def _ce_model(cfg: Settings, backbone: Backbone, num_classes: int) -> nn.Module:
    return _image_model(cfg, backbone, num_classes, classifier="end_to_end")


def _loco_model(cfg: Settings, backbone: Backbone, num_classes: int) -> nn.Module:
    """Local units with their own heads (:class:`imagecl.loco.LoCoModel`)."""
    return LoCoModel(
        backbone,
        stages=cfg.stages,
        overlap=cfg.overlap,  # type: ignore[arg-type]
        head_dim=cfg.head_dim,
        decoder_depth=cfg.decoder_depth,
        end_to_end=cfg.end_to_end,
    )


# --- the settings checks ------------------------------------------------------------------


def _refuse_adversarial(cfg: Settings) -> None:
    if cfg.adversarial:
        raise ValueError("adversarial applies to methods simclr and supcon (clae is simclr)")


def _refuse_queue(cfg: Settings) -> None:
    if cfg.queue_size:
        raise ValueError("queue_size applies to method simclr only")


def _refuse_joint_classifier(cfg: Settings) -> None:
    if cfg.joint_classifier:
        raise ValueError("joint_classifier applies to method supcon only")


def _two_views(cfg: Settings) -> None:
    if cfg.views != 2:
        raise ValueError("simclr contrasts exactly 2 views (NT-Xent); use supcon for more")


def _nt_xent_only(cfg: Settings) -> None:
    if cfg.loss != "nt_xent":
        raise ValueError(f"loss {cfg.loss!r} applies to method simclr only (got {cfg.method})")


def _normalised_for(cfg: Settings, *, adversarial: bool) -> None:
    """NT-Xent without ℓ2 normalisation cannot take a queue or adversarial views."""
    if cfg.loss == "nt_xent" and not cfg.normalize:
        if cfg.queue_size:
            raise ValueError("the queue contrasts normalised keys: drop --no-normalize")
        if adversarial:
            raise ValueError("adversarial views use the normalised NT-Xent: drop --no-normalize")


def _check_simclr(cfg: Settings) -> None:
    _refuse_joint_classifier(cfg)
    _two_views(cfg)
    if cfg.loss != "nt_xent" and (cfg.queue_size or cfg.adversarial):
        raise ValueError(f"loss {cfg.loss!r} takes no queue and no adversarial views")
    _normalised_for(cfg, adversarial=cfg.adversarial)


def _check_clae(cfg: Settings) -> None:
    _refuse_joint_classifier(cfg)
    _two_views(cfg)
    _nt_xent_only(cfg)
    _normalised_for(cfg, adversarial=True)


def _check_supcon(cfg: Settings) -> None:
    _refuse_queue(cfg)
    _nt_xent_only(cfg)
    _normalised_for(cfg, adversarial=cfg.adversarial)


def _check_ce(cfg: Settings) -> None:
    _refuse_adversarial(cfg)
    _refuse_queue(cfg)
    _refuse_joint_classifier(cfg)
    _nt_xent_only(cfg)


def _check_loco(cfg: Settings) -> None:
    _refuse_adversarial(cfg)
    if cfg.queue_size or cfg.views != 2:
        raise ValueError("loco trains 2 views without a queue or adversarial views")
    _refuse_joint_classifier(cfg)
    _nt_xent_only(cfg)


# SimCLR's CIFAR-10 τ (Chen et al. 2020, App. B.9) and SupCon's (Khosla et al. 2020, Sec. 4)
METHODS: dict[str, Method] = {
    "simclr": Method(
        _check_simclr, _image_model, _simclr, temperature=0.5, pair_loss=_nt_xent_pair
    ),
    "supcon": Method(
        _check_supcon, _supcon_model, _supcon, temperature=0.1, labels=True, pair_loss=_supcon_pair
    ),
    "ce": Method(_check_ce, _ce_model, _ce, labels=True, views=1),
    "clae": Method(
        _check_clae,
        _image_model,
        _simclr,
        temperature=0.5,
        pair_loss=_nt_xent_pair,
        adversarial=True,
    ),
    "loco": Method(_check_loco, _loco_model, _loco, temperature=0.5, updater=_loco_updater),
}
