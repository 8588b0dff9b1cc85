"""``graphcl probe``: frozen embeddings of a pre-trained encoder, scored by simple models.

Regression: ridge regression with its penalty chosen by cross-validation on the training split
(scikit-learn ``RidgeCV``), RMSE and MAE on test. Classification: ``shared.probes.linear_probe``
(L2 logistic regression, weight decay chosen on a held-out part of train) and an SVM whose C is
chosen by 5-fold cross-validation on train (GraphCL's TU protocol, scikit-learn). Scaffold split
by default; the untrained encoder of the same architecture is probed alongside as the baseline.
"""

from __future__ import annotations

import math
from typing import Any

from graphcl.config import ProbeConfig as Config
from graphcl.data import load_molecules, skipped_summary, write_skipped
from graphcl.evaluate import embed, probe_features
from graphcl.models import encoder_from_config, load_pretrained
from graphcl.report import open_run
from graphcl.splits import make_split
from graphcl.tasks import choose_task
from shared.config import parse_config, save_config
from shared.runs import write_report, write_summary
from shared.runtime import runs_on_this_rank, seed_everything, select_device

__all__ = ["Config", "main"]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``graphcl probe --encoder RUN/encoder.safetensors --data solubility``."""
    cfg = parse_config(Config, argv, prog="graphcl probe")
    if not runs_on_this_rank("graphcl probe"):  # one process: under torchrun, rank 0 alone
        return {}
    device = select_device(cfg.device)
    encoder, config = load_pretrained(cfg.encoder)
    targets = tuple(t.strip() for t in cfg.target.split(",") if t.strip())
    data = load_molecules(
        cfg.data,
        smiles_column=cfg.smiles_column,
        targets=targets,
        layout=config["layout"],
        root=cfg.data_root,
        task=None if cfg.task == "auto" else cfg.task,
        max_molecules=cfg.max_molecules,
        seed=cfg.seed,
    )
    if data.targets is None:
        raise ValueError(f"data {cfg.data!r} has no targets; name them with --target")
    kind, why = choose_task(data.targets, cfg.task, data.task)
    print(f"graphcl probe: task {kind} for {', '.join(data.target_names)}: {why}")
    split = make_split(cfg.split, data.smiles, seed=cfg.seed)
    classification = kind == "classification"
    run = open_run(cfg.out, "probe")
    save_config(cfg, run.path)
    write_skipped(data, run.path / "skipped.csv")
    if data.skipped:
        print(skipped_summary(data))
    seed_everything(cfg.seed)
    encoders = {
        "pretrained": encoder.to(device),
        "random_init": encoder_from_config(config).to(device),
    }
    summary: dict[str, Any] = {
        "data": data.name,
        "molecules": len(data.graphs),
        "skipped": len(data.skipped),
    }
    for name, model in encoders.items():
        h = embed(model, data.graphs, device)  # (N, D)
        for t, target in enumerate(data.target_names):
            y = data.targets[:, t]
            scores = probe_features(
                h[split.train],
                y[split.train],
                h[split.test],
                y[split.test],
                classification=classification,
                seed=cfg.seed,
            )
            for key, value in scores.items():
                summary[f"{name}/{target}/{key}"] = value if math.isfinite(value) else None
    write_summary(run.summary_path, summary)
    write_report(run, f"graphcl probe on {data.name}", {"Protocol": __doc__ or ""}, summary=summary)
    return summary
