"""The settings of the ``contragan`` commands: one frozen dataclass per command, and presets.

:class:`Config` is ``contragan train``'s (its ``--quick`` preset :data:`QUICK`),
:class:`SampleConfig` ``contragan sample``'s and :class:`EvaluateConfig` ``contragan
evaluate``'s (``--quick``: :data:`EVALUATE_QUICK`). :func:`shared.config.parse_config` turns
each into the command's options; the checks here read the settings alone (the ones that also
need the data are in :mod:`contragan.models`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from contragan.arch import CONTRASTIVE_LOSSES, GanLoss
from contragan.data import GanData
from contragan.losses import AdvLoss, ClassPositives, LossSettings
from shared.config import config_to_dict

__all__ = [
    "EVALUATE_QUICK",
    "QUICK",
    "Config",
    "EvaluateConfig",
    "SampleConfig",
    "resume_config",
]


@dataclass(frozen=True)
class Config:
    """Train a class-conditional GAN: ContraGAN (2C loss), ReACGAN (D2D-CE) or the ProjGAN/ACGAN
    baselines."""

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
    """contra (ContraGAN: adversarial + 2C loss), reacgan (ReACGAN: adversarial + D2D-CE), proj
    (projection D, ProjGAN) or ac (auxiliary classifier, ACGAN)"""
    adv_loss: AdvLoss = "hinge"  # the adversarial loss: hinge (ContraGAN's) or nonsaturating
    lambda_2c: float | None = None
    """contra, reacgan: weight λ of the class loss (2C, D2D-CE), >= 0; none: the method's
    reference value, contra 1, reacgan 0.5"""
    g_lambda_2c: float | None = None
    """contra, reacgan: weight of the class loss in G's loss alone, >= 0 (D keeps λ); none: λ,
    as in ContraGAN and ReACGAN"""
    lambda_2c_decay: int | None = None
    """contra, reacgan: the class loss's weights, D's λ and G's, fall linearly from their
    values at G step 1 to 0 at G step N + 1 and stay 0 (with --proj-adv the run then goes on
    as ProjGAN), >= 1; none: constant"""
    tau: float | None = None
    """contra, reacgan: temperature τ of the class loss, > 0; none: the method's reference
    value, contra 1, reacgan 0.5"""
    class_positives: ClassPositives = "all"
    """contra: the 2C numerator: all (the paper: the class proxy and every same-class sample)
    or proxy (the proxy alone; StudioGAN's former pos_collected_numerator: false)"""
    margin_pos: float | None = None
    """reacgan: D2D-CE's positive margin m_p in [0, 1], the negative margin being 1 − m_p;
    none: 0.98 (ReACGAN's CIFAR-10 config)"""
    adc: bool = False
    """contra, reacgan: a second proxy per class for fakes (ADC-GAN's auxiliary discriminative
    classifier; StudioGAN's aux_cls_type: ADC): D also learns fakes against it, G pushes its
    fakes from it; off: the class term reads real images only (ContraGAN, ReACGAN)"""
    proj_adv: bool = False
    """contra, reacgan: the adversarial logit gains ProjGAN's class projection ⟨v(y), h⟩ (a
    table of its own), so D also judges each image against its class's real images; off: the
    logit is unconditional (ContraGAN, ReACGAN)"""
    ac_weight: float = 1.0  # ac: weight of the classification loss, >= 0
    ac_fakes: bool = True
    """ac: D's classifier also learns from fakes (the paper; StudioGAN until 2021);
    --no-ac-fakes: from real images only (StudioGAN since November 2021)"""
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
        for name in ("batch_size", "n_dis", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in (
            "image_size",
            "epochs",
            "max_steps",
            "eval_every",
            "checkpoint_every",
            "lambda_2c_decay",
        ):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 or none, got {getattr(self, name)}")
        for name in ("g_lr", "d_lr", "tau"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("lambda_2c", "g_lambda_2c", "ac_weight", "ema_start", "num_workers", "seed"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
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
        self._check_class_options()
        _ = self.loss_settings  # LossSettings checks what the losses read (m_p, NaN λ, ...)

    def _check_class_options(self) -> None:
        """A class option given with a loss it does not apply to is refused (not ignored)."""
        if self.class_positives != "all" and self.loss != "contra":
            raise ValueError(
                f"class_positives applies to loss contra only, got loss {self.loss!r}: drop "
                "--class-positives"
            )
        if self.margin_pos is not None and self.loss != "reacgan":
            raise ValueError(
                f"margin_pos applies to loss reacgan only, got loss {self.loss!r}: drop "
                "--margin-pos"
            )
        if self.adc and self.loss not in CONTRASTIVE_LOSSES:
            raise ValueError(
                f"adc applies to losses contra and reacgan only, got loss {self.loss!r}: drop --adc"
            )
        if self.g_lambda_2c is not None and self.loss not in CONTRASTIVE_LOSSES:
            raise ValueError(
                f"g_lambda_2c applies to losses contra and reacgan only, got loss {self.loss!r}: "
                "drop --g-lambda-2c"
            )
        if self.lambda_2c_decay is not None and self.loss not in CONTRASTIVE_LOSSES:
            raise ValueError(
                f"lambda_2c_decay applies to losses contra and reacgan only, got loss "
                f"{self.loss!r}: drop --lambda-2c-decay"
            )
        if self.proj_adv and self.loss not in CONTRASTIVE_LOSSES:
            raise ValueError(
                f"proj_adv applies to losses contra and reacgan only, got loss {self.loss!r}: "
                "drop --proj-adv"
            )
        if not self.ac_fakes and self.loss != "ac":
            raise ValueError(
                f"ac_fakes applies to loss ac only, got loss {self.loss!r}: drop --no-ac-fakes"
            )

    @property
    def loss_settings(self) -> LossSettings:
        """What D's and G's losses read, unset λ, τ and m_p resolved to the method's reference
        values (:meth:`contragan.losses.LossSettings.resolve`); ``gather`` is off (``build``
        turns it on under DDP)."""
        return LossSettings.resolve(
            self.loss,
            adv=self.adv_loss,
            lambda_2c=self.lambda_2c,
            tau=self.tau,
            ac_weight=self.ac_weight,
            class_positives=self.class_positives,
            margin_pos=self.margin_pos,
            ac_fakes=self.ac_fakes,
            adc=self.adc,
            g_lambda_2c=self.g_lambda_2c,
        )


# options added with ReACGAN (and later), at the value that reproduces what came before them
_ADDED_LATER: dict[str, Any] = {
    "class_positives": "all",
    "margin_pos": None,
    "ac_fakes": True,
    "adc": False,
    "proj_adv": False,
    "g_lambda_2c": None,
    "lambda_2c_decay": None,
}


def resume_config(cfg: Config) -> dict[str, Any]:
    """What a checkpoint stores and a resume compares: ``cfg`` with λ and τ as the losses use
    them (resolved) and the options added with ReACGAN left out where they keep their default
    (reacgan's m_p resolved). A run folder written before them (λ = τ = 1 stored, those
    options absent) resumes with its own flags, and unset λ and τ compare equal to their
    reference values given explicitly."""
    plain = config_to_dict(cfg)
    settings = cfg.loss_settings
    plain["lambda_2c"], plain["tau"] = settings.lambda_2c, settings.tau
    for name, default in _ADDED_LATER.items():
        if plain[name] == default:
            del plain[name]
    if cfg.loss == "reacgan":
        plain["margin_pos"] = settings.margin_pos
    return plain


# The digits networks at 16×16, batch 64, 2 D steps per G step, 1000 G steps: where ProjGAN's
# GAN-test on digits has levelled off (0.18 after 500 steps, 0.98 after 1000) and the grids
# are recognisable digits; a few minutes on 2 CPU cores.
QUICK: dict[str, Any] = {
    "data": "digits",
    "arch": "digits",
    "image_size": 16,
    "batch_size": 64,
    "n_dis": 2,
    "max_steps": 1000,
    "ema_decay": 0.99,  # an average over ~100 steps: 0.999 would still be the step-100 G
    "ema_start": 100,
    "log_every": 10,
    "eval_every": 250,
    "checkpoint_every": 250,
}


def _require_checkpoint(checkpoint: Path | None) -> None:
    if checkpoint is None:
        raise ValueError("--checkpoint is required (a run's checkpoints/last.pt)")


@dataclass(frozen=True)
class SampleConfig:
    """Draw a grid of samples, one row per class, from a contragan checkpoint."""

    # group: data
    checkpoint: Path | None = None  # a contragan run's checkpoints/last.pt (required)
    # group: method
    classes: str = "all"
    """classes to draw, one row each: all, or ids and ranges such as 0-9, 1,3,5 or 0-2,7"""
    per_class: int = 8  # samples per class (columns of the grid), >= 1
    # group: run
    out: Path = Path("samples.png")
    """the grid's .png/.jpg file, or a folder (existing, or a name without a suffix) for
    samples.png inside it"""
    tensors: Path | None = None
    """also save the samples and labels to this safetensors file; none: no"""
    # group: method
    ema: bool = True  # use the EMA generator when the run kept one
    # group: run
    seed: int = 0  # random seed of the latent vectors z; any integer >= 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto: CUDA when available, else CPU; or force cpu / cuda"""

    def __post_init__(self) -> None:
        if self.per_class < 1:
            raise ValueError(f"per_class must be >= 1, got {self.per_class}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        _require_checkpoint(self.checkpoint)


@dataclass(frozen=True)
class EvaluateConfig:
    """Offline metrics of a contragan checkpoint, each next to its real-vs-real value."""

    # group: data
    checkpoint: Path | None = None  # a contragan run's checkpoints/last.pt (required)
    data_root: Path | None = None  # where the run's data set lies now, if not where it was trained
    # group: method
    seeds: int = 3
    """generated sets (and real-vs-real draws) to average, >= 1: seeds seed .. seed + seeds − 1"""
    ema: bool = True  # use the EMA generator when the run kept one
    # group: model
    cache_dir: Path = Path("runs/contragan/extractors")
    """folder where the trained feature extractors are cached, per data set"""
    min_extractor_accuracy: float = 0.95
    """refuse an extractor whose test accuracy is below this, in [0, 1]"""
    extractor_epochs: int | None = None
    """training epochs of the feature extractor, >= 1; none: the data set's recipe (digits-m 15
    over its training split and four copies on fresh backgrounds, every other 12)"""
    # group: method
    cas_epochs: int = 12  # epochs of the CAS classifier trained on generated images, >= 1
    cas_samples: Literal["test", "train"] = "test"
    """what the CAS classifier trains on: test, the scored generated set (one sample per test
    image); train, as many generated images as the train split holds, with its class counts
    (Ravuri & Vinyals' protocol), and real-vs-real's classifier on the whole train split"""
    # group: model
    inception_weights: Path | None = None
    """torch-fidelity's Inception weights on disk, for the Inception FID; none: skipped"""
    # group: run
    out: Path | None = None  # evaluation folder; none: <run>/evaluation; refused if it holds files
    seed: int = 0  # first seed of the generated sets and the extractor; any integer >= 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto: CUDA when available, else CPU; or force cpu / cuda"""

    def __post_init__(self) -> None:
        for name in ("seeds", "extractor_epochs", "cas_epochs"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.min_extractor_accuracy <= 1.0:
            raise ValueError(
                f"min_extractor_accuracy must be in [0, 1], got {self.min_extractor_accuracy}"
            )
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        _require_checkpoint(self.checkpoint)


EVALUATE_QUICK: dict[str, Any] = {"seeds": 1, "cas_epochs": 4}
