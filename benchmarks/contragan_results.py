"""ContraGAN against ProjGAN against ACGAN: same networks, same budget, several seeds.

Trains ``contragan train`` with ``--loss contra|proj|ac`` on one data set (digits by default,
the small networks, ``--steps`` G steps of batch 64 with ``--n-dis`` D steps each) for every
seed, evaluates each run's EMA generator with ``contragan evaluate`` (one generated set per
run), and prints every figure as mean ± std over the training seeds next to real-vs-real
(train images against the test split, over the same seeds). Run folders (with their sample
grids) go to ``runs/bench/contragan/<data>-<loss>-s<seed>``; runs already finished are
evaluated again but not retrained.

    python benchmarks/contragan_results.py                    # digits, 3 seeds, 600 steps
    python benchmarks/contragan_results.py --data digits-m --steps 600
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path
from typing import Any

import torch

from contragan.commands.evaluate import main as evaluate_main
from contragan.commands.train import main as train_main
from contragan.report import FIGURES

LOSSES = ("contra", "proj", "ac")


def _mean_std(values: list[float]) -> str:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return "nan"
    std = statistics.stdev(finite) if len(finite) > 1 else 0.0
    return f"{statistics.fmean(finite):.4g} ± {std:.2g}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default="digits")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--n-dis", type=int, default=2)
    parser.add_argument("--cas-epochs", type=int, default=12)
    parser.add_argument("--root", type=Path, default=Path("runs/bench/contragan"))
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    results: dict[str, list[dict[str, Any]]] = {loss: [] for loss in LOSSES}
    for seed in range(args.seeds):
        for loss in LOSSES:
            out = args.root / f"{args.data}-{loss}-s{seed}"
            if not (out / "summary.json").is_file():
                train_main(
                    [
                        "--quick",
                        "--data",
                        args.data,
                        "--loss",
                        loss,
                        "--seed",
                        str(seed),
                        "--max-steps",
                        str(args.steps),
                        "--n-dis",
                        str(args.n_dis),
                        "--eval-every",
                        str(max(1, args.steps // 4)),
                        "--out",
                        str(out),
                        "--no-progress",
                    ]
                )
            results[loss].append(
                evaluate_main(
                    [
                        "--checkpoint",
                        str(out / "checkpoints" / "last.pt"),
                        "--seeds",
                        "1",
                        "--seed",
                        str(seed),
                        "--cas-epochs",
                        str(args.cas_epochs),
                        "--cache-dir",
                        str(args.root / "extractors"),
                    ]
                )
            )
    first = results[LOSSES[0]]
    header = "| figure | better | " + " | ".join(LOSSES) + " | real vs real |"
    print(
        f"\n{args.data}: {args.steps} G steps × {args.n_dis} D steps, batch 64, "
        f"{args.seeds} seeds (mean ± std over training seeds); extractor test accuracy "
        f"{100 * first[0]['extractor_test_accuracy']:.1f} %\n"
    )
    print(header)
    print("|---|---|" + "---|" * (len(LOSSES) + 1))
    for key, better in FIGURES.items():
        cells = [_mean_std([r[key] for r in results[loss]]) for loss in LOSSES]
        real = _mean_std([r[f"real_{key}"] for r in first])
        print(f"| {key} | {better} | " + " | ".join(cells) + f" | {real} |")


if __name__ == "__main__":
    main()
