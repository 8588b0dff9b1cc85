"""Peak training memory of end-to-end SimCLR, GIM and LoCo: fit's single backward vs the per-unit
step that ``imagecl train --method loco`` runs; with ``--readout``, also their readout accuracy
per stage on digits-m over seeds.

    python benchmarks/loco_memory.py                 # CPU: small_cnn and resnet18, 256 images
    python benchmarks/loco_memory.py --device cuda --batch 512
    python benchmarks/loco_memory.py --backbones small_cnn --batch 64
    python benchmarks/loco_memory.py --readout --seeds 3 [--epochs 25]

``--readout`` trains ``imagecl train --quick --method loco`` (small CNN on digits-m, batch 128)
as end-to-end SimCLR, GIM and LoCo for each seed, the same budget for all (``--epochs``; 25 is
the quick preset's), reads the linear-probe accuracy of every stage from each run's summary,
and prints one markdown table (mean ± std over seeds) with the peak memory of one training
step of that very model and batch, for both paths below. Finished runs in ``--out`` are only
re-evaluated.

One training step — the forward of both views stacked (2 × ``--batch`` rows of 32×32), the
backward and the optimizer step — of one backbone (the same initial weights every time) trained
as end-to-end SimCLR, GIM (overlap 0) and LoCo (overlap 1), 4 stages, 128-d heads, through the
two updaters of :mod:`shared.updaters` / :mod:`imagecl.loco`:

(a) ``OptimizerUpdater`` with ``loco_train_step``: one backward of the total loss, what
    ``shared.train.fit`` runs;
(b) ``LocalUpdater``, what ``imagecl train --method loco`` runs: each unit's loss
    back-propagated as soon as it exists (``local_backward_step``).

The optimizer is SGD with a learning rate of 0 (no state, the weights stay the same), so every
row measures the same model.

Peak memory is the allocator's high-water mark above the start of the step (CPU: the torch
profiler's memory events, as in benchmarks/losses.py; CUDA: ``torch.cuda.max_memory_allocated``).
Gradients are set to ``None`` before each measured step, so their allocation counts alike in
every row. The views are drawn once (SimCLR's CIFAR recipe), outside the measurement. The time
is one un-profiled step after the measured one: a rough figure, not a benchmark of speed.
"""

from __future__ import annotations

import argparse
import copy
import functools
import gc
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.image_augment import timer
from benchmarks.losses import peak_memory
from imagecl.augment import SimCLRViews
from imagecl.backbones import build_backbone
from imagecl.commands import train
from imagecl.config import QUICK
from imagecl.loco import LocalUpdater, loco_train_step
from imagecl.loco_model import LoCoModel
from shared.updaters import OptimizerUpdater, StepContext, Updater

TAU = 0.5  # SimCLR's CIFAR temperature
MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)  # CIFAR-10
METHODS: dict[str, dict[str, Any]] = {
    "end-to-end": {"end_to_end": True},
    "GIM (overlap 0)": {"overlap": 0},
    "LoCo (overlap 1)": {"overlap": 1},
}
# the same three as `imagecl train --method loco` flags, and their run-folder names
TRAIN_FLAGS: dict[str, tuple[str, list[str]]] = {
    "end-to-end": ("e2e", ["--end-to-end"]),
    "GIM (overlap 0)": ("gim", ["--overlap", "0"]),
    "LoCo (overlap 1)": ("loco", ["--overlap", "1"]),
}
Batch = tuple[Tensor, Tensor]


def single_backward(model: LoCoModel, views: Callable[[Tensor], Tensor]) -> Updater:
    """Path (a): one total loss, one backward (``fit``'s updater)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    step = functools.partial(loco_train_step, views=views, temperature=TAU, gather=False)
    return OptimizerUpdater(model, optimizer, step)


def per_unit_backward(model: LoCoModel, views: Callable[[Tensor], Tensor]) -> Updater:
    """Path (b): each unit back-propagated as soon as its loss exists (``imagecl train``'s)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    return LocalUpdater(model, optimizer, views=views, temperature=TAU, gather=False)


PATHS = {"(a) single backward": single_backward, "(b) per-unit (CLI)": per_unit_backward}


def peak_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """High-water mark of allocations while ``fn`` runs, above what was allocated at its start."""
    if device.type != "cuda":
        return peak_memory(fn)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    start = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - start


def bench_backbone(name: str, batch_size: int, device: torch.device) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    backbone = build_backbone(name, width=32, cifar_stem=True)
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (batch_size, 3, 32, 32), dtype=torch.uint8, generator=g)
    batch = (images.to(device), torch.zeros(batch_size, dtype=torch.long, device=device))
    x: Tensor = SimCLRViews(32, MEAN, STD, "simclr_cifar").to(device)(batch[0])  # (N, 2, 3, 32, 32)

    def views(_: Tensor) -> Tensor:
        return x  # the same views for every row

    rows = []
    for method, kwargs in METHODS.items():
        torch.manual_seed(1)  # the same heads for every path
        model = LoCoModel(copy.deepcopy(backbone), **kwargs).to(device).train()
        params = sum(p.numel() * p.element_size() for p in model.parameters())
        for path, make in PATHS.items():
            updater = make(model, views)
            ctx = StepContext(step=1, device=device, dtype=None)
            run = lambda u=updater, ctx=ctx: u.step(iter([batch]), ctx)  # noqa: E731
            model.zero_grad(set_to_none=True)
            gc.collect()
            peak = peak_bytes(run, device)
            model.zero_grad(set_to_none=True)
            secs = timer(run, device)()
            model.zero_grad(set_to_none=True)
            rows.append(
                {
                    "backbone": name,
                    "method": method,
                    "path": path,
                    "peak_mib": peak / 2**20,
                    "params_mib": params / 2**20,
                    "seconds": secs,
                }
            )
            print(f"  {name:9} {method:17} {path:22} {peak / 2**20:9.1f} MiB", flush=True)
        del model
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    print(
        f"\n{'backbone':9} {'method':17} {'path':22} {'peak MiB':>9} {'× e2e (a)':>9} "
        f"{'params MiB':>10} {'s/step':>7}"
    )
    for name in dict.fromkeys(r["backbone"] for r in rows):
        group = [r for r in rows if r["backbone"] == name]
        reference = next(r["peak_mib"] for r in group if r["method"] == "end-to-end")
        for r in group:
            print(
                f"{name:9} {r['method']:17} {r['path']:22} {r['peak_mib']:9.1f} "
                f"{r['peak_mib'] / reference:9.2f} {r['params_mib']:10.1f} {r['seconds']:7.2f}"
            )


def train_readout(method: str, seed: int, epochs: int, out: Path) -> dict[str, Any]:
    """The summary of one quick LoCo-family run (trained unless finished): its steps and the
    readout accuracy of every stage, ``stage{k}_probe_accuracy``."""
    name, flags = TRAIN_FLAGS[method]
    run = out / f"{name}-e{epochs}-s{seed}"
    argv = [
        "--quick",
        "--method",
        "loco",
        *flags,
        "--epochs",
        str(epochs),
        "--seed",
        str(seed),
        "--device",
        "cpu",
        "--out",
        str(run),
    ]
    if (run / "checkpoints" / "last.pt").is_file():
        argv.append("--resume")  # finished: only re-evaluated
    return train.main(argv)


def _cell(values: list[float]) -> str:
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * statistics.fmean(values):.1f} ± {100 * spread:.1f}"


def readout_table(seeds: int, epochs: int, out: Path) -> None:
    """Train end-to-end, GIM and LoCo per seed; print readout per stage and peak memory."""
    runs: dict[str, list[dict[str, Any]]] = {method: [] for method in METHODS}
    for seed in range(seeds):
        for method in METHODS:
            runs[method].append(train_readout(method, seed, epochs, out))
            (out / "readout.json").write_text(json.dumps(runs, indent=1))
    batch = int(QUICK["batch_size"])
    memory = bench_backbone("small_cnn", batch, torch.device("cpu"))
    peak = {(r["method"], r["path"]): r["peak_mib"] for r in memory}
    first = runs["end-to-end"][0]
    stages = sum(1 for key in first if key.startswith("stage") and key.endswith("_probe_accuracy"))
    print(
        f"\ndigits-m, small CNN width 32, batch {batch}, {first['steps']} steps ({epochs} epochs), "
        f"{seeds} seed(s): linear-probe readout accuracy (%) of each stage's pooled output, "
        f"mean ± std; peak memory of one training step (batch {batch} × 2 views, CPU): (a) "
        "fit's single backward, (b) per-unit backward\n"
    )
    head = " | ".join(f"stage {k + 1}" for k in range(stages))
    print(f"| method | {head} | peak MiB (a) | peak MiB (b) |")
    print("|---" * (stages + 3) + "|")
    for method, summaries in runs.items():
        cells = " | ".join(
            _cell([float(s[f"stage{k}_probe_accuracy"]) for s in summaries]) for k in range(stages)
        )
        a, b = (peak[(method, path)] for path in PATHS)
        print(f"| {method} | {cells} | {a:.1f} | {b:.1f} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=256, help="images per step (2 views each)")
    parser.add_argument("--backbones", nargs="+", default=["small_cnn", "resnet18"])
    parser.add_argument("--readout", action="store_true", help="train and read out every stage")
    parser.add_argument("--seeds", type=int, default=3, help="--readout: seeds 0..N-1")
    parser.add_argument("--epochs", type=int, default=int(QUICK["epochs"]))
    parser.add_argument("--out", type=Path, default=Path("runs/loco-results"))
    parser.add_argument("--threads", type=int, default=2, help="--readout: torch threads")
    args = parser.parse_args(argv)
    if args.readout:
        torch.set_num_threads(args.threads)
        readout_table(args.seeds, args.epochs, args.out)
        return
    device = torch.device(args.device)
    print(
        f"torch {torch.__version__}, {device}, {torch.get_num_threads()} threads, batch "
        f"{args.batch} × 2 views of 32×32, fp32, 4 stages, one forward + backward"
    )
    rows: list[dict[str, Any]] = []
    for name in args.backbones:
        rows += bench_backbone(name, args.batch, device)
    print_table(rows)


if __name__ == "__main__":
    main()
