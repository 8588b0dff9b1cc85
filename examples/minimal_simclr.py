"""Minimal SimCLR: your own training loop, our NT-Xent, on scikit-learn's digits (no download).

A small MLP encoder learns from two noisy views of each 8×8 digit; a linear probe on its frozen
representation is then compared with the same probe on the raw pixels.

    python examples/minimal_simclr.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from sklearn.datasets import load_digits
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout too
from shared.heads import simclr_v1_head  # noqa: E402
from shared.losses import nt_xent_loss  # noqa: E402
from shared.probes import linear_probe  # noqa: E402


def augment(x: Tensor, generator: torch.Generator) -> Tensor:
    """One random view of a batch of 8×8 digits: shift by up to a pixel, drop 20 % of the
    pixels, rescale the contrast and add noise. Shape: (N, 64) -> (N, 64)."""
    N = x.shape[0]
    img = x.view(N, 1, 8, 8)
    padded = nn.functional.pad(img, (1, 1, 1, 1))  # (N, 1, 10, 10)
    dy, dx = torch.randint(0, 3, (2,), generator=generator).tolist()
    img = padded[:, :, dy : dy + 8, dx : dx + 8]  # (N, 1, 8, 8), shifted
    keep = torch.rand(img.shape, generator=generator) > 0.2
    contrast = 0.6 + 0.8 * torch.rand(N, 1, 1, 1, generator=generator)
    noise = 0.1 * torch.randn(img.shape, generator=generator)
    return (img * keep * contrast + noise).reshape(N, 64)


def main(epochs: int = 60, batch_size: int = 256, seed: int = 0) -> dict[str, object]:
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
        for idx in train[torch.randperm(len(train), generator=g)].split(batch_size):
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
    print(f"linear probe on {len(test)} held-out digits: SimCLR features {learned.accuracy:.3f}, "
          f"raw pixels {raw.accuracy:.3f}")  # fmt: skip
    return {"losses": losses, "features": h, "labels": y, "test": test,
            "probe_accuracy": learned.accuracy, "raw_pixel_accuracy": raw.accuracy}  # fmt: skip


if __name__ == "__main__":
    main()
