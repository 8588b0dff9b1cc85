"""The image pipelines' results table: SimCLR, SupCon and CE against raw pixels and a random-init
encoder, same backbone and budget, on digits-m and digits, over several seeds.

For each data set and seed: ``imagecl train --quick`` for each method; linear probe on frozen h
(full labels and 1 / 5 / 10 labels per class); mean corruption accuracy of the probe (7
corruptions × 5 severities); ``imagecl finetune`` of the SimCLR encoder with 1 % and 10 % of the
labels against the same network from scratch. Prints markdown tables (mean ± std over seeds)
and writes ``results.json``.

    python benchmarks/imagecl_results.py [--seeds 3] [--data digits-m digits] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from imagecl.backbones import build_backbone
from imagecl.commands import finetune, train
from imagecl.corruptions import CORRUPTIONS
from imagecl.data import load_data
from imagecl.evaluate import evaluate_encoder
from imagecl.models import load_trained

CPU = torch.device("cpu")
PER_CLASS = (1, 5, 10)
METHODS = ("simclr", "supcon", "ce")


class _Identity(torch.nn.Module):
    """Raw pixels as the 'encoder': flattened [0, 1]-normalised images."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1)


def _evaluate(encoder: torch.nn.Module, data: Any, seed: int) -> dict[str, Any]:
    numbers = evaluate_encoder(
        encoder,
        data,
        device=CPU,
        seed=seed,
        knn_k=(20,),
        labels_per_class=PER_CLASS,
        corruptions=CORRUPTIONS,
    )
    numbers.pop("corruptions")
    return numbers


def finetune_rows(name: str, seed: int, out: Path, rows: dict[str, dict[str, Any]]) -> None:
    """``imagecl finetune`` of the SimCLR encoder with 1 % and 10 % of the labels vs scratch."""
    checkpoint = str(out / f"{name}-simclr-s{seed}" / "checkpoints" / "last.pt")
    for fraction in (0.01, 0.1):
        result = finetune.main(
            [
                "--checkpoint",
                checkpoint,
                "--label-fraction",
                str(fraction),
                "--seed",
                str(seed),
                "--device",
                "cpu",
                "--out",
                str(out / f"{name}-ft{fraction}-s{seed}-{time.time_ns()}"),
            ]
        )
        rows["simclr"][f"finetune_{fraction:g}_accuracy"] = result["finetuned_accuracy"]
        rows["simclr"][f"scratch_{fraction:g}_accuracy"] = result["scratch_accuracy"]


def one_seed(name: str, seed: int, out: Path) -> dict[str, dict[str, Any]]:
    data = load_data(name, seed=seed)
    rows: dict[str, dict[str, Any]] = {}
    rows["raw pixels"] = _evaluate(_Identity(), data, seed)
    torch.manual_seed(seed)
    random_init = build_backbone("small_cnn", in_channels=data.channels)
    rows["random-init encoder"] = _evaluate(random_init, data, seed)
    for method in METHODS:
        run = out / f"{name}-{method}-s{seed}"
        start = time.perf_counter()
        argv = [
            "--quick",
            "--method",
            method,
            "--data",
            name,
            "--seed",
            str(seed),
            "--device",
            "cpu",
            "--out",
            str(run),
        ]
        if run.exists():
            argv += ["--resume"]  # a finished run only re-evaluates
        train.main(argv)
        seconds = time.perf_counter() - start
        _, data, model = load_trained(run / "checkpoints" / "last.pt", device=CPU)
        rows[method] = {**_evaluate(model.backbone, data, seed), "train_seconds": seconds}
    finetune_rows(name, seed, out, rows)
    return rows


def _cell(values: list[float]) -> str:
    if not values:
        return "–"
    mean = 100 * statistics.fmean(values)
    spread = 100 * statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.1f} ± {spread:.1f}"


def table(results: dict[str, list[dict[str, dict[str, Any]]]]) -> str:
    columns = [
        ("linear_probe_accuracy", "probe (all labels)"),
        *((f"probe_{n}_per_class_accuracy", f"probe {n}/class") for n in PER_CLASS),
        ("knn20_accuracy", "kNN k=20"),
        ("corruption_mean_accuracy", "mean corruption acc."),
        ("finetune_0.01_accuracy", "finetune 1 %"),
        ("scratch_0.01_accuracy", "scratch 1 %"),
        ("finetune_0.1_accuracy", "finetune 10 %"),
        ("scratch_0.1_accuracy", "scratch 10 %"),
    ]
    lines = []
    for name, seeds in results.items():
        lines += [f"### {name} ({len(seeds)} seeds, accuracy %, mean ± std)", ""]
        lines.append("| encoder | " + " | ".join(title for _, title in columns) + " |")
        lines.append("|---" * (len(columns) + 1) + "|")
        for row in seeds[0]:
            cells = [_cell([s[row][key] for s in seeds if key in s[row]]) for key, _ in columns]
            lines.append(f"| {row} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--data", nargs="+", default=["digits-m", "digits"])
    parser.add_argument("--out", type=Path, default=Path("runs/imagecl-results"))
    parser.add_argument(
        "--finetune-only",
        action="store_true",
        help="keep results.json's other numbers and redo the finetune columns",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    results: dict[str, list[dict[str, dict[str, Any]]]] = {}
    if args.finetune_only:
        results = json.loads((args.out / "results.json").read_text())
    for name in args.data:
        if args.finetune_only:
            for seed, rows in enumerate(results[name]):
                finetune_rows(name, seed, args.out, rows)
        else:
            results[name] = [one_seed(name, seed, args.out) for seed in range(args.seeds)]
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print(table(results))


if __name__ == "__main__":
    main()
