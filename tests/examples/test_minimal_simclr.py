"""The minimal SimCLR example the demo tour runs: full batches only, so no saw-tooth loss."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import minimal_simclr


def test_every_batch_is_full_and_every_sample_takes_part_over_epochs() -> None:
    g = torch.Generator().manual_seed(0)
    indices = torch.arange(1200)
    epochs = [minimal_simclr.epoch_batches(indices, 512, g) for _ in range(8)]
    assert all([len(batch) for batch in epoch] == [512, 512] for epoch in epochs)
    seen = torch.cat([torch.cat(epoch) for epoch in epochs]).unique()
    assert torch.equal(seen, indices)  # a different 176 are left out each epoch


def test_the_demo_loss_has_one_value_per_full_batch() -> None:
    result = minimal_simclr.main(epochs=3, seed=0)
    losses = result["losses"]
    assert isinstance(losses, list) and len(losses) == 3 * (1200 // 512)
