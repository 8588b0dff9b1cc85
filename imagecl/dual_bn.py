"""A separate batch-norm branch for adversarial examples (CLAE, Ho & Vasconcelos 2020).

Adversarial images have other activation statistics than clean ones; CLAE normalises them with
their own batch-norm layers (momentum 0.01) so they do not disturb the clean statistics used at
test time (the "auxiliary BN" of AdvProp). :func:`convert_dual_bn` gives every ``BatchNorm2d``
of a model a twin; inside ``with adversarial_rows(model, k)`` the last ``k`` rows of every
batch go through the twins. One forward pass can so hold clean and adversarial rows, which
keeps a training step to one forward and one backward (what DDP expects). The twins serve
training only: :func:`revert_dual_bn` puts the clean layers back, which gives the plain network
that evaluation, fine-tuning and export expect (its ``state_dict`` keys are a plain model's).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

__all__ = [
    "DualBatchNorm2d",
    "adversarial_rows",
    "convert_dual_bn",
    "frozen_bn_statistics",
    "revert_dual_bn",
]

ADVERSARIAL_MOMENTUM = 0.01  # CLAE's adversarial BN branch


class DualBatchNorm2d(nn.Module):
    """A clean ``BatchNorm2d`` and its adversarial twin; ``adv_rows`` trailing rows use the twin.

    Shape:
        input and output: ``(N, C, H, W)``.
    """

    def __init__(self, clean: nn.BatchNorm2d, momentum: float = ADVERSARIAL_MOMENTUM) -> None:
        super().__init__()
        self.clean = clean
        self.adversarial = copy.deepcopy(clean)
        self.adversarial.momentum = momentum
        self.adv_rows = 0

    def forward(self, x: Tensor) -> Tensor:
        k = self.adv_rows
        if k <= 0:
            return self.clean(x)  # type: ignore[no-any-return]
        if k >= x.shape[0]:
            return self.adversarial(x)  # type: ignore[no-any-return]
        return torch.cat([self.clean(x[:-k]), self.adversarial(x[-k:])])  # (N, C, H, W)


def convert_dual_bn(module: nn.Module, momentum: float = ADVERSARIAL_MOMENTUM) -> nn.Module:
    """Replace every ``BatchNorm2d`` inside ``module`` by a :class:`DualBatchNorm2d` (in place)."""
    for name, child in module.named_children():
        if isinstance(child, nn.BatchNorm2d):
            setattr(module, name, DualBatchNorm2d(child, momentum))
        else:
            convert_dual_bn(child, momentum)
    return module


def revert_dual_bn(module: nn.Module) -> nn.Module:
    """Replace every :class:`DualBatchNorm2d` inside ``module`` by its clean branch (in place).

    The inverse of :func:`convert_dual_bn`: the adversarial twins are dropped, and the clean
    ``BatchNorm2d`` layers (the statistics test images are normalised with) keep their weights
    and running statistics, so ``module`` computes what it computed outside
    :func:`adversarial_rows` and loads into a network built without dual batch norm.
    """
    for name, child in module.named_children():
        if isinstance(child, DualBatchNorm2d):
            setattr(module, name, child.clean)
        else:
            revert_dual_bn(child)
    return module


@contextmanager
def adversarial_rows(module: nn.Module, rows: int) -> Iterator[None]:
    """Route the last ``rows`` rows of each batch through the adversarial twins (0: none)."""
    layers = [m for m in module.modules() if isinstance(m, DualBatchNorm2d)]
    for layer in layers:
        layer.adv_rows = rows
    try:
        yield
    finally:
        for layer in layers:
            layer.adv_rows = 0


@contextmanager
def frozen_bn_statistics(module: nn.Module) -> Iterator[None]:
    """Inside, no batch norm of ``module`` updates its running statistics or batch count.

    In train mode the layers still normalise with the batch's own statistics (exactly as
    before); in eval mode they use the running statistics as always. Each layer's
    ``track_running_stats`` is switched off and restored on exit.
    """
    layers = [
        m
        for m in module.modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats
    ]
    for layer in layers:
        layer.track_running_stats = False
    try:
        yield
    finally:
        for layer in layers:
            layer.track_running_stats = True
