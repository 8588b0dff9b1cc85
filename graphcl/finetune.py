"""``graphcl finetune``: a (pre-trained) GNN fine-tuned on a molecular property task.

The protocol of Hu et al. 2019 / GraphCL's transfer experiments: a scaffold split (80/10/10),
the encoder plus a linear head trained end to end (Adam, lr 1e-3, batch 32, dropout 0.5 before
the head), several seeds. Both test numbers are reported: at the final epoch, and at the epoch
with the best validation metric (``best.pt``). ``--compare-scratch`` trains the same network
from random initialisation in the same run, with the same splits, label subsets and seeds, and
reports both side by side (mean ± std over seeds). ``--label-fraction`` keeps a seeded fraction
of the training labels (the semi-supervised setting). For classification, the final models'
accuracy under random edge flips and a GradArgmax edge-flip attack (k flips per graph) is
measured, pre-trained against scratch.
"""

from __future__ import annotations

import functools
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset
from torch_geometric.data import Batch

from graphcl.attacks import gradargmax_edge_flips, random_edge_flips
from graphcl.data import (
    MoleculeData,
    collate_graphs,
    load_molecules,
    random_split,
    scaffold_split,
    stratified_split,
    write_skipped,
)
from graphcl.export import encoder_from_config, load_pretrained
from graphcl.report import open_run
from graphcl.tasks import FinetuneModel, Task, choose_task, infer_task, task_loss, task_metrics
from shared.checkpoint import load_checkpoint
from shared.config import parse_config, save_config
from shared.runs import RunDir, write_report, write_summary
from shared.runtime import make_loader, runs_on_this_rank, seed_everything, select_device
from shared.train import LoopConfig, fit

__all__ = ["QUICK", "Config", "main"]


@dataclass(frozen=True)
class Config:
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


QUICK: dict[str, Any] = {"epochs": 15, "seeds": (0,), "num_layers": 3, "hidden": 64}


def _split(cfg: Config, data: MoleculeData, seed: int) -> tuple[Tensor, Tensor, Tensor]:
    n = len(data.graphs)
    if cfg.split == "scaffold":
        split = scaffold_split(data.smiles)
    elif cfg.split == "random":
        split = random_split(n, seed=seed)
    else:
        assert data.targets is not None
        split = stratified_split(data.targets[:, 0].nan_to_num(-1).long(), seed=seed)
    train = split.train
    if cfg.label_fraction < 1:
        generator = torch.Generator().manual_seed(seed)
        keep = max(1, round(cfg.label_fraction * train.numel()))
        train = train[torch.randperm(train.numel(), generator=generator)[:keep]].sort().values
    return train, split.valid, split.test


@torch.no_grad()
def _outputs(model: nn.Module, graphs: list[Any], device: torch.device) -> Tensor:
    model.eval()
    parts = [
        model(collate_graphs(graphs[i : i + 256]).to(device)).float().cpu()
        for i in range(0, len(graphs), 256)
    ]
    return torch.cat(parts)


def _targets(graphs: list[Any]) -> Tensor:
    return torch.cat([g.y.view(1, -1).float() for g in graphs])


def _make_encoder(cfg: Config, pretrained: bool) -> nn.Module:
    if pretrained:
        assert cfg.encoder is not None
        encoder, _ = load_pretrained(cfg.encoder)
        return encoder
    if cfg.encoder is not None:  # scratch twin of the pre-trained architecture
        _, config = load_pretrained(cfg.encoder)
        return encoder_from_config(config)
    return encoder_from_config(
        {"encoder": "gin", "layout": cfg.layout, "num_layers": cfg.num_layers,
         "hidden": cfg.hidden, "jk": cfg.jk, "pooling": cfg.pooling, "dropout": 0.0}
    )  # fmt: skip


def _step(model: nn.Module, batch: Batch, *, task: Task) -> dict[str, Tensor]:
    return {"loss": task_loss(task, model(batch), batch.y.view(batch.num_graphs, -1).float())}


def train_one(
    run: RunDir, cfg: Config, data: MoleculeData, seed: int, pretrained: bool, device: torch.device,
    *, resume: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """One seed of one initialisation; test metrics at the final and at the best-valid epoch.

    With ``resume`` the run continues from its ``last.pt`` (bit for bit, as ``fit`` resumes).
    """
    train, valid, test = _split(cfg, data, seed)
    graphs = data.graphs
    assert data.targets is not None
    task = infer_task(data.targets, train, data.task)  # resolved once in main (choose_task)
    seed_everything(seed)
    model = FinetuneModel(_make_encoder(cfg, pretrained), task.outputs, cfg.dropout).to(device)
    train_graphs = [graphs[i] for i in train]
    valid_graphs, test_graphs = [graphs[i] for i in valid], [graphs[i] for i in test]
    # every labelled molecule counts: a last batch of one graph is kept (the encoder's batch
    # norm handles it), unlike the reference code, which crashes there
    loader = make_loader(
        cast(Dataset[Any], train_graphs), min(cfg.batch_size, len(train_graphs)), shuffle=True,
        seed=seed, drop_last=False, collate_fn=collate_graphs,
    )  # fmt: skip
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    metric, mode = task.main_metric

    def evaluate(inner: nn.Module) -> dict[str, float]:
        scores = task_metrics(task, _outputs(inner, valid_graphs, device), _targets(valid_graphs))
        value = scores[metric]  # NaN (e.g. one class only in valid) is never the best epoch
        worst = -math.inf if mode == "max" else math.inf
        return {f"valid_{metric}": value if math.isfinite(value) else worst}

    loop_cfg = LoopConfig(
        epochs=cfg.epochs, eval_every=len(loader), log_every=len(loader), amp=cfg.amp,
        checkpoint_every=len(loader),  # every epoch: an interrupted run resumes from there
        best_metric=f"valid_{metric}", best_mode=mode, progress=False,
    )  # fmt: skip
    step = functools.partial(_step, task=task)
    fit(model, optimizer, loader, step, loop_cfg=loop_cfg, run_dir=run, device=device,
        evaluate=evaluate, config=cfg, resume=resume)  # fmt: skip
    y_test = _targets(test_graphs)
    final = task_metrics(task, _outputs(model, test_graphs, device), y_test)
    result: dict[str, Any] = {f"final_{k}": v for k, v in final.items()}
    if task.kind != "regression" and cfg.flips:
        result.update(robustness(model, test_graphs, task, cfg.flips, seed, device))
    if run.best_checkpoint.is_file():
        model.load_state_dict(load_checkpoint(run.best_checkpoint)["model"])
        best = task_metrics(task, _outputs(model, test_graphs, device), y_test)
        result.update({f"best_valid_{k}": v for k, v in best.items()})
    if task.kind == "regression":  # the baseline every model must beat: the training mean
        mean_pred = task_metrics(task, torch.zeros(len(test_graphs), task.outputs), y_test)
        result.update({f"train_mean_{k}": v for k, v in mean_pred.items()})
    return result


def robustness(
    model: nn.Module, graphs: list[Any], task: Task, flips: tuple[int, ...], seed: int,
    device: torch.device,
) -> dict[str, float]:  # fmt: skip
    """Test accuracy under k random edge flips and k GradArgmax flips per graph."""
    model.eval()
    batch = collate_graphs(graphs).to(device)
    y = batch.y.view(batch.num_graphs, -1).float()

    def loss_fn(b: Batch) -> Tensor:
        return task_loss(task, model(b), b.y.view(b.num_graphs, -1).float())

    out: dict[str, float] = {}
    for k in flips:
        generator = torch.Generator().manual_seed(seed)
        flipped = random_edge_flips(batch, k, generator=generator)
        with torch.no_grad():
            out[f"random_{k}_flips_accuracy"] = task_metrics(task, model(flipped), y)["accuracy"]
        attacked = gradargmax_edge_flips(loss_fn, batch, k)
        with torch.no_grad():
            out[f"gradargmax_{k}_flips_accuracy"] = task_metrics(task, model(attacked), y)[
                "accuracy"
            ]
    return out


def _sub_run(
    run: RunDir, cfg: Config, data: MoleculeData, seed: int, name: str, device: torch.device
) -> dict[str, Any]:
    """One ``<init>-seed<k>`` sub-run: reused when finished, continued with ``--resume``."""
    folder = run.path / f"{name}-seed{seed}"
    done = folder / "result.json"
    if cfg.resume and done.is_file():
        result: dict[str, Any] = json.loads(done.read_text())
        return result
    resume = cfg.resume and (folder / "checkpoints" / "last.pt").is_file()
    sub = RunDir.create(run.path.name, folder.name, root=run.path.parent, resume=resume,
                        overwrite=cfg.resume and not resume)  # fmt: skip
    result = train_one(sub, cfg, data, seed, name == "pretrained", device, resume=resume)
    write_summary(done, result)
    return result


def _mean_std(values: list[float]) -> str:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return "–"
    spread = statistics.stdev(finite) if len(finite) > 1 else 0.0
    return f"{statistics.fmean(finite):.4g} ± {spread:.2g}"


def results_table(results: dict[str, list[dict[str, Any]]]) -> str:
    """Markdown: one row per metric, one column per initialisation (mean ± std over seeds)."""
    names = list(results)
    keys = sorted({key for runs in results.values() for r in runs for key in r})
    lines = ["| metric | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for key in keys:
        cells = [_mean_std([r[key] for r in results[name] if key in r]) for name in names]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``graphcl finetune [--encoder FILE] --data freesolv [--compare-scratch]``."""
    cfg = parse_config(Config, argv, prog="graphcl finetune", presets={"quick": QUICK})
    if not runs_on_this_rank("graphcl finetune"):  # one process: under torchrun, rank 0 alone
        return {}
    device = select_device(cfg.device)
    layout = cfg.layout
    if cfg.encoder is not None:
        layout = load_pretrained(cfg.encoder)[1]["layout"]
    targets = tuple(t.strip() for t in cfg.target.split(",") if t.strip())
    data = load_molecules(
        cfg.data, smiles_column=cfg.smiles_column, targets=targets, layout=layout,
        root=cfg.data_root, task=None if cfg.task == "auto" else cfg.task,
    )  # fmt: skip
    if data.targets is None:
        raise ValueError(f"data {cfg.data!r} has no targets; name them with --target")
    kind, why = choose_task(data.targets, cfg.task, data.task)
    print(f"graphcl finetune: task {kind} for {', '.join(data.target_names)}: {why}")
    data = data._replace(task=kind)
    if cfg.resume:  # the sub-runs hold the checkpoints: the folder itself must exist
        if cfg.out is None or not (cfg.out / "config.json").is_file():
            raise ValueError("--resume needs --out, the folder of the finetune run to continue")
        run = RunDir(cfg.out.resolve())
    else:
        run = open_run(cfg.out, "finetune")
    save_config(cfg, run.path)
    write_skipped(data, run.path / "skipped.csv")
    inits = (["pretrained"] if cfg.encoder is not None else []) + (
        ["scratch"] if cfg.compare_scratch or cfg.encoder is None else []
    )
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in inits}
    for seed in cfg.seeds:
        for name in inits:
            results[name].append(_sub_run(run, cfg, data, seed, name, device))
    summary: dict[str, Any] = {
        "data": data.name, "molecules": len(data.graphs), "skipped": len(data.skipped),
        "seeds": list(cfg.seeds),
    }  # fmt: skip
    for name, runs in results.items():
        for key in sorted({k for r in runs for k in r}):
            values = [r[key] for r in runs if key in r]
            summary[f"{name}/{key}"] = statistics.fmean(values) if values else math.nan
    table = results_table(results)
    write_summary(run.summary_path, summary)
    write_report(
        run, f"graphcl finetune on {data.name}", {"Results": table, "Protocol": __doc__ or ""}
    )
    print(table)
    return summary
