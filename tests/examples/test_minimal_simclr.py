"""The minimal SimCLR example the demo tour runs: full batches only, so no saw-tooth loss."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
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


def test_the_demo_loss_has_one_finite_value_per_full_batch_and_falls() -> None:
    """Three epochs of two full batches of 512: the loss starts at NT-Xent's chance level and
    falls. Measured on seeds 0-5: the first loss 6.905-6.916, the last epoch's mean 0.29-0.48
    below the first epoch's."""
    result = minimal_simclr.main(epochs=3, seed=0)
    losses = result["losses"]
    assert isinstance(losses, list) and len(losses) == 3 * (1200 // 512)
    assert all(math.isfinite(loss) for loss in losses), losses
    # untrained: every similarity alike, so NT-Xent ≈ log(2N - 1) with N = 512
    assert losses[0] == pytest.approx(math.log(2 * 512 - 1), abs=0.1)
    first_epoch, last_epoch = sum(losses[:2]) / 2, sum(losses[-2:]) / 2
    assert last_epoch < first_epoch - 0.15, losses
