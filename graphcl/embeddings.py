"""Building blocks shared by the GNN encoders: categorical feature embeddings, float32 sums."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

__all__ = ["CategoricalEmbedding", "upcast"]


def upcast(x: Tensor) -> Tensor:
    """x in at least float32: bf16/fp16 -> float32, float32 and float64 unchanged."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


class CategoricalEmbedding(nn.Module):
    """Sum of one embedding per categorical column (OGB's AtomEncoder/BondEncoder, any vocab).

    h_i = Σ_f E_f[x_if], with E_f a table of ``vocab[f]`` rows, Xavier-uniform initialised as in
    Hu et al.'s pretrain-gnns.

    Shape:
        - Input: x of shape (n, F) long, F = len(vocab), 0 <= x[:, f] < vocab[f]
        - Output: (n, dim)
    """

    def __init__(self, vocab: Sequence[int], dim: int) -> None:
        super().__init__()
        if len(vocab) == 0 or min(vocab) < 1:
            raise ValueError(f"vocab must be a non-empty sequence of sizes >= 1, got {vocab}")
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        self.vocab = tuple(vocab)
        self.dim = dim
        embeddings = [nn.Embedding(size, dim) for size in self.vocab]
        for embedding in embeddings:
            nn.init.xavier_uniform_(embedding.weight)
        self.embeddings = nn.ModuleList(embeddings)

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim != 2 or x.shape[1] != len(self.vocab) or x.is_floating_point():
            raise ValueError(
                f"expected integer x of shape (n, {len(self.vocab)}), got {x.dtype} "
                f"{tuple(x.shape)}"
            )
        h: Tensor = self.embeddings[0](x[:, 0])  # (n, dim)
        for column in range(1, len(self.vocab)):
            h = h + self.embeddings[column](x[:, column])  # (n, dim)
        return h
