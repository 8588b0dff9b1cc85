"""Minimal SimCLR: your own training loop, our NT-Xent, on scikit-learn's digits (no download).

A small MLP encoder learns from two randomly warped, noisy views of each 8×8 digit; a linear
probe on its frozen representation is then compared with the same probe on the raw pixels.

    python examples/minimal_simclr.py
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout too
from shared.heads import simclr_v1_head
from shared.losses import nt_xent_loss
from shared.probes import linear_probe


def augment(x: Tensor, generator: torch.Generator) -> Tensor:
    """One random view of a batch of 8×8 digits: a random affine warp (rotation up to 15°,
    scale 0.9–1.1, shift up to a pixel), 10 % of the pixels dropped, Gaussian noise.
    Shape: (N, 64) -> (N, 64)."""
    N = x.shape[0]
    angle = (torch.rand(N, generator=generator) * 2 - 1) * math.radians(15)
    scale = 0.9 + 0.2 * torch.rand(N, generator=generator)
    shift = (torch.rand(N, 2, generator=generator) * 2 - 1) * 0.25  # grid units: 0.25 = 1 pixel
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    theta = torch.stack(
        [torch.stack([cos, -sin, shift[:, 0]], 1), torch.stack([sin, cos, shift[:, 1]], 1)], 1
    )  # (N, 2, 3)
    grid = F.affine_grid(theta, [N, 1, 8, 8], align_corners=False)  # (N, 8, 8, 2)
    img = F.grid_sample(x.view(N, 1, 8, 8), grid, align_corners=False)  # (N, 1, 8, 8)
    keep = torch.rand(img.shape, generator=generator) > 0.1
    return (img * keep + 0.05 * torch.randn(img.shape, generator=generator)).reshape(N, 64)


def epoch_batches(indices: Tensor, batch_size: int, generator: torch.Generator) -> list[Tensor]:
    """One epoch of shuffled full batches of ``indices``; the incomplete last batch is dropped.

    As in SimCLR: a short batch has fewer negatives, a lower NT-Xent and a different objective,
    and would put a saw-tooth into the loss curve. Over epochs every sample still takes part.
    """
    shuffled = indices[torch.randperm(len(indices), generator=generator)]
    full = len(indices) // batch_size * batch_size
    if full == 0:
        raise ValueError(f"batch_size {batch_size} is larger than the {len(indices)} samples")
    return list(shuffled[:full].split(batch_size))


def main(epochs: int = 100, batch_size: int = 512, seed: int = 0) -> dict[str, object]:
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0  # (1797, 64) in [0, 1]
    y = torch.tensor(digits.target)
    order = torch.randperm(len(x), generator=g)
    train, test = order[:1200], order[1200:]

    encoder = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU())
    head = simclr_v1_head(128, out_dim=64)  # the representation before the head is evaluated
    params = [*encoder.parameters(), *head.parameters()]
    optimizer = torch.optim.Adam(params, lr=1e-3, weight_decay=1e-5)
    losses = []
    for _epoch in range(epochs):
        for idx in epoch_batches(train, batch_size, g):
            x1, x2 = augment(x[idx], g), augment(x[idx], g)
            loss = nt_xent_loss(head(encoder(x1)), head(encoder(x2)), temperature=0.2)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())

    encoder.eval()
    with torch.no_grad():
        h = encoder(x)  # (1797, 128) frozen features
    learned = linear_probe(h[train], y[train], h[test], y[test], seed=seed)
    raw = linear_probe(x[train], y[train], x[test], y[test], seed=seed)
    print(
        f"linear probe on {len(test)} held-out digits: SimCLR features {learned.accuracy:.3f}, "
        f"raw pixels {raw.accuracy:.3f}"
    )
    return {
        "losses": losses,
        "features": h,
        "labels": y,
        "test": test,
        "probe_accuracy": learned.accuracy,
        "raw_pixel_accuracy": raw.accuracy,
    }


if __name__ == "__main__":
    main()
