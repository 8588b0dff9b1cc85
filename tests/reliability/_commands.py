"""The three training commands at their smallest, run in-process through their console script.

Shared by test_write_failures.py and test_nan.py: ``graphcl pretrain``, ``imagecl train`` and
``contragan train`` with tiny models and data, 4 steps and a checkpoint every 2, called as
``<cli>.main(argv)`` so that the console script's one-line error handling is what is tested.
"""

from __future__ import annotations

import csv
import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from shared.checkpoint import load_checkpoint

STEPS = ["--max-steps", "4", "--checkpoint-every", "2", "--log-every", "1"]
MOLECULES = 48  # 3 steps an epoch at batch 16


@dataclass(frozen=True)
class Command:
    """One training command: ``<cli> <name> [options]``."""

    cli: str
    name: str
    options: tuple[str, ...]
    needs: str | None = None  # an optional dependency the command imports

    @property
    def prog(self) -> str:
        return f"{self.cli} {self.name}"

    def main(self, argv: list[str]) -> int:
        """The console script's ``main``: its exit status (2 and one line for bad input).

        imagecl's final evaluation (a linear probe fitted over a weight-decay grid, kNN,
        t-SNE: most of a tiny run's time, and not what these tests are about) is left out;
        the encoder export, plots, summary and report are still written.
        """
        module = importlib.import_module(f"{self.cli}.cli")
        with pytest.MonkeyPatch.context() as patch:
            if self.cli == "imagecl":
                patch.setattr("imagecl.report._evaluate_into", lambda *args, **kwargs: {})
                patch.setattr("imagecl.report.plot_tsne", lambda *args, **kwargs: None)
            return int(module.main([self.name, *argv]))

    def argv(self, out: Path, data: Path | None, *extra: str) -> list[str]:
        with_data = [*self.options, *(["--data", str(data)] if data is not None else [])]
        return [*with_data, *STEPS, "--out", str(out), *extra]


GRAPH = (
    "--device",
    "cpu",
    "--num-layers",
    "2",
    "--hidden",
    "16",
    "--amp",
    "off",
    "--batch-size",
    "16",
)
IMAGE = (
    "--quick",
    "--device",
    "cpu",
    "--data",
    "digits",
    "--image-size",
    "8",
    "--width",
    "4",
    "--head-dim",
    "8",
    "--eval-every",
    "none",
    "--amp",
    "off",
    "--method",
    "simclr",
    "--batch-size",
    "16",
)
GAN = (
    "--data",
    "digits",
    "--image-size",
    "16",
    "--arch",
    "digits",
    "--width",
    "8",
    "--batch-size",
    "16",
    "--n-dis",
    "2",
    "--ema-start",
    "2",
    "--ema-decay",
    "0.9",
    "--device",
    "cpu",
    "--amp",
    "off",
    "--eval-every",
    "none",
    "--no-progress",
)
COMMANDS = {
    "graphcl": Command("graphcl", "pretrain", GRAPH, needs="rdkit"),
    "imagecl": Command("imagecl", "train", IMAGE, needs="kornia"),
    "contragan": Command("contragan", "train", GAN),
}


def command(domain: str) -> Command:
    """The domain's training command; skips when its optional dependency is missing."""
    cmd = COMMANDS[domain]
    if cmd.needs is not None:
        pytest.importorskip(cmd.needs)
    return cmd


def data_for(domain: str, folder: Path) -> Path | None:
    """The data file a command reads: FreeSolv's first molecules for graphcl, else none."""
    if domain != "graphcl":
        return None
    path = folder / "molecules.smi"
    if not path.is_file():
        from graphcl.data import load_molecules

        path.write_text("\n".join(load_molecules("freesolv").smiles[:MOLECULES]) + "\n")
    return path


def error_line(prog: str, err: str) -> str:
    """The one ``<prog>: error: ...`` line of stderr, which must hold no traceback."""
    assert "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith(f"{prog}: error:")]
    assert len(lines) == 1, err[-3000:]
    assert err.rstrip().endswith(lines[0]), err[-3000:]  # the last thing the user sees
    return lines[0]


def metric_rows(run: Path) -> list[dict[str, str]]:
    """metrics.csv's rows; every row complete (as many cells as the header, none torn)."""
    with (run / "metrics.csv").open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = next(reader)
        rows = list(reader)
    for row in rows:
        assert len(row) == len(header), (header, row)
        float(row[header.index("loss" if "loss" in header else "d_loss")])  # parses
    return [dict(zip(header, row, strict=True)) for row in rows]


def metric_steps(run: Path) -> list[int]:
    return [int(row["step"]) for row in metric_rows(run)]


def last_step(run: Path) -> int:
    """The step of ``last.pt``, which must load (weights only)."""
    return int(load_checkpoint(run / "checkpoints" / "last.pt")["step"])


def summary(run: Path) -> dict[str, Any]:
    return dict(json.loads((run / "summary.json").read_text(encoding="utf-8")))


def _tensors(value: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return {prefix: value}
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        return {}
    out: dict[str, torch.Tensor] = {}
    for key, item in items:
        out.update(_tensors(item, f"{prefix}.{key}" if prefix else str(key)))
    return out


def assert_same_checkpoint(a: Path, b: Path) -> None:
    """Two ``last.pt`` hold the same step and bit for bit the same tensors (weights, optimizer
    and RNG states, ...)."""
    one, two = load_checkpoint(a), load_checkpoint(b)
    assert one["step"] == two["step"]
    x, y = _tensors(one), _tensors(two)
    assert x.keys() == y.keys()
    for key, value in x.items():
        assert torch.equal(value, y[key]), key
