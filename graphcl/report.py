"""Run folders and pictures of the ``graphcl`` commands."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from rdkit import Chem
from rdkit.Chem.Crippen import MolLogP  # type: ignore[attr-defined]
from torch import Tensor, nn

from graphcl.augment import AUGMENTATIONS
from graphcl.data import MoleculeData, collate_graphs
from graphcl.draw import draw_grid
from graphcl.evaluate import embed
from graphcl.features import LAYOUTS
from shared.plots import plot_loss_curves, plot_tsne, save_figure
from shared.runs import RunDir
from shared.runs import open_run as shared_open_run
from shared.runtime import SINGLE_PROCESS, DistEnv

__all__ = ["augmentation_views", "open_run", "plot_joao", "pretrain_plots"]

VIEW_NAMES = ("drop_nodes", "perturb_edges", "mask_attributes", "subgraph")


def open_run(
    out: Path | None, kind: str, *, resume: bool = False, env: DistEnv = SINGLE_PROCESS
) -> RunDir:
    """The run folder: ``out``, or ``runs/graphcl/<kind>-<time>`` (see ``shared.runs.open_run``)."""
    return shared_open_run(out, Path("runs") / "graphcl" / kind, resume=resume, rank=env.rank)


def augmentation_views(graph: Any, layout: str, p: float, seed: int) -> tuple[list[Any], list[str]]:
    """The graph and one view per augmentation (seeded), with legends."""
    batch = collate_graphs([graph])
    views, legends = [graph], ["original"]
    mask = torch.tensor(LAYOUTS[layout].atom_mask)
    for name in VIEW_NAMES:
        generator = torch.Generator().manual_seed(seed)
        kwargs: dict[str, Any] = {"mask_index": mask} if name == "mask_attributes" else {}
        view = AUGMENTATIONS[name](batch, p, generator=generator, **kwargs)
        views.append(view.get_example(0))
        legends.append(f"{name} (p = {p:g})")
    return views, legends


def _logp_bins(smiles: Sequence[str], bins: int = 5) -> Tensor:
    """Quintiles of Crippen logP (a property computed from the molecule) as integer labels."""
    values = []
    for text in smiles:
        mol = Chem.MolFromSmiles(text) if text else None
        values.append(MolLogP(mol) if mol is not None else float("nan"))
    logp = torch.tensor(values)
    edges = torch.nanquantile(logp, torch.linspace(0, 1, bins + 1)[1:-1])
    return torch.bucketize(logp.nan_to_num(float(logp.nanmedian())), edges)


def pretrain_plots(
    run: RunDir, model: nn.Module, data: MoleculeData, cfg: Any, device: torch.device
) -> None:
    """Loss curve, t-SNE of h coloured by logP quintile, a molecule and its views."""
    with run.metrics_path.open(newline="", encoding="utf-8") as handle:
        header = next(csv.reader(handle), [])
    keys = [key for key in ("loss", "joao_max_pair_probability") if key in header]
    plot_loss_curves(run.metrics_path, run.plots / "training.png", keys=keys)
    sample = data.graphs[: min(2000, len(data.graphs))]
    h = embed(model.encoder, sample, device)  # type: ignore[arg-type]
    labels = _logp_bins(data.smiles[: len(sample)])
    plot_tsne(h, labels, run.plots / "tsne_h_logp_quintile.png", seed=cfg.seed, num_threads=1)
    # the first molecule with a ring and 10+ atoms shows every augmentation well
    index = next(
        (i for i, g in enumerate(data.graphs) if g.num_nodes >= 10 and g.num_edges >= 20), 0
    )
    views, legends = augmentation_views(data.graphs[index], cfg.layout, cfg.aug_ratio, cfg.seed)
    draw_grid(views, legends, run.plots / "views.png", layout=cfg.layout, per_row=5)
    joao = getattr(model, "joao", None)
    if joao is not None:
        plot_joao(joao.sampler.history, joao.sampler.names, run.plots / "joao.png")


def plot_joao(history: list[Tensor], names: tuple[str, ...], path: Path) -> Path:
    """JOAO's pair distribution: the last one as a heat map, each pair's probability by epoch."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10.0, 4.0))
    left, right = fig.subplots(1, 2)
    final = history[-1].numpy()
    image = left.imshow(final, cmap="viridis")
    left.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=7)
    left.set_yticks(range(len(names)), names, fontsize=7)
    left.set_xlabel("view 2")
    left.set_ylabel("view 1")
    left.set_title(f"pair probabilities after {len(history) - 1} update(s)")
    fig.colorbar(image, ax=left)
    stacked = torch.stack(history).flatten(1).numpy()  # (T, K²)
    right.plot(stacked)
    right.set_xlabel("epoch (updates)")
    right.set_ylabel("probability of each pair")
    return save_figure(fig, path, dpi=110)
