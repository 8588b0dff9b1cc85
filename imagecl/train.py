"""``imagecl train``: SimCLR, SupCon and cross-entropy image training on one code path.

The same data, on-device augmentation, backbone and loop serve the three methods; they differ
only in the loss of :func:`train_step`:

* ``simclr`` (Chen et al. 2020): two views, NT-Xent on z = g(h) (τ = 0.5, the CIFAR setting),
  every rank's samples as negatives under DDP; ``--queue-size K`` adds the last K keys as
  extra negatives (MoCo's queue, for small batches); ``--loss nt_logistic|triplet|generalized``
  swaps NT-Xent for SimCLR's alternatives or the generalized loss (:mod:`imagecl.losses`).
* ``supcon`` (Khosla et al. 2020): ``views`` views, ``L_out`` (or ``L_in``) with the labels
  (τ = 0.1); the two-stage protocol is this pre-training followed by ``imagecl eval``'s linear
  classifier on frozen h, the joint variant (``--joint-classifier``) trains a classifier on
  stop-gradient h alongside.
* ``ce``: the same backbone and augmentation (one view) with a linear classifier, end to end.
* ``loco`` (Xiong et al. 2020): the backbone split into ``stages`` local units, each with its
  own head and NT-Xent (:mod:`imagecl.loco`); ``--overlap 0`` is Greedy InfoMax,
  ``--end-to-end`` the same model trained end to end (the baseline). Trained unit by unit
  (:class:`imagecl.loco.LocalUpdater`: each unit's backward frees its activations before the
  next unit runs), DDP included.
* ``clae`` (Ho & Vasconcelos 2020) = ``simclr`` + ``--adversarial``: an adversarial view from
  the first one (:mod:`imagecl.clae`) adds α·L(f(x1), f(x_adv)); ``--adversarial`` does the same
  for SupCon.

An online linear probe on detached h (its own parameter group, no weight decay) reports
``probe_acc`` as training goes. LARS (or SGD/Adam) with linear learning-rate scaling
(lr × batch / 256) and SimCLR's warm-up + cosine schedule; ``shared.train.fit`` does the rest
(precision, DDP, checkpoints, exact resume, metrics.csv).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from imagecl.augment import PRESETS, SimCLRViews
from imagecl.backbones import build_backbone, to_channels_last
from imagecl.clae import adversarial_view, pair_loss
from imagecl.data import DATASETS, ImageData, collate_uint8, load_data, report_skipped_images
from imagecl.dual_bn import adversarial_rows, convert_dual_bn
from imagecl.evaluate import make_monitor
from imagecl.loco import LocalUpdater, LoCoModel, loco_train_step
from imagecl.losses import LossName, check_loss_settings, simclr_loss
from imagecl.models import HEADS, ImageModel, ModelOutput, build_head
from imagecl.report import finish_run, open_run
from shared.checkpoint import load_checkpoint
from shared.config import load_config, parse_config, save_config
from shared.losses import MemoryQueue, supcon_loss
from shared.losses.generalized import Prior
from shared.optim import LARS, lars_param_groups, warmup_cosine_schedule
from shared.runtime import (
    SINGLE_PROCESS,
    DistEnv,
    cleanup_distributed,
    init_distributed,
    local_device,
    make_loader,
    seed_everything,
    select_device,
    unwrap,
    wrap_ddp,
)
from shared.train import LoopConfig, fit, fit_updater

__all__ = ["QUICK", "Built", "Config", "build", "main", "train_step"]

Method = Literal["simclr", "supcon", "ce", "clae", "loco"]
DataName = Literal["digits", "digits-m", "cifar10", "cifar100", "stl10", "imagefolder", "unlabeled"]
Backbone = Literal["resnet18", "resnet50", "small_cnn"]
Head = Literal["mlp", "mlp3", "linear", "none"]

# SimCLR's CIFAR-10 τ (Chen et al. 2020, App. B.9) and SupCon's (Khosla et al. 2020, Sec. 4)
DEFAULT_TEMPERATURE = {"simclr": 0.5, "supcon": 0.1}


@dataclass(frozen=True)
class Config:
    """Train an image encoder with SimCLR, SupCon or cross-entropy."""

    # group: method
    method: Method = "simclr"
    """simclr (2 views, NT-Xent), supcon (labels), ce (cross-entropy), clae (simclr + an
    adversarial view) or loco (a local loss per backbone stage)"""
    # group: data
    data: DataName = "digits-m"
    """digits and digits-m (offline), cifar10/cifar100/stl10 (torchvision, in --data-root),
    imagefolder (a sub-folder per class) or unlabeled (any image folder)"""
    data_root: Path | None = None
    """folder of the torchvision data set or of the images; the digits need none"""
    download: bool = False  # let torchvision fetch cifar10/cifar100/stl10 into --data-root
    image_size: int | None = None
    """image side in pixels, >= 1; none: the source's (digits, CIFAR and folders 32, STL-10 96)"""
    # group: model
    backbone: Backbone = "resnet18"
    """encoder f: resnet18 / resnet50 (torchvision) or small_cnn (4 conv layers, fast on CPU)"""
    cifar_stem: bool = True
    """ResNet stem for small images: 3×3 stride-1 conv, no max-pool (SimCLR/SupCon on 32 px)"""
    width: int = 32  # small_cnn only: channels of its first layer, >= 1
    head: Head = "mlp"
    """projection head g: mlp (SimCLR v1, 2 layers), mlp3 (v2, 3 layers), linear, or none
    (contrast h itself)"""
    head_dim: int = 128  # width of z = g(h), the projection that is contrasted; >= 1
    # group: data
    augment: str = "auto"
    """augmentation preset: simclr_imagenet, simclr_cifar (colour s = 0.5), small_gray (crop +
    flip); auto: small_gray for 1 channel, else simclr_cifar"""
    # group: method
    views: int = 2  # augmented views per image, >= 2 (supcon only; simclr and loco use 2, ce 1)
    # group: optimisation
    batch_size: int = 512
    """images per step in each process (the global batch is this × processes); >= 1"""
    epochs: int = 100  # passes over the pre-training set, >= 1 (--max-steps stops earlier)
    max_steps: int | None = None  # stop after this many optimizer steps; none: --epochs decides
    optimizer: Literal["lars", "sgd", "adam"] = "lars"
    """lars (SimCLR's; biases and norms without decay or adaptation), sgd (with --momentum) or
    adam (AdamW)"""
    lr: float = 0.3
    """learning rate per 256 images, > 0: scaled by global batch / 256 for lars and sgd, used as
    is for adam (SimCLR: 0.3)"""
    weight_decay: float = 1e-6
    """weight decay, >= 0 (L2 for lars/sgd, decoupled for adam; SimCLR with LARS: 1e-6)"""
    momentum: float = 0.9  # momentum of lars and sgd, in [0, 1)
    warmup_epochs: float = 10.0
    """epochs of linear warm-up before the cosine decay, >= 0 (SimCLR: 10)"""
    # group: method
    temperature: float | None = None
    """τ of the contrastive loss, > 0; none: 0.5 for simclr (CIFAR), 0.1 for supcon"""
    variant: Literal["out", "in"] = "out"
    """supcon: L_out (log outside the sum over positives, the better one) or L_in"""
    joint_classifier: bool = False  # supcon: also train a linear classifier on stop-gradient h
    adversarial: bool = False
    """CLAE: add an adversarial view to simclr or supcon (method clae is simclr with this on)"""
    adv_alpha: float = 1.0
    """CLAE: weight α of the adversarial term, loss = L(x1, x2) + α·L(x1, x_adv); >= 0"""
    adv_eps: float = 0.015
    """CLAE: L∞ attack budget in [0, 1] pixel units (CLAE's 0.03 is in normalised units)"""
    adv_steps: int = 1  # CLAE: attack steps, >= 1; 1 is FGSM (CLAE's), more is PGD
    adv_bn: bool = True  # CLAE: a separate batch-norm branch for adversarial images (momentum 0.01)
    stages: int = 4  # loco: local units the backbone is split into, >= 1
    overlap: int = 1
    """loco: 1 = unit k spans stages k and k+1 (LoCo); 0 = no overlap (Greedy InfoMax)"""
    decoder_depth: int = 0  # loco: extra non-shared conv layers before each unit's head, >= 0
    end_to_end: bool = False  # loco: train the same model end to end with one head (the baseline)
    queue_size: int = 0  # simclr: the last K keys as extra negatives (MoCo's queue); 0 = none
    loss: LossName = "nt_xent"
    """simclr: nt_xent, nt_logistic, triplet (SimCLR Table 4) or generalized (alignment +
    λ·distribution)"""
    normalize: bool = True  # ℓ2-normalise z in nt_xent, nt_logistic and triplet (SimCLR Table 5)
    prior: Prior = "uniform_hypersphere"
    """generalized: the distribution term's target, e.g. uniform_hypersphere (Chen et al. 2021)"""
    lam: float = 1.0  # generalized: weight λ of the distribution term, L_align + λ·L_dist; >= 0
    margin: float = 0.5
    """triplet: margin on squared distances of normalised z (0.5 = 0.25 on cosines); > 0"""
    # group: run
    online_probe: bool = True  # train a linear probe on detached h alongside and log probe_acc
    probe_lr: float = 0.1
    """learning rate of the online probe, > 0 (a tenth of it with adam; no weight decay)"""
    compile: bool = False  # torch.compile the backbone in place (checkpoints keep plain keys)
    amp: Literal["auto", "bf16", "off"] = "auto"
    """mixed precision: auto = bf16 autocast on CUDA, fp32 on CPU; bf16; off = fp32"""
    seed: int = 0  # random seed of initialisation, data order and augmentations; any integer >= 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto: CUDA when available, else CPU; or force cpu / cuda"""
    num_workers: int = 0  # DataLoader worker processes that decode images; 0 = in the main process
    log_every: int = 10  # write a metrics.csv row every N steps, >= 1
    eval_every: int | None = None
    """run the kNN monitor on the test split every N steps; none: at the end only"""
    checkpoint_every: int | None = None
    """save checkpoints/last.pt every N steps; none: at the end only"""
    out: Path | None = None
    """run folder; none: runs/imagecl/<method>-<time>; an existing non-empty folder is refused
    without --resume"""
    resume: bool = False  # continue the run in --out from checkpoints/last.pt (same config)

    def __post_init__(self) -> None:
        for name in ("batch_size", "epochs", "width", "head_dim", "views"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("lr", "probe_lr"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("weight_decay", "warmup_epochs", "queue_size", "num_workers"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.temperature is not None and not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.augment != "auto" and self.augment not in PRESETS:
            raise ValueError(f"augment must be 'auto' or one of {sorted(PRESETS)}")
        if self.head not in HEADS:
            raise ValueError(f"head must be one of {HEADS}, got {self.head!r}")
        if self.adversarial and self.method not in ("simclr", "supcon", "clae"):
            raise ValueError("adversarial applies to methods simclr and supcon (clae is simclr)")
        if not self.adv_eps >= 0 or self.adv_steps < 1 or not self.adv_alpha >= 0:
            raise ValueError(
                f"need adv_eps >= 0, adv_steps >= 1, adv_alpha >= 0; got {self.adv_eps}, "
                f"{self.adv_steps}, {self.adv_alpha}"
            )
        if self.method == "loco" and (self.adversarial or self.queue_size or self.views != 2):
            raise ValueError("loco trains 2 views without a queue or adversarial views")
        if self.overlap not in (0, 1) or self.decoder_depth < 0:
            raise ValueError(f"overlap must be 0 or 1 and decoder_depth >= 0, got {self.overlap}")
        if self.queue_size and self.method not in ("simclr", "clae"):
            raise ValueError("queue_size applies to method simclr only")
        if self.joint_classifier and self.method != "supcon":
            raise ValueError("joint_classifier applies to method supcon only")
        if self.method in ("simclr", "clae") and self.views != 2:
            raise ValueError("simclr contrasts exactly 2 views (NT-Xent); use supcon for more")
        if self.data not in DATASETS:
            raise ValueError(f"data must be one of {DATASETS}, got {self.data!r}")
        check_loss_settings(self)

    @property
    def tau(self) -> float:
        """The temperature in use (the method's default unless set)."""
        if self.temperature is not None:
            return self.temperature
        return DEFAULT_TEMPERATURE.get(self.base_method, 1.0)

    def augment_preset(self, channels: int) -> str:
        """The augmentation preset in use: ``augment``, or by the channel count when auto."""
        if self.augment != "auto":
            return self.augment
        return "small_gray" if channels == 1 else "simclr_cifar"

    @property
    def base_method(self) -> str:
        """The loss family: clae is SimCLR with adversarial views."""
        return "simclr" if self.method in ("clae", "loco") else self.method

    @property
    def is_adversarial(self) -> bool:
        return self.adversarial or self.method == "clae"

    @property
    def num_views(self) -> int:
        return 1 if self.method == "ce" else self.views


# About a minute on 2 CPU cores: a small CNN on digits-m, 250 steps of batch 128. Measured for
# SimCLR (seed 0, probe accuracy): τ 0.5 / batch 256 → 48 %, τ 0.2 / batch 256 → 50 %,
# τ 0.2 / batch 128 → 56 % (random init 40 %, raw pixels 70 %).
QUICK: dict[str, Any] = {
    "data": "digits-m",
    "backbone": "small_cnn",
    "width": 32,
    "batch_size": 128,
    "epochs": 25,
    "optimizer": "adam",
    "lr": 2e-3,
    "weight_decay": 1e-5,
    "warmup_epochs": 2.0,
    "temperature": 0.2,
    "log_every": 10,
    "eval_every": 50,  # the kNN monitor, five times
}


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
    seeded the same way before the call)."""
    backbone = build_backbone(
        cfg.backbone, in_channels=data.channels, cifar_stem=cfg.cifar_stem, width=cfg.width
    )
    labelled = data.num_classes >= 2
    if cfg.base_method != "simclr" and not labelled:
        raise ValueError(f"method {cfg.method} needs labels; data set {data.name!r} has none")
    if cfg.method == "loco":  # local units with their own heads (imagecl.loco)
        return LoCoModel(
            backbone, stages=cfg.stages, overlap=cfg.overlap,  # type: ignore[arg-type]
            head_dim=cfg.head_dim, decoder_depth=cfg.decoder_depth, end_to_end=cfg.end_to_end,
        )  # fmt: skip
    head = None if cfg.method == "ce" else build_head(cfg.head, backbone.feature_dim, cfg.head_dim)
    classifier: Literal["none", "end_to_end", "detached"] = "none"
    if cfg.method == "ce":
        classifier = "end_to_end"
    elif cfg.joint_classifier:
        classifier = "detached"
    queue = None
    if cfg.queue_size:
        dim = backbone.feature_dim if cfg.head == "none" else cfg.head_dim
        queue = MemoryQueue(cfg.queue_size, dim)
    if cfg.is_adversarial and cfg.adv_bn:
        convert_dual_bn(backbone)  # CLAE's separate batch norm for adversarial rows
    return ImageModel(
        backbone, head=head, num_classes=data.num_classes, classifier=classifier,
        online_probe=cfg.online_probe and labelled, queue=queue,
    )  # fmt: skip


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
            cfg.data, root=cfg.data_root, seed=cfg.seed, download=cfg.download,
            image_size=cfg.image_size,
        )  # fmt: skip
    seed_everything(cfg.seed)  # the same initial weights on every rank
    model = build_model(cfg, data).to(device)
    model = to_channels_last(model, device)
    if cfg.compile:  # in place: the state_dict keys (checkpoints, export) stay the plain ones
        model.get_submodule("backbone").compile()
        if isinstance(model, LoCoModel):  # its training calls the units, not the backbone
            model.compile_units()
    seed_everything(cfg.seed, rank=env.rank)  # each rank its own augmentations from here on
    dataset = data.pretrain if cfg.base_method == "simclr" else data.train
    if len(dataset) < cfg.batch_size:
        raise ValueError(
            f"batch_size {cfg.batch_size} is larger than the {len(dataset)} training images of "
            f"{data.name!r} (the last incomplete batch is dropped)"
        )
    loader = make_loader(
        dataset, cfg.batch_size, shuffle=True, seed=cfg.seed, dist=env,
        num_workers=cfg.num_workers, collate_fn=collate_uint8, pin_memory=device.type == "cuda",
    )  # fmt: skip
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


def _masked_cross_entropy(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """Cross-entropy and accuracy over the rows with a label (>= 0); unlabelled rows are -1."""
    known = labels >= 0
    count = known.sum().clamp(min=1)
    per_row = F.cross_entropy(logits.float(), labels.clamp(min=0), reduction="none")  # (B,)
    loss = (per_row * known).sum() / count
    accuracy = ((logits.argmax(1) == labels) & known).sum() / count
    return loss, accuracy.detach().float()


def train_step(
    model: nn.Module, batch: tuple[Tensor, Tensor], *, cfg: Config, views: SimCLRViews, gather: bool
) -> dict[str, Tensor]:
    """One step's loss for ``cfg.method`` (plus the joint classifier and online probe).

    Shape:
        batch: images ``(N, C, H, W)`` uint8 and labels ``(N,)`` (-1 where unknown).
    """
    if cfg.method == "loco":  # a contrastive loss per local unit (imagecl.loco)
        return loco_train_step(model, batch, views=views, temperature=cfg.tau, gather=gather)
    images, labels = batch
    N = images.shape[0]
    x = views(images)  # (N, V, C, S, S) normalised float, augmented on the device
    V = x.shape[1]
    rows = x.flatten(0, 1)  # (N·V, C, S, S), row n·V + v
    adv = 0
    if cfg.is_adversarial:  # CLAE: x_adv rows after the views, through their own BN branch
        inner = unwrap(model)
        x_adv = adversarial_view(inner, x[:, 0], labels, cfg=cfg, mean=views.mean, std=views.std)
        rows, adv = torch.cat([rows, x_adv]), N  # (N·V + N, C, S, S)
    with adversarial_rows(unwrap(model), adv if cfg.adv_bn else 0):
        full = model(rows)  # one forward for clean and adversarial rows
    out = ModelOutput(
        full.h[: N * V], *(None if t is None else t[: N * V] for t in full[1:])
    )  # the clean rows; ModelOutput fields after h are optional
    y = labels.repeat_interleave(V)  # (N·V,)
    metrics: dict[str, Tensor] = {}
    if cfg.method == "ce":
        assert out.logits is not None
        loss, metrics["train_acc"] = _masked_cross_entropy(out.logits, y)
    else:
        assert out.z is not None
        z = out.z.view(N, V, -1)  # (N, V, D)
        if cfg.base_method == "simclr":
            loss = simclr_loss(unwrap(model), z, cfg, gather)
        else:
            loss = supcon_loss(z, labels, temperature=cfg.tau, variant=cfg.variant, gather=gather)
        metrics["contrastive_loss"] = loss.detach()
        if adv:
            assert full.z is not None
            adv_loss = pair_loss(cfg, z[:, 0], full.z[N * V :], labels, gather)
            metrics["adversarial_loss"] = adv_loss.detach()
            loss = loss + cfg.adv_alpha * adv_loss
        metrics["z_std"] = F.normalize(z.detach().float(), dim=-1).flatten(0, 1).std(0).mean()
        if out.logits is not None:  # SupCon's joint classifier on stop-gradient h
            classifier_loss, metrics["classifier_acc"] = _masked_cross_entropy(out.logits, y)
            loss = loss + classifier_loss
    if out.probe_logits is not None:
        probe_loss, metrics["probe_acc"] = _masked_cross_entropy(out.probe_logits, y)
        metrics["probe_loss"] = probe_loss.detach()
        loss = loss + probe_loss  # reaches the probe only: it reads h.detach()
    return {"loss": loss, **metrics}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``imagecl train [options]``: train, then evaluate the encoder and write the run folder."""
    cfg = parse_config(Config, argv, prog="imagecl train", presets={"quick": QUICK})
    device = select_device(cfg.device)
    env = init_distributed(device)
    device = local_device(device, env)
    try:
        run = open_run(cfg.out, cfg.method, resume=cfg.resume, env=env)
        if env.rank == 0:
            save_config(cfg, run.path)
        built = build(cfg, device=device, env=env)
        if env.rank == 0:
            report_skipped_images(built.data, run)  # skipped.csv and one line
        loop_cfg = LoopConfig(
            epochs=cfg.epochs, max_steps=cfg.max_steps, log_every=cfg.log_every,
            eval_every=cfg.eval_every, checkpoint_every=cfg.checkpoint_every, amp=cfg.amp,
        )  # fmt: skip
        step = functools.partial(train_step, cfg=cfg, views=built.views, gather=env.is_distributed)
        monitor = make_monitor(cfg, built.data, device)
        if cfg.method == "loco":  # per-unit backward: local learning's memory (imagecl.loco)
            updater = LocalUpdater(
                built.model, built.optimizer, views=built.views, temperature=cfg.tau,
                gather=env.is_distributed, scheduler=built.scheduler,
            )  # fmt: skip
            result = fit_updater(
                updater, built.loader, loop_cfg=loop_cfg, run_dir=run, device=device,
                evaluate=monitor, evaluate_on_all_ranks=True, resume=cfg.resume, dist_env=env,
                config=cfg,
            )  # fmt: skip
        else:
            result = fit(
                built.model, built.optimizer, built.loader, step, loop_cfg=loop_cfg, run_dir=run,
                device=device, scheduler=built.scheduler, evaluate=monitor, resume=cfg.resume,
                dist_env=env, config=cfg,
            )  # fmt: skip
        summary: dict[str, Any] = {}
        if env.rank == 0:
            summary = finish_run(run, cfg, built, result.step, device)
        return summary
    finally:
        cleanup_distributed()


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
    cfg = load_config(Config, config_path)
    state = load_checkpoint(checkpoint)
    data = load_data(
        cfg.data, root=data_root or cfg.data_root, seed=cfg.seed, image_size=cfg.image_size
    )
    model = build_model(cfg, data)
    model.load_state_dict(_without_compile_prefix(state["model"]))
    return cfg, data, model.to(device).eval()


def _without_compile_prefix(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with the ``_orig_mod.`` segment that a ``torch.compile`` wrapper puts into every
    key of the wrapped module removed (checkpoints of runs whose backbone was compiled that way
    say ``backbone._orig_mod.features.0.weight`` for ``backbone.features.0.weight``)."""
    return {".".join(p for p in k.split(".") if p != "_orig_mod"): v for k, v in state.items()}
