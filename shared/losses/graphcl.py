"""The GraphCL paper's contrastive loss (You et al. 2020): one direction, positive left out.

A thin derivation of the contrastive core (:mod:`shared.losses.core`), like
:func:`shared.losses.nt_xent_loss`, from which it differs in three ways: view 1 anchors only,
negatives from view 2 only, and no positive in the denominator. It reads no tensor value back
to the host, and follows the empty-batch rule of :mod:`shared.losses.core`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from shared.distributed import gather_with_offset
from shared.losses.common import (
    Gather,
    Reduction,
    autocast_off,
    check_block_size,
    check_features,
    check_gather,
    check_positive,
    check_reduction,
    check_same_shape,
    l2_normalize,
    reduce,
)
from shared.losses.core import masked_logsumexp

__all__ = ["GraphCLLoss", "graphcl_loss"]


def graphcl_loss(
    z1: Tensor,
    z2: Tensor,
    *,
    temperature: float = 0.2,
    gather: Gather = False,
    block_size: int | None = None,
    reduction: Reduction = "mean",
) -> Tensor:
    """The GraphCL paper's contrastive loss (You et al. 2020, the released code of every folder).

    ℓ_i = −log(e^{s_ii'/τ} / Σ_{j≠i} e^{s_ij'/τ}): one direction only (view 1 anchors), negatives
    from view 2 only, and the positive left OUT of the denominator, so the loss can be negative.
    τ = 0.2 in the unsupervised TU experiments (0.5 semi-supervised, 0.1 transfer).

    ``gather=True`` takes the negatives from every rank's second views (gradient-correct
    all-gather): as for :func:`~shared.losses.nt_xent_loss`, the loss is this rank's anchors'
    share and DDP's gradient average equals one process holding the whole batch.

    N = 0 gives a zero loss with a zero gradient (see :mod:`shared.losses.core`); N = 1 (over
    all ranks with ``gather``) raises: the lone anchor has no negative, so its denominator is
    empty and its loss would be −∞. ``gather="equal"`` as for
    :func:`~shared.losses.supcon_loss`. Inputs are not checked for NaN (that would wait for the
    device): the training loop checks the loss.

    Shape:
        z1, z2: ``(N, D)`` with N ≠ 1; result: scalar, or ``(N,)`` with ``reduction="none"``.
    """
    check_features(z1, "z1", ndim=2)
    check_features(z2, "z2", ndim=2)
    check_same_shape(z1, z2, "z1 and z2")
    check_positive(temperature, "temperature")
    check_reduction(reduction)
    check_gather(gather)
    with autocast_off(z1):
        a, c = l2_normalize(z1), l2_normalize(z2)  # (N, D) each
        c_all, offset = (
            gather_with_offset(c, equal_sizes=gather == "equal") if gather else (c, 0)
        )  # (Ng, D), rank order
        if c_all.shape[0] == 1:
            raise ValueError("graphcl_loss needs at least 2 samples (negatives), got 1")
        # the positive column of each local anchor among all contrasts, left out
        own = offset + torch.arange(a.shape[0], device=a.device)  # (N,)
        lse = masked_logsumexp(
            a,
            c_all,
            temperature=temperature,
            self_index=own,
            block_size=block_size,
            norm_bound=1.0,
        )
        per_anchor = lse.all - (a * c).sum(1) / temperature  # (N,)
        if gather and a.shape[0] == 0:  # keep the gather (and its backward all-reduce) in the graph
            per_anchor = per_anchor + 0.0 * c_all.sum()
        return reduce(per_anchor, reduction)


class GraphCLLoss(nn.Module):
    """Module form of :func:`graphcl_loss`."""

    def __init__(
        self,
        temperature: float = 0.2,
        gather: Gather = False,
        block_size: int | None = None,
        reduction: Reduction = "mean",
    ) -> None:
        super().__init__()
        self.temperature = check_positive(temperature, "temperature")
        self.gather, self.block_size = check_gather(gather), check_block_size(block_size)
        self.reduction: Reduction = reduction
        check_reduction(reduction)

    def forward(self, z1: Tensor, z2: Tensor) -> Tensor:
        return graphcl_loss(
            z1,
            z2,
            temperature=self.temperature,
            gather=self.gather,
            block_size=self.block_size,
            reduction=self.reduction,
        )
