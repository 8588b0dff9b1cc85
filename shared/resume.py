"""The loop's checkpoints: what they hold, and how a resume checks and restores them.

A checkpoint of :func:`shared.train.fit` holds the updater's state (weights, optimizer and
scheduler states, ...), the position in the run (:class:`Progress`: step, epoch, micro-batch in
the epoch, best metric), every rank's RNG states right after the checkpoint and at the start of
its epoch, and the resolved config (:func:`resolved_config`). A resume must match the stored
batch layout, process count and config, except the keys of :data:`RESUME_MAY_CHANGE`. See
docs/architecture.md, "Training loop" and "Run folders".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from shared.checkpoint import load_checkpoint, rng_state, save_checkpoint
from shared.config import config_to_dict
from shared.field_types import jsonable
from shared.loop_config import LoopConfig, PipelineConfig
from shared.runtime import DistEnv, unwrap
from shared.updaters import Updater, check_finite

__all__ = [
    "RESUME_MAY_CHANGE",
    "LoopCheckpoints",
    "Progress",
    "check_parameters",
    "config_differences",
    "flatten_config",
    "resolved_config",
]

# Config keys (at any nesting level) that may differ on resume: they extend or observe a run
# without changing what its steps compute. Everything else must match the checkpoint's config.
RESUME_MAY_CHANGE = frozenset(
    {
        "epochs",
        "max_steps",
        "log_every",
        "eval_every",
        "checkpoint_every",
        "progress",
        "tensorboard",
        "resume",
        "out",
        "device",
        "num_workers",
    }
)

_MISSING = object()


@dataclass
class Progress:
    """Where the loop stands: steps done, the epoch, micro-batches consumed in the epoch, the
    best value of ``best_metric`` with its step, and the last logged row."""

    step: int = 0
    epoch: int = 0
    batch: int = 0  # micro-batches consumed in the current epoch
    best: float | None = None
    best_step: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)


def check_parameters(modules: Mapping[str, nn.Module], step: int) -> None:
    """Refuse to checkpoint non-finite weights (a NaN gradient with a finite loss gets here)."""
    for prefix, module in modules.items():
        for name, param in unwrap(module).named_parameters():
            label = name if len(modules) == 1 else f"{prefix}.{name}"
            check_finite(param, f"parameter {label}", step)


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"loop": {"epochs": 3}}`` -> ``{"loop.epochs": 3}``; lists and tuples compare as lists."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_config(value, f"{name}."))
        else:
            flat[name] = list(value) if isinstance(value, tuple) else value
    return flat


def resolved_config(loop_cfg: LoopConfig, config: PipelineConfig | None) -> dict[str, Any]:
    """What the checkpoint stores and a resume compares: the loop's settings and the pipeline's.

    Plain JSON-like values (paths become strings), so ``weights_only`` loading accepts them.
    """
    if config is None:
        pipeline: dict[str, Any] = {}
    elif isinstance(config, Mapping):
        pipeline = jsonable(dict(config))
    else:
        pipeline = config_to_dict(config)
    return {"loop": asdict(loop_cfg), "pipeline": pipeline}


def config_differences(
    saved: Mapping[str, Any], now: Mapping[str, Any], may_change: frozenset[str]
) -> list[str]:
    """``"key: old -> new"`` for every flattened key that differs, except ``may_change`` keys
    (matched on the last part of the dotted key, at any nesting level)."""
    before, after = flatten_config(saved), flatten_config(now)
    return [
        f"{key}: {before.get(key, '<absent>')!r} -> {after.get(key, '<absent>')!r}"
        for key in sorted(before.keys() | after.keys())
        if before.get(key, _MISSING) != after.get(key, _MISSING)
        and key.rsplit(".", 1)[-1] not in may_change
    ]


@dataclass(frozen=True)
class LoopCheckpoints:
    """Writes and restores the checkpoints of one run of the loop.

    Args:
        updater: whose state joins every checkpoint (its keys must not clash with the loop's).
        steps_per_epoch, batches_per_step, grad_accum_steps: the batch layout; a resume with
            another layout is refused (the position in the epoch would mean other batches).
        total: the run's last step; a checkpoint past it is refused.
        env: this process's rank and the number of processes.
        config: :func:`resolved_config` of this run.
        may_change: config keys a resume may change.
    """

    updater: Updater
    steps_per_epoch: int
    batches_per_step: int
    grad_accum_steps: int
    total: int
    env: DistEnv
    config: dict[str, Any]
    may_change: frozenset[str]

    def save(
        self,
        path: Path,
        progress: Progress,
        epoch_rng: dict[str, Tensor],
        per_rank: list[dict[str, dict[str, Tensor]]] | None = None,
    ) -> None:
        """Write a checkpoint holding everything that decides the rest of the run.

        ``per_rank`` holds every rank's RNG states (``last.pt``, gathered by the loop); without
        it only this process's states are stored.
        """
        check_parameters(self.updater.modules(), progress.step)
        epoch, batch = progress.epoch, progress.batch
        if batch == self.steps_per_epoch * self.batches_per_step:
            epoch, batch = epoch + 1, 0  # the epoch is complete: resume at the next one
        loop_state = {
            "step": progress.step,
            "epoch": epoch,
            "batch_in_epoch": batch,
            "steps_per_epoch": self.steps_per_epoch,
            "grad_accum_steps": self.grad_accum_steps,
            "batches_per_step": self.batches_per_step,
            "world_size": self.env.world_size,
            "rng": rng_state(),
            "epoch_rng": epoch_rng,
            "rng_per_rank": per_rank,
            "config": self.config,
            "best": progress.best,
            "best_step": progress.best_step,
            "metrics": dict(progress.metrics),
        }
        state = self.updater.state_dict()
        clash = sorted(set(state) & set(loop_state))
        if clash:
            raise ValueError(f"the updater's state uses the loop's checkpoint keys {clash}")
        save_checkpoint(path, {**state, **loop_state})

    def restore(self, path: Path) -> tuple[Progress, dict[str, Any]]:
        """Load ``path`` into the updater (models, optimizers, ...); return the position.

        The returned checkpoint's ``rng``/``epoch_rng`` are this rank's own states.
        """
        ckpt = load_checkpoint(path, map_location="cpu")  # RNG states must stay on the CPU
        per_step = ckpt.get("batches_per_step", ckpt.get("grad_accum_steps"))
        saved = (ckpt.get("steps_per_epoch"), per_step)
        now = (self.steps_per_epoch, self.batches_per_step)
        if saved != now:
            raise ValueError(
                f"{path} was written with (steps_per_epoch, batches_per_step) = {saved}, this "
                f"run has {now}: the position in the epoch would mean different batches"
            )
        self.check_config(path, ckpt)
        if ckpt["step"] > self.total:
            raise ValueError(
                f"{path} is at step {ckpt['step']}, past this run's last step {self.total}: "
                "raise epochs or max_steps to continue it"
            )
        per_rank = ckpt.get("rng_per_rank")
        if per_rank is not None:
            if len(per_rank) != self.env.world_size:
                raise ValueError(
                    f"{path} was written by {len(per_rank)} processes, this run has "
                    f"{self.env.world_size}: each rank's random stream could not be continued"
                )
            ckpt["rng"], ckpt["epoch_rng"] = (
                per_rank[self.env.rank][k] for k in ("rng", "epoch_rng")
            )
        try:
            self.updater.load_state_dict(ckpt)
        except (KeyError, ValueError) as error:
            raise ValueError(f"{path}: {error}") from error
        progress = Progress(
            step=ckpt["step"],
            epoch=ckpt["epoch"],
            batch=ckpt["batch_in_epoch"],
            best=ckpt["best"],
            best_step=ckpt["best_step"],
            metrics=dict(ckpt["metrics"]),
        )
        return progress, ckpt

    def check_config(self, path: Path, ckpt: Mapping[str, Any]) -> None:
        """Refuse to continue a run whose config differs, except in ``may_change`` keys."""
        saved = ckpt.get("config")
        if saved is None:  # a checkpoint without a stored config: nothing to compare
            return
        differ = config_differences(saved, self.config, self.may_change)
        if differ:
            raise ValueError(
                f"cannot resume {path}: the config differs from the checkpoint's in "
                f"{'; '.join(differ)}. Resume with the original settings, or start a new run"
            )
