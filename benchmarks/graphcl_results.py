"""The graph pipelines' results: GraphCL pre-training on the bundled corpus, then fine-tuning on
FreeSolv, solubility (SOL) and solubility classes with scaffold splits, pre-trained against
scratch in the same run (same splits and seeds), and the robustness table (accuracy under
random and GradArgmax edge flips). Prints the markdown tables of each ``finetune`` run.

    python benchmarks/graphcl_results.py [--epochs 10] [--finetune-epochs 30] [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from graphcl.commands import finetune, pretrain

TASKS = ("freesolv", "solubility", "solubility-class")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=10, help="pre-training epochs")
    parser.add_argument("--finetune-epochs", type=int, default=30)
    parser.add_argument("--layers", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("runs/graphcl-results"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    arch = ["--num-layers", str(args.layers), "--hidden", str(args.hidden)]
    pre = args.out / "pretrain"
    start = time.perf_counter()
    if not (pre / "encoder.safetensors").is_file():
        pretrain.main([*arch, "--epochs", str(args.epochs), "--device", "cpu", "--out", str(pre)])
    print(f"pre-training: {time.perf_counter() - start:.0f} s")
    for task in TASKS:
        start = time.perf_counter()
        print(f"\n### {task} (scaffold split, seeds {args.seeds}, mean ± std)\n")
        finetune.main(
            [
                "--encoder",
                str(pre / "encoder.safetensors"),
                "--data",
                task,
                "--compare-scratch",
                "--epochs",
                str(args.finetune_epochs),
                "--seeds",
                *map(str, args.seeds),
                "--device",
                "cpu",
                "--out",
                str(args.out / f"{task}-{time.time_ns()}"),
            ]
        )
        print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
