"""The ``graphcl`` console script: ``graphcl <pipeline> [options]``."""

from __future__ import annotations

from collections.abc import Sequence

from shared.cli import PipelineMain, dispatch

# name -> (one-line help, main(argv)); each pipeline adds itself here when it lands
PIPELINES: dict[str, tuple[str, PipelineMain]] = {}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``graphcl`` command."""
    return dispatch("graphcl", (__doc__ or "").strip(), PIPELINES, argv)
