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

from typing import Any

import torch
from torch import Tensor, nn

from imagecl.attacks import fgsm_contrastive, pgd_contrastive
from imagecl.dual_bn import adversarial_rows, frozen_bn_statistics
from shared.losses import nt_xent_loss, supcon_loss

__all__ = ["adversarial_view", "frozen_bn_statistics", "pair_loss"]


def pair_loss(cfg: Any, a: Tensor, b: Tensor, labels: Tensor, gather: bool) -> Tensor:
    """The method's loss between two views: NT-Xent (SimCLR) or SupCon with the labels.

    Shape:
        a, b: ``(N, D)``; labels: ``(N,)``; result: scalar.
    """
    if cfg.base_method == "supcon":
        features = torch.stack([a, b], dim=1)  # (N, 2, D)
        return supcon_loss(
            features, labels, temperature=cfg.tau, variant=cfg.variant, gather=gather
        )
    return nt_xent_loss(a, b, temperature=cfg.tau, gather=gather)


def adversarial_view(
    model: nn.Module, x1: Tensor, labels: Tensor, *, cfg: Any, mean: Tensor, std: Tensor
) -> Tensor:
    """x_adv from the normalised first view ``x1``, returned normalised and detached.

    The attack runs on the unwrapped model (no DDP hooks; input gradients only, parameter
    gradients untouched) with the adversarial batch-norm branch when ``cfg.adv_bn``; its loss
    contrasts f(x_adv) with the fixed f(x1). Local to each rank (no gather). Every forward here
    normalises with batch statistics (train mode) and leaves all running statistics as they
    were (:func:`frozen_bn_statistics`; see the module docstring).

    Shape:
        x1: ``(N, C, S, S)``; mean, std: ``(C,)``; result: ``(N, C, S, S)``.
    """
    m, s = mean.view(1, -1, 1, 1), std.view(1, -1, 1, 1)
    pixels = (x1.detach() * s + m).clamp(0, 1)  # (N, C, S, S) in [0, 1]
    rows = x1.shape[0] if cfg.adv_bn else 0
    with frozen_bn_statistics(model):
        with torch.no_grad():
            z1 = model(x1).z.detach()  # (N, D) the anchor the attack moves away from

        def loss_fn(x_adv: Tensor) -> Tensor:
            with adversarial_rows(model, rows):
                z_adv = model((x_adv - m) / s).z
            return pair_loss(cfg, z1, z_adv, labels, gather=False)

        if cfg.adv_steps == 1:
            x_adv = fgsm_contrastive(loss_fn, pixels, eps=cfg.adv_eps)
        else:
            x_adv = pgd_contrastive(loss_fn, pixels, eps=cfg.adv_eps, steps=cfg.adv_steps)
    return ((x_adv - m) / s).detach()  # (N, C, S, S) normalised
