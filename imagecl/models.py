"""Building ``imagecl train``'s model and everything a run needs, and loading a trained one.

:func:`build_model` makes the backbone and the method's model around it (its entry in
:data:`imagecl.steps.METHODS`), :func:`build` adds the data, loader, on-device views,
optimizer (LARS, SGD or AdamW with linear learning-rate scaling, lr × batch / 256, the online
probe in its own group without weight decay) and SimCLR's warm-up + cosine schedule;
:func:`load_trained` rebuilds the model of a run folder from its config and checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from imagecl.augment import SimCLRViews
from imagecl.backbones import build_backbone, to_channels_last
from imagecl.config import Config
from imagecl.data import ImageData, collate_uint8, load_data
from imagecl.loco_model import LoCoModel
from imagecl.steps import METHODS
from shared.checkpoint import load_checkpoint, load_state
from shared.config import load_config
from shared.optim import LARS, lars_param_groups, warmup_cosine_schedule
from shared.runtime import SINGLE_PROCESS, DistEnv, make_loader, seed_everything, wrap_ddp

__all__ = ["Built", "build", "build_model", "load_trained", "without_compile_prefix"]


class Built(NamedTuple):
    """Everything :func:`build` makes for one run."""

    model: nn.Module  # DDP-wrapped when distributed
    views: SimCLRViews
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    loader: torch.utils.data.DataLoader[Any]
    data: ImageData


def build_model(cfg: Config, data: ImageData) -> nn.Module:
    """The model of ``cfg`` for ``data``'s channels and classes (identical on every rank when
    seeded the same way before the call): the backbone, and around it the method's model
    (:data:`imagecl.steps.METHODS`)."""
    backbone = build_backbone(
        cfg.backbone, in_channels=data.channels, cifar_stem=cfg.cifar_stem, width=cfg.width
    )
    method = METHODS[cfg.method]
    if method.labels and data.num_classes < 2:
        raise ValueError(f"method {cfg.method} needs labels; data set {data.name!r} has none")
    return method.model(cfg, backbone, data.num_classes)


def _optimizer(cfg: Config, model: nn.Module, world_size: int) -> torch.optim.Optimizer:
    """LARS/SGD/Adam over the trained parts; the online probe in its own group."""
    probe_head = getattr(model, "probe", None)
    probe = set() if probe_head is None else {id(p) for p in probe_head.parameters()}
    main = nn.ModuleDict({k: v for k, v in model.named_children() if k != "probe"})
    lr = cfg.lr * cfg.batch_size * world_size / 256 if cfg.optimizer != "adam" else cfg.lr
    groups = lars_param_groups(main, cfg.weight_decay)
    for group in groups:
        group["params"] = [p for p in group["params"] if id(p) not in probe]
    if probe_head is not None:
        groups.append(
            {"params": list(probe_head.parameters()), "weight_decay": 0.0, "lars_adapt": False}
        )
        groups[-1]["lr"] = cfg.probe_lr if cfg.optimizer != "adam" else cfg.probe_lr / 10
    if cfg.optimizer == "lars":
        return LARS(groups, lr=lr, momentum=cfg.momentum)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=cfg.momentum)
    return torch.optim.AdamW(groups, lr=lr)


def build(
    cfg: Config,
    *,
    device: torch.device,
    env: DistEnv = SINGLE_PROCESS,
    data: ImageData | None = None,
) -> Built:
    """Data, model (on ``device``, DDP-wrapped when distributed), views, optimizer, schedule."""
    if data is None:
        data = load_data(
            cfg.data,
            root=cfg.data_root,
            seed=cfg.seed,
            download=cfg.download,
            image_size=cfg.image_size,
        )
    seed_everything(cfg.seed)  # the same initial weights on every rank
    model = build_model(cfg, data).to(device)
    model = to_channels_last(model, device)
    if cfg.compile:  # in place: the state_dict keys (checkpoints, export) stay the plain ones
        model.get_submodule("backbone").compile()
        if isinstance(model, LoCoModel):  # its training calls the units, not the backbone
            model.compile_units()
    seed_everything(cfg.seed, rank=env.rank)  # each rank its own augmentations from here on
    dataset = data.train if METHODS[cfg.method].labels else data.pretrain
    if len(dataset) < cfg.batch_size:
        raise ValueError(
            f"batch_size {cfg.batch_size} is larger than the {len(dataset)} training images of "
            f"{data.name!r} (the last incomplete batch is dropped)"
        )
    loader = make_loader(
        dataset,
        cfg.batch_size,
        shuffle=True,
        seed=cfg.seed,
        dist=env,
        num_workers=cfg.num_workers,
        collate_fn=collate_uint8,
        pin_memory=device.type == "cuda",
    )
    optimizer = _optimizer(cfg, model, env.world_size)
    steps_per_epoch = len(loader)
    total = cfg.epochs * steps_per_epoch
    if cfg.max_steps is not None:
        total = min(total, cfg.max_steps)
    warmup = min(round(cfg.warmup_epochs * steps_per_epoch), total - 1)
    scheduler = warmup_cosine_schedule(optimizer, warmup_steps=warmup, total_steps=total)
    views = SimCLRViews(
        data.image_size, data.mean, data.std, cfg.augment_preset(data.channels), views=cfg.num_views
    ).to(device)  # once: its constants live there, each step copies nothing from the host
    return Built(wrap_ddp(model, env), views, optimizer, scheduler, loader, data)


def load_trained(
    checkpoint: Path, *, data_root: Path | None = None, device: torch.device
) -> tuple[Config, ImageData, Any]:
    """The config, data and model of a training run, from its ``checkpoints/*.pt``.

    The run's ``config.json`` (two folders up) rebuilds the model; ``data_root`` overrides the
    recorded data location (e.g. the run was trained on another machine).
    """
    checkpoint = Path(checkpoint)
    config_path = checkpoint.resolve().parent.parent / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(
            f"{config_path} does not exist: --checkpoint must lie in a run folder written by "
            "imagecl train (run/checkpoints/last.pt beside run/config.json)"
        )
    cfg = load_config(Config, config_path, command="imagecl train")
    state = load_checkpoint(checkpoint)
    if not isinstance(state.get("model"), dict):
        raise ValueError(
            f"checkpoint {checkpoint} holds no model state: not a checkpoint of imagecl train "
            f"(its keys: {', '.join(sorted(map(str, state))) or 'none'})"
        )
    data = load_data(
        cfg.data, root=data_root or cfg.data_root, seed=cfg.seed, image_size=cfg.image_size
    )
    model = build_model(cfg, data)
    load_state(model, without_compile_prefix(state["model"]), source=f"checkpoint {checkpoint}")
    return cfg, data, model.to(device).eval()


def without_compile_prefix(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with the ``_orig_mod.`` segment that a ``torch.compile`` wrapper puts into every
    key of the wrapped module removed (checkpoints of runs whose backbone was compiled that way
    say ``backbone._orig_mod.features.0.weight`` for ``backbone.features.0.weight``)."""
    return {".".join(p for p in k.split(".") if p != "_orig_mod"): v for k, v in state.items()}
