"""Building ContraGAN's networks and training setup, and loading a generator from a run folder.

:func:`build_gan` makes G and D for a :class:`~contragan.arch.GanArch` (orthogonally
initialised); :func:`build_arch` chooses that architecture from ``contragan train``'s settings
and the data; :func:`build` puts together the data, the networks (channels-last, DDP-wrapped
when distributed), the :class:`~contragan.steps.GanUpdater` and the loader. A run folder holds
``arch.json`` (:func:`save_arch`, :func:`load_arch`) beside ``config.json`` and
``checkpoints/``; :func:`load_generator` turns a checkpoint back into its (EMA) generator.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from contragan.arch import GanArch
from contragan.config import Config
from contragan.data import DIGITS_DATA, ImageData, collate_uint8, load_data
from contragan.layers import orthogonal_init_
from contragan.networks import Discriminator, Generator
from contragan.steps import GanUpdater
from shared.checkpoint import atomic_write, load_checkpoint, load_state
from shared.config import load_config
from shared.runs import RunDir
from shared.runtime import SINGLE_PROCESS, DistEnv, make_loader, seed_everything, wrap_ddp

__all__ = [
    "Built",
    "build",
    "build_arch",
    "build_gan",
    "load_arch",
    "load_generator",
    "save_arch",
]


def build_gan(arch: GanArch) -> tuple[Generator, Discriminator]:
    """G and D for ``arch``, orthogonally initialised with zero biases (BigGAN, StudioGAN's
    ``init: ortho``)."""
    generator, discriminator = Generator(arch), Discriminator(arch)
    orthogonal_init_(generator)
    orthogonal_init_(discriminator)
    return generator, discriminator


def build_arch(cfg: Config, data: ImageData) -> GanArch:
    """G and D's architecture: image size, channels and classes from ``data``.

    ``--arch auto`` chooses by data set: the small ``digits`` networks for digits and
    digits-m, ``resnet32`` (StudioGAN's CIFAR-10 recipe) for every other set, which must then
    be 32×32 (a ``ValueError`` otherwise; ``--arch digits`` takes other sizes).
    """
    image, _ = data.train[0]
    channels, size = int(image.shape[0]), int(image.shape[-1])
    if data.num_classes < 2:
        raise ValueError(
            f"{data.name!r} has {data.num_classes} class; a conditional GAN needs >= 2"
        )
    name = cfg.arch
    if name == "auto":
        name = "digits" if cfg.data in DIGITS_DATA else "resnet32"
        if name == "resnet32" and size != 32:
            raise ValueError(
                f"--arch auto picks resnet32 (the CIFAR-10 networks) for {cfg.data}, and it "
                f"takes 32×32 images only, got {size}×{size}: pass --image-size 32, or --arch "
                "digits (the small networks: 16, 24, 28, 48, 64 and other b·2^u up to 128)"
            )
    make = GanArch.digits if name == "digits" else GanArch.resnet32
    widths = {} if cfg.width is None else {"g_channels": cfg.width, "d_channels": cfg.width}
    arch = make(
        image_size=size, channels=channels, num_classes=data.num_classes, loss=cfg.loss, **widths
    )
    return replace(arch, adc=cfg.adc, proj_adv=cfg.proj_adv)


class Built(NamedTuple):
    """What :func:`build` returns: everything a training run needs."""

    data: ImageData
    arch: GanArch
    updater: GanUpdater
    loader: Any


def build(
    cfg: Config,
    *,
    device: torch.device,
    env: DistEnv = SINGLE_PROCESS,
    data: ImageData | None = None,
) -> Built:
    """Data, G and D (on ``device``, DDP-wrapped when distributed), the updater, the loader."""
    if data is None:
        data = load_data(
            cfg.data,
            root=cfg.data_root,
            seed=cfg.seed,
            download=cfg.download,
            image_size=cfg.image_size,
        )
    if len(data.train) < cfg.batch_size * cfg.n_dis:
        raise ValueError(
            f"{data.name!r} has {len(data.train)} training images, fewer than one step's "
            f"batch_size × n_dis = {cfg.batch_size * cfg.n_dis}"
        )
    arch = build_arch(cfg, data)
    seed_everything(cfg.seed)  # the same initial weights on every rank
    g, d = build_gan(arch)
    # channels-last: the faster memory layout for these narrow convolutions, on CPU and in bf16
    g_net: nn.Module = g.to(device).to(memory_format=torch.channels_last)
    d_net: nn.Module = d.to(device).to(memory_format=torch.channels_last)
    if env.is_distributed:
        g_net, d_net = wrap_ddp(g_net, env), wrap_ddp(d_net, env)
    updater = GanUpdater(
        g_net,
        d_net,
        num_classes=arch.num_classes,
        z_dim=arch.z_dim,
        loss=cfg.loss,
        settings=replace(cfg.loss_settings, gather=env.is_distributed),
        n_dis=cfg.n_dis,
        g_lr=cfg.g_lr,
        d_lr=cfg.d_lr,
        betas=(cfg.beta1, cfg.beta2),
        g_batch_size=cfg.batch_size,
        ema=cfg.ema,
        ema_decay=cfg.ema_decay,
        ema_start=cfg.ema_start,
        diffaug=cfg.diffaug,
        class_decay=cfg.lambda_2c_decay,
    )
    seed_everything(cfg.seed, rank=env.rank)  # each rank its own z and augmentations from here
    loader = make_loader(
        data.train,
        cfg.batch_size,
        shuffle=True,
        seed=cfg.seed,
        dist=env,
        num_workers=cfg.num_workers,
        collate_fn=collate_uint8,
        pin_memory=device.type == "cuda",
    )
    return Built(data, arch, updater, loader)


def save_arch(arch: GanArch, run: RunDir) -> Path:
    """Write ``arch`` as the run's ``arch.json`` (what :func:`load_arch` reads back)."""
    path = run.path / "arch.json"
    with atomic_write(path) as handle:
        handle.write(json.dumps(asdict(arch), indent=2).encode("utf-8"))
    return path


def load_arch(run_path: Path) -> GanArch:
    """The architecture a run trained, from its ``arch.json``."""
    path = run_path / "arch.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist: the checkpoint must lie in a run folder written by "
            "contragan train (run/checkpoints/last.pt beside run/arch.json)"
        )
    try:
        return GanArch(**json.loads(path.read_text(encoding="utf-8")))
    except (json.JSONDecodeError, TypeError) as error:
        raise ValueError(
            f"{path} is not an architecture written by contragan train: {error}"
        ) from error


def load_generator(
    checkpoint: Path, *, device: torch.device, ema: bool = True
) -> tuple[Config, GanArch, Generator]:
    """The config, architecture and (EMA) generator of a training run's checkpoint."""
    checkpoint = Path(checkpoint)
    if not checkpoint.is_file():
        raise FileNotFoundError(f"checkpoint {checkpoint} does not exist")
    run_path = checkpoint.resolve().parent.parent
    arch = load_arch(run_path)
    cfg = load_config(Config, run_path / "config.json", command="contragan train")
    state = load_checkpoint(checkpoint, map_location="cpu")
    key = "generator_ema" if ema and state.get("generator_ema") is not None else "generator"
    if key not in state:
        raise ValueError(f"{checkpoint} holds no generator: not a contragan train checkpoint")
    generator = Generator(arch)
    where = f"{checkpoint}: its {key}"
    load_state(generator, state[key], source=f"{where} (for {run_path / 'arch.json'})")
    return cfg, arch, generator.to(device).eval()
