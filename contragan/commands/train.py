"""``contragan train``: a class-conditional GAN with the 2C loss (ContraGAN), D2D-CE (ReACGAN) or a
baseline.

``--loss contra`` is ContraGAN (Kang & Park 2020): hinge adversarial loss plus λ·2C on D's
projection of real images (D) and of fakes (G), through ``shared.losses`` (``--class-positives
proxy``: the proxy alone in 2C's numerator); ``--loss reacgan`` is ReACGAN (Kang et al. 2021), the
same with D2D-CE in place of 2C (λ 0.5, τ 0.5, ``--margin-pos`` 0.98 unless given); on either,
``--adc`` adds ADC-GAN's fake proxies, ``--proj-adv`` ProjGAN's class projection to the adversarial
logit and ``--lambda-2c-decay N`` lets the class term's weights fall linearly to 0 over the first N
G steps; ``--loss proj`` is the projection discriminator (Miyato & Koyama 2018) and ``--loss ac`` an
auxiliary classifier (ACGAN; ``--no-ac-fakes``: D's classifier on real images only), on the same
networks. The recipe of docs/architecture.md, "ContraGAN": Adam 2e-4 with betas (0.5, 0.999), batch
64, ``n_dis`` = 5 D steps per G step, an EMA generator (0.9999 from step 1000), optional
DiffAugment. ``shared.train.fit_updater`` runs the loop with :class:`contragan.steps.GanUpdater`
(precision, DDP, metrics.csv, checkpoints, exact resume, compared on
:func:`contragan.config.resume_config`); every ``eval_every`` steps rank 0 saves a sample grid of
the EMA generator (one row per class) under ``samples/``. At the end: ``generator.safetensors`` (the
EMA generator), ``arch.json``, ``plots/samples.png``, loss curves, ``summary.json`` and
``report.md``.

``--quick`` trains the small digits networks (a short CPU run).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from contragan.config import QUICK, Config, resume_config
from contragan.data import report_skipped_images
from contragan.models import Built, build, save_arch
from contragan.report import plot_losses, save_class_grid, write_train_report
from shared.checkpoint import export_encoder
from shared.config import parse_config, save_config
from shared.runs import RunDir, open_run, write_summary
from shared.runtime import cleanup_distributed, init_distributed, local_device, select_device
from shared.train import FitResult, LoopConfig, fit_updater

__all__ = ["finish", "main"]


def _grid_saver(
    run: RunDir, cfg: Config, built: Built, device: torch.device
) -> Callable[[nn.Module], dict[str, float]]:
    """The loop's ``evaluate``: a sample grid of the EMA generator, ``samples/grid_step<N>.png``
    (named by the step, so a resumed run writes the same files as an uninterrupted one)."""

    def evaluate(generator: nn.Module) -> dict[str, float]:
        path = run.path / "samples" / f"grid_step{built.updater.steps_done:06d}.png"
        save_class_grid(generator, built.arch, path, device=device, seed=cfg.seed)
        return {}

    return evaluate


def _save_settings(run: RunDir, cfg: Config, built: Built) -> None:
    """``config.json`` and ``arch.json``, what ``sample`` and ``evaluate`` read the run from.

    On a resume they are written after the loop: a resume it refuses (another config than the
    checkpoint's) must leave them describing the weights in the folder."""
    save_config(cfg, run.path)
    save_arch(built.arch, run)


def finish(
    run: RunDir, cfg: Config, built: Built, result: FitResult, device: torch.device
) -> dict[str, Any]:
    """Export the EMA generator, save the final grid and curves, write summary and report."""
    arch = built.arch
    generator = built.updater.generator()
    export_encoder(
        generator,
        run.path / "generator.safetensors",
        metadata={"arch": json.dumps(asdict(arch)), "loss": cfg.loss, "data": cfg.data},
    )
    save_class_grid(generator, arch, run.plots / "samples.png", device=device, seed=cfg.seed)
    plot_losses(run, cfg.loss, cfg.adc)
    summary: dict[str, Any] = {
        "loss": cfg.loss,
        "data": cfg.data,
        "arch": arch.name,
        "steps": result.step,
        "skipped": len(built.data.skipped),
        **{k: v for k, v in result.metrics.items() if k != "epoch"},
    }
    write_summary(run.summary_path, summary)
    write_train_report(run, cfg, arch, built.data, result.step, summary)
    return summary


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``contragan train [options]``: train, then write the run folder; returns the summary."""
    cfg = parse_config(Config, argv, prog="contragan train", presets={"quick": QUICK})
    device = select_device(cfg.device)
    env = init_distributed(device)
    device = local_device(device, env)
    try:
        run = open_run(
            cfg.out, Path("runs") / "contragan" / cfg.loss, resume=cfg.resume, rank=env.rank
        )
        resume = cfg.resume and run.last_checkpoint.is_file()  # none yet: from step 0
        built = build(cfg, device=device, env=env)
        if env.rank == 0:
            if not resume:  # a resume rewrites them only once the loop has accepted its config
                _save_settings(run, cfg, built)
            report_skipped_images(built.data, run)  # skipped.csv and one line
        loop_cfg = LoopConfig(
            epochs=cfg.epochs,
            max_steps=cfg.max_steps,
            log_every=cfg.log_every,
            eval_every=cfg.eval_every,
            checkpoint_every=cfg.checkpoint_every,
            amp=cfg.amp,
            progress=cfg.progress,
        )
        result = fit_updater(
            built.updater,
            built.loader,
            loop_cfg=loop_cfg,
            run_dir=run,
            device=device,
            evaluate=_grid_saver(run, cfg, built, device),
            evaluate_on_all_ranks=False,  # the grid is drawn once, on rank 0
            resume=resume,
            dist_env=env,
            config=resume_config(cfg),
        )
        summary: dict[str, Any] = {}
        if env.rank == 0:
            if resume:
                _save_settings(run, cfg, built)
            summary = finish(run, cfg, built, result, device)
        return summary
    finally:
        cleanup_distributed()
