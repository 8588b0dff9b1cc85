"""``imagecl study augmentations``: which augmentations make the task (SimCLR Fig. 5, Table 1).

SimCLR (Chen et al. 2020, Sec. 3) applies one transformation, or a composition of two, to one
branch only (the other branch is the identity) and reads the linear accuracy: no single
transformation suffices, crop + colour stands out. Table 1 then varies the strength s of the
colour distortion in the full recipe: stronger colour helps contrastive learning. On digits-m,
whose digits are a change of colour against a photograph (MNIST-M's recipe), colour should
matter as much.

:class:`BranchViews` makes the two views: branch 1 the un-augmented image, branch 2 ``first``
then ``second`` (one transformation when they are equal, the heat map's diagonal). Every
transformation is applied with probability 1: ``crop`` (random resized crop, area 0.08–1, and
flip), ``cutout`` (a zeroed square of side U(1/4, 1/2) of the image), ``colour`` (SimCLR's jitter
at s = 1), ``grayscale``, ``blur`` (SimCLR's Gaussian blur), ``rotation`` (90°, 180° or 270°),
``noise`` (Gaussian, σ ~ U(0, 0.2) in [0, 1] units) and ``sobel`` (the Sobel gradient magnitude
of the grey image, on every channel).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from imagecl.augment import SimCLRViews, ViewConfig
from imagecl.colour import GRAY_WEIGHTS, random_color_jitter
from imagecl.crops import resized_crop
from imagecl.studies.cells import (
    digits_m,
    features,
    probe,
    random_init_probe,
    train_pipeline,
)
from imagecl.studies.figures import Panel, heat_map, line_panels
from imagecl.studies.runner import (
    CellContext,
    CellResult,
    Study,
    run_study,
)
from imagecl.studies.tables import (
    lookup,
    markdown_table,
    spread_note,
)
from shared.runs import RunDir

OPS = ("crop", "cutout", "colour", "grayscale", "blur", "rotation", "noise", "sobel")
STRENGTHS = (0.0, 0.25, 0.5, 1.0)
QUICK_OPS, QUICK_STRENGTHS = ("crop", "colour"), (0.0, 1.0)
NOISE_SIGMA = 0.2  # upper end of the noise std, [0, 1] pixel units

# every op always applied; crop and jitter at SimCLR's ImageNet settings (Appendix A)
BRANCH_CONFIG = ViewConfig(
    crop_scale=(0.08, 1.0), jitter_strength=1.0, jitter_p=1.0, gray_p=1.0, blur_p=1.0
)


class BranchViews(SimCLRViews):
    """Two views: ``(identity, second ∘ first)`` of each image, normalised (SimCLR Fig. 5).

    The SimCLR ops reuse :class:`SimCLRViews`' crop, jitter, grayscale and blur (drawn from the
    global generator, or from ``generator`` through ``forward``); the others are batched here.
    Images must have 3 channels (digits-m).

    Shape:
        forward: uint8 ``(N, 3, H, W)`` -> float ``(N, 2, 3, size, size)``
    """

    def __init__(
        self, size: int, mean: Sequence[float], std: Sequence[float], first: str, second: str
    ) -> None:
        super().__init__(size, mean, std, BRANCH_CONFIG, views=2)
        for op in (first, second):
            if op not in OPS:
                raise ValueError(f"unknown transformation {op!r}; choose from {OPS}")
        self.ops = (first,) if first == second else (first, second)

    def draw_views(self, images: Tensor) -> Tensor:
        N, C, H, W = images.shape
        if C != 3 or (H, W) != (self.size, self.size):
            raise ValueError(f"BranchViews needs (N, 3, {self.size}, {self.size}) images")
        x = images.float().div(255)  # (N, 3, S, S)
        y = x.clone()
        for op in self.ops:
            y = self._transform(op, y).clamp(0.0, 1.0)  # (N, 3, S, S)
        views = torch.stack([x, y], dim=1).flatten(0, 1)  # (2N, 3, S, S), row n·2 + v
        mean = self.mean.to(x.device)[:, None, None]  # (3, 1, 1)
        std = self.std.to(x.device)[:, None, None]  # (3, 1, 1)
        return ((views - mean) / std).view(N, 2, C, H, W)  # (N, 2, 3, S, S)

    def _transform(self, op: str, x: Tensor) -> Tensor:
        N, C, S, _ = x.shape
        sampled_op = {"crop": self.flip, "grayscale": self.gray, "blur": self.blur}.get(op)
        if sampled_op is not None:
            source = resized_crop(x, self.crop, self.size) if op == "crop" else x  # then flip
            out: Tensor = sampled_op(source)
            return out
        if op == "colour":
            assert self.jitter is not None
            return random_color_jitter(x, self.jitter)
        if op == "cutout":
            side = (S * (0.25 + 0.25 * torch.rand(N, device=x.device))).long()  # (N,)
            top = (torch.rand(N, device=x.device) * (S - side + 1)).long()  # (N,)
            left = (torch.rand(N, device=x.device) * (S - side + 1)).long()  # (N,)
            ar = torch.arange(S, device=x.device)  # (S,)
            rows = (ar >= top[:, None]) & (ar < (top + side)[:, None])  # (N, S)
            cols = (ar >= left[:, None]) & (ar < (left + side)[:, None])  # (N, S)
            hole = rows[:, :, None] & cols[:, None, :]  # (N, S, S)
            return x.masked_fill(hole[:, None], 0.0)
        if op == "rotation":
            turns = torch.randint(1, 4, (N,), device=x.device)  # (N,) quarter turns
            out = x.clone()
            for k in (1, 2, 3):
                chosen = turns == k
                out[chosen] = torch.rot90(x[chosen], k, dims=(2, 3))
            return out
        if op == "noise":
            sigma = NOISE_SIGMA * torch.rand(N, 1, 1, 1, device=x.device)  # (N, 1, 1, 1)
            return x + sigma * torch.randn_like(x)
        # sobel: gradient magnitude of the grey image, scaled to [0, 1] (max 4·√2 for a unit step)
        weights = torch.tensor(GRAY_WEIGHTS, device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
        gray = (x * weights).sum(1, keepdim=True)  # (N, 1, S, S)
        kx = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]], device=x.device)
        kernels = torch.stack([kx, kx.T])[:, None].to(x.dtype)  # (2, 1, 3, 3)
        grad = F.conv2d(F.pad(gray, (1, 1, 1, 1), mode="replicate"), kernels)  # (N, 2, S, S)
        magnitude = grad.pow(2).sum(1, keepdim=True).sqrt() / (4 * math.sqrt(2))  # (N, 1, S, S)
        return magnitude.expand(N, C, S, S)


def grid(quick: bool) -> list[dict[str, Any]]:
    ops, strengths = (QUICK_OPS, QUICK_STRENGTHS) if quick else (OPS, STRENGTHS)
    pairs = [{"part": "pairs", "first": a, "second": b} for a in ops for b in ops]
    colour = [{"part": "colour", "strength": s} for s in strengths]
    return pairs + colour


def measure(params: dict[str, Any], ctx: CellContext) -> dict[str, float]:
    data = digits_m(ctx.seed)
    if params["part"] == "pairs":
        views: SimCLRViews = BranchViews(
            data.image_size, data.mean, data.std, params["first"], params["second"]
        )
    else:  # the CIFAR recipe (crop from 0.2, flip, grayscale 0.2, no blur) at jitter strength s
        config = ViewConfig(crop_scale=(0.2, 1.0), jitter_strength=params["strength"], blur_p=0.0)
        views = SimCLRViews(data.image_size, data.mean, data.std, config, views=2)
    model = train_pipeline(ctx, data, views=views)
    return {"probe_acc": probe(*features(model.backbone, data, ctx), ctx)}


def summarise(results: list[CellResult], baseline: dict[str, float], run: RunDir) -> dict[str, str]:
    pairs = [r for r in results if r.params["part"] == "pairs"]
    colour = [r for r in results if r.params["part"] == "colour"]
    sections: dict[str, str] = {}
    findings = []
    if pairs:
        ops = list(dict.fromkeys(r.params["first"] for r in pairs))
        table = [[lookup(pairs, "probe_acc", first=a, second=b) for b in ops] for a in ops]
        heat_map(
            table,
            ops,
            ops,
            run.plots / "augmentation_pairs.png",
            title="probe accuracy (%): 1st → 2nd transformation on one branch",
            xlabel="2nd transformation",
            ylabel="1st transformation",
        )
        sections["Pairs: probe accuracy (%)"] = markdown_table(
            ["1st \\ 2nd", *ops], [[a, *row] for a, row in zip(ops, table, strict=True)]
        )
        ranked = sorted(
            (
                (v, a, b)
                for a, row in zip(ops, table, strict=True)
                for b, v in zip(ops, row, strict=True)
                if math.isfinite(v)
            ),
            reverse=True,
        )
        if ranked:
            top = ", ".join(f"{a}→{b} {100 * v:.1f} %" for v, a, b in ranked[:3])
            diagonal = [table[i][i] for i in range(len(ops))]
            findings.append(
                f"Best compositions: {top}. Best single transformation: "
                f"{ops[max(range(len(ops)), key=lambda i: _finite(diagonal[i]))]}. "
                + spread_note([v for v, _, _ in ranked])
            )
    if colour:
        strengths = [r.params["strength"] for r in colour]
        accuracy = [r.metrics.get("probe_acc", math.nan) for r in colour]
        line_panels(
            [
                Panel(
                    "colour distortion strength",
                    "s",
                    "probe accuracy (%)",
                    {"SimCLR": (strengths, accuracy)},
                )
            ],
            run.plots / "colour_strength.png",
        )
        sections["Colour strength: probe accuracy (%)"] = markdown_table(
            ["s", "accuracy"], [[f"{s:g}", a] for s, a in zip(strengths, accuracy, strict=True)]
        )
        listed = zip(strengths, accuracy, strict=True)
        each = ", ".join(f"s={s:g} {100 * a:.1f} %" for s, a in listed)
        findings.append(f"Colour strength: {each}. {spread_note(accuracy)}")
    sections["Finding"] = " ".join(findings) or "No finished cell."
    return sections


def _finite(value: float) -> float:
    return value if math.isfinite(value) else -math.inf


STUDY = Study(
    name="augmentations",
    title="pairs of augmentations and colour strength",
    question=(
        "SimCLR (Chen et al. 2020, Fig. 5): a single transformation on one branch is not enough, "
        "and crop + colour is the composition that stands out; Table 1: stronger colour "
        "distortion helps contrastive learning. Here on digits-m, whose digits are a change of "
        "colour against a photograph."
    ),
    grid=grid,
    measure=measure,
    summarise=summarise,
    baseline=random_init_probe,
)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``imagecl study augmentations [--quick] [--out DIR] [--seed N] [--device D]``."""
    return run_study(STUDY, argv)
