"""``contragan sample``: a grid of class-conditional samples from a training checkpoint.

One row per class, ``--per-class`` samples in each, from the EMA generator (``--no-ema`` for
the trained one), ``z`` drawn from ``--seed`` alone: the same command draws the same grid.
``--classes`` takes ``0-9``, ``1,3,5`` or a mix (``0-2,7``). ``--tensors PATH`` also saves the
samples (float in [-1, 1]) and their labels as safetensors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from contragan.config import SampleConfig
from contragan.models import load_generator
from contragan.report import save_class_grid
from shared.checkpoint import atomic_write
from shared.config import parse_config
from shared.runtime import runs_on_this_rank, select_device

__all__ = ["grid_path", "main", "parse_classes"]


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


def grid_path(out: Path) -> Path:
    """Where ``--out`` puts the grid: ``samples.png`` inside a folder (an existing one, or a
    name without a suffix, created), else the file itself, which must be .png or .jpg."""
    if out.is_dir() or not out.suffix:
        out.mkdir(parents=True, exist_ok=True)
        return out / "samples.png"
    if out.suffix.lower() not in (".png", ".jpg", ".jpeg"):
        raise ValueError(f"--out {out}: the grid is an image, name a .png or .jpg file or a folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``contragan sample --checkpoint RUN/checkpoints/last.pt [options]``."""
    cfg = parse_config(SampleConfig, argv, prog="contragan sample", presets={"quick": {}})
    if not runs_on_this_rank("contragan sample"):  # one process: under torchrun, rank 0 alone
        return {}
    assert cfg.checkpoint is not None  # SampleConfig requires it
    device = select_device(cfg.device)
    grid = grid_path(cfg.out)
    _, arch, generator = load_generator(cfg.checkpoint, device=device, ema=cfg.ema)
    classes = parse_classes(cfg.classes, arch.num_classes)
    images = save_class_grid(
        generator,
        arch,
        grid,
        device=device,
        seed=cfg.seed,
        classes=classes,
        per_class=cfg.per_class,
    )
    result: dict[str, Any] = {"grid": str(grid), "classes": classes, "per_class": cfg.per_class}
    if cfg.tensors is not None:
        labels = torch.tensor(classes).repeat_interleave(cfg.per_class)
        payload = {"images": images.mul(2).sub(1).contiguous(), "labels": labels}
        with atomic_write(cfg.tensors) as handle:
            handle.write(safetensors.torch.save(payload))
        result["tensors"] = str(cfg.tensors)
    print(f"wrote {grid} ({len(classes)} classes × {cfg.per_class})")
    return result
