"""``imagecl study feature-suppression``: easy features suppress the ones the task needs.

"Intriguing Properties of Contrastive Losses" (Chen, Luo & Li 2021, Sec. 4): with RandBit, n
random bits per image as constant extra channels, identical in both views, instance
discrimination can be solved by reading the bits, and the linear accuracy on the real label falls
as n grows (their Fig. 5), at every temperature τ. DigitOnImage puts a second, competing object
(a digit in one of 3 × 3 cells) on every image: the features learned serve one of the two labels
better. The cells train SimCLR (NT-Xent) on :class:`imagecl.suppression.RandBits` over digits-m
for bits × τ, and on :class:`imagecl.suppression.DigitOverlay` (scikit-learn's 8 × 8 digits
pasted at a third of the side) for each τ, probing the image label and the pasted digit's label.
"""

from __future__ import annotations

import math
from typing import Any

from imagecl.data import TensorImageDataset
from imagecl.networks import ImageModel
from imagecl.sources import digit_images
from imagecl.studies.cells import (
    digits_m,
    features,
    probe,
    random_init_probe,
    train_pipeline,
)
from imagecl.studies.figures import Panel, line_panels
from imagecl.studies.runner import (
    CellContext,
    CellResult,
    Study,
    run_study,
)
from imagecl.studies.tables import (
    NOISE_POINTS,
    lookup,
    markdown_table,
)
from imagecl.suppression import DigitOverlay, RandBits, WrappedData, split_seed, wrap_image_data
from shared.runs import RunDir

BITS = (0, 5, 10, 15, 20)
TAUS = (0.05, 0.1, 0.2)
QUICK_BITS, QUICK_TAUS = (0, 10), (0.1,)


def grid(quick: bool) -> list[dict[str, Any]]:
    bits, taus = (QUICK_BITS, QUICK_TAUS) if quick else (BITS, TAUS)
    cells = [{"data": "randbits", "bits": b, "tau": t} for b in bits for t in taus]
    return cells + [{"data": "overlay", "bits": 0, "tau": t} for t in taus]


def _overlay(seed: int) -> WrappedData:
    """digits-m with scikit-learn's digits pasted by :class:`DigitOverlay` (the digit label as
    ``train_extra`` / ``test_extra``)."""
    digits = TensorImageDataset(*digit_images(8))  # (1797, 1, 8, 8): pasted at 32 // 3 = 10 px
    overlay = wrap_image_data(
        digits_m(seed),
        lambda split, s: DigitOverlay(split, digits, grid=3, seed=split_seed(seed, 10 + s)),
    )
    assert overlay.train_extra is not None and overlay.test_extra is not None
    return overlay


def _overlay_probes(model: ImageModel, overlay: WrappedData, ctx: CellContext) -> dict[str, float]:
    assert overlay.train_extra is not None and overlay.test_extra is not None
    train_h, train_y, test_h, test_y = features(model.backbone, overlay.data, ctx)
    return {
        "probe_acc": probe(train_h, train_y, test_h, test_y, ctx),
        "digit_acc": probe(train_h, overlay.train_extra, test_h, overlay.test_extra, ctx),
    }


def measure(params: dict[str, Any], ctx: CellContext) -> dict[str, float]:
    seed, tau = ctx.seed, params["tau"]
    if params["data"] == "randbits":
        n = params["bits"]
        data = wrap_image_data(
            digits_m(seed), lambda split, s: RandBits(split, n, seed=split_seed(seed, s))
        )
        model = train_pipeline(ctx, data.data, temperature=tau)
        return {"probe_acc": probe(*features(model.backbone, data.data, ctx), ctx)}
    overlay = _overlay(seed)
    return _overlay_probes(train_pipeline(ctx, overlay.data, temperature=tau), overlay, ctx)


def baseline(params: dict[str, Any], ctx: CellContext) -> dict[str, float]:
    """The untrained encoder on digits-m, and on the overlay for both of its labels (can a
    linear probe read the pasted digit at all?)."""
    overlay = _overlay(ctx.seed)
    untrained = _overlay_probes(train_pipeline(ctx, overlay.data, untrained=True), overlay, ctx)
    return {
        **random_init_probe(params, ctx),
        "overlay_image_acc": untrained["probe_acc"],
        "overlay_digit_acc": untrained["digit_acc"],
    }


def summarise(results: list[CellResult], baseline: dict[str, float], run: RunDir) -> dict[str, str]:
    randbits = [r for r in results if r.params["data"] == "randbits"]
    overlay = [r for r in results if r.params["data"] == "overlay"]
    bits = sorted({r.params["bits"] for r in randbits})
    taus = sorted({r.params["tau"] for r in results})
    panels = []
    sections: dict[str, str] = {}
    findings = []
    if randbits:
        acc = {t: [lookup(randbits, "probe_acc", bits=b, tau=t) for b in bits] for t in taus}
        panels.append(
            Panel(
                "RandBits",
                "random bits per image",
                "probe accuracy (%)",
                {f"τ={t:g}": (list(bits), acc[t]) for t in taus},
            )
        )
        rows = [[f"{b} bits", *[acc[t][i] for t in taus]] for i, b in enumerate(bits)]
        sections["RandBits: probe accuracy on the label (%)"] = markdown_table(
            ["", *[f"τ = {t:g}" for t in taus]], rows
        )
        for t in taus:
            first, last = acc[t][0], acc[t][-1]
            if len(bits) < 2 or not (math.isfinite(first) and math.isfinite(last)):
                continue
            drop = 100 * (first - last)
            verdict = (
                "falls (the paper's direction)"
                if drop >= NOISE_POINTS
                else "rises (against the paper)"
                if drop <= -NOISE_POINTS
                else f"does not move beyond {NOISE_POINTS:g} points (no direction)"
            )
            findings.append(
                f"τ = {t:g}: {100 * first:.1f} % at {bits[0]} bits → {100 * last:.1f} % at "
                f"{bits[-1]} bits: accuracy {verdict}."
            )
    if overlay:
        image = [lookup(overlay, "probe_acc", tau=t) for t in taus]
        digit = [lookup(overlay, "digit_acc", tau=t) for t in taus]
        panels.append(
            Panel(
                "DigitOverlay",
                "τ",
                "probe accuracy (%)",
                {"image label": (list(taus), image), "pasted digit": (list(taus), digit)},
                log_x=True,
            )
        )
        untrained = [
            [
                "(random init)",
                baseline.get("overlay_image_acc", math.nan),
                baseline.get("overlay_digit_acc", math.nan),
            ]
        ]
        sections["DigitOverlay: probe accuracy (%)"] = markdown_table(
            ["τ", "image label", "pasted digit's label"],
            untrained + [[f"{t:g}", i, d] for t, i, d in zip(taus, image, digit, strict=True)],
        )
        each = "; ".join(
            f"τ = {t:g}: image label {100 * i:.1f} %, pasted digit {100 * d:.1f} %"
            for t, i, d in zip(taus, image, digit, strict=True)
        )
        findings.append(f"DigitOverlay: {each} (chance 10 % for both).")
        if "overlay_digit_acc" in baseline:
            findings.append(
                f"The untrained encoder reads {100 * baseline['overlay_image_acc']:.1f} % "
                f"(image) and {100 * baseline['overlay_digit_acc']:.1f} % (pasted digit) on the "
                "same overlay data: training moves each label by "
                + "; ".join(
                    f"τ = {t:g}: {100 * (i - baseline['overlay_image_acc']):+.1f} / "
                    f"{100 * (d - baseline['overlay_digit_acc']):+.1f} points"
                    for t, i, d in zip(taus, image, digit, strict=True)
                )
                + "."
            )
    if panels:
        line_panels(panels, run.plots / "feature_suppression.png")
    sections["Finding"] = " ".join(findings) or "No finished cell."
    return sections


STUDY = Study(
    name="feature-suppression",
    title="RandBits and DigitOverlay: easy features suppress the label",
    question=(
        "Chen, Luo & Li (2021, Fig. 5): with n random bits per image as extra constant channels "
        "(the same in both views), the linear accuracy on the real label falls as n grows, at "
        "every τ ∈ {0.05, 0.1, 0.2}; with a digit pasted on every image, the two objects compete "
        "for the features. Here on digits-m with a small CNN."
    ),
    grid=grid,
    measure=measure,
    summarise=summarise,
    baseline=baseline,
)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``imagecl study feature-suppression [--quick] [--out DIR] [--seed N] [--device D]``."""
    return run_study(STUDY, argv)
