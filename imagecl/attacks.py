"""L∞ gradient-sign attacks on images in [0, 1] pixel units, for any loss of the perturbed batch.

Both attacks take ``loss_fn(x_adv) -> scalar`` to *maximise* and the clean batch ``x``; they
never touch a model themselves. For CLAE (Ho & Vasconcelos 2020) the loss is the contrastive
loss between the embeddings of the first view and of the perturbed one,
``loss_fn = lambda x_adv: nt_xent_loss(f(normalise(x1)), f(normalise(x_adv)))`` with ``x = x1``;
for robustness evaluation it is the cross-entropy of a classifier.

The input gradient comes from ``torch.autograd.grad(loss, x_adv)``: no parameter's ``.grad``
is written (a ``.backward()`` here would leak the attack's gradient into the next optimiser
step). ``loss_fn`` runs under whatever autocast is active, and the attacks never switch a
model between train and eval mode: BatchNorm branches (CLAE's separate adversarial BN) and the
mode are the caller's choice.

Units. ε is in [0, 1] pixel units, applied before normalisation. A normalised input is
``(pixel - mean) / std``, so a step of ε_norm in normalised units is ``ε_pixel = ε_norm · std``
in pixel units (per channel). CLAE's ε = 0.03 is in normalised units: its CIFAR SimCLR code
normalises with mean = std = 0.5 (inputs in [-1, 1]), so ε = 0.03 · 0.5 = 0.015 ≈ 3.8/255
pixel units; under the ImageNet std (≈ 0.226, their tiny-ImageNet runs) or the
CIFAR std (≈ 0.25) the same 0.03 would be ≈ 0.007 ≈ 1.8/255. CLAE also takes no projection to
the valid pixel range; ours always clamps to ``clamp``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

__all__ = ["Attack", "fgsm_contrastive", "pgd_contrastive"]

LossFn = Callable[[Tensor], Tensor]
Attack = Literal["fgsm", "pgd"]  # what robustness evaluation attacks with (imagecl eval --attack)

# Madry et al. 2018 (PGD): step size 2.5 ε / steps, so that a walk can reach the boundary of the
# ε-ball from anywhere in it (random start included) and move along it.
PGD_STEP_FACTOR = 2.5


def fgsm_contrastive(
    loss_fn: LossFn,
    x: Tensor,
    *,
    eps: float,
    clamp: tuple[float, float] = (0.0, 1.0),
) -> Tensor:
    """One fast-gradient-sign step: ``clamp(x + ε · sign(∇_x loss_fn(x)))`` (Goodfellow et al.).

    CLAE's adversarial view is this step from the first view ``x1`` with the contrastive loss
    ``L_CL(f(x1), f(x_adv))`` (Ho & Vasconcelos 2020: ε ≈ 0.015 pixel units; see the module
    docstring for the conversion). ``eps = 0`` returns a copy of ``x`` without calling ``loss_fn``.

    Shape:
        x: ``(N, C, H, W)`` floating, in [0, 1] pixel units (any shape works; not modified)
        returns: detached, the shape, dtype and device of ``x``
    """
    lo, hi = _check_attack(x, eps, clamp)
    if eps == 0.0:
        return x.detach().clone()
    x = x.detach()
    grad = _input_gradient(loss_fn, x)
    return _project(x + eps * grad.sign(), x, eps, lo, hi)


def pgd_contrastive(
    loss_fn: LossFn,
    x: Tensor,
    *,
    eps: float,
    step_size: float | None = None,  # Madry et al. 2018: 2.5 ε / steps
    steps: int = 10,
    random_start: bool = True,
    clamp: tuple[float, float] = (0.0, 1.0),
    generator: torch.Generator | None = None,
) -> Tensor:
    """Projected gradient ascent in the L∞ ball of radius ε around ``x`` (Madry et al. 2018).

    ``x_0 = x + U(-ε, ε)`` (or ``x`` without ``random_start``), projected; then ``steps`` times
    ``x_{t+1} = Π(x_t + step_size · sign(∇ loss_fn(x_t)))``, where Π clips to ``[x - ε, x + ε]``
    and then to ``clamp``. The random start is drawn on the generator's device (CPU without
    one: the global CPU generator) in float32 and then moved to ``x``, so a seeded CPU
    generator gives the same start on every device and dtype. ``eps = 0`` returns a copy of
    ``x`` without calling ``loss_fn``.

    Shape:
        x: ``(N, C, H, W)`` floating, in [0, 1] pixel units (any shape works; not modified)
        returns: detached, the shape, dtype and device of ``x``
    """
    lo, hi = _check_attack(x, eps, clamp)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    if step_size is not None and not (math.isfinite(step_size) and step_size > 0.0):
        raise ValueError(f"step_size must be a finite number > 0, got {step_size!r}")
    if eps == 0.0:
        return x.detach().clone()
    step = PGD_STEP_FACTOR * eps / steps if step_size is None else step_size
    x = x.detach()
    x_adv = x
    if random_start:
        where = generator.device if generator is not None else torch.device("cpu")
        noise = torch.rand(x.shape, generator=generator, device=where)  # U(0, 1), float32
        delta = (2.0 * noise - 1.0).mul_(eps).to(device=x.device, dtype=x.dtype)  # U(-ε, ε)
        x_adv = _project(x + delta, x, eps, lo, hi)
    for _ in range(steps):
        grad = _input_gradient(loss_fn, x_adv)
        x_adv = _project(x_adv + step * grad.sign(), x, eps, lo, hi)
    return x_adv


def _check_attack(x: Tensor, eps: float, clamp: tuple[float, float]) -> tuple[float, float]:
    if not isinstance(x, Tensor) or not x.dtype.is_floating_point:
        what = x.dtype if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"x must be a floating tensor of images in [0, 1], got {what}")
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not math.isfinite(eps):
        raise ValueError(f"eps must be a finite number >= 0 (pixel units), got {eps!r}")
    if eps < 0.0:
        raise ValueError(f"eps must be >= 0 (pixel units), got {eps!r}")
    lo, hi = (float(v) for v in clamp)
    if not lo < hi:
        raise ValueError(f"clamp must be (low, high) with low < high, got {clamp!r}")
    return lo, hi


def _input_gradient(loss_fn: LossFn, x_adv: Tensor) -> Tensor:
    """``∇_x loss_fn(x)`` at ``x_adv`` through ``autograd.grad``: no ``.grad`` is written."""
    x_adv = x_adv.detach().requires_grad_(True)
    with torch.enable_grad():  # an attack inside a no_grad evaluation still needs the graph
        loss = loss_fn(x_adv)
    if not isinstance(loss, Tensor) or loss.ndim != 0:
        shape = tuple(loss.shape) if isinstance(loss, Tensor) else type(loss).__name__
        raise ValueError(f"loss_fn must return a scalar loss tensor, got {shape}")
    grad = None
    if loss.requires_grad:
        (grad,) = torch.autograd.grad(loss, x_adv, allow_unused=True)
    if grad is None:
        raise ValueError("loss_fn's loss does not depend on its input: there is no gradient")
    return grad


def _project(x_adv: Tensor, x: Tensor, eps: float, lo: float, hi: float) -> Tensor:
    """Clip to the L∞ ball of radius ``eps`` around ``x``, then to the pixel range."""
    return torch.clamp(torch.clamp(x_adv, min=x - eps, max=x + eps), lo, hi).detach()
