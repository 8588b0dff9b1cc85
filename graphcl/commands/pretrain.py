"""``graphcl pretrain``: GraphCL pre-training of a GNN encoder on molecules (You et al. 2020).

Each step makes two augmented views of every graph of the batch on the device
(:mod:`graphcl.augment`), encodes both in one forward pass, projects them with a
``shared.heads`` MLP and contrasts them with ``graphcl_loss`` (the paper's form: one direction,
positive left out of the denominator; τ = 0.1 in the transfer experiments) or the symmetric
``nt_xent_loss`` (every rank's graphs as negatives under DDP); ``--queue-size K`` adds the last
K keys as extra negatives. ``--adaptive`` samples the augmentation pair of each step from a
distribution that JOAO's min-max update moves towards the pairs with the highest loss, once per
epoch. The encoder is exported as ``encoder.safetensors`` with its config in the header.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple, cast

import torch
from torch import nn
from torch.utils.data import Dataset
from torch_geometric.data import Batch

from graphcl.config import PRETRAIN_QUICK as QUICK
from graphcl.config import PretrainConfig as Config
from graphcl.data import (
    MoleculeData,
    collate_graphs,
    load_molecules,
    skipped_summary,
    subset_molecules,
    write_skipped,
)
from graphcl.models import GraphCLModel, pretrain_model, pretrain_names, save_pretrained
from graphcl.moses import store_line
from graphcl.report import open_run, pretrain_plots
from graphcl.sharded import ShardedGraphs
from graphcl.steps import joao_end_epoch, pretrain_step, view_maker
from shared.config import parse_config, save_config
from shared.runs import write_report, write_summary
from shared.runtime import (
    SINGLE_PROCESS,
    DistEnv,
    cleanup_distributed,
    init_distributed,
    local_device,
    make_loader,
    seed_everything,
    select_device,
    unwrap,
    wrap_ddp,
)
from shared.train import LoopConfig, fit

__all__ = ["QUICK", "Built", "Config", "build", "main"]


class Built(NamedTuple):
    """What a pre-training run trains: the (DDP-wrapped) model, its optimizer, the loader of
    molecules, one view maker per augmentation name, and the data set."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    loader: torch.utils.data.DataLoader[Any]
    views: tuple[Callable[[Batch], Batch], ...]
    data: MoleculeData


def build(
    cfg: Config,
    *,
    device: torch.device,
    env: DistEnv = SINGLE_PROCESS,
    data: MoleculeData | None = None,
) -> Built:
    """Data, model (DDP-wrapped when distributed), optimizer and view makers."""
    if data is None:
        data = load_molecules(
            cfg.data,
            smiles_column=cfg.smiles_column,
            layout=cfg.layout,
            root=cfg.data_root,
            max_molecules=cfg.max_molecules,
            seed=cfg.seed,
            progress=env.rank == 0,
        )
    else:
        data = subset_molecules(data, cfg.max_molecules, cfg.seed)
    graphs = data.graphs
    if len(graphs) < cfg.batch_size:
        raise ValueError(
            f"batch_size {cfg.batch_size} is larger than the {len(graphs)} molecules of "
            f"{data.name!r}"
        )
    seed_everything(cfg.seed)  # the same initial weights on every rank
    model = pretrain_model(cfg).to(device)
    seed_everything(cfg.seed, rank=env.rank)  # each rank its own views from here on
    # a shard store: the loader draws molecule positions and slices them from its arrays
    loader = make_loader(
        cast(Dataset[Any], range(len(graphs)) if isinstance(graphs, ShardedGraphs) else graphs),
        cfg.batch_size,
        shuffle=True,
        seed=cfg.seed,
        dist=env,
        num_workers=cfg.num_workers,
        collate_fn=graphs.collate if isinstance(graphs, ShardedGraphs) else collate_graphs,
        pin_memory=device.type == "cuda",  # so the copy to the GPU is non-blocking
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    views = tuple(view_maker(name, cfg) for name in pretrain_names(cfg))
    return Built(wrap_ddp(model, env), optimizer, loader, views, data)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``graphcl pretrain [--data FILE] [--quick]``: pre-train, export, plot, report."""
    cfg = parse_config(Config, argv, prog="graphcl pretrain", presets={"quick": QUICK})
    device = select_device(cfg.device)
    env = init_distributed(device)
    device = local_device(device, env)
    try:
        run = open_run(cfg.out, "pretrain", resume=cfg.resume, env=env)
        resume = cfg.resume and run.last_checkpoint.is_file()  # none yet: from step 0
        built = build(cfg, device=device, env=env)
        if env.rank == 0:
            save_config(cfg, run.path)
            write_skipped(built.data, run.path / "skipped.csv")
            if built.data.skipped:
                print(skipped_summary(built.data))
            if built.data.store is not None:
                print(store_line(built.data.store))
        loop_cfg = LoopConfig(
            epochs=cfg.epochs,
            max_steps=cfg.max_steps,
            log_every=cfg.log_every,
            checkpoint_every=cfg.checkpoint_every,
            amp=cfg.amp,
        )
        step = functools.partial(
            pretrain_step, cfg=cfg, views=built.views, gather=env.is_distributed
        )
        result = fit(
            built.model,
            built.optimizer,
            built.loader,
            step,
            loop_cfg=loop_cfg,
            run_dir=run,
            device=device,
            resume=resume,
            dist_env=env,
            config=cfg,
            end_epoch=joao_end_epoch(built.model),  # JOAO's update, once per epoch
        )
        summary: dict[str, Any] = {}
        if env.rank == 0:
            model = unwrap(built.model)
            assert isinstance(model, GraphCLModel)
            save_pretrained(model.encoder, run.path / "encoder.safetensors", cfg.encoder_config())
            summary = {
                "molecules": len(built.data.graphs),
                "skipped": len(built.data.skipped),
                "steps": result.step,
                "final_loss": result.metrics.get("loss"),
            }
            if built.data.store is not None:
                summary["store"] = built.data.store
            pretrain_plots(run, model, built.data, cfg, device)
            write_summary(run.summary_path, summary)
            write_report(run, f"graphcl pretrain on {built.data.name}", {"Run": __doc__ or ""})
        return summary
    finally:
        cleanup_distributed()
