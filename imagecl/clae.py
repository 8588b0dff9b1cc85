"""CLAE: adversarial views for any contrastive method (Ho & Vasconcelos 2020).

The adversarial view starts from the first augmented view x1 and climbs the contrastive loss
between f(x1) and f(x_adv) (one FGSM step in the paper, PGD with ``adv_steps > 1``), in [0, 1]
pixel units; training then minimises L(f(x1), f(x2)) + α·L(f(x1), f(x_adv)), α = 1. The
adversarial rows go through a separate batch-norm branch (:mod:`imagecl.dual_bn`).

Batch-norm statistics during the attack. The reference code (chihhuiho/CLAE, ``gen_adv`` in
``SimCLR/main.py``) never leaves train mode: its attack forwards (the anchor and x_adv) run
through the adversarial BN branch, normalise with the attacked batch's statistics and update
that branch's running statistics only, so the clean statistics, the ones evaluation uses, never
see an attack forward. Ours keeps the train-mode normalisation (the attack's result is the same)
and freezes every running statistic while the attack runs (:func:`frozen_bn_statistics`): the
clean statistics see exactly the training forward's clean rows, also without the adversarial
branch (``adv_bn`` off, where the perturbed inputs would otherwise leak into them once per PGD
step) and for our anchor f(x1), which uses the clean branch; the adversarial branch, never
read at evaluation, sees the final x_adv once per step in the training forward (the
reference's sees the anchor and x_adv as well).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from imagecl.attacks import fgsm_contrastive, pgd_contrastive
from imagecl.dual_bn import adversarial_rows, frozen_bn_statistics
from shared.losses import nt_xent_loss, supcon_loss

__all__ = [
    "Adversary",
    "PairLoss",
    "adversarial_view",
    "frozen_bn_statistics",
    "nt_xent_pair",
    "supcon_pair",
]

# the method's loss between two views: (a, b, labels, gather) -> scalar
PairLoss = Callable[[Tensor, Tensor, Tensor, bool], Tensor]


def nt_xent_pair(
    a: Tensor, b: Tensor, labels: Tensor, gather: bool, *, temperature: float
) -> Tensor:
    """SimCLR's pair loss: NT-Xent between the views ``a`` and ``b`` (``labels`` unused).

    Shape:
        a, b: ``(N, D)``; labels: ``(N,)``; result: scalar.
    """
    return nt_xent_loss(a, b, temperature=temperature, gather=gather)


def supcon_pair(
    a: Tensor,
    b: Tensor,
    labels: Tensor,
    gather: bool,
    *,
    temperature: float,
    variant: Literal["out", "in"] = "out",
) -> Tensor:
    """SupCon's pair loss: ``L_out`` (or ``L_in``) over the two views with the labels.

    Shape:
        a, b: ``(N, D)``; labels: ``(N,)``; result: scalar.
    """
    features = torch.stack([a, b], dim=1)  # (N, 2, D)
    return supcon_loss(features, labels, temperature=temperature, variant=variant, gather=gather)


@dataclass(frozen=True)
class Adversary:
    """CLAE's settings: how the adversarial view is made and how much its term weighs."""

    pair_loss: PairLoss  # the method's loss between f(x1) and f(x_adv), climbed and added
    eps: float  # L∞ budget in [0, 1] pixel units
    steps: int = 1  # attack steps: 1 is FGSM (CLAE's), more is PGD
    alpha: float = 1.0  # weight α of the adversarial term, L(x1, x2) + α·L(x1, x_adv)
    dual_bn: bool = True  # adversarial rows through their own batch norm (imagecl.dual_bn)


def adversarial_view(
    model: nn.Module,
    x1: Tensor,
    labels: Tensor,
    *,
    adversary: Adversary,
    mean: Tensor,
    std: Tensor,
) -> Tensor:
    """x_adv from the normalised first view ``x1``, returned normalised and detached.

    The attack runs on the unwrapped model (no DDP hooks; input gradients only, parameter
    gradients untouched) with the adversarial batch-norm branch when ``adversary.dual_bn``; its
    loss, ``adversary.pair_loss``, contrasts f(x_adv) with the fixed f(x1). Local to each rank
    (no gather). Every forward here normalises with batch statistics (train mode) and leaves
    all running statistics as they were (:func:`frozen_bn_statistics`; see the module
    docstring).

    Shape:
        x1: ``(N, C, S, S)``; mean, std: ``(C,)``; result: ``(N, C, S, S)``.
    """
    m, s = mean.view(1, -1, 1, 1), std.view(1, -1, 1, 1)
    pixels = (x1.detach() * s + m).clamp(0, 1)  # (N, C, S, S) in [0, 1]
    rows = x1.shape[0] if adversary.dual_bn else 0
    with frozen_bn_statistics(model):
        with torch.no_grad():
            z1 = model(x1).z.detach()  # (N, D) the anchor the attack moves away from

        def loss_fn(x_adv: Tensor) -> Tensor:
            with adversarial_rows(model, rows):
                z_adv = model((x_adv - m) / s).z
            return adversary.pair_loss(z1, z_adv, labels, False)

        if adversary.steps == 1:
            x_adv = fgsm_contrastive(loss_fn, pixels, eps=adversary.eps)
        else:
            x_adv = pgd_contrastive(loss_fn, pixels, eps=adversary.eps, steps=adversary.steps)
    return ((x_adv - m) / s).detach()  # (N, C, S, S) normalised
