"""The ``graphcl`` console script: ``graphcl <command> [options]``.

``pretrain`` (GraphCL on molecules), ``finetune`` (a property task, pre-trained against
scratch), ``probe`` (frozen embeddings) and ``augment`` (pictures of the augmentations).
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Sequence
from typing import Any

from shared.cli import PipelineMain, dispatch


def _lazy(module: str) -> PipelineMain:
    """``main`` of ``module``, imported on use: ``graphcl --help`` stays fast."""

    def run(argv: list[str]) -> Any:
        return importlib.import_module(module).main(argv)

    return run


# name -> (one-line help, main(argv))
PIPELINES: dict[str, tuple[str, PipelineMain]] = {
    "pretrain": ("GraphCL pre-training of a GNN encoder", _lazy("graphcl.commands.pretrain")),
    "finetune": (
        "fine-tune on a property task, against scratch",
        _lazy("graphcl.commands.finetune"),
    ),
    "probe": ("probe frozen embeddings (ridge / logistic / SVM)", _lazy("graphcl.commands.probe")),
    "augment": ("draw a molecule and its augmented views", _lazy("graphcl.commands.augment")),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``graphcl`` command."""
    # PyG scripts a few functions at import time, which torch >= 2.10 answers with a two-line
    # deprecation warning the user can do nothing about; it would precede every command's output.
    warnings.filterwarnings(
        "ignore", message=r"`torch\.jit\.script` is deprecated", category=FutureWarning
    )
    return dispatch("graphcl", (__doc__ or "").strip().split("\n")[0], PIPELINES, argv)
