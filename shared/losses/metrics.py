"""Alignment and uniformity of representations (Wang & Isola 2020, Eq. 4 and 5)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from shared.losses.common import check_features, check_positive, check_same_shape, l2_normalize

__all__ = ["alignment", "uniformity"]


def alignment(z1: Tensor, z2: Tensor, *, alpha: float = 2.0) -> Tensor:
    """L_align = E ‖f(x) − f(y)‖₂^α over positive pairs, on L2-normalised rows (α = 2 in the
    paper). Lower is better aligned. NaN inputs are not checked (that would wait for the
    device): they give a NaN result.

    Shape:
        z1, z2: ``(N, D)``; result: scalar.
    """
    check_features(z1, "z1", ndim=2)
    check_features(z2, "z2", ndim=2)
    check_same_shape(z1, z2, "z1 and z2")
    check_positive(alpha, "alpha")
    distances: Tensor = (F.normalize(z1, dim=1) - F.normalize(z2, dim=1)).norm(dim=1)  # (N,)
    powered = distances.pow(alpha)
    # N = 0: 0 with a zero gradient, not the NaN of an empty mean (shared.losses.core's rule)
    return powered.mean() if powered.numel() else powered.sum()


def uniformity(z: Tensor, *, t: float = 2.0) -> Tensor:
    """L_uniform = log E exp(−t ‖f(x) − f(y)‖²) over distinct pairs, on L2-normalised rows
    (t = 2 in the paper). Lower is more uniform; the minimum over the sphere is reached by
    uniformly spread points. NaN inputs are not checked (that would wait for the device): they
    give a NaN result.

    Shape:
        z: ``(N, D)`` with N ≥ 2; result: scalar.
    """
    check_features(z, "z", ndim=2)
    check_positive(t, "t")
    if z.shape[0] < 2:
        raise ValueError(f"uniformity needs at least 2 rows, got {z.shape[0]}")
    # l2_normalize: fp32 maths (pdist has no bf16 kernel), fp64 stays fp64
    sq_dists = torch.pdist(l2_normalize(z), p=2).pow(2)  # (N(N−1)/2,)
    return sq_dists.mul(-t).exp().mean().log()
