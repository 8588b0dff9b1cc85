"""The ``contragan`` console script: ``contragan <command> [options]``.

``train`` (ContraGAN with the 2C loss, ReACGAN with D2D-CE, or the ProjGAN/ACGAN baselines),
``sample`` (a grid of class-conditional samples from a checkpoint) and ``evaluate`` (offline
metrics next to their real-vs-real baselines).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shared.cli import PipelineMain, dispatch


def _train(argv: list[str]) -> Any:
    from contragan.commands.train import main  # lazy: `contragan --help` stays fast

    return main(argv)


def _sample(argv: list[str]) -> Any:
    from contragan.commands.sample import main

    return main(argv)


def _evaluate(argv: list[str]) -> Any:
    from contragan.commands.evaluate import main

    return main(argv)


# name -> (one-line help, main(argv))
PIPELINES: dict[str, tuple[str, PipelineMain]] = {
    "train": ("train a class-conditional GAN: --loss contra|reacgan|proj|ac", _train),
    "sample": ("a grid of samples per class from a checkpoint", _sample),
    "evaluate": ("offline metrics (FD, KID, P/R, D/C, GAN-test, CAS) vs real-vs-real", _evaluate),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``contragan`` command."""
    return dispatch("contragan", (__doc__ or "").strip().split("\n")[0], PIPELINES, argv)
