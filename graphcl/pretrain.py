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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple, cast

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset
from torch_geometric.data import Batch

from graphcl.adaptive import AugmentationSampler
from graphcl.augment import AUGMENTATIONS, random_choice
from graphcl.data import (
    MoleculeData,
    collate_graphs,
    load_molecules,
    skipped_summary,
    write_skipped,
)
from graphcl.export import ENCODER_KEYS, encoder_from_config, save_pretrained
from graphcl.features import LAYOUTS
from graphcl.report import open_run, pretrain_plots
from shared.config import parse_config, save_config
from shared.heads import simclr_v1_head
from shared.losses import MemoryQueue, graphcl_loss, nt_xent_loss, two_view_info_nce_loss
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

__all__ = ["QUICK", "Config", "GraphCLModel", "build", "concat_batches", "main", "train_step"]

AUGMENT_CHOICES = (
    "random",
    "drop_nodes",
    "perturb_edges",
    "mask_attributes",
    "subgraph",
    "identity",
)


@dataclass(frozen=True)
class Config:
    """Pre-train a GNN encoder with GraphCL on molecules."""

    # group: data
    data: str = "bundled"
    """bundled (about 9K offline molecules), freesolv, solubility, a .csv/.sdf/.smi file,
    moleculenet:NAME or tu:NAME (with --data-root)"""
    smiles_column: str = "smiles"
    """the CSV column that holds the SMILES (matched case-insensitively when unique)"""
    data_root: Path | None = None
    """the folder of PyG's MoleculeNet / TUDataset for moleculenet:NAME and tu:NAME"""
    layout: Literal["pyg", "pretrain-gnns"] = "pyg"
    """atom/bond features: pyg (PyG's from_smiles) or pretrain-gnns (Hu et al.'s 2+2 layout, for
    their data and weights)"""
    max_molecules: int | None = None
    """read only the first N molecules, >= 1 (quick runs); none: all"""
    # group: model
    encoder: Literal["gin", "tu_gin"] = "gin"
    """gin (Hu et al.'s molecular GIN with bond features) or tu_gin (GraphCL's TU GIN: sum
    pooling of every layer)"""
    num_layers: int = 5  # GNN message-passing layers, >= 1 (Hu et al. / GraphCL transfer: 5)
    hidden: int = 300  # node embedding width of every layer, >= 1 (Hu et al.: 300)
    jk: Literal["last", "concat", "max", "sum"] = "last"
    """jumping knowledge, how the layers' node embeddings combine: last, concat, max or sum"""
    pooling: Literal["mean", "sum", "attention"] = "mean"
    """graph readout over nodes: mean (Hu et al.), sum or attention"""
    dropout: float = 0.0
    """dropout probability on node embeddings in [0, 1) (Hu et al.: 0 for pre-training)"""
    # group: method
    augment1: str = "random"
    """first view's augmentation: drop_nodes, perturb_edges, mask_attributes, subgraph, identity,
    or random (drop_nodes or subgraph, 50/50 per graph)"""
    augment2: str = "random"  # second view's augmentation (the same choices as --augment1)
    aug_ratio: float = 0.2
    """share of each graph's nodes/edges/attributes that an augmentation removes or changes, in
    [0, 1) (subgraph keeps 1 − ratio); GraphCL: 0.2"""
    adaptive: bool = False
    """JOAO: draw each step's augmentation pair from a distribution that moves toward the hardest
    pairs once per epoch"""
    joao_gamma: float = 0.1
    """JOAO: γ of the pull toward the uniform pair distribution, > 0 (JOAO's chem default 0.1)"""
    loss: Literal["graphcl", "nt_xent"] = "graphcl"
    """graphcl (the paper's: one direction, positive not in the denominator) or nt_xent
    (symmetric)"""
    temperature: float = 0.1  # τ of the contrastive loss, > 0 (GraphCL transfer: 0.1)
    # group: model
    head_dim: int = 128  # width of the projection head's output z, >= 1
    # group: method
    queue_size: int = 0  # nt_xent only: the last K keys as extra negatives; 0 = none
    # group: optimisation
    batch_size: int = 256  # molecules per step in each process, >= 1 (GraphCL chem: 256)
    epochs: int = 20  # passes over the molecules, >= 1 (--max-steps stops earlier)
    max_steps: int | None = None  # stop after this many optimizer steps; none: --epochs decides
    lr: float = 1e-3  # Adam learning rate, > 0 (GraphCL: 1e-3)
    weight_decay: float = 0.0  # Adam's L2 weight decay, >= 0
    # group: run
    amp: Literal["auto", "bf16", "off"] = "auto"
    """mixed precision: auto = bf16 autocast on CUDA, fp32 on CPU; bf16; off = fp32"""
    seed: int = 0  # random seed of initialisation, data order and augmentations; any integer >= 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto: CUDA when available, else CPU; or force cpu / cuda"""
    num_workers: int = 0  # DataLoader worker processes; 0 = in the main process
    log_every: int = 10  # write a metrics.csv row every N steps, >= 1
    checkpoint_every: int | None = None
    """save checkpoints/last.pt every N steps; none: at the end only"""
    out: Path | None = None
    """run folder; none: runs/graphcl/pretrain-<time>; a non-empty folder is refused without
    --resume"""
    resume: bool = False  # continue the run in --out from checkpoints/last.pt (same config)

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden", "head_dim", "batch_size", "epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("augment1", "augment2"):
            if getattr(self, name) not in AUGMENT_CHOICES:
                raise ValueError(
                    f"{name} must be one of {AUGMENT_CHOICES}, got {getattr(self, name)!r}"
                )
        if not 0 <= self.aug_ratio < 1:
            raise ValueError(f"aug_ratio must be in [0, 1), got {self.aug_ratio}")
        if not self.temperature > 0 or not self.lr > 0:
            raise ValueError("temperature and lr must be > 0")
        if self.queue_size < 0 or (self.queue_size and self.loss != "nt_xent"):
            raise ValueError("queue_size must be >= 0, and a queue needs loss nt_xent")
        if self.max_molecules is not None and self.max_molecules < 1:
            raise ValueError(f"max_molecules must be >= 1, got {self.max_molecules}")

    def encoder_config(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in ENCODER_KEYS}


# About a minute on 2 CPU cores: a 3-layer GIN of 64 on 3000 bundled molecules.
QUICK: dict[str, Any] = {
    "max_molecules": 3000,
    "num_layers": 3,
    "hidden": 64,
    "batch_size": 128,
    "epochs": 3,
    "log_every": 5,
}


class SamplerState(nn.Module):
    """Holds JOAO's sampler so that its state is part of the model's ``state_dict`` (extra
    state, tensors only) and therefore of every checkpoint."""

    def __init__(self, sampler: AugmentationSampler) -> None:
        super().__init__()
        self.sampler = sampler

    def get_extra_state(self) -> dict[str, Tensor]:
        return self.sampler.state_dict()

    def set_extra_state(self, state: dict[str, Tensor]) -> None:
        self.sampler.load_state_dict(state)


class GraphCLModel(nn.Module):
    """Encoder -> h, projection head -> z, and an optional queue of past keys (in state_dict).

    Shape:
        input: a ``Batch`` of G graphs; output: ``(h (G, feature_dim), z (G, head_dim))``.
    """

    def __init__(self, encoder: nn.Module, head_dim: int, queue_size: int = 0) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = simclr_v1_head(int(encoder.feature_dim), head_dim)  # type: ignore[arg-type]
        self.queue = MemoryQueue(queue_size, head_dim) if queue_size else None
        self.joao: SamplerState | None = None

    def forward(self, batch: Batch) -> tuple[Tensor, Tensor]:
        h = self.encoder(batch)  # (G, feature_dim)
        return h, self.head(h)  # (G, head_dim)


def concat_batches(a: Batch, b: Batch) -> Batch:
    """One batch holding ``a``'s graphs, then ``b``'s: both views in a single forward pass."""
    offset = a.num_nodes
    out = Batch(
        x=torch.cat([a.x, b.x]),
        edge_index=torch.cat([a.edge_index, b.edge_index + offset], dim=1),
        edge_attr=torch.cat([a.edge_attr, b.edge_attr]),
        batch=torch.cat([a.batch, b.batch + a.num_graphs]),
        ptr=torch.cat([a.ptr, b.ptr[1:] + offset]),
    )
    out._num_graphs = a.num_graphs + b.num_graphs  # Batch.num_graphs reads it
    return out


def _augmentation(name: str, cfg: Config) -> Callable[[Batch], Batch]:
    """A view maker ``batch -> batch`` for one augmentation name (global RNG, per rank)."""
    mask = torch.tensor(LAYOUTS[cfg.layout].atom_mask)
    kwargs: dict[str, Any] = {"mask_index": mask} if name == "mask_attributes" else {}
    if name == "random":
        pair = [AUGMENTATIONS["drop_nodes"], AUGMENTATIONS["subgraph"]]
        return functools.partial(random_choice, pair, p=cfg.aug_ratio)
    return functools.partial(AUGMENTATIONS[name], p=cfg.aug_ratio, **kwargs)


def train_step(
    model: nn.Module, batch: Batch, *, cfg: Config, views: tuple[Callable[[Batch], Batch], ...],
    gather: bool,
) -> dict[str, Tensor]:  # fmt: skip
    """Two views per graph, one forward pass, the contrastive loss.

    ``views`` holds one view maker per augmentation name; with ``--adaptive`` the pair is
    drawn from the model's sampler, else it is ``(augment1, augment2)``.
    """
    inner = unwrap(model)
    joao = getattr(inner, "joao", None)
    sampler = None if joao is None else joao.sampler
    i, j = (0, 1) if sampler is None else sampler.sample()
    v1, v2 = views[i](batch), views[j](batch)
    G = batch.num_graphs
    _, z = model(concat_batches(v1, v2))  # (2G, head_dim)
    z1, z2 = z[:G], z[G:]
    queue = getattr(inner, "queue", None)
    if queue is not None:
        loss = two_view_info_nce_loss(
            z1, z2, queue.negatives(), temperature=cfg.temperature, gather=gather
        )
        queue.enqueue(z.detach())
    elif cfg.loss == "nt_xent":
        loss = nt_xent_loss(z1, z2, temperature=cfg.temperature, gather=gather)
    else:
        loss = graphcl_loss(z1, z2, temperature=cfg.temperature, gather=gather)
    if sampler is not None:
        sampler.record(i, j, loss.detach())
    # a fill, not a copy of a host number: no host→device transfer in the step
    nodes_per_view = v1.x.new_full((), v1.num_nodes / G, dtype=torch.float)
    return {"loss": loss, "nodes_per_view": nodes_per_view}


class Built(NamedTuple):
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
            cfg.data, smiles_column=cfg.smiles_column, layout=cfg.layout, root=cfg.data_root
        )
    graphs = data.graphs[: cfg.max_molecules] if cfg.max_molecules else data.graphs
    if len(graphs) < cfg.batch_size:
        raise ValueError(
            f"batch_size {cfg.batch_size} is larger than the {len(graphs)} molecules of "
            f"{data.name!r}"
        )
    seed_everything(cfg.seed)  # the same initial weights on every rank
    model = GraphCLModel(encoder_from_config(cfg.encoder_config()), cfg.head_dim, cfg.queue_size)
    names: tuple[str, ...] = (cfg.augment1, cfg.augment2)
    if cfg.adaptive:
        names = tuple(name for name in AUGMENT_CHOICES if name != "random")
        model.joao = SamplerState(AugmentationSampler(names, gamma=cfg.joao_gamma))
    model = model.to(device)
    seed_everything(cfg.seed, rank=env.rank)  # each rank its own views from here on
    loader = make_loader(
        cast(Dataset[Any], graphs), cfg.batch_size, shuffle=True, seed=cfg.seed, dist=env,
        num_workers=cfg.num_workers, collate_fn=collate_graphs,
    )  # fmt: skip
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    views = tuple(_augmentation(name, cfg) for name in names)
    return Built(wrap_ddp(model, env), optimizer, loader, views, data)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``graphcl pretrain [--data FILE] [--quick]``: pre-train, export, plot, report."""
    cfg = parse_config(Config, argv, prog="graphcl pretrain", presets={"quick": QUICK})
    device = select_device(cfg.device)
    env = init_distributed(device)
    device = local_device(device, env)
    try:
        run = open_run(cfg.out, "pretrain", resume=cfg.resume, env=env)
        built = build(cfg, device=device, env=env)
        if env.rank == 0:
            save_config(cfg, run.path)
            write_skipped(built.data, run.path / "skipped.csv")
            if built.data.skipped:
                print(skipped_summary(built.data))
        loop_cfg = LoopConfig(
            epochs=cfg.epochs, max_steps=cfg.max_steps, log_every=cfg.log_every,
            checkpoint_every=cfg.checkpoint_every, amp=cfg.amp,
            eval_every=len(built.loader) if cfg.adaptive else None,  # JOAO: once per epoch
        )  # fmt: skip
        step = functools.partial(train_step, cfg=cfg, views=built.views, gather=env.is_distributed)
        evaluate = _epoch_end_update(built, len(built.loader))
        result = fit(
            built.model, built.optimizer, built.loader, step, loop_cfg=loop_cfg, run_dir=run,
            device=device, resume=cfg.resume, dist_env=env, config=cfg, evaluate=evaluate,
        )  # fmt: skip
        summary: dict[str, Any] = {}
        if env.rank == 0:
            model = unwrap(built.model)
            assert isinstance(model, GraphCLModel)
            save_pretrained(model.encoder, run.path / "encoder.safetensors", cfg.encoder_config())
            summary = {
                "molecules": len(built.data.graphs), "skipped": len(built.data.skipped),
                "steps": result.step, "final_loss": result.metrics.get("loss"),
            }  # fmt: skip
            pretrain_plots(run, model, built.data, cfg, device)
            write_summary(run.summary_path, summary)
            write_report(run, f"graphcl pretrain on {built.data.name}", {"Run": __doc__ or ""})
        return summary
    finally:
        cleanup_distributed()


def _epoch_end_update(built: Built, steps_per_epoch: int) -> Any:
    """With --adaptive, fit's evaluate hook (every epoch) applies JOAO's update."""
    model = unwrap(built.model)
    if getattr(model, "joao", None) is None:
        return None

    def evaluate(inner: nn.Module) -> dict[str, float]:
        joao = getattr(inner, "joao", None)
        assert isinstance(joao, SamplerState)
        probabilities = joao.sampler.update()
        return {"joao_max_pair_probability": float(probabilities.max())}

    return evaluate
