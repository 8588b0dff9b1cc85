"""The configs of the ``graphcl`` commands (frozen dataclasses read by
``shared.config.parse_config``) and their ``--quick`` presets.

:class:`PretrainConfig` (``graphcl pretrain``), :class:`FinetuneConfig` (``graphcl finetune``),
:class:`ProbeConfig` (``graphcl probe``) and :class:`AugmentConfig` (``graphcl augment``). A
field's comment or docstring is its ``--help`` text, and ``# group:`` comments group the
options in ``--help``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "AUGMENT_CHOICES",
    "ENCODER_KEYS",
    "FINETUNE_QUICK",
    "PRETRAIN_QUICK",
    "AugmentConfig",
    "FinetuneConfig",
    "PretrainConfig",
    "ProbeConfig",
]

# the keys of an encoder's config: what rebuilds it (graphcl.models.encoder_from_config)
ENCODER_KEYS = ("encoder", "layout", "num_layers", "hidden", "jk", "pooling", "dropout", "conv")

AUGMENT_CHOICES = (
    "random",
    "drop_nodes",
    "perturb_edges",
    "mask_attributes",
    "subgraph",
    "identity",
)


@dataclass(frozen=True)
class PretrainConfig:
    """Pre-train a GNN encoder with GraphCL on molecules."""

    # group: data
    data: str = "bundled"
    """bundled (about 9K offline molecules), moses (1.58M ZINC molecules, offline once molsets is
    installed; also moses-test, moses-scaffolds), freesolv, solubility, a .csv/.sdf/.smi file,
    moleculenet:NAME or tu:NAME (with --data-root)"""
    smiles_column: str = "smiles"
    """the CSV column that holds the SMILES (matched case-insensitively when unique)"""
    data_root: Path | None = None
    """the folder of PyG's MoleculeNet / TUDataset for moleculenet:NAME and tu:NAME"""
    layout: Literal["pyg", "pretrain-gnns"] = "pyg"
    """atom/bond features: pyg (PyG's from_smiles) or pretrain-gnns (Hu et al.'s 2+2 layout, for
    their data and weights)"""
    max_molecules: int | None = None
    """a random subset of N molecules drawn with --seed, >= 1 (moses: only those rows are
    featurised); none: all"""
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
    conv: Literal["gine", "hu"] = "gine"
    """gin's layer: gine (a ReLU on each message, as PyG's GINEConv) or hu (Hu et al.'s and
    GraphCL's own: linear messages, a self-loop bond embedding); both cost about the same"""
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
        for name in ("num_layers", "hidden", "head_dim", "batch_size", "epochs", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_steps", "checkpoint_every"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 or none, got {getattr(self, name)}")
        for name in ("weight_decay", "seed", "num_workers"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if not self.joao_gamma > 0:
            raise ValueError(f"joao_gamma must be > 0, got {self.joao_gamma}")
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
        if self.conv != "gine" and self.encoder != "gin":
            raise ValueError(f"--conv {self.conv} is a layer of gin, not of {self.encoder}")

    def encoder_config(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in ENCODER_KEYS}


# --quick: a 3-layer GIN of 64 on 3000 bundled molecules, 3 epochs.
PRETRAIN_QUICK: dict[str, Any] = {
    "max_molecules": 3000,
    "num_layers": 3,
    "hidden": 64,
    "batch_size": 128,
    "epochs": 3,
    "log_every": 5,
}


@dataclass(frozen=True)
class FinetuneConfig:
    """Fine-tune a GNN encoder on a molecular property task."""

    # group: data
    data: str = "freesolv"
    """freesolv, solubility, solubility-class (offline), a .csv/.sdf file or moleculenet:NAME
    (with --data-root)"""
    smiles_column: str = "smiles"
    """the CSV column that holds the SMILES (matched case-insensitively when unique)"""
    target: str = ""
    """the target column(s) of a CSV/SDF file, comma-separated; empty: the source's own"""
    task: Literal["auto", "regression", "classification"] = "auto"
    """auto: the source's task, else 0/1 labels are classification and any other number (counts
    too) regression; or force regression / classification"""
    data_root: Path | None = None
    """the folder of PyG's MoleculeNet / TUDataset for moleculenet:NAME and tu:NAME"""
    # group: model
    encoder: Path | None = None
    """a pretrain run's encoder.safetensors to fine-tune; none: train from scratch only"""
    layout: Literal["pyg", "pretrain-gnns"] = "pyg"
    """without --encoder: atom/bond features: pyg (PyG's from_smiles) or pretrain-gnns (Hu et
    al.'s 2+2 layout, for their data and weights)"""
    num_layers: int = 5
    """without --encoder: GNN message-passing layers, >= 1 (Hu et al. / GraphCL transfer: 5)"""
    hidden: int = 300
    """without --encoder: node embedding width of every layer, >= 1 (Hu et al.: 300)"""
    jk: Literal["last", "concat", "max", "sum"] = "last"
    """without --encoder: jumping knowledge, how the layers' node embeddings combine: last,
    concat, max or sum"""
    pooling: Literal["mean", "sum", "attention"] = "mean"
    """without --encoder: graph readout over nodes: mean (Hu et al.), sum or attention"""
    conv: Literal["gine", "hu"] = "gine"
    """without --encoder: gin's layer: gine (a ReLU on each message) or hu (Hu et al.'s linear
    messages with a self-loop bond embedding)"""
    # group: method
    compare_scratch: bool = False
    """also train the same network from random initialisation, same splits and seeds"""
    # group: data
    split: Literal["scaffold", "random", "stratified"] = "scaffold"
    """scaffold (Bemis–Murcko, 80/10/10; Hu et al.), random, or stratified by the first target's
    class"""
    # group: run
    seeds: tuple[int, ...] = (0, 1, 2)
    """one sub-run per seed (split, label subset and initialisation); results are mean ± std"""
    # group: data
    label_fraction: float = 1.0  # keep this seeded fraction of the training labels, in (0, 1]
    # group: optimisation
    epochs: int = 100  # passes over the training split, >= 1 (Hu et al.: 100)
    batch_size: int = 32  # molecules per step, >= 1 (Hu et al.: 32)
    lr: float = 1e-3  # Adam learning rate, > 0 (Hu et al.: 1e-3)
    weight_decay: float = 0.0  # Adam's L2 weight decay, >= 0
    dropout: float = 0.5  # dropout probability before the linear head, in [0, 1) (Hu et al.: 0.5)
    # group: method
    flips: tuple[int, ...] = (1, 2, 3)
    """classification: edge flips per graph for the robustness table (random and GradArgmax),
    each >= 1"""
    # group: run
    amp: Literal["auto", "bf16", "off"] = "auto"
    """mixed precision: auto = bf16 autocast on CUDA, fp32 on CPU; bf16; off = fp32"""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto: CUDA when available, else CPU; or force cpu / cuda"""
    out: Path | None = None  # run folder; none: runs/graphcl/finetune-<time>
    resume: bool = False  # continue an interrupted run in --out (finished sub-runs are kept)

    def __post_init__(self) -> None:
        if not 0 < self.label_fraction <= 1:
            raise ValueError(f"label_fraction must be in (0, 1], got {self.label_fraction}")
        if not self.seeds:
            raise ValueError("seeds must name at least one seed")
        for name in ("epochs", "batch_size", "num_layers", "hidden"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not self.weight_decay >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if any(seed < 0 for seed in self.seeds):
            raise ValueError(f"seeds must be >= 0, got {self.seeds}")
        if any(k < 1 for k in self.flips):
            raise ValueError(f"flips must each be >= 1, got {self.flips}")


FINETUNE_QUICK: dict[str, Any] = {"epochs": 15, "seeds": (0,), "num_layers": 3, "hidden": 64}


@dataclass(frozen=True)
class ProbeConfig:
    """Probe the frozen embeddings of a pre-trained GNN encoder."""

    # group: model
    encoder: Path  # a pretrain run's encoder.safetensors (required)
    # group: data
    data: str = "solubility"
    """freesolv, solubility, solubility-class (offline), a .csv/.sdf file or moleculenet:NAME
    (with --data-root)"""
    smiles_column: str = "smiles"
    """the CSV column that holds the SMILES (matched case-insensitively when unique)"""
    target: str = ""
    """the target column(s) of a CSV/SDF file, comma-separated; empty: the source's own"""
    task: Literal["auto", "regression", "classification"] = "auto"
    """auto: the source's task, else 0/1 labels are classification and any other number
    regression; or force regression / classification"""
    data_root: Path | None = None
    """the folder of PyG's MoleculeNet / TUDataset for moleculenet:NAME and tu:NAME"""
    split: Literal["scaffold", "random"] = "scaffold"
    """scaffold (Bemis–Murcko, 80/10/10) or random train/test split"""
    max_molecules: int | None = None
    """a random subset of N molecules drawn with --seed, >= 1; none: all"""
    # group: run
    seed: int = 0  # random seed of the split, the subset and the probes; any integer >= 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto: CUDA when available, else CPU; or force cpu / cuda"""
    out: Path | None = None  # run folder; none: runs/graphcl/probe-<time>

    def __post_init__(self) -> None:
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if self.max_molecules is not None and self.max_molecules < 1:
            raise ValueError(f"max_molecules must be >= 1, got {self.max_molecules}")


@dataclass(frozen=True)
class AugmentConfig:
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
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
