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
from typing import Any, cast

import torch
from torch import nn
from torch.utils.data import Dataset

from graphcl.config import FINETUNE_QUICK as QUICK
from graphcl.config import FinetuneConfig as Config
from graphcl.data import (
    MoleculeData,
    collate_graphs,
    load_molecules,
    skipped_summary,
    write_skipped,
)
from graphcl.evaluate import graph_targets, predict, results_table, robustness
from graphcl.models import finetune_encoder, load_pretrained
from graphcl.report import open_run
from graphcl.splits import make_split
from graphcl.steps import finetune_step
from graphcl.tasks import FinetuneModel, choose_task, infer_task, task_metrics
from shared.checkpoint import load_checkpoint
from shared.config import parse_config, save_config
from shared.runs import RunDir, write_report, write_summary
from shared.runtime import make_loader, runs_on_this_rank, seed_everything, select_device
from shared.train import LoopConfig, fit

__all__ = ["QUICK", "Config", "main", "train_one"]


def train_one(
    run: RunDir,
    cfg: Config,
    data: MoleculeData,
    seed: int,
    pretrained: bool,
    device: torch.device,
    *,
    resume: bool = False,
) -> dict[str, Any]:
    """One seed of one initialisation; test metrics at the final and at the best-valid epoch.

    With ``resume`` the run continues from its ``last.pt`` (bit for bit, as ``fit`` resumes).
    """
    assert data.targets is not None
    split = make_split(
        cfg.split, data.smiles, data.targets, seed=seed, label_fraction=cfg.label_fraction
    )
    graphs = data.graphs
    task = infer_task(data.targets, split.train, data.task)  # resolved once in main
    seed_everything(seed)
    model = FinetuneModel(finetune_encoder(cfg, pretrained), task.outputs, cfg.dropout).to(device)
    train_graphs = [graphs[i] for i in split.train]
    valid_graphs, test_graphs = [graphs[i] for i in split.valid], [graphs[i] for i in split.test]
    # every labelled molecule counts: a last batch of one graph is kept (the encoder's batch
    # norm handles it), unlike the reference code, which crashes there
    loader = make_loader(
        cast(Dataset[Any], train_graphs),
        min(cfg.batch_size, len(train_graphs)),
        shuffle=True,
        seed=seed,
        drop_last=False,
        collate_fn=collate_graphs,
        pin_memory=device.type == "cuda",  # so the copy to the GPU is non-blocking
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    metric, mode = task.main_metric

    def evaluate(inner: nn.Module) -> dict[str, float]:
        outputs = predict(inner, valid_graphs, device)
        value = task_metrics(task, outputs, graph_targets(valid_graphs))[metric]
        worst = -math.inf if mode == "max" else math.inf  # NaN is never the best epoch
        return {f"valid_{metric}": value if math.isfinite(value) else worst}

    loop_cfg = LoopConfig(
        epochs=cfg.epochs,
        eval_every=len(loader),
        log_every=len(loader),
        amp=cfg.amp,
        checkpoint_every=len(loader),  # every epoch: an interrupted run resumes from there
        best_metric=f"valid_{metric}",
        best_mode=mode,
        progress=False,
    )
    step = functools.partial(finetune_step, task=task)
    fit(
        model,
        optimizer,
        loader,
        step,
        loop_cfg=loop_cfg,
        run_dir=run,
        device=device,
        evaluate=evaluate,
        config=cfg,
        resume=resume,
    )
    y_test = graph_targets(test_graphs)
    final = task_metrics(task, predict(model, test_graphs, device), y_test)
    result: dict[str, Any] = {f"final_{k}": v for k, v in final.items()}
    if task.kind != "regression" and cfg.flips:
        result.update(robustness(model, test_graphs, task, cfg.flips, seed, device))
    if run.best_checkpoint.is_file():
        model.load_state_dict(load_checkpoint(run.best_checkpoint)["model"])
        best = task_metrics(task, predict(model, test_graphs, device), y_test)
        result.update({f"best_valid_{k}": v for k, v in best.items()})
    if task.kind == "regression":  # the baseline every model must beat: the training mean
        mean_pred = task_metrics(task, torch.zeros(len(test_graphs), task.outputs), y_test)
        result.update({f"train_mean_{k}": v for k, v in mean_pred.items()})
    return result


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
    sub = RunDir.create(
        run.path.name,
        folder.name,
        root=run.path.parent,
        resume=resume,
        overwrite=cfg.resume and not resume,
    )
    result = train_one(sub, cfg, data, seed, name == "pretrained", device, resume=resume)
    write_summary(done, result)
    return result


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
        cfg.data,
        smiles_column=cfg.smiles_column,
        targets=targets,
        layout=layout,
        root=cfg.data_root,
        task=None if cfg.task == "auto" else cfg.task,
    )
    if data.targets is None:
        raise ValueError(f"data {cfg.data!r} has no targets; name them with --target")
    kind, why = choose_task(data.targets, cfg.task, data.task)
    print(f"graphcl finetune: task {kind} for {', '.join(data.target_names)}: {why}")
    data = data._replace(task=kind)
    if cfg.resume:  # the sub-runs hold the checkpoints: the folder itself must exist
        if cfg.out is None:
            raise ValueError("--resume needs --out, the folder of the finetune run to continue")
        if not cfg.out.is_dir():
            raise FileNotFoundError(f"cannot resume: the run folder {cfg.out} does not exist")
        run = RunDir(cfg.out.resolve())
        run.remove_partial_writes()  # a kill inside an atomic write left its temporary file
    else:
        run = open_run(cfg.out, "finetune")
    save_config(cfg, run.path)
    write_skipped(data, run.path / "skipped.csv")
    if data.skipped:
        print(skipped_summary(data))
    inits = (["pretrained"] if cfg.encoder is not None else []) + (
        ["scratch"] if cfg.compare_scratch or cfg.encoder is None else []
    )
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in inits}
    for seed in cfg.seeds:
        for name in inits:
            results[name].append(_sub_run(run, cfg, data, seed, name, device))
    summary: dict[str, Any] = {
        "data": data.name,
        "molecules": len(data.graphs),
        "skipped": len(data.skipped),
        "seeds": list(cfg.seeds),
    }
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
