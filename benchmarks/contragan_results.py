"""Class-conditional GANs side by side: same networks, same budget, several seeds.

Trains ``contragan train`` for every variant of :data:`VARIANTS` (faithful ContraGAN, ContraGAN
with proxy-only positives, ReACGAN's D2D-CE at its CIFAR-10 τ and at τ 0.1, ProjGAN, ACGAN) on
each data set (the small digits networks, ``--steps`` G steps of batch 64 with ``--n-dis`` D
steps each, ``--image-size`` pixels) for every seed, evaluates each run's EMA generator with
``contragan evaluate`` (``--eval-seeds`` generated sets per run, each with its own CAS
classifier) and prints every figure as mean ± std over the training seeds next to real-vs-real
(train images against the test split, over the same seeds).

``--curve`` first trains the table's ProjGAN seed-0 run in segments, resuming it, and evaluates
it after each, so the table shows where its GAN-test levels off: the budget of the comparison
should lie there.

Run folders (each with its sample grid, ``plots/samples.png``) go to
``<root>/<data>-<variant>-s<seed>``; the grids are also copied to ``<root>/grids/``, and the
tables to a Markdown file named results in ``<root>``. Finished runs and evaluations are read
back, not redone.

    python benchmarks/contragan_results.py                      # digits and digits-m, 3 seeds
    python benchmarks/contragan_results.py --data digits --seeds 1 --steps 400 --variants proj
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import time
from pathlib import Path
from typing import Any, get_args

import torch

from contragan.commands.evaluate import main as evaluate_main
from contragan.commands.train import main as train_main
from contragan.metrics import CasSamples
from contragan.report import FIGURES

# variant -> (what it is, its contragan train options)
VARIANTS: dict[str, tuple[str, list[str]]] = {
    "contra": ("ContraGAN: 2C, data-to-data positives, τ 1 (the paper)", ["--loss", "contra"]),
    "contra-proxy": (
        "ContraGAN: 2C with proxy-only positives, τ 0.1",
        ["--loss", "contra", "--class-positives", "proxy", "--tau", "0.1"],
    ),
    "reacgan": (
        "ReACGAN: D2D-CE, λ 0.5, m_p 0.98, τ 0.5 (its CIFAR-10 config)",
        ["--loss", "reacgan"],
    ),
    "reacgan-t0.1": (
        "ReACGAN: D2D-CE, λ 0.5, m_p 0.98, τ 0.1",
        ["--loss", "reacgan", "--tau", "0.1"],
    ),
    "proj": ("ProjGAN: projection discriminator", ["--loss", "proj"]),
    "ac": ("ACGAN: auxiliary classifier on real and fake", ["--loss", "ac"]),
}
# the table's variants; the others are the tuning of the two class-consistent options
MAIN = list(VARIANTS)
VARIANTS.update(
    {
        f"contra-proxy-{name}": (
            f"ContraGAN: 2C with proxy-only positives, τ {tau}, λ {lam}",
            ["--loss", "contra", "--class-positives", "proxy", "--tau", tau, "--lambda-2c", lam],
        )
        for name, tau, lam in [
            ("t0.05", "0.05", "1.0"),
            ("t0.2", "0.2", "1.0"),
            ("t0.3", "0.3", "1.0"),
            ("t0.15", "0.15", "1.0"),
            ("l2", "0.1", "2.0"),
            ("l0.5", "0.1", "0.5"),
            ("l0.25", "0.1", "0.25"),
            ("t0.2-l0.5", "0.2", "0.5"),
            ("t0.2-l0.25", "0.2", "0.25"),
            ("t0.3-l0.25", "0.3", "0.25"),
            ("t0.5-l0.25", "0.5", "0.25"),
            ("t0.2-l0.1", "0.2", "0.1"),
        ]
    }
    | {
        f"reacgan-t{tau}": (
            f"ReACGAN: D2D-CE, λ 0.5, m_p 0.98, τ {tau}",
            ["--loss", "reacgan", "--tau", tau],
        )
        for tau in ("0.2", "0.3")
    }
)
# the best contrastive option and ProjGAN with DiffAugment's CIFAR-10 recipe on D's images
VARIANTS.update(
    {
        f"{name}-da": (
            f"{VARIANTS[name][0]}, DiffAugment",
            [*VARIANTS[name][1], "--diffaug", "color,translation,cutout"],
        )
        for name in ("proj", "contra-proxy-t0.2")
    }
)
# each contrastive option with ADC's second proxy per class, for fakes (--adc)
VARIANTS.update(
    {
        f"{name}-adc": (f"{VARIANTS[name][0]}, ADC", [*VARIANTS[name][1], "--adc"])
        for name in (
            "contra",
            "contra-proxy",
            "contra-proxy-t0.2",
            "contra-proxy-t0.2-l0.25",
            "reacgan",
            "reacgan-t0.1",
        )
    }
)
# the contrastive options with ProjGAN's conditional adversarial logit (--proj-adv)
VARIANTS.update(
    {
        f"{name}-pa": (f"{VARIANTS[name][0]}, projection logit", [*VARIANTS[name][1], "--proj-adv"])
        for name in (
            "contra-proxy-t0.2",
            "contra-proxy-t0.2-l0.5",
            "contra-proxy-t0.2-l0.25",
            "contra-proxy-t0.3-l0.25",
            "contra-proxy-t0.5-l0.25",
            "contra-proxy-t0.2-l0.1",
            "contra-proxy-t0.2-l0.25-adc",
            "reacgan-t0.1",
        )
    }
)
# λ 0.25 with the projection logit, G's class term weighed less than D's (--g-lambda-2c)
VARIANTS.update(
    {
        f"contra-proxy-t0.2-l0.25-g{g}-pa": (
            f"ContraGAN: 2C with proxy-only positives, τ 0.2, λ 0.25 (G: {g}), projection logit",
            [*VARIANTS["contra-proxy-t0.2-l0.25-pa"][1], "--g-lambda-2c", g],
        )
        for g in ("0", "0.1")
    }
)
# the same with ADC's fake proxies: D's class term on real and fake, none in G's loss
VARIANTS["contra-proxy-t0.2-l0.25-adc-g0-pa"] = (
    "ContraGAN: 2C with proxy-only positives, τ 0.2, λ 0.25 (G: 0), ADC, projection logit",
    [*VARIANTS["contra-proxy-t0.2-l0.25-adc-pa"][1], "--g-lambda-2c", "0"],
)
# an option's value written HALF_RUN (THIRD_RUN) is half (a third of) the run's G steps (--steps)
HALF_RUN = "{half-run}"
THIRD_RUN = "{third-run}"
RUN_FRACTIONS = {HALF_RUN: 2, THIRD_RUN: 3}
# the class term for the first half (third) of the run only: its weights fall linearly to 0 by
# then, and with the projection logit the rest of the run trains as ProjGAN
_DECAYED = {  # placeholder: (name suffix, when in words, the variants it is added to)
    HALF_RUN: (
        "decay",
        "half the run",
        ("contra-proxy-t0.2-l0.25-pa", "contra-proxy-t0.2-l0.25-adc-pa"),
    ),
    THIRD_RUN: (
        "decay3",
        "a third of the run",
        ("contra-proxy-t0.2-l0.25-pa", "contra-proxy-t0.2-l0.25-g0-pa"),
    ),
}
VARIANTS.update(
    {
        f"{name}-{suffix}": (
            f"{VARIANTS[name][0]}, class term falling to 0 by {words}",
            [*VARIANTS[name][1], "--lambda-2c-decay", when],
        )
        for when, (suffix, words, names) in _DECAYED.items()
        for name in names
    }
)


def _run_options(variant: str, steps: int) -> list[str]:
    """``variant``'s options for a run of ``steps`` G steps: HALF_RUN and THIRD_RUN replaced."""
    return [
        str(max(1, steps // RUN_FRACTIONS[o])) if o in RUN_FRACTIONS else o
        for o in VARIANTS[variant][1]
    ]


def _mean_std(values: list[float]) -> str:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return "nan"
    std = statistics.stdev(finite) if len(finite) > 1 else 0.0
    return f"{statistics.fmean(finite):.4g} ± {std:.2g}"


def paired(
    ours: dict[int, dict[str, Any]], base: dict[int, dict[str, Any]], key: str, better: str
) -> tuple[float, float, int, int]:
    """Seed-by-seed comparison of two variants over the seeds both have run.

    Returns the mean of the per-seed differences ``ours - base``, its standard error (0 with one
    seed), the number of shared seeds, and the number of those where ours is at least as good
    (``better``: ``"higher"`` or ``"lower"``). Two runs of one seed are evaluated with the same
    draws (CAS classifier, KID subsets); the standard error of the paired differences says
    whether a difference of means is larger than the seeds' own spread.
    """
    if better not in ("higher", "lower"):
        raise ValueError(f"better must be 'higher' or 'lower', got {better!r}")
    shared = sorted(set(ours) & set(base))
    if not shared:
        raise ValueError("the two variants have no seed in common")
    diffs = [float(ours[seed][key]) - float(base[seed][key]) for seed in shared]
    error = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else 0.0
    wins = sum(d >= 0 if better == "higher" else d <= 0 for d in diffs)
    return statistics.fmean(diffs), error, len(diffs), wins


def _paired_lines(data: str, results: dict[str, dict[int, dict[str, Any]]]) -> list[str]:
    """The table of every variant against ProjGAN, seed by seed (empty without ProjGAN)."""
    base = results.get("proj", {})
    others = [v for v, runs in results.items() if v != "proj" and set(runs) & set(base)]
    if not others:
        return []
    lines = [
        f"\n### {data}: against ProjGAN, seed by seed (mean of the differences ± its standard "
        "error; seeds at least as good / seeds shared)\n",
        "| figure | better | " + " | ".join(others) + " |",
        "|---|---|" + "---|" * len(others),
    ]
    # recall beside coverage: k-NN recall counts a real image covered when it falls in any fake's
    # neighbourhood ball, so a few outlying fakes (large balls) raise it; coverage counts balls
    # around real images only (Naeem et al., 2020) and is the steadier measure of diversity
    for key in ("gan_test_acc", "cas_acc", "fd", "precision", "recall", "density", "coverage"):
        cells = []
        for variant in others:
            mean, error, n, wins = paired(results[variant], base, key, FIGURES[key])
            cells.append(f"{mean:+.4f} ± {error:.4f} ({wins}/{n})")
        lines.append(f"| {key} | {FIGURES[key]} | " + " | ".join(cells) + " |")
    return lines


def _finished(out: Path, steps: int) -> bool:
    """Whether the run in ``out`` has trained ``steps`` G steps (its summary says so)."""
    if not (out / "summary.json").is_file():
        return False
    return bool(json.loads((out / "summary.json").read_text()).get("steps") == steps)


def _train(out: Path, data: str, variant: str, seed: int, steps: int, args: Any) -> float:
    """Train (or continue, up to ``steps``) one run; return the seconds it took (0: done)."""
    last = out / "checkpoints" / "last.pt"
    if _finished(out, steps):
        return 0.0
    if out.exists() and not last.is_file():
        shutil.rmtree(out)  # a run cut short before its first checkpoint
    start = time.perf_counter()
    train_main(
        [
            "--quick",
            "--data",
            data,
            *_run_options(variant, steps),
            "--seed",
            str(seed),
            "--image-size",
            str(args.image_size),
            "--max-steps",
            str(steps),
            "--n-dis",
            str(args.n_dis),
            "--eval-every",
            str(max(1, args.steps // 4)),
            "--checkpoint-every",
            str(max(1, args.steps // 4)),
            "--device",
            args.device,
            "--amp",
            args.amp,
            "--out",
            str(out),
            "--no-progress",
            *(["--resume"] if last.is_file() else []),
        ]
    )
    return time.perf_counter() - start


def _evaluation_folder(args: Any, stem: str = "evaluation") -> str:
    """``stem`` for one generated set, ``<stem>-x<N>`` for ``--eval-seeds N``; ``-cas-train``
    appended for ``--cas-samples train``."""
    name = stem if args.eval_seeds == 1 else f"{stem}-x{args.eval_seeds}"
    return name + ("-cas-train" if args.cas_samples == "train" else "")


def _evaluate(checkpoint: Path, out: Path, seed: int, args: Any) -> dict[str, Any]:
    """``contragan evaluate`` into ``out``, or its summary when it has run already."""
    if (out / "summary.json").is_file():
        summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
        return summary
    if out.exists():
        shutil.rmtree(out)  # an evaluation cut short
    return evaluate_main(
        [
            "--checkpoint",
            str(checkpoint),
            "--seeds",
            str(args.eval_seeds),
            "--seed",
            str(seed),
            "--cas-epochs",
            str(args.cas_epochs),
            "--cas-samples",
            args.cas_samples,
            "--cache-dir",
            str(args.root / "extractors"),
            "--device",
            args.device,
            "--out",
            str(out),
        ]
    )


def _curve(data: str, args: Any, lines: list[str]) -> None:
    """ProjGAN's GAN-test and FD after each segment of one run (seed 0).

    The run is the table's own ProjGAN seed-0 run, trained in segments: a resumed run continues
    bit for bit and the learning rate is constant, so it ends where one uninterrupted run would.
    """
    out = args.root / f"{data}-proj-s0"
    lines += [
        f"\n### {data}: ProjGAN (seed 0) after each segment of one run\n",
        "| G steps | GAN-test | CAS | FD |",
        "|---|---|---|---|",
    ]
    for steps in args.curve:
        if steps > args.steps:
            raise SystemExit(f"--curve: {steps} G steps is beyond --steps {args.steps}")
        folder = out / _evaluation_folder(
            args, "evaluation" if steps == args.steps else f"eval-{steps}"
        )
        if not (folder / "summary.json").is_file():  # evaluated already: the run has moved on
            if args.report_only:
                continue
            _train(out, data, "proj", 0, steps, args)
        figures = _evaluate(out / "checkpoints" / "last.pt", folder, 0, args)
        lines.append(
            f"| {steps} | {figures['gan_test_acc']:.3f} | {figures['cas_acc']:.3f} | "
            f"{figures['fd']:.4g} |"
        )
        print(lines[-1], flush=True)


def _table(data: str, args: Any, lines: list[str]) -> None:
    by_seed: dict[str, dict[int, dict[str, Any]]] = {variant: {} for variant in args.variants}
    seconds: dict[str, list[float]] = {variant: [] for variant in args.variants}
    grids = args.root / "grids"
    grids.mkdir(parents=True, exist_ok=True)
    for seed in args.only_seeds or range(args.seeds):
        for variant in args.variants:
            out = args.root / f"{data}-{variant}-s{seed}"
            folder = out / _evaluation_folder(args)
            if args.report_only and not _finished(out, args.steps):
                continue
            took = _train(out, data, variant, seed, args.steps, args)
            if took:
                seconds[variant].append(took)
                for old in out.glob("evaluation*"):  # a shorter run's figures
                    shutil.rmtree(old, ignore_errors=True)
            figures = _evaluate(out / "checkpoints" / "last.pt", folder, seed, args)
            by_seed[variant][seed] = figures
            shutil.copy(out / "plots" / "samples.png", grids / f"{data}-{variant}-s{seed}.png")
            print(
                f"{data} {variant} seed {seed}: GAN-test {figures['gan_test_acc']:.3f}, "
                f"CAS {figures['cas_acc']:.3f}, FD {figures['fd']:.4g}",
                flush=True,
            )
    results = {variant: list(runs.values()) for variant, runs in by_seed.items()}
    first = max(results.values(), key=len)
    if not first:
        lines.append(f"\n### {data}: no finished run\n")
        return
    shown = [variant for variant in args.variants if results[variant]]  # a column per run loss
    counts = [len(results[variant]) for variant in shown]
    seeds = len(args.only_seeds or range(args.seeds))
    lines += [
        f"\n### {data}: {args.steps} G steps × {args.n_dis} D steps, batch 64, "
        f"{args.image_size}×{args.image_size}, {seeds} seeds "
        "(mean ± std over training "
        f"seeds, {args.eval_seeds} generated set{'' if args.eval_seeds == 1 else 's'} each"
        f"{'; CAS trained on a train-split-sized set' if args.cas_samples == 'train' else ''}); "
        f"extractor test accuracy {100 * first[0]['extractor_test_accuracy']:.1f} %\n",
        "| figure | better | "
        + " | ".join(
            variant if count == seeds else f"{variant} ({count} seed{'' if count == 1 else 's'})"
            for variant, count in zip(shown, counts, strict=True)
        )
        + " | real vs real |",
        "|---|---|" + "---|" * (len(shown) + 1),
    ]
    for key, better in FIGURES.items():
        cells = [_mean_std([r[key] for r in results[variant]]) for variant in shown]
        real = _mean_std([r[f"real_{key}"] for r in first])
        lines.append(f"| {key} | {better} | " + " | ".join(cells) + f" | {real} |")
    times = [
        f"{variant} {statistics.fmean(seconds[variant]):.0f} s"
        for variant in args.variants
        if seconds[variant]
    ]
    if times:
        lines.append(f"\ntraining time per run (this invocation): {', '.join(times)}")
    lines += _paired_lines(data, by_seed)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--data", nargs="+", default=["digits", "digits-m"])
    parser.add_argument(
        "--variants",
        nargs="+",
        default=MAIN,
        choices=list(VARIANTS),
        help=f"default: {' '.join(MAIN)}; the others tune τ and λ of the class-consistent options",
    )
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--n-dis", type=int, default=2)
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--cas-epochs", type=int, default=12)
    parser.add_argument(
        "--cas-samples",
        default="test",
        choices=get_args(CasSamples),
        help="contragan evaluate --cas-samples: the CAS classifier trains on the scored set "
        "(test, one sample per test image) or on as many generated images as the train split "
        "holds (train; the figures go to <evaluation folder>-cas-train), so finished runs can be "
        "scored both ways with --report-only",
    )
    parser.add_argument(
        "--eval-seeds",
        type=int,
        default=3,
        help="generated sets (each with its own CAS classifier) averaged per run, contragan "
        "evaluate --seeds (its default, 3); the figures go to <run>/evaluation-x<N> (1: "
        "<run>/evaluation, where earlier tables were read from), so finished runs can be "
        "evaluated again with --report-only, without training",
    )
    parser.add_argument(
        "--curve",
        type=lambda text: [int(s) for s in text.split(",")],
        default=[],
        help="comma-separated G steps at which ProjGAN (seed 0) is evaluated, e.g. 500,1000",
    )
    parser.add_argument(
        "--only-seeds",
        type=int,
        nargs="+",
        default=None,
        help="train and evaluate these seeds alone (to share the seeds between processes; a "
        "later run with --seeds N reads them back into one table)",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="train nothing: tabulate the finished runs, evaluating those not yet evaluated with "
        "these --eval-seeds (a cell names its number of seeds when it has fewer than --seeds)",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        choices=["cpu", "cuda"],
        help="where to train and evaluate (cpu: a resumed run continues bit for bit)",
    )
    parser.add_argument(
        "--amp", default="auto", choices=["auto", "bf16", "off"], help="contragan train --amp"
    )
    parser.add_argument("--root", type=Path, default=Path("runs/bench/contragan"))
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    lines = ["\n".join(f"- `{name}`: {text}" for name, (text, _) in VARIANTS.items())]
    for data in args.data:
        if args.curve:
            _curve(data, args, lines)
        _table(data, args, lines)
    text = "\n".join(lines) + "\n"
    args.root.mkdir(parents=True, exist_ok=True)
    (args.root / "results").with_suffix(".md").write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
