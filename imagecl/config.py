"""The configs of the ``imagecl`` commands and their presets.

:class:`Config` is ``imagecl train``'s (the method's own checks come from its entry in
:data:`imagecl.steps.METHODS`), :class:`EvalConfig` ``imagecl eval``'s and
:class:`FinetuneConfig` ``imagecl finetune``'s; :func:`finetune_config` turns a training run's
config into the cross-entropy config that fine-tunes its encoder.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from imagecl.attacks import Attack
from imagecl.augment import PRESETS
from imagecl.data import DATASETS
from imagecl.losses import LossName, check_loss_settings
from imagecl.networks import HEADS, Head
from imagecl.steps import METHODS
from shared.losses.generalized import Prior

__all__ = [
    "ENCODER_FIELDS",
    "FINETUNE_QUICK",
    "QUICK",
    "Config",
    "EvalConfig",
    "FinetuneConfig",
    "finetune_config",
]

MethodName = Literal["simclr", "supcon", "ce", "clae", "loco"]
DataName = Literal["digits", "digits-m", "cifar10", "cifar100", "stl10", "imagefolder", "unlabeled"]
Backbone = Literal["resnet18", "resnet50", "small_cnn"]


@dataclass(frozen=True)
class Config:
    """Train an image encoder with SimCLR, SupCon or cross-entropy."""

    # group: method
    method: MethodName = "simclr"
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
    """triplet: margin on squared distances of normalised z (0.5 = 0.25 on cosines); >= 0"""
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
        for name in ("batch_size", "epochs", "width", "head_dim", "views", "stages", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("image_size", "max_steps", "eval_every", "checkpoint_every"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 or none, got {getattr(self, name)}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")
        if self.adv_eps > 1:
            raise ValueError(f"adv_eps must be <= 1 (pixel units in [0, 1]), got {self.adv_eps}")
        for name in ("lr", "probe_lr"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("weight_decay", "warmup_epochs", "queue_size", "num_workers", "seed"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {tuple(METHODS)}, got {self.method!r}")
        if self.temperature is not None and not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.augment != "auto" and self.augment not in PRESETS:
            raise ValueError(f"augment must be 'auto' or one of {sorted(PRESETS)}")
        if self.head not in HEADS:
            raise ValueError(f"head must be one of {HEADS}, got {self.head!r}")
        if not self.adv_eps >= 0 or self.adv_steps < 1 or not self.adv_alpha >= 0:
            raise ValueError(
                f"need adv_eps >= 0, adv_steps >= 1, adv_alpha >= 0; got {self.adv_eps}, "
                f"{self.adv_steps}, {self.adv_alpha}"
            )
        if self.overlap not in (0, 1) or self.decoder_depth < 0:
            raise ValueError(f"overlap must be 0 or 1 and decoder_depth >= 0, got {self.overlap}")
        if self.data not in DATASETS:
            raise ValueError(f"data must be one of {DATASETS}, got {self.data!r}")
        check_loss_settings(loss=self.loss, prior=self.prior, lam=self.lam, margin=self.margin)
        METHODS[self.method].check(self)  # what the method takes (imagecl.steps)

    @property
    def tau(self) -> float:
        """The temperature in use (the method's default unless set)."""
        if self.temperature is not None:
            return self.temperature
        return METHODS[self.method].temperature

    def augment_preset(self, channels: int) -> str:
        """The augmentation preset in use: ``augment``, or by the channel count when auto."""
        if self.augment != "auto":
            return self.augment
        return "small_gray" if channels == 1 else "simclr_cifar"

    @property
    def is_adversarial(self) -> bool:
        """Whether the run trains with adversarial views (CLAE)."""
        return self.adversarial or METHODS[self.method].adversarial

    @property
    def num_views(self) -> int:
        """Augmented views per image: the method's, or ``views``."""
        fixed = METHODS[self.method].views
        return self.views if fixed is None else fixed


# A small CNN on digits-m, 250 steps of batch 128: the budget of the demo, the tests and the
# studies.
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


@dataclass(frozen=True)
class EvalConfig:
    """Evaluate a trained encoder: linear probe, kNN, alignment/uniformity, corruptions."""

    # group: data
    checkpoint: Path  # a training run's checkpoints/last.pt (or best.pt) to evaluate (required)
    data_root: Path | None = None  # where the run's data set lies now, if not where it was trained
    # group: run
    out: Path | None = None  # evaluation folder; none: <run>/eval-<time>
    # group: method
    corruptions: bool = True
    """also score the probe on corrupted test images (the CIFAR-10-C protocol)"""
    severities: tuple[int, ...] = (1, 2, 3, 4, 5)  # corruption severities to test, each in 1..5
    labels_per_class: tuple[int, ...] = (1, 5, 10)
    """also fit the probe on only n labelled images per class (the low-label regime), each >= 1"""
    knn_k: tuple[int, ...] = (20, 200)
    """neighbours of the weighted cosine kNN classifier (InstDisc: 20 and 200), each >= 1"""
    attack: Attack | None = None
    """probe accuracy under an L∞ attack on the frozen encoder: fgsm or pgd; none: no attack"""
    eps: float = field(
        default=2 / 255,
        metadata={"help": "attack budget in [0, 1] pixel units (0.00784 = 2/255, 0.0314 = 8/255)"},
    )
    attack_steps: int = 10  # PGD steps, >= 1 (step size 2.5·eps / steps, Madry et al.)
    # group: run
    seed: int = 0  # random seed of the probe's split and the views; any integer >= 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto: CUDA when available, else CPU; or force cpu / cuda"""

    def __post_init__(self) -> None:
        if any(not 1 <= s <= 5 for s in self.severities):
            raise ValueError(f"severities must lie in 1..5, got {self.severities}")
        if any(n < 1 for n in (*self.labels_per_class, *self.knn_k)):
            raise ValueError("labels_per_class and knn_k must be >= 1")
        if not (math.isfinite(self.eps) and 0.0 <= self.eps <= 1.0):
            raise ValueError(f"eps must lie in [0, 1] (pixel units), got {self.eps}")
        if self.attack_steps < 1:
            raise ValueError(f"attack_steps must be >= 1, got {self.attack_steps}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")


@dataclass(frozen=True)
class FinetuneConfig:
    """Fine-tune a pre-trained encoder on a fraction of the labels, against scratch."""

    # group: data
    checkpoint: Path  # a training run's checkpoints/last.pt whose encoder is fine-tuned (required)
    label_fraction: float = 0.1
    """class-balanced fraction of the training labels, in (0, 1] (SimCLR: 0.01 and 0.1)"""
    # group: optimisation
    steps: int = 300
    """optimizer steps, >= 1, whatever the subset's size (1 % of digits is 13 images)"""
    batch_size: int = 64  # labelled images per step, >= 1 (at most the subset's size)
    optimizer: Literal["sgd", "adam", "lars"] = "adam"  # sgd (momentum 0.9), adam or lars
    lr: float = 1e-3  # learning rate, > 0 (per 256 images for sgd and lars, as is for adam)
    weight_decay: float = 1e-5  # L2 weight decay, >= 0
    warmup_epochs: float = 0.0  # epochs of linear warm-up before the cosine decay, >= 0
    # group: method
    compare_scratch: bool = True
    """also train the same architecture from random initialisation on the same labels"""
    # group: data
    data_root: Path | None = None  # where the run's data set lies now, if not where it was trained
    # group: run
    out: Path | None = None  # run folder; none: runs/imagecl/finetune-<fraction>-<time>
    seed: int = 0  # random seed of the label subset, initialisation and augmentation
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto: CUDA when available, else CPU; or force cpu / cuda"""

    def __post_init__(self) -> None:
        if not 0 < self.label_fraction <= 1:
            raise ValueError(f"label_fraction must be in (0, 1], got {self.label_fraction}")
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError("steps and batch_size must be >= 1")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        for name in ("weight_decay", "warmup_epochs", "seed"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


FINETUNE_QUICK: dict[str, Any] = {"steps": 100}

# The fields of a training config that define the encoder and the images it reads; everything
# else (method, loss, views, adversarial views, queue, head, ...) concerns how it was trained.
ENCODER_FIELDS = ("data", "data_root", "image_size", "backbone", "cifar_stem", "width", "augment")


def finetune_config(
    trained: Config, cfg: FinetuneConfig, *, epochs: int, batch_size: int
) -> Config:
    """The cross-entropy config that fine-tunes (or trains from scratch) ``trained``'s encoder.

    Only :data:`ENCODER_FIELDS` come from the training run, so a run of any method (SimCLR with
    any loss or a queue, SupCon, CLAE, adversarial SupCon, LoCo, cross-entropy) gives the same
    network with a linear classifier; the optimisation comes from ``cfg``. ``cfg.data_root``
    overrides the recorded data location.

    Args:
        trained: the config of the training run whose encoder is fine-tuned.
        cfg: the fine-tuning settings.
        epochs: passes over the labelled subset (``cfg.steps`` caps the steps).
        batch_size: images per step (at most the subset's size).
    """
    encoder = {name: getattr(trained, name) for name in ENCODER_FIELDS}
    encoder["data_root"] = cfg.data_root or trained.data_root
    return Config(
        method="ce",
        **encoder,
        epochs=epochs,
        max_steps=cfg.steps,
        batch_size=batch_size,
        optimizer=cfg.optimizer,
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        warmup_epochs=cfg.warmup_epochs,
        online_probe=False,
        seed=cfg.seed,
        device=cfg.device,
    )
