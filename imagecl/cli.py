"""The ``imagecl`` console script: ``imagecl <command> [options]``.

``train`` (SimCLR, SupCon, cross-entropy, CLAE or LoCo), ``eval`` (linear probe, kNN,
corruptions and attacks on a trained encoder), ``finetune`` (SimCLR's semi-supervised
protocol against scratch) and ``study`` (the papers' findings as grids of small runs). Each
command is :mod:`imagecl.commands`' module of that name, imported when it runs, so that
``imagecl --help`` stays fast.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shared.cli import PipelineMain, dispatch


def _train(argv: list[str]) -> Any:
    from imagecl.commands.train import main

    return main(argv)


def _eval(argv: list[str]) -> Any:
    from imagecl.commands.eval import main

    return main(argv)


def _finetune(argv: list[str]) -> Any:
    from imagecl.commands.finetune import main

    return main(argv)


def _study(argv: list[str]) -> Any:
    from imagecl.commands.study import main

    return main(argv)


# name -> (one-line help, main(argv))
PIPELINES: dict[str, tuple[str, PipelineMain]] = {
    "train": ("train an encoder: --method simclr|supcon|ce|clae|loco", _train),
    "eval": ("evaluate a trained encoder: probe, kNN, corruptions", _eval),
    "finetune": ("fine-tune on a fraction of the labels, against scratch", _finetune),
    "study": ("run a study: tau-lambda|feature-suppression|augmentations|head|...", _study),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``imagecl`` command."""
    return dispatch("imagecl", (__doc__ or "").strip().split("\n")[0], PIPELINES, argv)
