"""GAN losses: adversarial (hinge, non-saturating) plus each method's class term.

The class terms, on the same networks (:mod:`contragan.models`):

- ``"contra"`` (ContraGAN, Kang & Park 2020, Eq. 8 and Alg. 1): the 2C loss of
  :func:`shared.losses.conditional_contrastive_loss` on the discriminator's embeddings and
  class proxies, on real images in D's loss and on fakes (with their conditioning labels) in
  G's loss, weighted by λ (``lambda_2c``) at temperature τ; λ = 1 and τ = 1 in every reference
  config. ``gather=True`` under DDP, so every rank's samples are contrasts.
- ``"proj"`` (ProjGAN, Miyato & Koyama 2018): no extra term; the class enters through the
  projection inside the adversarial logit.
- ``"ac"`` (ACGAN, Odena et al. 2017, Eq. 1–2): cross-entropy of the auxiliary classifier.
  D minimises it on real *and* fake images (the paper's L_C is the log-likelihood of the
  correct class on both sources; StudioGAN does the same), G on its fakes. The weight is
  ``ac_weight`` (1 in the paper and StudioGAN).

Every adversarial loss is a mean over the batch and computed in fp32 whatever the autocast
dtype (fp64 stays fp64).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from contragan.models import LOSSES, DiscOutput, GanLoss
from shared.losses import conditional_contrastive_loss

__all__ = [
    "ADV_LOSSES",
    "d_hinge",
    "d_nonsaturating",
    "discriminator_loss",
    "g_hinge",
    "g_nonsaturating",
    "generator_loss",
]

AdvLoss = Literal["hinge", "nonsaturating"]


def _upcast(x: Tensor) -> Tensor:
    return x if x.dtype == torch.float64 else x.float()


def d_hinge(real_adv: Tensor, fake_adv: Tensor) -> Tensor:
    """Discriminator hinge loss, ``mean(relu(1 − D(x))) + mean(relu(1 + D(G(z))))``.

    Lim & Ye 2017; Miyato et al. 2018, Eq. 16; the loss of BigGAN and StudioGAN's ContraGAN.

    Shape:
        real_adv: ``(N,)``; fake_adv: ``(M,)``; result: scalar
    """
    return F.relu(1 - _upcast(real_adv)).mean() + F.relu(1 + _upcast(fake_adv)).mean()


def g_hinge(fake_adv: Tensor) -> Tensor:
    """Generator hinge loss, ``−mean(D(G(z)))``.

    Shape:
        fake_adv: ``(M,)``; result: scalar
    """
    return -_upcast(fake_adv).mean()


def d_nonsaturating(real_adv: Tensor, fake_adv: Tensor) -> Tensor:
    """Discriminator loss of the original GAN: binary cross-entropy with logits,
    ``mean(softplus(−D(x))) + mean(softplus(D(G(z))))`` (Goodfellow et al. 2014, Eq. 1).

    Shape:
        real_adv: ``(N,)``; fake_adv: ``(M,)``; result: scalar
    """
    return F.softplus(-_upcast(real_adv)).mean() + F.softplus(_upcast(fake_adv)).mean()


def g_nonsaturating(fake_adv: Tensor) -> Tensor:
    """Non-saturating generator loss, ``mean(softplus(−D(G(z))))`` = −mean log σ(D(G(z)))
    (Goodfellow et al. 2014, Sec. 3).

    Shape:
        fake_adv: ``(M,)``; result: scalar
    """
    return F.softplus(-_upcast(fake_adv)).mean()


# (discriminator loss, generator loss) by name: the one string table, for configs and the CLI
ADV_LOSSES: dict[str, tuple[Callable[[Tensor, Tensor], Tensor], Callable[[Tensor], Tensor]]] = {
    "hinge": (d_hinge, g_hinge),
    "nonsaturating": (d_nonsaturating, g_nonsaturating),
}


def _check_settings(
    loss: str, adv: str, lambda_2c: float, tau: float, ac_weight: float
) -> tuple[Callable[[Tensor, Tensor], Tensor], Callable[[Tensor], Tensor]]:
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
    if adv not in ADV_LOSSES:
        raise ValueError(f"adv must be one of {tuple(ADV_LOSSES)}, got {adv!r}")
    for name, value in (("lambda_2c", lambda_2c), ("ac_weight", ac_weight)):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value}")
    if not (math.isfinite(tau) and tau > 0):
        raise ValueError(f"tau must be a finite number > 0, got {tau}")
    return ADV_LOSSES[adv]


def _class_logits(out: DiscOutput, which: str) -> Tensor:
    if out.class_logits is None:
        raise ValueError(
            f"loss='ac' needs class_logits on the {which} DiscOutput; build the discriminator "
            "with GanArch(loss='ac')"
        )
    return _upcast(out.class_logits)


def discriminator_loss(
    real: DiscOutput,
    fake: DiscOutput,
    y_real: Tensor,
    y_fake: Tensor,
    *,
    loss: GanLoss,
    adv: AdvLoss = "hinge",
    lambda_2c: float = 1.0,
    tau: float = 1.0,
    ac_weight: float = 1.0,
    gather: bool = False,
) -> dict[str, Tensor]:
    """D's loss: adversarial on real and fake, plus the class term of ``loss``.

    - ``"contra"``: ``d_adv + λ · 2C(real.embedding, real.proxy, y_real; τ)``;
    - ``"proj"``: ``d_adv`` (the class is inside the logits);
    - ``"ac"``: ``d_adv + ac_weight · (CE(real.class_logits, y_real) + CE(fake.class_logits,
      y_fake))``.

    Returns ``{"loss": total, "d_adv": ..., and "d_2c" or "d_ac"}``, all scalars with their
    graph (detach before logging).

    Shape:
        real: DiscOutput of N real images; fake: DiscOutput of M fakes; y_real: ``(N,)``;
        y_fake: ``(M,)``
    """
    d_fn, _ = _check_settings(loss, adv, lambda_2c, tau, ac_weight)
    d_adv = d_fn(real.adv, fake.adv)
    parts = {"d_adv": d_adv}
    if loss == "contra":
        parts["d_2c"] = conditional_contrastive_loss(
            real.embedding, real.proxy, y_real, temperature=tau, gather=gather
        )
        total = d_adv + lambda_2c * parts["d_2c"]
    elif loss == "ac":
        parts["d_ac"] = F.cross_entropy(_class_logits(real, "real"), y_real) + F.cross_entropy(
            _class_logits(fake, "fake"), y_fake
        )
        total = d_adv + ac_weight * parts["d_ac"]
    else:
        total = d_adv
    return {"loss": total, **parts}


def generator_loss(
    fake: DiscOutput,
    y_fake: Tensor,
    *,
    loss: GanLoss,
    adv: AdvLoss = "hinge",
    lambda_2c: float = 1.0,
    tau: float = 1.0,
    ac_weight: float = 1.0,
    gather: bool = False,
) -> dict[str, Tensor]:
    """G's loss on D's output for its fakes: adversarial plus the class term of ``loss``.

    - ``"contra"``: ``g_adv + λ · 2C(fake.embedding, fake.proxy, y_fake; τ)``;
    - ``"proj"``: ``g_adv``;
    - ``"ac"``: ``g_adv + ac_weight · CE(fake.class_logits, y_fake)``.

    Returns ``{"loss": total, "g_adv": ..., and "g_2c" or "g_ac"}``.

    Shape:
        fake: DiscOutput of M fakes; y_fake: ``(M,)`` their conditioning labels
    """
    _, g_fn = _check_settings(loss, adv, lambda_2c, tau, ac_weight)
    g_adv = g_fn(fake.adv)
    parts = {"g_adv": g_adv}
    if loss == "contra":
        parts["g_2c"] = conditional_contrastive_loss(
            fake.embedding, fake.proxy, y_fake, temperature=tau, gather=gather
        )
        total = g_adv + lambda_2c * parts["g_2c"]
    elif loss == "ac":
        parts["g_ac"] = F.cross_entropy(_class_logits(fake, "fake"), y_fake)
        total = g_adv + ac_weight * parts["g_ac"]
    else:
        total = g_adv
    return {"loss": total, **parts}
