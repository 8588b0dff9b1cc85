"""CLAE's results on digits-m: probe accuracy and PGD-robust probe accuracy of SimCLR against
SimCLR + CLAE, and of SupCon against SupCon + adversarial views (at the default ε and at
ε = 0.004), same backbone and budget (``imagecl train --quick``, ``--epochs`` of it, the same
for every method), several seeds.
Prints a markdown table (mean ± std) and writes ``results.json``. Finished runs in ``--out``
are only re-evaluated.

    python benchmarks/imagecl_robust_results.py [--seeds 3] [--epochs 25] [--eps 0.0078]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from imagecl.commands import train
from imagecl.config import QUICK
from imagecl.evaluate import evaluate_encoder
from imagecl.models import load_trained

CPU = torch.device("cpu")
RUNS = {
    "SimCLR": ["--method", "simclr"],
    "SimCLR + CLAE": ["--method", "clae"],
    "SupCon": ["--method", "supcon"],
    "SupCon + adversarial": ["--method", "supcon", "--adversarial"],
    # the attack on SupCon climbs the supervised loss: at the default ε = 0.015 it drives x_adv
    # into other classes; a smaller ε keeps it a view of its own class
    "SupCon + adversarial, ε = 0.004": [
        "--method",
        "supcon",
        "--adversarial",
        "--adv-eps",
        "0.004",
    ],
}


def one(
    name: str, argv: list[str], seed: int, out: Path, *, epochs: int, eps: float, steps: int
) -> dict[str, Any]:
    folder = name.replace(" ", "").replace("+", "-").replace(",ε=", "-eps")
    run = out / f"{folder}-e{epochs}-s{seed}"
    flags = [
        "--quick",
        "--epochs",
        str(epochs),
        "--seed",
        str(seed),
        "--device",
        "cpu",
        "--out",
        str(run),
        *argv,
    ]
    if (run / "checkpoints" / "last.pt").is_file():
        flags.append("--resume")  # finished: only re-evaluated
    train.main(flags)
    _, data, model = load_trained(run / "checkpoints" / "last.pt", device=CPU)
    numbers = evaluate_encoder(
        model.backbone,
        data,
        device=CPU,
        seed=seed,
        knn_k=(),
        attack="pgd",
        eps=eps,
        attack_steps=steps,
    )
    return {"probe": numbers["linear_probe_accuracy"], "robust": numbers["pgd_robust_accuracy"]}


def _cell(values: list[float]) -> str:
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * statistics.fmean(values):.1f} ± {100 * spread:.1f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=int(QUICK["epochs"]))
    parser.add_argument("--eps", type=float, default=2 / 255, help="PGD ε in pixel units")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("runs/imagecl-robust-results"))
    parser.add_argument("--threads", type=int, default=2, help="torch threads (1 on a busy CPU)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in RUNS}
    for seed in range(args.seeds):
        for name, flags in RUNS.items():
            results[name].append(
                one(name, flags, seed, args.out, epochs=args.epochs, eps=args.eps, steps=args.steps)
            )
            (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print(
        f"digits-m, small CNN, {args.epochs} epochs of batch 128, {args.seeds} seeds, PGD ε = "
        f"{args.eps:.4f} ({args.steps} steps) on the linear probe, % mean ± std\n"
    )
    print("| method | probe accuracy | PGD-robust probe accuracy |\n|---|---|---|")
    for name, runs in results.items():
        probe, robust = [r["probe"] for r in runs], [r["robust"] for r in runs]
        print(f"| {name} | {_cell(probe)} | {_cell(robust)} |")


if __name__ == "__main__":
    main()
