"""Projection heads (h -> z) and the linear classification head of linear evaluation.

SimCLR (Chen et al. 2020a, Sec. 2.1) maps the representation h to z = g(h) with a 2-layer MLP,
z = W2 ReLU(W1 h), and evaluates h, not z. SimCLR v2 (Chen et al. 2020b) uses a deeper
head, 3 layers with batch norm, and fine-tunes from its middle layer. Both are `ProjectionHead`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["LinearHead", "ProjectionHead", "simclr_v1_head", "simclr_v2_head"]


def _check_at_least_one(**values: int) -> None:
    """Sizes and layer counts are >= 1 (``losses.common.check_positive`` means > 0)."""
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")


class _ScaleOnlyBatchNorm(nn.Module):
    """Batch norm with a learnable scale and no shift, the output BN of SimCLR v2.

    The reference TF code (`batch_norm_relu(..., center=False)` on the last head layer) keeps
    gamma and drops beta: a learnable shift of z before L2 normalisation is not wanted.

    Shape:
        - Input: (N, D)
        - Output: (N, D)
    """

    def __init__(self, num_features: int) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(num_features, affine=False)
        self.weight = nn.Parameter(torch.ones(num_features))

    def forward(self, x: Tensor) -> Tensor:
        normalized: Tensor = self.norm(x)  # (N, D)
        return normalized * self.weight  # (N, D)


class ProjectionHead(nn.Module):
    """MLP projection head: `num_layers` linear layers, ReLU between them.

    Layer i (all but the last): Linear(d_i, hidden_dim) [-> BatchNorm1d] -> ReLU.
    Last layer: Linear(d, out_dim) [-> batch norm with scale only, if `last_bn`].
    A linear layer followed by batch norm has no bias (BN's shift makes it redundant).

    - SimCLR v1: `num_layers=2, batch_norm=False, last_bn=False` (`simclr_v1_head`).
    - SimCLR v2: `num_layers=3, batch_norm=True, last_bn=True` (`simclr_v2_head`).
    - `num_layers=1` is a linear projection (`hidden_dim` unused).

    `self.layers` is an `nn.Sequential`: slice it to read a middle layer (SimCLR v2 fine-tunes
    from the output of the first layer).

    Shape:
        - Input: h of shape (N, in_dim)
        - Output: z of shape (N, out_dim), not normalised (the loss normalises)
    """

    def __init__(
        self,
        in_dim: int,
        hidden_dim: int,
        out_dim: int,
        num_layers: int = 2,  # SimCLR v1: 2-layer MLP (Chen et al. 2020a, Sec. 2.1)
        batch_norm: bool = False,
        last_bn: bool = False,
    ) -> None:
        super().__init__()
        _check_at_least_one(
            in_dim=in_dim, hidden_dim=hidden_dim, out_dim=out_dim, num_layers=num_layers
        )
        self.in_dim = in_dim
        self.out_dim = out_dim
        layers: list[nn.Module] = []
        dim = in_dim
        for _ in range(num_layers - 1):
            layers.append(nn.Linear(dim, hidden_dim, bias=not batch_norm))
            if batch_norm:
                layers.append(nn.BatchNorm1d(hidden_dim))
            layers.append(nn.ReLU(inplace=True))
            dim = hidden_dim
        layers.append(nn.Linear(dim, out_dim, bias=not last_bn))
        if last_bn:
            layers.append(_ScaleOnlyBatchNorm(out_dim))
        self.layers = nn.Sequential(*layers)

    def forward(self, h: Tensor) -> Tensor:
        if h.ndim != 2 or h.shape[1] != self.in_dim:
            raise ValueError(f"expected h of shape (N, {self.in_dim}), got {tuple(h.shape)}")
        z: Tensor = self.layers(h)  # (N, out_dim)
        return z


def simclr_v1_head(in_dim: int, out_dim: int = 128) -> ProjectionHead:
    """SimCLR v1 head: Linear(in, in) -> ReLU -> Linear(in, out).

    The hidden width equals the representation width (2048 for ResNet-50) and z has 128 dims
    (Chen et al. 2020a, Sec. 2.1 and 3).

    Shape:
        - Input: (N, in_dim)
        - Output: (N, out_dim)
    """
    return ProjectionHead(in_dim, in_dim, out_dim, num_layers=2)


def simclr_v2_head(
    in_dim: int,
    out_dim: int = 128,  # SimCLR v2 keeps 128 (Chen et al. 2020b)
    hidden_dim: int | None = None,  # None: in_dim, as in the reference code
    num_layers: int = 3,  # 3-layer head (Chen et al. 2020b)
) -> ProjectionHead:
    """SimCLR v2 head: (Linear -> BN -> ReLU) x (num_layers - 1), then Linear -> BN (scale only).

    Shape:
        - Input: (N, in_dim)
        - Output: (N, out_dim)
    """
    return ProjectionHead(
        in_dim,
        in_dim if hidden_dim is None else hidden_dim,
        out_dim,
        num_layers=num_layers,
        batch_norm=True,
        last_bn=True,
    )


class LinearHead(nn.Module):
    """Linear classifier on (frozen) representations: logits = W h + b.

    Shape:
        - Input: h of shape (N, in_dim)
        - Output: logits of shape (N, num_classes)
    """

    def __init__(self, in_dim: int, num_classes: int) -> None:
        super().__init__()
        _check_at_least_one(in_dim=in_dim, num_classes=num_classes)
        self.fc = nn.Linear(in_dim, num_classes)

    def forward(self, h: Tensor) -> Tensor:
        logits: Tensor = self.fc(h)  # (N, num_classes)
        return logits
