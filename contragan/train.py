"""``contragan train``: a class-conditional GAN with the 2C loss (ContraGAN) or a baseline.

``--loss contra`` is ContraGAN (Kang & Park 2020): hinge adversarial loss plus λ·2C on D's
projection of real images (D) and of fakes (G), through ``shared.losses``; ``--loss proj`` is
the projection discriminator (Miyato & Koyama 2018) and ``--loss ac`` an auxiliary classifier
(ACGAN), on the same networks. The recipe of docs/architecture.md, "ContraGAN": Adam 2e-4 with
betas (0.5, 0.999), batch 64, ``n_dis`` = 5 D steps per G step, an EMA generator (0.9999 from
step 1000), optional DiffAugment. ``shared.train.fit_updater`` runs the loop with
:class:`contragan.updater.GanUpdater` (precision, DDP, metrics.csv, checkpoints, exact resume);
every ``eval_every`` steps rank 0 saves a sample grid of the EMA generator (one row per class)
under ``samples/``. At the end: ``generator.safetensors`` (the EMA generator), ``arch.json``,
``plots/samples.png``, loss curves, ``summary.json`` and ``report.md``.

``--quick`` trains the small digits networks for about a minute on 2 CPU cores.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

import torch
from torch import Tensor, nn

from contragan.losses import AdvLoss
from contragan.models import GanArch, GanLoss, Generator, build_gan
from contragan.updater import GanUpdater
from imagecl.data import ImageData, collate_uint8, load_data, report_skipped_images, skipped_summary
from shared.checkpoint import export_encoder, load_checkpoint
from shared.config import load_config, parse_config, save_config
from shared.plots import plot_loss_curves, save_image_grid
from shared.runs import RunDir, open_run, write_report, write_summary
from shared.runtime import (
    SINGLE_PROCESS,
    DistEnv,
    cleanup_distributed,
    eval_mode,
    init_distributed,
    local_device,
    make_loader,
    seed_everything,
    select_device,
    wrap_ddp,
)
from shared.train import FitResult, LoopConfig, fit_updater

__all__ = [
    "QUICK", "Config", "build", "build_arch", "class_grid", "load_generator", "main",
    "save_class_grid",
]  # fmt: skip

GanData = Literal["digits", "digits-m", "cifar10", "cifar100", "imagefolder"]
DIGITS_DATA = ("digits", "digits-m")  # --arch auto trains the small digits networks on these


@dataclass(frozen=True)
class Config:
    """Train a class-conditional GAN: ContraGAN (2C loss) or the ProjGAN/ACGAN baselines."""

    # group: data
    data: GanData = "cifar10"
    """digits, digits-m (offline), cifar10/cifar100 (torchvision, in --data-root) or imagefolder
    (a sub-folder per class)"""
    data_root: Path | None = None
    """folder of the torchvision data set or of the images; the digits need none"""
    download: bool = False  # let torchvision fetch cifar10/cifar100 into --data-root
    image_size: int | None = None
    """image side in pixels: digits are upsampled, folders resized; none: 32"""
    # group: model
    arch: Literal["auto", "digits", "resnet32"] = "auto"
    """G and D: digits (small networks, sides b·2^u up to 128), resnet32 (CIFAR's, 32×32 only),
    or auto: digits for digits/digits-m, resnet32 otherwise"""
    width: int | None = None
    """base channels of G and D, >= 1; none: the arch's (resnet32 96, digits 32)"""
    # group: method
    loss: GanLoss = "contra"
    """contra (ContraGAN: adversarial + 2C loss), proj (projection D, ProjGAN) or ac (auxiliary
    classifier, ACGAN)"""
    adv_loss: AdvLoss = "hinge"  # the adversarial loss: hinge (ContraGAN's) or nonsaturating
    lambda_2c: float = 1.0  # contra: weight of the 2C loss, >= 0 (1 in every reference config)
    tau: float = 1.0  # contra: temperature of the 2C loss, > 0 (1 in every reference config)
    ac_weight: float = 1.0  # ac: weight of the classification loss, >= 0
    diffaug: str | None = None
    """DiffAugment policies for D's real and fake images, comma-separated from color,
    translation, cutout; none: off"""
    # group: optimisation
    batch_size: int = 64  # images per process for D's real batch and for G's fakes, >= 1
    n_dis: int = 5  # D steps per G step, >= 1 (ContraGAN CIFAR: 5)
    g_lr: float = 2e-4  # Adam learning rate of G, > 0
    d_lr: float = 2e-4  # Adam learning rate of D, > 0
    beta1: float = 0.5  # Adam β1 of G and D, in [0, 1)
    beta2: float = 0.999  # Adam β2 of G and D, in [0, 1)
    # group: method
    ema: bool = True  # keep an exponential moving average of G for sampling and evaluation
    ema_decay: float = 0.9999  # EMA decay per G step, in [0, 1) (StudioGAN: 0.9999)
    ema_start: int = 1000  # G steps before the EMA starts averaging (it copies G until then), >= 0
    # group: optimisation
    epochs: int | None = None  # passes over the data set; none: --max-steps decides
    max_steps: int | None = 100_000  # stop after this many G steps; none: --epochs decides
    # group: run
    amp: Literal["auto", "bf16", "off"] = "auto"
    """mixed precision: auto = bf16 autocast on CUDA, fp32 on CPU; bf16; off = fp32"""
    seed: int = 0  # random seed of initialisation, data order and augmentations; any integer >= 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto: CUDA when available, else CPU; or force cpu / cuda"""
    num_workers: int = 0  # DataLoader worker processes that decode images; 0 = in the main process
    log_every: int = 50  # write a metrics.csv row every N G steps, >= 1
    eval_every: int | None = 2000  # save a sample grid every N G steps; none: at the end only
    checkpoint_every: int | None = 2000
    """save checkpoints/last.pt every N G steps; none: at the end only"""
    progress: bool = True  # show a progress bar (rank 0 only)
    out: Path | None = None
    """run folder; none: runs/contragan/<loss>-<time>; a non-empty folder is refused without
    --resume"""
    resume: bool = False  # continue the run in --out from checkpoints/last.pt (same config)

    def __post_init__(self) -> None:
        for name in ("batch_size", "n_dis"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("g_lr", "d_lr", "tau"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("lambda_2c", "ac_weight", "ema_start", "num_workers"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1 and 0 <= self.ema_decay < 1):
            raise ValueError(
                f"beta1, beta2 and ema_decay must lie in [0, 1), got {self.beta1}, "
                f"{self.beta2}, {self.ema_decay}"
            )
        if self.width is not None and self.width < 1:
            raise ValueError(f"width must be >= 1 or None, got {self.width}")
        if self.epochs is None and self.max_steps is None:
            raise ValueError("give epochs or max_steps")


# About a minute on 2 CPU cores: the digits networks at 32×32, batch 64, 2 D steps per G step.
QUICK: dict[str, Any] = {
    "data": "digits",
    "arch": "digits",
    "batch_size": 64,
    "n_dis": 2,
    "max_steps": 300,
    "ema_decay": 0.99,  # an average over ~100 steps: 0.999 would still be the step-100 G
    "ema_start": 100,
    "log_every": 10,
    "eval_every": 100,
    "checkpoint_every": 100,
}


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
    return arch


class Built(NamedTuple):
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
            cfg.data, root=cfg.data_root, seed=cfg.seed, download=cfg.download,
            image_size=cfg.image_size,
        )  # fmt: skip
    if len(data.train) < cfg.batch_size * cfg.n_dis:
        raise ValueError(
            f"{data.name!r} has {len(data.train)} training images, fewer than one step's "
            f"batch_size × n_dis = {cfg.batch_size * cfg.n_dis}"
        )
    arch = build_arch(cfg, data)
    seed_everything(cfg.seed)  # the same initial weights on every rank
    g, d = build_gan(arch)
    # channels-last: about 25 % faster on CPU for these narrow convolutions, and on GPU in bf16
    g_net: nn.Module = g.to(device).to(memory_format=torch.channels_last)
    d_net: nn.Module = d.to(device).to(memory_format=torch.channels_last)
    if env.is_distributed:
        g_net, d_net = wrap_ddp(g_net, env), wrap_ddp(d_net, env)
    updater = GanUpdater(
        g_net, d_net, num_classes=arch.num_classes, z_dim=arch.z_dim, loss=cfg.loss,
        adv_loss=cfg.adv_loss, lambda_2c=cfg.lambda_2c, tau=cfg.tau, ac_weight=cfg.ac_weight,
        n_dis=cfg.n_dis, g_lr=cfg.g_lr, d_lr=cfg.d_lr, betas=(cfg.beta1, cfg.beta2),
        g_batch_size=cfg.batch_size, ema=cfg.ema, ema_decay=cfg.ema_decay,
        ema_start=cfg.ema_start, diffaug=cfg.diffaug, gather=env.is_distributed,
    )  # fmt: skip
    seed_everything(cfg.seed, rank=env.rank)  # each rank its own z and augmentations from here
    loader = make_loader(
        data.train, cfg.batch_size, shuffle=True, seed=cfg.seed, dist=env,
        num_workers=cfg.num_workers, collate_fn=collate_uint8, pin_memory=device.type == "cuda",
    )  # fmt: skip
    return Built(data, arch, updater, loader)


@torch.no_grad()
def class_grid(
    generator: nn.Module,
    classes: list[int],
    per_class: int,
    *,
    z_dim: int,
    device: torch.device,
    seed: int,
) -> Tensor:
    """``per_class`` samples of every class in ``classes``, one row per class, in [0, 1].

    ``z`` comes from its own seeded generator (the global RNG is untouched), so grids of the
    same seed are comparable across training steps. Shape: ``(len(classes)·per_class, C, H, W)``.
    """
    rng = torch.Generator().manual_seed(seed)
    z = torch.randn(len(classes) * per_class, z_dim, generator=rng).to(device)
    y = torch.tensor(classes, device=device).repeat_interleave(per_class)
    with eval_mode(generator):
        images: Tensor = generator(z, y).float()
    return images.add(1).div(2).clamp(0, 1).cpu()


def save_class_grid(
    generator: nn.Module,
    arch: GanArch,
    path: Path,
    *,
    device: torch.device,
    seed: int,
    classes: list[int] | None = None,
    per_class: int = 8,
) -> Tensor:
    """:func:`class_grid` of ``classes`` (default all) saved as a PNG; returns the images."""
    classes = list(range(arch.num_classes)) if classes is None else classes
    images = class_grid(generator, classes, per_class, z_dim=arch.z_dim, device=device, seed=seed)
    save_image_grid(images, path, nrow=per_class)
    return images


def _grid_saver(
    run: RunDir, cfg: Config, built: Built, device: torch.device
) -> Callable[[nn.Module], dict[str, float]]:
    """The loop's ``evaluate``: a sample grid of the EMA generator, ``samples/grid_step<N>.png``
    (named by the step, so a resumed run writes the same files as an uninterrupted one)."""

    def evaluate(generator: nn.Module) -> dict[str, float]:
        path = run.path / "samples" / f"grid_step{built.updater.steps_done:06d}.png"
        save_class_grid(generator, built.arch, path, device=device, seed=cfg.seed)
        return {}

    return evaluate


def finish(
    run: RunDir, cfg: Config, built: Built, result: FitResult, device: torch.device
) -> dict[str, Any]:
    """Export the EMA generator, save the final grid and curves, write summary and report."""
    arch = built.arch
    generator = built.updater.generator()
    export_encoder(
        generator, run.path / "generator.safetensors",
        metadata={"arch": json.dumps(asdict(arch)), "loss": cfg.loss, "data": cfg.data},
    )  # fmt: skip
    save_class_grid(generator, arch, run.plots / "samples.png", device=device, seed=cfg.seed)
    plot_loss_curves(run.metrics_path, run.plots / "losses.png", keys=_curve_keys(cfg))
    summary: dict[str, Any] = {
        "loss": cfg.loss, "data": cfg.data, "arch": arch.name, "steps": result.step,
        "skipped": len(built.data.skipped),
        **{k: v for k, v in result.metrics.items() if k != "epoch"},
    }  # fmt: skip
    write_summary(run.summary_path, summary)
    sections = {
        "Run": (
            f"{cfg.loss} GAN ({arch.name} networks, {arch.image_size}×{arch.image_size}×"
            f"{arch.channels}, {arch.num_classes} classes) on {cfg.data}: {result.step} G steps "
            f"of batch {cfg.batch_size}, {cfg.n_dis} D steps each; samples from the "
            f"{'EMA ' if cfg.ema else ''}generator, one row per class (`plots/samples.png`). "
            "`contragan evaluate --checkpoint checkpoints/last.pt` measures it."
        )
    }
    skipped = skipped_summary(built.data, run.skipped_path.name)
    if skipped is not None:
        sections["Skipped files"] = skipped
    write_report(run, f"contragan train: {cfg.loss} on {cfg.data}", sections, summary=summary)
    return summary


def _curve_keys(cfg: Config) -> list[str]:
    extra = {"contra": ["d_2c", "g_2c"], "ac": ["d_ac", "g_ac"], "proj": []}[cfg.loss]
    return ["d_loss", "g_loss", "d_real", "d_fake", *extra]


def save_arch(arch: GanArch, run: RunDir) -> Path:
    path = run.path / "arch.json"
    path.write_text(json.dumps(asdict(arch), indent=2), encoding="utf-8")
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


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``contragan train [options]``: train, then write the run folder; returns the summary."""
    cfg = parse_config(Config, argv, prog="contragan train", presets={"quick": QUICK})
    device = select_device(cfg.device)
    env = init_distributed(device)
    device = local_device(device, env)
    try:
        run = open_run(
            cfg.out, Path("runs") / "contragan" / cfg.loss, resume=cfg.resume, rank=env.rank
        )
        built = build(cfg, device=device, env=env)
        if env.rank == 0:
            save_config(cfg, run.path)
            save_arch(built.arch, run)
            report_skipped_images(built.data, run)  # skipped.csv and one line
        loop_cfg = LoopConfig(
            epochs=cfg.epochs, max_steps=cfg.max_steps, log_every=cfg.log_every,
            eval_every=cfg.eval_every, checkpoint_every=cfg.checkpoint_every, amp=cfg.amp,
            progress=cfg.progress,
        )  # fmt: skip
        result = fit_updater(
            built.updater, built.loader, loop_cfg=loop_cfg, run_dir=run, device=device,
            evaluate=_grid_saver(run, cfg, built, device), resume=cfg.resume,
            dist_env=env, config=cfg,
        )  # fmt: skip
        summary: dict[str, Any] = {}
        if env.rank == 0:
            summary = finish(run, cfg, built, result, device)
        return summary
    finally:
        cleanup_distributed()


def load_generator(
    checkpoint: Path, *, device: torch.device, ema: bool = True
) -> tuple[Config, GanArch, Generator]:
    """The config, architecture and (EMA) generator of a training run's checkpoint."""
    checkpoint = Path(checkpoint)
    if not checkpoint.is_file():
        raise FileNotFoundError(f"checkpoint {checkpoint} does not exist")
    run_path = checkpoint.resolve().parent.parent
    arch = load_arch(run_path)
    cfg = load_config(Config, run_path / "config.json")
    state = load_checkpoint(checkpoint, map_location="cpu")
    key = "generator_ema" if ema and state.get("generator_ema") is not None else "generator"
    if key not in state:
        raise ValueError(f"{checkpoint} holds no generator: not a contragan train checkpoint")
    generator = Generator(arch)
    try:
        generator.load_state_dict(state[key])
    except RuntimeError as error:
        raise ValueError(
            f"{checkpoint}: its {key} does not fit {run_path / 'arch.json'}: {error}"
        ) from error
    return cfg, arch, generator.to(device).eval()
