"""Molecular property tasks: the head, the masked loss and the metrics of fine-tuning and probing.

Regression or classification is chosen by :func:`choose_task` (the ``--task`` of ``graphcl
finetune`` and ``probe``; with ``auto``, the data source's task, else only 0/1 labels are
classification, so an integer count stays a regression). Three kinds of head follow:
``regression`` (targets standardised with the training split's mean and std; RMSE and MAE on
the original scale), ``binary`` (one or several 0/1 tasks, missing labels masked as MoleculeNet
does; ROC-AUC averaged over the tasks that have both classes in the evaluated split, and
accuracy) and ``multiclass`` (one target with more than two classes, e.g. solubility's
``SOL_classification``; cross-entropy, one-vs-rest macro ROC-AUC and accuracy).
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.metrics import roc_auc_score
from torch import Tensor, nn
from torch_geometric.data import Batch

__all__ = ["FinetuneModel", "Task", "choose_task", "infer_task", "task_loss", "task_metrics"]

Kind = Literal["regression", "binary", "multiclass"]


class Task(NamedTuple):
    """What the head predicts and how targets are scaled."""

    kind: Kind
    outputs: int  # head width: T (regression, binary) or C (multiclass)
    mean: Tensor  # (T,) regression standardisation (0 otherwise)
    std: Tensor  # (T,) (1 otherwise)

    @property
    def main_metric(self) -> tuple[str, Literal["min", "max"]]:
        return ("rmse", "min") if self.kind == "regression" else ("roc_auc", "max")


def _is_binary(values: Tensor) -> bool:
    """Every known value is 0 or 1 (and there is at least one)."""
    return bool(values.numel()) and bool(((values == 0) | (values == 1)).all())


def choose_task(
    targets: Tensor, requested: str = "auto", documented: str | None = None
) -> tuple[Literal["regression", "classification"], str]:
    """Regression or classification for ``targets`` (N, T), and the reason, for the console.

    ``requested`` ("regression" or "classification", e.g. from ``--task``) wins. With "auto",
    ``documented`` (the data source's task: FreeSolv is regression, ``solubility-class`` and
    class-name columns are classification) is taken; without it only 0/1 labels (binary, one or
    several tasks, NaN for a missing label) are classification. Any other integral target, such as
    a count 0..6 or scores {0, 3, 9}, is regression: calling it classes would invent classes that
    are not there.

    Shape:
        targets: ``(N, T)`` with NaN for a missing label.
    """
    if requested not in ("auto", "regression", "classification"):
        raise ValueError(f"task must be auto, regression or classification, got {requested!r}")
    if requested != "auto":
        return requested, f"requested with --task {requested}"  # type: ignore[return-value]
    values = targets[~torch.isnan(targets)]
    binary = _is_binary(values)
    integral = bool(values.numel()) and bool((values == values.round()).all())
    if documented == "classification" or (documented is None and binary):
        why = "every label is 0 or 1" if binary else "the data source's labels are classes"
        return "classification", f"{why}; --task regression overrides"
    if documented not in (None, "regression"):
        raise ValueError(f"unknown documented task {documented!r}")
    if integral:
        why = "integral targets other than 0/1 (counts, scores) are treated as numbers"
        return "regression", f"{why}; --task classification reads them as class ids"
    return "regression", "the targets are real numbers; --task classification overrides"


def infer_task(targets: Tensor, train: Tensor, hint: str | None = None) -> Task:
    """The task of ``targets`` (N, T), standardised on the rows ``train``.

    ``hint`` ("regression" or "classification") decides; without it only 0/1 labels are
    classification (see :func:`choose_task`). Classification with one target whose class ids go
    beyond 1 is ``multiclass`` (C = max id + 1); otherwise it is ``binary`` per target.

    Shape:
        targets: ``(N, T)`` with NaN for a missing label; train: ``(N_train,)`` row indices.
    """
    if hint not in (None, "regression", "classification"):
        raise ValueError(f"task hint must be regression, classification or None, got {hint!r}")
    values = targets[~torch.isnan(targets)]
    classification = hint == "classification" or (hint is None and _is_binary(values))
    T = targets.shape[1]
    zeros, ones = torch.zeros(T), torch.ones(T)
    if not classification:
        part = targets[train]
        mean = torch.nanmean(part, dim=0)
        std = torch.sqrt(torch.nanmean((part - mean) ** 2, dim=0)).clamp(min=1e-6)
        return Task("regression", T, mean, std)
    if values.numel() and not bool(((values >= 0) & (values == values.round())).all()):
        raise ValueError("classification targets must be class ids 0, 1, 2, ...")
    classes = int(values.max()) + 1 if values.numel() else 0
    if T == 1 and classes > 2:
        return Task("multiclass", classes, zeros[:1], ones[:1])
    if classes > 2:  # a per-target BCE needs 0/1 labels
        raise ValueError(
            f"{T} classification targets need 0/1 labels, got class ids up to "
            f"{classes - 1}; fine-tune one multi-class target at a time"
        )
    return Task("binary", T, zeros, ones)


class FinetuneModel(nn.Module):
    """Encoder -> dropout -> linear head for a :class:`Task`.

    Shape:
        input: a ``Batch`` of G graphs; output: ``(G, task.outputs)``.
    """

    def __init__(self, encoder: nn.Module, outputs: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.encoder = encoder
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(int(encoder.feature_dim), outputs)  # type: ignore[arg-type]

    def forward(self, batch: Batch) -> Tensor:
        out: Tensor = self.head(self.dropout(self.encoder(batch)))  # (G, outputs)
        return out


def task_loss(task: Task, out: Tensor, y: Tensor) -> Tensor:
    """Masked loss: MSE on standardised targets, BCE per task, or cross-entropy.

    Shape:
        out: ``(G, outputs)``; y: ``(G, T)`` with NaN where a label is missing.
    """
    out = out.float()
    if task.kind == "multiclass":
        known = ~torch.isnan(y[:, 0])
        per_row = F.cross_entropy(out, y[:, 0].nan_to_num(0).long(), reduction="none")
        return (per_row * known).sum() / known.sum().clamp(min=1)
    known = ~torch.isnan(y)
    target = y.nan_to_num(0)
    if task.kind == "regression":
        target = (target - task.mean.to(y.device)) / task.std.to(y.device)
        per = (out - target) ** 2
    else:
        per = F.binary_cross_entropy_with_logits(out, target, reduction="none")
    return (per * known).sum() / known.sum().clamp(min=1)


def predictions(task: Task, out: Tensor) -> Tensor:
    """Regression values on the original scale, or class probabilities."""
    out = out.float().cpu()
    if task.kind == "regression":
        return out * task.std + task.mean
    return out.softmax(1) if task.kind == "multiclass" else out.sigmoid()


def task_metrics(task: Task, out: Tensor, y: Tensor) -> dict[str, float]:
    """RMSE/MAE, or ROC-AUC (mean over tasks with both classes; macro one-vs-rest) and accuracy.

    Shape:
        out: raw model outputs ``(N, outputs)``; y: ``(N, T)`` with NaN for missing labels.
    """
    pred, y = predictions(task, out), y.cpu()
    if task.kind == "regression":
        known = ~torch.isnan(y)
        err = (pred - y.nan_to_num(0))[known]
        return {"rmse": float(err.pow(2).mean().sqrt()), "mae": float(err.abs().mean())}
    if task.kind == "multiclass":
        known = ~torch.isnan(y[:, 0])
        labels, probs = y[known, 0].long().numpy(), pred[known].numpy()
        accuracy = float((probs.argmax(1) == labels).mean()) if labels.size else math.nan
        present = np.unique(labels)
        auc = math.nan
        if present.size > 1:
            probs = probs[:, present] / probs[:, present].sum(1, keepdims=True)
            if present.size == 2:
                auc = float(roc_auc_score(labels == present[1], probs[:, 1]))
            else:
                auc = float(roc_auc_score(labels, probs, multi_class="ovr", labels=present))
        return {"roc_auc": auc, "accuracy": accuracy}
    aucs, correct, count = [], 0, 0
    for t in range(y.shape[1]):
        known = ~torch.isnan(y[:, t])
        labels, scores = y[known, t].numpy(), pred[known, t].numpy()
        correct += int(((scores > 0.5) == (labels > 0.5)).sum())
        count += labels.size
        if np.unique(labels).size == 2:
            aucs.append(roc_auc_score(labels, scores))
    return {
        "roc_auc": float(np.mean(aucs)) if aucs else math.nan,
        "accuracy": correct / count if count else math.nan,
    }
