"""``imagecl train``: SimCLR, SupCon, cross-entropy, CLAE or LoCo image training on one path.

The same data, on-device augmentation, backbone and loop serve every method; what differs is the
method's entry in :data:`imagecl.steps.METHODS` (its model, its step, its checks):

* ``simclr`` (Chen et al. 2020): two views, NT-Xent on z = g(h) (τ = 0.5, the CIFAR setting),
  every rank's samples as negatives under DDP; ``--queue-size K`` adds the last K keys as
  extra negatives (MoCo's queue, for small batches); ``--loss nt_logistic|triplet|generalized``
  swaps NT-Xent for SimCLR's alternatives or the generalized loss (:mod:`imagecl.losses`).
* ``supcon`` (Khosla et al. 2020): ``views`` views, ``L_out`` (or ``L_in``) with the labels
  (τ = 0.1); the two-stage protocol is this pre-training followed by ``imagecl eval``'s linear
  classifier on frozen h, the joint variant (``--joint-classifier``) trains a classifier on
  stop-gradient h alongside.
* ``ce``: the same backbone and augmentation (one view) with a linear classifier, end to end.
* ``clae`` (Ho & Vasconcelos 2020) = ``simclr`` + ``--adversarial``: an adversarial view from
  the first one (:mod:`imagecl.clae`) adds α·L(f(x1), f(x_adv)); ``--adversarial`` does the same
  for SupCon.
* ``loco`` (Xiong et al. 2020): the backbone split into ``stages`` local units, each with its
  own head and NT-Xent (:mod:`imagecl.loco`); ``--overlap 0`` is Greedy InfoMax,
  ``--end-to-end`` the same model trained end to end (the baseline). Trained unit by unit
  (:class:`imagecl.loco.LocalUpdater`: each unit's backward frees its activations before the
  next unit runs), DDP included.

An online linear probe on detached h (its own parameter group, no weight decay) reports
``probe_acc`` as training goes. LARS (or SGD/Adam) with linear learning-rate scaling
(lr × batch / 256) and SimCLR's warm-up + cosine schedule (:func:`imagecl.models.build`);
``shared.train.fit`` (or ``fit_updater`` for a method with an updater, LoCo) does the rest:
precision, DDP, checkpoints, exact resume, metrics.csv. At the end the encoder is exported
and evaluated (:func:`imagecl.report.finish_run`).
"""

from __future__ import annotations

from typing import Any

from imagecl.config import QUICK, Config
from imagecl.data import report_skipped_images
from imagecl.evaluate import make_monitor
from imagecl.models import build
from imagecl.report import finish_run, open_run
from imagecl.steps import METHODS, make_step
from shared.config import parse_config, save_config
from shared.runtime import cleanup_distributed, init_distributed, local_device, select_device
from shared.train import FitResult, LoopConfig, fit, fit_updater

__all__ = ["main"]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``imagecl train [options]``: train, then evaluate the encoder and write the run folder."""
    cfg = parse_config(Config, argv, prog="imagecl train", presets={"quick": QUICK})
    device = select_device(cfg.device)
    env = init_distributed(device)
    device = local_device(device, env)
    try:
        run = open_run(cfg.out, cfg.method, resume=cfg.resume, env=env)
        resume = cfg.resume and run.last_checkpoint.is_file()  # none yet: from step 0
        if env.rank == 0:
            save_config(cfg, run.path)
        built = build(cfg, device=device, env=env)
        if env.rank == 0:
            report_skipped_images(built.data, run)  # skipped.csv and one line
        loop_cfg = LoopConfig(
            epochs=cfg.epochs,
            max_steps=cfg.max_steps,
            log_every=cfg.log_every,
            eval_every=cfg.eval_every,
            checkpoint_every=cfg.checkpoint_every,
            amp=cfg.amp,
        )
        where = f"imagecl train ({cfg.method})"
        monitor = make_monitor(built.data, device, seed=cfg.seed, where=where)
        gather = env.is_distributed
        make_updater = METHODS[cfg.method].updater
        result: FitResult
        if make_updater is not None:  # a step of its own (LoCo: per-unit backward)
            updater = make_updater(
                cfg,
                built.model,
                built.optimizer,
                views=built.views,
                gather=gather,
                scheduler=built.scheduler,
            )
            result = fit_updater(
                updater,
                built.loader,
                loop_cfg=loop_cfg,
                run_dir=run,
                device=device,
                evaluate=monitor,
                evaluate_on_all_ranks=True,
                resume=resume,
                dist_env=env,
                config=cfg,
            )
        else:
            result = fit(
                built.model,
                built.optimizer,
                built.loader,
                make_step(cfg, views=built.views, gather=gather),
                loop_cfg=loop_cfg,
                run_dir=run,
                device=device,
                scheduler=built.scheduler,
                evaluate=monitor,
                resume=resume,
                dist_env=env,
                config=cfg,
            )
        summary: dict[str, Any] = {}
        if env.rank == 0:
            summary = finish_run(run, cfg, built, result.step, device)
        return summary
    finally:
        cleanup_distributed()
