"""``graphcl augment``: pictures of a molecule and of each augmentation of it."""

from __future__ import annotations

from typing import Any

from graphcl.config import AugmentConfig as Config
from graphcl.draw import draw_grid
from graphcl.features import featurize
from graphcl.report import augmentation_views, open_run
from shared.config import parse_config, save_config

__all__ = ["Config", "main"]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``graphcl augment --smiles SMILES``: the molecule and one view per augmentation."""
    cfg = parse_config(Config, argv, prog="graphcl augment")
    graph = featurize(cfg.smiles, cfg.layout)
    if graph is None:
        raise ValueError(f"--smiles {cfg.smiles!r} is not a valid SMILES")
    run = open_run(cfg.out, "augment")
    save_config(cfg, run.path)
    views, legends = augmentation_views(graph, cfg.layout, cfg.aug_ratio, cfg.seed)
    path = draw_grid(views, legends, run.plots / "augmentations.png", layout=cfg.layout, per_row=5)
    print(f"drawing: {path}")
    return {"drawing": str(path), "atoms": [int(v.num_nodes) for v in views]}
