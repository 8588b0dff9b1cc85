"""``contragan sample``: a grid of class-conditional samples from a training checkpoint.

One row per class, ``--per-class`` samples in each, from the EMA generator (``--no-ema`` for
the trained one), ``z`` drawn from ``--seed`` alone: the same command draws the same grid.
``--classes`` takes ``0-9``, ``1,3,5`` or a mix (``0-2,7``). ``--tensors PATH`` also saves the
samples (float in [-1, 1]) and their labels as safetensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import safetensors.torch
import torch

from contragan.train import load_generator, save_class_grid
from shared.checkpoint import atomic_write
from shared.config import parse_config
from shared.runtime import runs_on_this_rank, select_device

__all__ = ["Config", "main", "parse_classes"]


@dataclass(frozen=True)
class Config:
    """Draw a grid of samples, one row per class, from a contragan checkpoint."""

    # group: data
    checkpoint: Path | None = None  # a contragan run's checkpoints/last.pt (required)
    # group: method
    classes: str = "all"
    """classes to draw, one row each: all, or ids and ranges such as 0-9, 1,3,5 or 0-2,7"""
    per_class: int = 8  # samples per class (columns of the grid), >= 1
    # group: run
    out: Path = Path("samples.png")  # the PNG file of the grid
    tensors: Path | None = None
    """also save the samples and labels to this safetensors file; none: no"""
    # group: method
    ema: bool = True  # use the EMA generator when the run kept one
    # group: run
    seed: int = 0  # random seed of the latent vectors z; any integer >= 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto: CUDA when available, else CPU; or force cpu / cuda"""

    def __post_init__(self) -> None:
        if self.per_class < 1:
            raise ValueError(f"per_class must be >= 1, got {self.per_class}")


def parse_classes(spec: str, num_classes: int) -> list[int]:
    """``"0-2,7"`` -> ``[0, 1, 2, 7]``; ``"all"`` -> every class; each within ``num_classes``."""
    if spec.strip() == "all":
        return list(range(num_classes))
    classes: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        try:
            if "-" in part:
                low, high = (int(x) for x in part.split("-", 1))
                if low > high:
                    raise ValueError
                classes.extend(range(low, high + 1))
            else:
                classes.append(int(part))
        except ValueError:
            raise ValueError(
                f"--classes {spec!r}: {part!r} is not a class or a range like 0-9"
            ) from None
    bad = [c for c in classes if not 0 <= c < num_classes]
    if bad:
        raise ValueError(f"--classes {spec!r}: {bad} outside 0..{num_classes - 1}")
    return classes


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``contragan sample --checkpoint RUN/checkpoints/last.pt [options]``."""
    cfg = parse_config(Config, argv, prog="contragan sample", presets={"quick": {}})
    if not runs_on_this_rank("contragan sample"):  # one process: under torchrun, rank 0 alone
        return {}
    if cfg.checkpoint is None:
        raise ValueError("--checkpoint is required (a run's checkpoints/last.pt)")
    device = select_device(cfg.device)
    _, arch, generator = load_generator(cfg.checkpoint, device=device, ema=cfg.ema)
    classes = parse_classes(cfg.classes, arch.num_classes)
    images = save_class_grid(
        generator, arch, cfg.out, device=device, seed=cfg.seed, classes=classes,
        per_class=cfg.per_class,
    )  # fmt: skip
    grid = cfg.out
    result: dict[str, Any] = {"grid": str(grid), "classes": classes, "per_class": cfg.per_class}
    if cfg.tensors is not None:
        labels = torch.tensor(classes).repeat_interleave(cfg.per_class)
        payload = {"images": images.mul(2).sub(1).contiguous(), "labels": labels}
        with atomic_write(cfg.tensors) as handle:
            handle.write(safetensors.torch.save(payload))
        result["tensors"] = str(cfg.tensors)
    print(f"wrote {grid} ({len(classes)} classes × {cfg.per_class})")
    return result
