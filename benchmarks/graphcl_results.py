"""The graph pipelines' results: GraphCL pre-training on one or more corpora (the bundled ~8.8 K
molecules, MOSES's 1.58 M ZINC molecules or a seeded subset), then fine-tuning on FreeSolv,
solubility (SOL) and solubility classes with scaffold splits: each corpus's encoder against
scratch in the same splits and seeds, and against a fingerprint baseline on the same splits
(ECFP4, 2048 bits, with ridge and with a random forest; rdkit + scikit-learn). Prints each
``finetune`` run's own table, then one table per task (mean ± std over seeds, final and
best-validation test metrics), where each pre-trained column also says by how many standard
deviations (of scratch's seeds) it differs from scratch. Finished pre-training and fine-tuning
runs are read back, not redone.

    python benchmarks/graphcl_results.py [--corpora bundled] [--epochs 10] [--seeds 0 1 2]
    python benchmarks/graphcl_results.py --corpora bundled=57 moses=2 --max-molecules 250000 \\
        --out runs/graphcl-results-moses   # the same number of pre-training steps on each
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from graphcl.commands import finetune, pretrain
from graphcl.data import load_molecules
from graphcl.splits import make_split

TASKS = ("freesolv", "solubility", "solubility-class")


def _mean_std(values: list[float]) -> tuple[float, float]:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return math.nan, math.nan
    return statistics.fmean(finite), statistics.stdev(finite) if len(finite) > 1 else 0.0


def _pretrain(corpus: str, args: Any, arch: list[str]) -> Path:
    corpus, _, epochs = corpus.partition("=")  # NAME=EPOCHS: this corpus's own epochs
    out = args.out / f"pretrain-{corpus}"
    if (out / "encoder.safetensors").is_file():
        return out / "encoder.safetensors"
    epochs = epochs or str(args.epochs)
    options = [*arch, "--data", corpus, "--epochs", epochs, "--device", "cpu"]
    if args.max_molecules and corpus.startswith("moses"):
        options += ["--max-molecules", str(args.max_molecules)]
    start = time.perf_counter()
    summary = pretrain.main([*options, "--out", str(out)])
    print(
        f"pre-training on {corpus}: {summary['molecules']} molecules, {summary['steps']} steps, "
        f"{time.perf_counter() - start:.0f} s",
        flush=True,
    )
    return out / "encoder.safetensors"


def _finetune(task: str, name: str, encoder: Path | None, args: Any) -> dict[str, list[dict]]:
    """Fine-tune (pre-trained from ``encoder``, and scratch when ``encoder`` is None) and read
    back every seed's result."""
    out = args.out / f"{task}-{name.removeprefix('GraphCL on ').replace(' ', '-')}"
    options = ["--data", task, "--epochs", str(args.finetune_epochs), "--device", "cpu"]
    options += ["--seeds", *map(str, args.seeds), "--out", str(out)]
    if encoder is not None:
        options += ["--encoder", str(encoder)]
    else:
        options += ["--num-layers", str(args.layers), "--hidden", str(args.hidden)]
    if out.is_dir():
        options.append("--resume")
    finetune.main(options)
    init = "pretrained" if encoder is not None else "scratch"
    return {
        name: [
            json.loads((out / f"{init}-seed{s}" / "result.json").read_text()) for s in args.seeds
        ]
    }


def _fingerprints(smiles: list[str]) -> np.ndarray:
    from rdkit import Chem
    from rdkit.Chem import rdFingerprintGenerator

    generator = rdFingerprintGenerator.GetMorganGenerator(radius=2, fpSize=2048)  # ECFP4
    rows = [generator.GetFingerprintAsNumPy(Chem.MolFromSmiles(s)) for s in smiles]
    return np.stack(rows).astype(np.float32)  # (N, 2048)


def _fingerprint_baselines(task: str, args: Any) -> dict[str, list[dict]]:
    """ECFP4 + ridge and ECFP4 + random forest on the fine-tuning runs' scaffold splits."""
    from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor
    from sklearn.linear_model import RidgeClassifierCV, RidgeCV
    from sklearn.metrics import accuracy_score, roc_auc_score

    data = load_molecules(task)
    assert data.targets is not None
    features = _fingerprints(list(data.smiles))
    y = data.targets[:, 0].numpy()
    classification = data.task == "classification"
    results: dict[str, list[dict]] = {"ECFP4 + ridge": [], "ECFP4 + RF": []}
    alphas = np.logspace(-2, 3, 12)
    for seed in args.seeds:
        split = make_split("scaffold", data.smiles, data.targets, seed=seed)
        train = [i for i in split.train if not math.isnan(y[i])]
        test = [i for i in split.test if not math.isnan(y[i])]
        x_train, x_test, y_train, y_test = features[train], features[test], y[train], y[test]
        if classification:
            models: dict[str, Any] = {
                "ECFP4 + ridge": RidgeClassifierCV(alphas=alphas),
                "ECFP4 + RF": RandomForestClassifier(500, n_jobs=args.threads, random_state=seed),
            }
        else:
            models = {
                "ECFP4 + ridge": RidgeCV(alphas=alphas),
                "ECFP4 + RF": RandomForestRegressor(500, n_jobs=args.threads, random_state=seed),
            }
        for name, model in models.items():
            model.fit(x_train, y_train)
            if not classification:
                error = model.predict(x_test) - y_test
                results[name].append(
                    {
                        "final_rmse": float(np.sqrt(np.mean(error**2))),
                        "final_mae": float(np.mean(np.abs(error))),
                    }
                )
                continue
            if hasattr(model, "predict_proba"):
                scores = model.predict_proba(x_test)
            else:  # ridge: softmax of its decision function
                logits = model.decision_function(x_test)
                scores = np.exp(logits - logits.max(1, keepdims=True))
                scores /= scores.sum(1, keepdims=True)
            labels = y_test.astype(int)
            results[name].append(
                {
                    "final_roc_auc": float(
                        roc_auc_score(labels, scores, multi_class="ovr", labels=model.classes_)
                    ),
                    "final_accuracy": float(accuracy_score(labels, model.predict(x_test))),
                }
            )
    return results


def _table(task: str, columns: dict[str, list[dict]]) -> str:
    """One row per metric, one column per method (mean ± std over seeds); each pre-trained
    column also says its distance from scratch in scratch's standard deviations."""
    names = list(columns)
    keys = [k for k in columns["scratch"][0] if k.startswith(("final_", "best_valid_"))]
    lines = [f"\n### {task}: scaffold split, test metrics, mean ± std over seeds\n"]
    lines += ["| metric | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for key in keys:
        base_mean, base_std = _mean_std([r[key] for r in columns["scratch"]])
        cells = []
        for name in names:
            values = [r[key] for r in columns[name] if key in r]
            if not values:
                cells.append("–")
                continue
            mean, std = _mean_std(values)
            cell = f"{mean:.4g} ± {std:.2g}"
            if name.startswith("GraphCL") and base_std > 0:
                cell += f" ({(mean - base_mean) / base_std:+.1f} σ)"
            cells.append(cell)
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--corpora",
        nargs="+",
        default=["bundled"],
        help="pre-training data, each NAME or NAME=EPOCHS (its own epochs instead of --epochs)",
    )
    parser.add_argument("--max-molecules", type=int, default=None, help="moses: a seeded subset")
    parser.add_argument("--epochs", type=int, default=10, help="pre-training epochs")
    parser.add_argument("--finetune-epochs", type=int, default=30)
    parser.add_argument("--layers", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("runs/graphcl-results"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    arch = ["--num-layers", str(args.layers), "--hidden", str(args.hidden)]
    encoders = {corpus.partition("=")[0]: _pretrain(corpus, args, arch) for corpus in args.corpora}
    tables = []
    for task in args.tasks:
        start = time.perf_counter()
        print(f"\n## {task} (scaffold split, seeds {args.seeds})\n", flush=True)
        columns = _finetune(task, "scratch", None, args)
        for corpus, encoder in encoders.items():
            columns.update(_finetune(task, f"GraphCL on {corpus}", encoder, args))
        columns.update(_fingerprint_baselines(task, args))
        tables.append(_table(task, columns))
        print(tables[-1], f"\n({time.perf_counter() - start:.0f} s)", flush=True)
    text = "\n".join(tables) + "\n"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.md").write_text(text, encoding="utf-8")  # the tables, as printed
    print(text)


if __name__ == "__main__":
    main()
