"""``graphcl augment``: pictures of a molecule and of each augmentation of it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from graphcl.draw import draw_grid
from graphcl.features import featurize
from graphcl.report import augmentation_views, open_run
from shared.config import parse_config, save_config

__all__ = ["Config", "main"]


@dataclass(frozen=True)
class Config:
    """Draw a molecule and one view per augmentation (node dropping, edge perturbation,
    attribute masking, subgraph)."""

    # group: data
    smiles: str = "CC(=O)Oc1ccccc1C(=O)O"  # the molecule to draw, as SMILES (default: aspirin)
    # group: method
    aug_ratio: float = 0.2
    """share of the graph that each augmentation removes or changes, in [0, 1) (subgraph keeps 1
    − ratio)"""
    # group: data
    layout: Literal["pyg", "pretrain-gnns"] = "pyg"
    """atom/bond features: pyg (PyG's from_smiles) or pretrain-gnns (Hu et al.'s 2+2 layout, for
    their data and weights)"""
    # group: run
    seed: int = 0  # random seed of the augmentations; any integer >= 0
    out: Path | None = None  # run folder; none: runs/graphcl/augment-<time>

    def __post_init__(self) -> None:
        if not 0 <= self.aug_ratio < 1:
            raise ValueError(f"aug_ratio must be in [0, 1), got {self.aug_ratio}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
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
