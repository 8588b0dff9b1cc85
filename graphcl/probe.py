"""``graphcl probe``: frozen embeddings of a pre-trained encoder, scored by simple models.

Regression: ridge regression with its penalty chosen by cross-validation on the training split
(scikit-learn ``RidgeCV``), RMSE and MAE on test. Classification: ``shared.probes.linear_probe``
(L2 logistic regression, weight decay chosen on a held-out part of train) and an SVM whose C is
chosen by 5-fold cross-validation on train (GraphCL's TU protocol, scikit-learn). Scaffold split
by default; the untrained encoder of the same architecture is probed alongside as the baseline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from sklearn.linear_model import RidgeCV
from sklearn.model_selection import GridSearchCV
from sklearn.preprocessing import StandardScaler
from sklearn.svm import SVC

from graphcl.data import load_molecules, random_split, scaffold_split
from graphcl.export import encoder_from_config, load_pretrained
from graphcl.report import embed, open_run
from graphcl.tasks import choose_task
from shared.config import parse_config, save_config
from shared.probes import linear_probe
from shared.runs import write_report, write_summary
from shared.runtime import runs_on_this_rank, seed_everything, select_device

__all__ = ["Config", "main", "probe_features"]


@dataclass(frozen=True)
class Config:
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
    # group: run
    seed: int = 0  # random seed of the split and the probes; any integer >= 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto: CUDA when available, else CPU; or force cpu / cuda"""
    out: Path | None = None  # run folder; none: runs/graphcl/probe-<time>


def probe_features(
    train_x: torch.Tensor, train_y: torch.Tensor, test_x: torch.Tensor, test_y: torch.Tensor,
    *, classification: bool, seed: int,
) -> dict[str, float]:  # fmt: skip
    """Ridge (regression) or logistic regression + cross-validated SVM (classification).

    Shape:
        train_x: ``(N, D)``; train_y: ``(N,)``; test_x: ``(M, D)``; test_y: ``(M,)``.
    """
    keep_train, keep_test = ~torch.isnan(train_y), ~torch.isnan(test_y)
    train_x, train_y = train_x[keep_train], train_y[keep_train]
    test_x, test_y = test_x[keep_test], test_y[keep_test]
    scaler = StandardScaler().fit(train_x.numpy())
    a, b = scaler.transform(train_x.numpy()), scaler.transform(test_x.numpy())
    if not classification:
        ridge = RidgeCV(alphas=np.logspace(-3, 3, 13)).fit(a, train_y.numpy())
        err = ridge.predict(b) - test_y.numpy()
        return {
            "ridge_rmse": float(np.sqrt((err**2).mean())),
            "ridge_mae": float(np.abs(err).mean()),
        }
    labels, tests = train_y.long(), test_y.long()
    logistic = linear_probe(train_x, labels, test_x, tests, seed=seed).accuracy
    grid = GridSearchCV(SVC(), {"C": [10.0**e for e in range(-3, 4)]}, cv=5)
    svm = float((grid.fit(a, labels.numpy()).predict(b) == tests.numpy()).mean())
    return {"logistic_accuracy": logistic, "svm_accuracy": svm}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``graphcl probe --encoder RUN/encoder.safetensors --data solubility``."""
    cfg = parse_config(Config, argv, prog="graphcl probe")
    if not runs_on_this_rank("graphcl probe"):  # one process: under torchrun, rank 0 alone
        return {}
    device = select_device(cfg.device)
    encoder, config = load_pretrained(cfg.encoder)
    targets = tuple(t.strip() for t in cfg.target.split(",") if t.strip())
    data = load_molecules(
        cfg.data, smiles_column=cfg.smiles_column, targets=targets, layout=config["layout"],
        root=cfg.data_root, task=None if cfg.task == "auto" else cfg.task,
    )  # fmt: skip
    if data.targets is None:
        raise ValueError(f"data {cfg.data!r} has no targets; name them with --target")
    kind, why = choose_task(data.targets, cfg.task, data.task)
    print(f"graphcl probe: task {kind} for {', '.join(data.target_names)}: {why}")
    split = (
        scaffold_split(data.smiles)
        if cfg.split == "scaffold"
        else random_split(len(data.graphs), seed=cfg.seed)
    )
    classification = kind == "classification"
    run = open_run(cfg.out, "probe")
    save_config(cfg, run.path)
    seed_everything(cfg.seed)
    encoders = {
        "pretrained": encoder.to(device),
        "random_init": encoder_from_config(config).to(device),
    }
    summary: dict[str, Any] = {"data": data.name, "molecules": len(data.graphs)}
    for name, model in encoders.items():
        h = embed(model, data.graphs, device)  # (N, D)
        for t, target in enumerate(data.target_names):
            y = data.targets[:, t]
            scores = probe_features(
                h[split.train], y[split.train], h[split.test], y[split.test],
                classification=classification, seed=cfg.seed,
            )  # fmt: skip
            for key, value in scores.items():
                summary[f"{name}/{target}/{key}"] = value if math.isfinite(value) else None
    write_summary(run.summary_path, summary)
    write_report(run, f"graphcl probe on {data.name}", {"Protocol": __doc__ or ""}, summary=summary)
    return summary
