"""GAN adversarial losses: hinge and non-saturating, for D and for G, and their table by name.

Every loss is a mean over the batch, computed in fp32 whatever the autocast dtype (fp64 stays
fp64), so a bf16 logit does not round the loss. :mod:`contragan.losses` adds each method's
class term to them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "ADV_LOSSES",
    "AdvLoss",
    "d_hinge",
    "d_nonsaturating",
    "g_hinge",
    "g_nonsaturating",
    "upcast",
]

AdvLoss = Literal["hinge", "nonsaturating"]


def upcast(x: Tensor) -> Tensor:
    """``x`` in fp32 for a loss, fp64 left as it is."""
    return x if x.dtype == torch.float64 else x.float()


def d_hinge(real_adv: Tensor, fake_adv: Tensor) -> Tensor:
    """Discriminator hinge loss, ``mean(relu(1 − D(x))) + mean(relu(1 + D(G(z))))``.

    Lim & Ye 2017; Miyato et al. 2018, Eq. 16; the loss of BigGAN and StudioGAN's ContraGAN.

    Shape:
        real_adv: ``(N,)``; fake_adv: ``(M,)``; result: scalar
    """
    return F.relu(1 - upcast(real_adv)).mean() + F.relu(1 + upcast(fake_adv)).mean()


def g_hinge(fake_adv: Tensor) -> Tensor:
    """Generator hinge loss, ``−mean(D(G(z)))``.

    Shape:
        fake_adv: ``(M,)``; result: scalar
    """
    return -upcast(fake_adv).mean()


def d_nonsaturating(real_adv: Tensor, fake_adv: Tensor) -> Tensor:
    """Discriminator loss of the original GAN: binary cross-entropy with logits,
    ``mean(softplus(−D(x))) + mean(softplus(D(G(z))))`` (Goodfellow et al. 2014, Eq. 1).

    Shape:
        real_adv: ``(N,)``; fake_adv: ``(M,)``; result: scalar
    """
    return F.softplus(-upcast(real_adv)).mean() + F.softplus(upcast(fake_adv)).mean()


def g_nonsaturating(fake_adv: Tensor) -> Tensor:
    """Non-saturating generator loss, ``mean(softplus(−D(G(z))))`` = −mean log σ(D(G(z)))
    (Goodfellow et al. 2014, Sec. 3).

    Shape:
        fake_adv: ``(M,)``; result: scalar
    """
    return F.softplus(-upcast(fake_adv)).mean()


# (discriminator loss, generator loss) by name: the one string table, for configs and the CLI
ADV_LOSSES: dict[str, tuple[Callable[[Tensor, Tensor], Tensor], Callable[[Tensor], Tensor]]] = {
    "hinge": (d_hinge, g_hinge),
    "nonsaturating": (d_nonsaturating, g_nonsaturating),
}
