"""Training and measuring one cell of a study: the SimCLR/SupCon/CE pipeline at a small budget.

:func:`train_pipeline` builds ``imagecl train``'s model, data loader, optimizer and schedule
(:func:`imagecl.models.build`) from the QUICK preset at the cell's :class:`~imagecl.studies.
runner.Budget` and trains it with ``shared.train.fit`` (:func:`fit_cell`: the training loop of
every pipeline, with its finiteness checks, in the cell's folder); :func:`features` and
:func:`probe` are the linear evaluation every study reports.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from imagecl.augment import SimCLRViews
from imagecl.config import QUICK, Config
from imagecl.data import ImageData, images_and_labels, load_data
from imagecl.evaluate import encode
from imagecl.models import build
from imagecl.networks import ImageModel
from imagecl.steps import make_step
from imagecl.studies.runner import CellContext, Params
from shared.probes import linear_probe
from shared.runtime import unwrap
from shared.train import LoopConfig, fit

__all__ = ["digits_m", "features", "fit_cell", "probe", "random_init_probe", "train_pipeline"]


@functools.lru_cache(maxsize=2)
def digits_m(seed: int) -> ImageData:
    """The studies' data set (digits-m, 3 channels, 1347 train / 450 test), loaded once."""
    return load_data("digits-m", seed=seed)


def train_pipeline(
    ctx: CellContext,
    data: ImageData,
    *,
    views: SimCLRViews | None = None,
    untrained: bool = False,
    **overrides: Any,
) -> ImageModel:
    """Train ``imagecl train``'s model for one cell and return it (unwrapped).

    The defaults are the QUICK preset of :mod:`imagecl.config` (small CNN, Adam lr 2e-3, τ 0.2)
    at the cell's budget, with warm-up over the first 10 % of the steps and no online probe;
    ``overrides`` are :class:`imagecl.config.Config` fields. ``views`` replaces the augmentation;
    ``untrained`` returns the freshly initialised model (the random-init baseline).
    """
    budget = ctx.budget
    batch_size = int(overrides.pop("batch_size", budget.batch_size))
    method = overrides.get("method", "simclr")
    source = data.pretrain if method == "simclr" else data.train
    steps_per_epoch = max(1, len(source) // batch_size)
    settings: dict[str, Any] = {
        **QUICK,
        "width": budget.width,
        "batch_size": batch_size,
        "epochs": 10_000,
        "max_steps": budget.steps,
        "warmup_epochs": 0.1 * budget.steps / steps_per_epoch,
        "online_probe": False,
        "eval_every": None,
        "log_every": max(1, budget.steps // 10),
        "seed": ctx.seed,
        **overrides,
    }
    cfg = Config(**settings)
    built = build(cfg, device=ctx.device, data=data)
    if untrained:
        model = unwrap(built.model)
        assert isinstance(model, ImageModel)
        return model
    step = make_step(cfg, views=views or built.views, gather=False)
    fit_cell(built.model, built.optimizer, built.loader, step, ctx, built.scheduler, cfg)
    model = unwrap(built.model)
    assert isinstance(model, ImageModel)
    return model


def fit_cell(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loader: Any,
    step: Callable[[nn.Module, Any], dict[str, Tensor]],
    ctx: CellContext,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    config: Any,
) -> None:
    """``shared.train.fit`` for ``ctx.budget.steps`` steps in the cell's folder, quietly."""
    loop_cfg = LoopConfig(
        max_steps=ctx.budget.steps, log_every=max(1, ctx.budget.steps // 10), progress=False
    )
    fit(
        model,
        optimizer,
        loader,
        step,
        loop_cfg=loop_cfg,
        run_dir=ctx.run,
        device=ctx.device,
        scheduler=scheduler,
        config=config,
    )


def features(
    encoder: nn.Module, data: ImageData, ctx: CellContext
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Frozen features and labels of the train and test splits (un-augmented images).

    Shape:
        returns train h ``(N, D)``, train labels ``(N,)``, test h ``(M, D)``, test labels ``(M,)``
    """
    train_x, train_y = images_and_labels(data.train)
    test_x, test_y = images_and_labels(data.test)
    train_h = encode(encoder, train_x, data.mean, data.std, device=ctx.device)
    test_h = encode(encoder, test_x, data.mean, data.std, device=ctx.device)
    return train_h, train_y, test_h, test_y


def probe(
    train_h: Tensor, train_y: Tensor, test_h: Tensor, test_y: Tensor, ctx: CellContext
) -> float:
    """Linear-probe test accuracy (weight decay from the budget; chosen on held-out train when
    there are several)."""
    decays = ctx.budget.probe_weight_decays
    held_out = 0.1 if len(decays) > 1 else 0.0
    result = linear_probe(
        train_h,
        train_y,
        test_h,
        test_y,
        weight_decay=list(decays),
        val_fraction=held_out,
        seed=ctx.seed,
    )
    return result.accuracy


def random_init_probe(params: Params, ctx: CellContext) -> dict[str, float]:
    """The baseline of the digits-m studies: the probe on h of the untrained small CNN."""
    data = digits_m(ctx.seed)
    model = train_pipeline(ctx, data, untrained=True)
    return {"probe_acc": probe(*features(model.backbone, data, ctx), ctx)}
