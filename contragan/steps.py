"""One GAN training step for :func:`shared.train.fit_updater`: ``n_dis`` D steps, one G step.

:class:`GanUpdater` is the GAN's :class:`~shared.updaters.Updater`. A step takes ``n_dis`` real
batches: for each, fakes from fresh ``z`` and uniformly drawn classes (no gradient into G), one
forward of D over real and fake together (one DDP forward; D has no batch norm, so this equals
two forwards), the discriminator loss, one D optimizer step. Then G makes ``batch_size`` fakes,
D scores them (unwrapped: no DDP all-reduce of D's gradients, which the next D step discards)
and G takes one step. The EMA generator copies G until ``ema_start`` and averages it after
(decay ``ema_decay``, StudioGAN's 0.9999 from step 1000); G's buffers (batch-norm statistics,
spectral-norm vectors) are copied, not averaged. DiffAugment, when on, is applied to real and
fake alike before D. Real images arrive as uint8 and become [-1, 1] on the device.

The step is the same for every method; what differs is D's and G's loss, one row per method in
:data:`GAN_LOSSES` (adding a method: its two functions in :mod:`contragan.losses`, a row here,
its name in :data:`contragan.arch.LOSSES`, and its head in :mod:`contragan.networks`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from contragan.arch import GanLoss
from contragan.data import to_signed_unit
from contragan.diffaug import diff_augment
from contragan.losses import (
    AdvLoss,
    ClassPositives,
    LossSettings,
    ac_d_loss,
    ac_g_loss,
    contra_d_loss,
    contra_g_loss,
    proj_d_loss,
    proj_g_loss,
    reacgan_d_loss,
    reacgan_g_loss,
)
from contragan.networks import DiscOutput
from shared.runtime import unwrap
from shared.updaters import StepContext, Updater

__all__ = ["GAN_LOSSES", "GanLossFns", "GanUpdater", "discriminator_loss", "generator_loss"]

DLoss = Callable[[DiscOutput, DiscOutput, Tensor, Tensor, LossSettings], dict[str, Tensor]]
GLoss = Callable[[DiscOutput, Tensor, LossSettings], dict[str, Tensor]]


class GanLossFns(NamedTuple):
    """A method's D loss ``(real, fake, y_real, y_fake, settings)`` and G loss ``(fake, y_fake,
    settings)``, each returning ``{"loss": total, ...its logged parts}``."""

    discriminator: DLoss
    generator: GLoss


# method name (--loss) -> its D and G losses
GAN_LOSSES: dict[str, GanLossFns] = {
    "contra": GanLossFns(contra_d_loss, contra_g_loss),
    "reacgan": GanLossFns(reacgan_d_loss, reacgan_g_loss),
    "proj": GanLossFns(proj_d_loss, proj_g_loss),
    "ac": GanLossFns(ac_d_loss, ac_g_loss),
}


def gan_losses(loss: str) -> GanLossFns:
    """The D and G losses of method ``loss``, or a ValueError naming the methods."""
    if loss not in GAN_LOSSES:
        raise ValueError(f"loss must be one of {tuple(GAN_LOSSES)}, got {loss!r}")
    return GAN_LOSSES[loss]


def discriminator_loss(
    real: DiscOutput,
    fake: DiscOutput,
    y_real: Tensor,
    y_fake: Tensor,
    *,
    loss: GanLoss,
    adv: AdvLoss = "hinge",
    lambda_2c: float | None = None,
    tau: float | None = None,
    ac_weight: float = 1.0,
    gather: bool = False,
    class_positives: ClassPositives = "all",
    margin_pos: float | None = None,
    ac_fakes: bool = True,
    adc: bool = False,
) -> dict[str, Tensor]:
    """D's loss of method ``loss``: adversarial on real and fake, plus the method's class term.

    Unset λ, τ and m_p take the method's reference values (:meth:`LossSettings.resolve`).
    Returns ``{"loss": total, "d_adv": ..., and "d_2c", "d_d2dce" or "d_ac"}`` (see
    :func:`contragan.losses.contra_d_loss` and its siblings).

    Shape:
        real: DiscOutput of N real images; fake: DiscOutput of M fakes; y_real: ``(N,)``;
        y_fake: ``(M,)``
    """
    fns = gan_losses(loss)
    settings = LossSettings.resolve(
        loss,
        adv=adv,
        lambda_2c=lambda_2c,
        tau=tau,
        ac_weight=ac_weight,
        gather=gather,
        class_positives=class_positives,
        margin_pos=margin_pos,
        ac_fakes=ac_fakes,
        adc=adc,
    )
    return fns.discriminator(real, fake, y_real, y_fake, settings)


def generator_loss(
    fake: DiscOutput,
    y_fake: Tensor,
    *,
    loss: GanLoss,
    adv: AdvLoss = "hinge",
    lambda_2c: float | None = None,
    tau: float | None = None,
    ac_weight: float = 1.0,
    gather: bool = False,
    class_positives: ClassPositives = "all",
    margin_pos: float | None = None,
    adc: bool = False,
    g_lambda_2c: float | None = None,
) -> dict[str, Tensor]:
    """G's loss of method ``loss`` on D's output for its fakes: adversarial plus the class term.

    The class term weighs ``g_lambda_2c`` when given, else λ (``lambda_2c``) as in D's loss.

    Returns ``{"loss": total, "g_adv": ..., and "g_2c", "g_d2dce" or "g_ac"}``.

    Shape:
        fake: DiscOutput of M fakes; y_fake: ``(M,)`` their conditioning labels
    """
    fns = gan_losses(loss)
    settings = LossSettings.resolve(
        loss,
        adv=adv,
        lambda_2c=lambda_2c,
        tau=tau,
        ac_weight=ac_weight,
        gather=gather,
        class_positives=class_positives,
        margin_pos=margin_pos,
        adc=adc,
        g_lambda_2c=g_lambda_2c,
    )
    return fns.generator(fake, y_fake, settings)


def _map(out: DiscOutput, fn: Callable[[Tensor], Tensor]) -> DiscOutput:
    """``fn`` applied to every field of ``out`` that is a tensor."""
    logits, fake_proxy = out.class_logits, out.fake_proxy
    return DiscOutput(
        fn(out.adv),
        fn(out.embedding),
        fn(out.proxy),
        None if logits is None else fn(logits),
        None if fake_proxy is None else fn(fake_proxy),
    )


def _split(out: DiscOutput, n: int) -> tuple[DiscOutput, DiscOutput]:
    """The first ``n`` rows of every field and the rest."""
    return _map(out, lambda t: t[:n]), _map(out, lambda t: t[n:])


def _float(out: DiscOutput) -> DiscOutput:
    """Losses run in float32 outside autocast."""
    return _map(out, lambda t: t.float())


class GanUpdater(Updater):
    """G and D (possibly DDP-wrapped), their Adam optimizers and an EMA copy of G.

    ``settings`` are the D and G losses' (``gather=True`` under DDP); none: the method's
    reference (:meth:`LossSettings.resolve`). ``class_decay`` N: the class term's weights, D's λ
    and G's, fall linearly from their values in ``settings`` at G step 1 (and its D steps) to
    0 at G step N + 1, then stay 0; they are logged as ``d_class_weight`` and
    ``g_class_weight``. None: constant."""

    def __init__(
        self,
        generator: nn.Module,
        discriminator: nn.Module,
        *,
        num_classes: int,
        z_dim: int,
        loss: GanLoss,
        settings: LossSettings | None = None,
        n_dis: int = 5,
        g_lr: float = 2e-4,
        d_lr: float = 2e-4,
        betas: tuple[float, float] = (0.5, 0.999),
        g_batch_size: int = 64,
        ema: bool = True,
        ema_decay: float = 0.9999,
        ema_start: int = 1000,
        diffaug: str | None = None,
        class_decay: int | None = None,
    ) -> None:
        if class_decay is not None and class_decay < 1:
            raise ValueError(f"class_decay must be >= 1 or None, got {class_decay}")
        if n_dis < 1 or g_batch_size < 1 or num_classes < 1:
            raise ValueError(
                f"n_dis, g_batch_size and num_classes must be >= 1, got {n_dis}, "
                f"{g_batch_size}, {num_classes}"
            )
        if not 0.0 <= ema_decay < 1.0 or ema_start < 0:
            raise ValueError(
                f"need 0 <= ema_decay < 1 and ema_start >= 0, got {ema_decay}, {ema_start}"
            )
        self.g, self.d = generator, discriminator
        self.num_classes, self.z_dim = num_classes, z_dim
        self.losses = gan_losses(loss)
        self.loss_settings = LossSettings.resolve(loss) if settings is None else settings
        self.batches_per_step = n_dis
        self.g_batch_size = g_batch_size
        self.g_opt = torch.optim.Adam(generator.parameters(), lr=g_lr, betas=betas)
        self.d_opt = torch.optim.Adam(discriminator.parameters(), lr=d_lr, betas=betas)
        self.ema: AveragedModel | None = None
        if ema:  # the container (module + n_averaged, as checkpoints hold it); see _update_ema
            average = get_ema_multi_avg_fn(ema_decay)  # type: ignore[no-untyped-call]
            self.ema = AveragedModel(unwrap(generator), multi_avg_fn=average)
        self.ema_decay = ema_decay
        self._ema_updates = 0  # a host copy of ema.n_averaged
        self.ema_start = ema_start
        self.diffaug = diffaug
        self.class_decay = class_decay
        self.steps_done = 0  # the loop's step number after the last step

    def _fakes(self, n: int, device: torch.device) -> tuple[Tensor, Tensor]:
        z = torch.randn(n, self.z_dim, device=device)
        y = torch.randint(0, self.num_classes, (n,), device=device)
        return z, y

    def settings_at(self, step: int) -> LossSettings:
        """The loss settings of G step ``step`` (from 1) and of its D steps: D's and G's class
        weights scaled by ``class_decay``'s linear schedule, else :attr:`loss_settings`
        unchanged. A function of the step alone, so a resumed run weighs every step as an
        uninterrupted one."""
        if self.class_decay is None:
            return self.loss_settings
        left = max(0.0, 1.0 - (step - 1) / self.class_decay)
        settings = self.loss_settings
        return replace(
            settings, lambda_2c=settings.lambda_2c * left, g_lambda_2c=settings.g_weight * left
        )

    def _augment(self, x: Tensor) -> Tensor:
        return x if self.diffaug is None else diff_augment(x, self.diffaug)

    def step(self, batches: Iterator[Any], ctx: StepContext) -> dict[str, Tensor | float]:
        sums: dict[str, Tensor] = {}
        settings = self.settings_at(ctx.step)
        for images, labels in batches:
            real = to_signed_unit(ctx.to_device(images)).contiguous(
                memory_format=torch.channels_last
            )
            y_real = ctx.to_device(labels)
            z, y_fake = self._fakes(real.shape[0], ctx.device)
            with ctx.autocast():
                with torch.no_grad():
                    fake = unwrap(self.g)(z, y_fake)
                both = self._augment(torch.cat([real, fake.to(real.dtype)]))
                out = self.d(both, torch.cat([y_real, y_fake]))
            out_real, out_fake = _split(_float(out), real.shape[0])
            parts = self.losses.discriminator(out_real, out_fake, y_real, y_fake, settings)
            self.d_opt.zero_grad(set_to_none=True)  # also what the last G step left on D
            ctx.backward(parts["loss"], "d_loss")
            self.d_opt.step()
            logged = {**parts, "d_real": out_real.adv.mean(), "d_fake": out_fake.adv.mean()}
            for key, value in logged.items():
                name = "d_loss" if key == "loss" else key
                share = value.detach() / self.batches_per_step
                sums[name] = sums[name] + share if name in sums else share
        z, y_fake = self._fakes(self.g_batch_size, ctx.device)
        with ctx.autocast():
            fake = self._augment(self.g(z, y_fake))
            out = unwrap(self.d)(fake, y_fake)
        g_parts = self.losses.generator(_float(out), y_fake, settings)
        self.g_opt.zero_grad(set_to_none=True)
        ctx.backward(g_parts["loss"], "g_loss")
        self.g_opt.step()
        self._update_ema(ctx.step)
        self.steps_done = ctx.step
        g_logged: dict[str, Tensor | float] = {
            ("g_loss" if k == "loss" else k): v.detach() for k, v in g_parts.items()
        }
        if self.class_decay is not None:
            g_logged["d_class_weight"] = settings.lambda_2c
            g_logged["g_class_weight"] = settings.g_weight
        return {"lr": float(self.g_opt.param_groups[0]["lr"]), **sums, **g_logged}

    @torch.no_grad()
    def _update_ema(self, step: int) -> None:
        """AveragedModel.update_parameters with the EMA average, bit for bit, without its host
        read of the device counter ``n_averaged`` (a wait for the GPU every G step): the branch
        is taken on the host copy ``_ema_updates``; ``n_averaged`` is still counted, on device.
        """
        if self.ema is None:
            return
        g = unwrap(self.g)
        ema_params: list[Tensor] = list(self.ema.module.parameters())
        params: list[Tensor] = list(g.parameters())
        if step > self.ema_start and self._ema_updates > 0:
            torch._foreach_lerp_(ema_params, params, 1.0 - self.ema_decay)
        else:  # before the start, and at the first update, the EMA is G itself
            for p_ema, p in zip(ema_params, params, strict=True):
                p_ema.copy_(p)
        if step > self.ema_start:
            self.ema.n_averaged += 1
            self._ema_updates += 1
        for b_ema, b in zip(self.ema.module.buffers(), g.buffers(), strict=True):
            b_ema.copy_(b)

    def generator(self) -> nn.Module:
        """The generator samples come from: the EMA copy when there is one."""
        return unwrap(self.g) if self.ema is None else self.ema.module

    def modules(self) -> Mapping[str, nn.Module]:
        named: dict[str, nn.Module] = {"generator": self.g, "discriminator": self.d}
        if self.ema is not None:
            named["generator_ema"] = self.ema
        return named

    def evaluated(self) -> nn.Module:
        return self.generator()

    def state_dict(self) -> dict[str, Any]:
        return {
            "generator": unwrap(self.g).state_dict(),
            "discriminator": unwrap(self.d).state_dict(),
            "generator_ema": None if self.ema is None else self.ema.module.state_dict(),
            "ema_updates": None if self.ema is None else self.ema.n_averaged.clone(),
            "g_optimizer": self.g_opt.state_dict(),
            "d_optimizer": self.d_opt.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if (self.ema is None) != (state["generator_ema"] is None):
            raise ValueError("an EMA generator must be kept now if and only if it was then")
        unwrap(self.g).load_state_dict(state["generator"])
        unwrap(self.d).load_state_dict(state["discriminator"])
        if self.ema is not None:
            self.ema.module.load_state_dict(state["generator_ema"])
            self.ema.n_averaged.copy_(state["ema_updates"])
            self._ema_updates = int(state["ema_updates"])  # one read, when a run resumes
        self.g_opt.load_state_dict(state["g_optimizer"])
        self.d_opt.load_state_dict(state["d_optimizer"])
