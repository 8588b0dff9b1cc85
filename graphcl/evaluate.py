"""Evaluation of ``graphcl`` encoders and fine-tuned models: embeddings, predictions, probes,
robustness to edge flips, and the table of results over seeds.

Probing (``graphcl probe``): :func:`probe_features` scores frozen embeddings (:func:`embed`)
with ridge regression whose penalty is chosen by cross-validation on the training split
(scikit-learn ``RidgeCV``; RMSE and MAE on test), or for classification with
``shared.probes.linear_probe`` (L2 logistic regression, weight decay chosen on a held-out part
of train) and an SVM whose C is chosen by 5-fold cross-validation on train (GraphCL's TU
protocol). Fine-tuning (``graphcl finetune``): :func:`predict` gives a model's raw outputs,
:func:`robustness` the accuracy under random and GradArgmax edge flips (GraphCL §4.4, after
Dai et al. 2018), :func:`results_table` the mean ± std over seeds of every metric.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from sklearn.linear_model import RidgeCV
from sklearn.model_selection import GridSearchCV
from sklearn.preprocessing import StandardScaler
from sklearn.svm import SVC
from torch import Tensor, nn
from torch_geometric.data import Batch

from graphcl.attacks import gradargmax_edge_flips, random_edge_flips
from graphcl.data import collate_graphs
from graphcl.tasks import Task, task_loss, task_metrics
from shared.probes import linear_probe
from shared.runtime import eval_mode

__all__ = [
    "embed",
    "graph_targets",
    "mean_std",
    "predict",
    "probe_features",
    "results_table",
    "robustness",
]


@torch.no_grad()
def embed(
    encoder: nn.Module, graphs: Sequence[Any], device: torch.device, batch_size: int = 512
) -> Tensor:
    """Graph representations h of ``graphs`` in eval mode (restored after), on the CPU.

    Shape:
        result: ``(len(graphs), feature_dim)``.
    """
    with eval_mode(encoder):
        parts = [
            encoder(collate_graphs(graphs[i : i + batch_size]).to(device)).float().cpu()
            for i in range(0, len(graphs), batch_size)
        ]
    return torch.cat(parts)


@torch.no_grad()
def predict(model: nn.Module, graphs: list[Any], device: torch.device) -> Tensor:
    """The raw outputs of ``model`` on ``graphs``, on the CPU; leaves the model in eval mode.

    Shape:
        result: ``(len(graphs), outputs)``.
    """
    model.eval()
    parts = [
        model(collate_graphs(graphs[i : i + 256]).to(device)).float().cpu()
        for i in range(0, len(graphs), 256)
    ]
    return torch.cat(parts)


def graph_targets(graphs: list[Any]) -> Tensor:
    """The targets ``y`` of ``graphs``, one row each: ``(len(graphs), T)`` float."""
    return torch.cat([g.y.view(1, -1).float() for g in graphs])


def probe_features(
    train_x: Tensor,
    train_y: Tensor,
    test_x: Tensor,
    test_y: Tensor,
    *,
    classification: bool,
    seed: int,
) -> dict[str, float]:
    """Ridge (regression) or logistic regression + cross-validated SVM (classification) on
    standardised features; rows with a missing (NaN) label are left out.

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


def robustness(
    model: nn.Module,
    graphs: list[Any],
    task: Task,
    flips: tuple[int, ...],
    seed: int,
    device: torch.device,
) -> dict[str, float]:
    """Test accuracy under k random edge flips and k GradArgmax flips per graph, for each k
    of ``flips`` (the random flips seeded with ``seed``); leaves the model in eval mode."""
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
            scores = task_metrics(task, model(attacked), y)
        out[f"gradargmax_{k}_flips_accuracy"] = scores["accuracy"]
    return out


def mean_std(values: list[float]) -> str:
    """``"mean ± std"`` of the finite values (std 0 for one value), ``"–"`` without any."""
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
        cells = [mean_std([r[key] for r in results[name] if key in r]) for name in names]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
