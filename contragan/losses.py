"""GAN losses: adversarial (hinge, non-saturating) plus each method's class term.

The class terms, on the same networks (:mod:`contragan.networks`):

- ``"contra"`` (ContraGAN, Kang & Park 2020, Eq. 8 and Alg. 1): the 2C loss of
  :func:`shared.losses.conditional_contrastive_loss` on the discriminator's embeddings and
  class proxies, on real images in D's loss and on fakes (with their conditioning labels) in
  G's loss, weighted by λ (``lambda_2c``; G's by ``g_lambda_2c`` when set) at temperature τ;
  λ = 1 and τ = 1 in every reference config. ``class_positives="all"`` is the paper's numerator
  (the proxy and every same-class embedding); ``"proxy"`` keeps the proxy alone there
  (StudioGAN's former ``pos_collected_numerator: false``), the same-class embeddings staying in
  the denominator.
- ``"reacgan"`` (ReACGAN, Kang et al. 2021): the same embeddings and proxies, with D2D-CE
  (:func:`shared.losses.data_to_data_cross_entropy_loss`) in place of 2C: the proxy is the only
  positive, same-class samples are dropped from the negatives, the positive is pulled in up to
  the margin ``m_p`` (``margin_pos``) and negatives pushed off beyond ``1 − m_p``. D's loss
  reads real images, G's its fakes, weighted by λ: StudioGAN's ``d_cond_mtd: D2DCE`` with no
  auxiliary classifier (``aux_cls_type: W/O``, its default). Its CIFAR-10 config:
  λ 0.5, τ 0.5, m_p 0.98.
- ``adc=True`` on either (ADC-GAN, Hou et al. 2022, on the contrastive head: StudioGAN's
  ``aux_cls_type: ADC``): the head holds a second proxy per class, for fakes. D also learns its
  fakes against their fake proxies; G pulls its fakes to the real proxy and pushes them from
  the fake one (the negated term). The class term thus becomes adversarial: a fake that looks
  like a typical real sample of its class still matches its fake proxy, so G is not rewarded
  for dropping the rest of the class.
- ``"proj"`` (ProjGAN, Miyato & Koyama 2018): no extra term; the class enters through the
  projection inside the adversarial logit.
- ``"ac"`` (ACGAN, Odena et al. 2017, Eq. 1–2): cross-entropy of the auxiliary classifier,
  weighted by ``ac_weight`` (1 in the paper and StudioGAN); G minimises it on its fakes. D
  minimises it on real *and* fake images by default (``ac_fakes=True``): the paper's L_C is
  the log-likelihood of the correct class on both sources, and StudioGAN's main branch did
  the same until its rewrite merged on 2 November 2021 (its last such commit is of 1 May
  2021). Today's StudioGAN trains D's classifier on real images only (fakes enter only with
  its ADC classifier): ``ac_fakes=False``.

λ and τ left unset (``None``) take the method's reference value, resolved in one place:
:meth:`LossSettings.resolve` (:data:`REFERENCE_SETTINGS`). The adversarial losses live in
:mod:`contragan.adversarial` (re-exported here). Each method
has a D loss and a G loss of one signature (``contra_d_loss``, ``contra_g_loss``, ...);
:data:`contragan.steps.GAN_LOSSES` picks them by name.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch.nn.functional as F
from torch import Tensor

from contragan.adversarial import (
    ADV_LOSSES,
    AdvLoss,
    d_hinge,
    d_nonsaturating,
    g_hinge,
    g_nonsaturating,
    upcast,
)
from contragan.networks import DiscOutput
from shared.losses import conditional_contrastive_loss, data_to_data_cross_entropy_loss

__all__ = [
    "ADV_LOSSES",
    "REFERENCE_SETTINGS",
    "AdvLoss",
    "ClassPositives",
    "LossSettings",
    "ac_d_loss",
    "ac_g_loss",
    "contra_d_loss",
    "contra_g_loss",
    "d_hinge",
    "d_nonsaturating",
    "g_hinge",
    "g_nonsaturating",
    "proj_d_loss",
    "proj_g_loss",
    "reacgan_d_loss",
    "reacgan_g_loss",
]

ClassPositives = Literal["all", "proxy"]
CLASS_POSITIVES = ("all", "proxy")


# what λ, τ and m_p left unset become, per method: ContraGAN's value in every StudioGAN config,
# ReACGAN's in StudioGAN's configs/CIFAR10/ReACGAN.yaml (cond_lambda, temperature, m_p)
REFERENCE_SETTINGS: dict[str, dict[str, float]] = {
    "contra": {"lambda_2c": 1.0, "tau": 1.0},
    "reacgan": {"lambda_2c": 0.5, "tau": 0.5, "margin_pos": 0.98},
}


@dataclass(frozen=True)
class LossSettings:
    """The settings every method's D and G loss reads, checked once on construction.

    ``adv``: the adversarial loss (:data:`ADV_LOSSES`); ``lambda_2c`` and ``tau``: the weight
    and temperature of the contrastive class term (contra's 2C, reacgan's D2D-CE);
    ``ac_weight``: the weight of the classification loss (ac); ``gather``: contrast against
    every rank's samples (under DDP); ``class_positives``: the 2C numerator, ``"all"`` or
    ``"proxy"`` (contra); ``margin_pos``: D2D-CE's positive margin m_p, the negative one being
    1 − m_p (reacgan); ``ac_fakes``: D's classifier also learns from fakes (ac); ``adc``:
    the contrastive term also on fakes against their fake proxies (contra, reacgan);
    ``g_lambda_2c``: the class term's weight in G's loss alone, ``None`` for ``lambda_2c``
    (contra, reacgan: D keeps ``lambda_2c``). Built with unset values by :meth:`resolve`.
    """

    adv: AdvLoss = "hinge"
    lambda_2c: float = 1.0
    tau: float = 1.0
    ac_weight: float = 1.0
    gather: bool = False
    class_positives: ClassPositives = "all"
    margin_pos: float = 0.98
    ac_fakes: bool = True
    adc: bool = False
    g_lambda_2c: float | None = None

    def __post_init__(self) -> None:
        if self.adv not in ADV_LOSSES:
            raise ValueError(f"adv must be one of {tuple(ADV_LOSSES)}, got {self.adv!r}")
        for name, value in (
            ("lambda_2c", self.lambda_2c),
            ("g_lambda_2c", self.g_weight),
            ("ac_weight", self.ac_weight),
        ):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        if not (math.isfinite(self.tau) and self.tau > 0):
            raise ValueError(f"tau must be a finite number > 0, got {self.tau}")
        if self.class_positives not in CLASS_POSITIVES:
            raise ValueError(
                f"class_positives must be one of {CLASS_POSITIVES}, got {self.class_positives!r}"
            )
        if not 0.0 <= self.margin_pos <= 1.0:  # also refuses NaN
            raise ValueError(f"margin_pos must lie in [0, 1], got {self.margin_pos}")

    @property
    def g_weight(self) -> float:
        """The class term's weight in G's loss: ``g_lambda_2c``, or ``lambda_2c`` when unset."""
        return self.lambda_2c if self.g_lambda_2c is None else self.g_lambda_2c

    @classmethod
    def resolve(
        cls,
        loss: str,
        *,
        adv: AdvLoss = "hinge",
        lambda_2c: float | None = None,
        tau: float | None = None,
        ac_weight: float = 1.0,
        gather: bool = False,
        class_positives: ClassPositives = "all",
        margin_pos: float | None = None,
        ac_fakes: bool = True,
        adc: bool = False,
        g_lambda_2c: float | None = None,
    ) -> LossSettings:
        """The settings of method ``loss``, unset λ, τ and m_p taking its reference values
        (:data:`REFERENCE_SETTINGS`; 1, 1 and 0.98 for methods without a contrastive term,
        which do not read them)."""
        reference = REFERENCE_SETTINGS.get(loss, {})

        def pick(value: float | None, name: str, fallback: float) -> float:
            return reference.get(name, fallback) if value is None else value

        return cls(
            adv=adv,
            lambda_2c=pick(lambda_2c, "lambda_2c", 1.0),
            tau=pick(tau, "tau", 1.0),
            ac_weight=ac_weight,
            gather=gather,
            class_positives=class_positives,
            margin_pos=pick(margin_pos, "margin_pos", 0.98),
            ac_fakes=ac_fakes,
            adc=adc,
            g_lambda_2c=g_lambda_2c,
        )


def _class_logits(out: DiscOutput, which: str) -> Tensor:
    if out.class_logits is None:
        raise ValueError(
            f"loss='ac' needs class_logits on the {which} DiscOutput; build the discriminator "
            "with GanArch(loss='ac')"
        )
    return upcast(out.class_logits)


def _d_adv(real: DiscOutput, fake: DiscOutput, settings: LossSettings) -> Tensor:
    return ADV_LOSSES[settings.adv][0](real.adv, fake.adv)


def _g_adv(fake: DiscOutput, settings: LossSettings) -> Tensor:
    return ADV_LOSSES[settings.adv][1](fake.adv)


ClassTerm = Callable[[Tensor, Tensor, Tensor, LossSettings], Tensor]


def _two_c(embedding: Tensor, proxy: Tensor, labels: Tensor, settings: LossSettings) -> Tensor:
    return conditional_contrastive_loss(
        embedding,
        proxy,
        labels,
        temperature=settings.tau,
        gather=settings.gather,
        positives=settings.class_positives,
    )


def _d2dce(embedding: Tensor, proxy: Tensor, labels: Tensor, settings: LossSettings) -> Tensor:
    return data_to_data_cross_entropy_loss(
        embedding,
        proxy,
        labels,
        temperature=settings.tau,
        margin_pos=settings.margin_pos,
        gather=settings.gather,
    )


def _fake_proxy(out: DiscOutput) -> Tensor:
    if out.fake_proxy is None:
        raise ValueError(
            "adc=True needs fake_proxy on the fake DiscOutput; build the discriminator with "
            "GanArch(adc=True)"
        )
    return out.fake_proxy


def _contrastive_d_loss(
    real: DiscOutput,
    fake: DiscOutput,
    y_real: Tensor,
    y_fake: Tensor,
    settings: LossSettings,
    term: ClassTerm,
    name: str,
) -> dict[str, Tensor]:
    d_adv = _d_adv(real, fake, settings)
    d_class = term(real.embedding, real.proxy, y_real, settings)
    parts = {"d_adv": d_adv, f"d_{name}": d_class}
    if settings.adc:  # each source contrasted within itself, as StudioGAN computes them
        parts["d_adc"] = term(fake.embedding, _fake_proxy(fake), y_fake, settings)
        d_class = d_class + parts["d_adc"]
    return {"loss": d_adv + settings.lambda_2c * d_class, **parts}


def _contrastive_g_loss(
    fake: DiscOutput, y_fake: Tensor, settings: LossSettings, term: ClassTerm, name: str
) -> dict[str, Tensor]:
    g_adv = _g_adv(fake, settings)
    g_class = term(fake.embedding, fake.proxy, y_fake, settings)
    parts = {"g_adv": g_adv, f"g_{name}": g_class}
    if settings.adc:
        parts["g_adc"] = -term(fake.embedding, _fake_proxy(fake), y_fake, settings)
        g_class = g_class + parts["g_adc"]
    return {"loss": g_adv + settings.g_weight * g_class, **parts}


def contra_d_loss(
    real: DiscOutput, fake: DiscOutput, y_real: Tensor, y_fake: Tensor, settings: LossSettings
) -> dict[str, Tensor]:
    """ContraGAN's D loss: ``d_adv + λ · 2C(real.embedding, real.proxy, y_real; τ)``.

    The 2C term reads real images only (Kang & Park 2020, Alg. 1); its numerator holds the
    positives ``settings.class_positives`` names. With ``settings.adc`` it adds
    ``λ · 2C(fake.embedding, fake.fake_proxy, y_fake; τ)``. Returns ``{"loss": total,
    "d_adv": ..., "d_2c": ...}`` (and ``"d_adc"``), all scalars with their graph (detach
    before logging).

    Shape:
        real: DiscOutput of N real images; fake: DiscOutput of M fakes; y_real: ``(N,)``;
        y_fake: ``(M,)``
    """
    return _contrastive_d_loss(real, fake, y_real, y_fake, settings, _two_c, "2c")


def contra_g_loss(fake: DiscOutput, y_fake: Tensor, settings: LossSettings) -> dict[str, Tensor]:
    """ContraGAN's G loss: ``g_adv + λ_G · 2C(fake.embedding, fake.proxy, y_fake; τ)``.

    λ_G is ``settings.g_weight`` (D's λ unless ``g_lambda_2c`` sets G's own). With
    ``settings.adc`` it adds ``−λ_G · 2C(fake.embedding, fake.fake_proxy, y_fake; τ)``.
    Returns ``{"loss": total, "g_adv": ..., "g_2c": ...}`` (and ``"g_adc"``).

    Shape:
        fake: DiscOutput of M fakes; y_fake: ``(M,)`` their conditioning labels
    """
    return _contrastive_g_loss(fake, y_fake, settings, _two_c, "2c")


def reacgan_d_loss(
    real: DiscOutput, fake: DiscOutput, y_real: Tensor, y_fake: Tensor, settings: LossSettings
) -> dict[str, Tensor]:
    """ReACGAN's D loss: ``d_adv + λ · D2D-CE(real.embedding, real.proxy, y_real; τ, m_p)``.

    D2D-CE reads real images only (StudioGAN's ``worker.py`` without ADC/TAC); with
    ``settings.adc`` it adds ``λ · D2D-CE(fake.embedding, fake.fake_proxy, y_fake)``. Returns
    ``{"loss": total, "d_adv": ..., "d_d2dce": ...}`` (and ``"d_adc"``).

    Shape:
        real: DiscOutput of N real images; fake: DiscOutput of M fakes; y_real: ``(N,)``;
        y_fake: ``(M,)``
    """
    return _contrastive_d_loss(real, fake, y_real, y_fake, settings, _d2dce, "d2dce")


def reacgan_g_loss(fake: DiscOutput, y_fake: Tensor, settings: LossSettings) -> dict[str, Tensor]:
    """ReACGAN's G loss: ``g_adv + λ_G · D2D-CE(fake.embedding, fake.proxy, y_fake; τ, m_p)``.

    λ_G is ``settings.g_weight`` (D's λ unless ``g_lambda_2c`` sets G's own). With
    ``settings.adc`` it adds ``−λ_G · D2D-CE(fake.embedding, fake.fake_proxy, y_fake)``.
    Returns ``{"loss": total, "g_adv": ..., "g_d2dce": ...}`` (and ``"g_adc"``).

    Shape:
        fake: DiscOutput of M fakes; y_fake: ``(M,)`` their conditioning labels
    """
    return _contrastive_g_loss(fake, y_fake, settings, _d2dce, "d2dce")


def proj_d_loss(
    real: DiscOutput, fake: DiscOutput, y_real: Tensor, y_fake: Tensor, settings: LossSettings
) -> dict[str, Tensor]:
    """ProjGAN's D loss: ``d_adv`` alone (the class is inside the logits).

    Returns ``{"loss": d_adv, "d_adv": d_adv}``.
    """
    d_adv = _d_adv(real, fake, settings)
    return {"loss": d_adv, "d_adv": d_adv}


def proj_g_loss(fake: DiscOutput, y_fake: Tensor, settings: LossSettings) -> dict[str, Tensor]:
    """ProjGAN's G loss: ``g_adv`` alone. Returns ``{"loss": g_adv, "g_adv": g_adv}``."""
    g_adv = _g_adv(fake, settings)
    return {"loss": g_adv, "g_adv": g_adv}


def ac_d_loss(
    real: DiscOutput, fake: DiscOutput, y_real: Tensor, y_fake: Tensor, settings: LossSettings
) -> dict[str, Tensor]:
    """ACGAN's D loss: ``d_adv + ac_weight · (CE(real.class_logits, y_real) +
    CE(fake.class_logits, y_fake))``, the fake term only with ``settings.ac_fakes``.

    Returns ``{"loss": total, "d_adv": ..., "d_ac": ...}``.

    Shape:
        real: DiscOutput of N real images; fake: DiscOutput of M fakes; y_real: ``(N,)``;
        y_fake: ``(M,)``
    """
    d_adv = _d_adv(real, fake, settings)
    d_ac = F.cross_entropy(_class_logits(real, "real"), y_real)
    if settings.ac_fakes:
        d_ac = d_ac + F.cross_entropy(_class_logits(fake, "fake"), y_fake)
    return {"loss": d_adv + settings.ac_weight * d_ac, "d_adv": d_adv, "d_ac": d_ac}


def ac_g_loss(fake: DiscOutput, y_fake: Tensor, settings: LossSettings) -> dict[str, Tensor]:
    """ACGAN's G loss: ``g_adv + ac_weight · CE(fake.class_logits, y_fake)``.

    Returns ``{"loss": total, "g_adv": ..., "g_ac": ...}``.

    Shape:
        fake: DiscOutput of M fakes; y_fake: ``(M,)`` their conditioning labels
    """
    g_adv = _g_adv(fake, settings)
    g_ac = F.cross_entropy(_class_logits(fake, "fake"), y_fake)
    return {"loss": g_adv + settings.ac_weight * g_ac, "g_adv": g_adv, "g_ac": g_ac}
