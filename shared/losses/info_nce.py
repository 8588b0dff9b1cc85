"""InfoNCE with in-batch or explicit negatives (CPC, MoCo): one query, one positive key.

With q̂, k̂ the L2-normalised query and keys, ℓ_i = −log[e^{q̂_i·k̂⁺_i/τ} / (e^{q̂_i·k̂⁺_i/τ} +
Σ_{k⁻} e^{q̂_i·k̂⁻/τ})] (van den Oord et al. 2018, Eq. 4; He et al. 2020, MoCo Eq. 1), i.e. the
cross-entropy of the logits ``[q·k⁺, q·k⁻…]/τ`` with target 0 (MoCo's Algorithm 1). The
negatives are either the other samples' positive keys (in-batch: MoCo v3, CPC) or given
explicitly, shared by every query (a :class:`~shared.losses.queue.MemoryQueue`) or one set per
query. The shared sums go through the contrastive core (:mod:`shared.losses.core`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
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
    reduce,
)
from shared.losses.core import masked_logsumexp

__all__ = ["InfoNCELoss", "info_nce_loss", "two_view_info_nce_loss"]


# MoCo v1 (He et al. 2020) uses τ = 0.07 with a linear head; MoCo v2 (Chen et al. 2020,
# "Improved Baselines with Momentum Contrastive Learning") moves to τ = 0.2 with its MLP head,
# the head every pipeline of this toolkit has, and MoCo v3's ViT recipes keep 0.2.
DEFAULT_TEMPERATURE = 0.2


def info_nce_loss(
    query: Tensor,
    positive_key: Tensor,
    negative_keys: Tensor | None = None,
    *,
    temperature: float = DEFAULT_TEMPERATURE,
    gather: Gather = False,
    block_size: int | None = None,
    reduction: Reduction = "mean",
    in_batch: bool = False,
) -> Tensor:
    """InfoNCE of each query against its positive key and a set of negatives (one direction).

    ℓ_i = log(e^{q̂_i·k̂⁺_i/τ} + Σ_{k⁻ ∈ N(i)} e^{q̂_i·k̂⁻/τ}) − q̂_i·k̂⁺_i/τ, features L2-normalised
    inside (fp32, or fp64 when any input is fp64) with autocast off. τ = 0.2 by default (MoCo v2;
    MoCo v1 used 0.07).

    * ``negative_keys=None``: in-batch. Query ``i``'s contrasts are all positive keys, its own
      at column ``i`` (the one-directional InfoNCE of CPC and MoCo v3, = :func:`npairs_loss`
      with ``normalize=True``). Symmetrise by averaging with the swapped call if wanted.
    * ``(K, D)``: K negatives shared by every query (MoCo's queue); the in-batch keys are not
      negatives. K = 0 (an empty queue) gives ℓ_i = 0.
    * ``(N, K, D)``: negatives per query. ``block_size`` does not apply: the ``(N, K, D)``
      input already outweighs its ``(N, K)`` logits.
    * ``in_batch=True`` with shared ``(K, D)`` negatives: both, the other samples' positive
      keys and the K extra negatives (a SimCLR-style batch topped up with a queue of past keys
      for small batches); ``gather`` then applies to the in-batch keys.

    ``gather=True`` (in-batch only) contrasts every query with every rank's positive keys,
    through a gradient-correct all-gather; as for :func:`supcon_loss`, the loss is this rank's
    mean and DDP's gradient averaging makes the parameter gradients those of one process with
    the whole batch. Explicit negatives are never gathered, and ``gather=True`` with them is an
    error: a :class:`MemoryQueue` already holds every rank's keys, and the per-rank loss of the
    local queries needs nothing from other ranks. ``gather="equal"`` promises every rank holds N
    queries and skips the exchange of the row counts (see :func:`supcon_loss`).

    An empty batch (N = 0) gives 0 for ``"mean"`` and ``"sum"``, still attached to the graph
    (backward runs, every gradient is zero), and an empty tensor for ``"none"``. Inputs are not
    checked for NaN (that would wait for the device): the training loop checks the loss.

    Args:
        query: ``q_i``, e.g. the online encoder's output.
        positive_key: ``k⁺_i``, e.g. the momentum encoder's output for the other view.
        negative_keys: ``None``, shared ``(K, D)`` or per-query ``(N, K, D)`` negatives.
        temperature: τ > 0.
        gather: in-batch negatives from every rank (see above).
        in_batch: with shared ``negative_keys``, keep the in-batch negatives too.
        block_size: see :func:`shared.losses.core.masked_logsumexp`.
        reduction: ``"mean"`` over queries, ``"sum"`` or ``"none"``.

    Shape:
        query, positive_key: ``(N, D)``; negative_keys: ``(K, D)`` or ``(N, K, D)``;
        result: scalar, or ``(N,)`` with ``reduction="none"``.
    """
    check_features(query, "query", ndim=2)
    check_features(positive_key, "positive_key", ndim=2)
    check_same_shape(query, positive_key, "query and positive_key")
    N, D = query.shape
    negatives = None if negative_keys is None else _check_negatives(negative_keys, N, D)
    check_positive(temperature, "temperature")
    check_reduction(reduction)
    check_block_size(block_size)
    check_gather(gather)
    if in_batch and negatives is not None and negatives.ndim == 3:
        raise ValueError("in_batch=True combines with shared (K, D) negative_keys, not per-query")
    in_batch = in_batch or negatives is None
    if gather and not in_batch:
        raise ValueError(
            "gather=True applies to in-batch negatives only (negative_keys=None or "
            "in_batch=True); explicit negative_keys are used as given (a MemoryQueue already "
            "holds every rank's keys)"
        )
    inputs = (query, positive_key) if negatives is None else (query, positive_key, negatives)
    dtype = torch.float64 if any(x.dtype == torch.float64 for x in inputs) else torch.float32
    with autocast_off(query):
        q = F.normalize(query.to(dtype), dim=1)  # (N, D)
        k = F.normalize(positive_key.to(dtype), dim=1)  # (N, D)
        positive = (q * k).sum(1) / temperature  # (N,) the logit of each query's positive
        if in_batch:
            k_all = (
                gather_with_offset(k, equal_sizes=gather == "equal").tensor if gather else k
            )  # (Ng, D), rank order
            if negatives is not None:  # the extra negatives join the in-batch keys
                extra = F.normalize(negatives.to(dtype), dim=-1)  # (K, D)
                k_all = torch.cat([k_all, extra])  # (Ng + K, D)
            if N == 0:  # keep the gather (and its backward all-reduce) in the graph
                per_query = positive + 0.0 * k_all.sum()  # (0,)
            else:  # all keys, own column included: lse − positive is the cross-entropy
                lse = masked_logsumexp(
                    q, k_all, temperature=temperature, block_size=block_size, norm_bound=1.0
                )
                per_query = lse.all - positive  # (N,)
        else:
            assert negatives is not None  # in_batch is True without explicit negatives
            n = F.normalize(negatives.to(dtype), dim=-1)  # (K, D) or (N, K, D)
            per_query = _explicit_negatives(q, n, positive, temperature, block_size)
        return reduce(per_query, reduction)


def two_view_info_nce_loss(
    z1: Tensor,
    z2: Tensor,
    negatives: Tensor,
    *,
    temperature: float,
    gather: Gather = False,
    block_size: int | None = None,
) -> Tensor:
    """Both directions of InfoNCE with in-batch keys plus shared extra negatives, averaged.

    ``½ [info_nce(z1, z2, negatives, in_batch=True) + info_nce(z2, z1, negatives,
    in_batch=True)]``: a SimCLR-style two-view loss whose small batch is topped up with
    ``negatives`` (e.g. a :class:`~shared.losses.queue.MemoryQueue`'s past keys). With no
    negatives (K = 0) it is the mean of the two in-batch InfoNCE directions.

    Shape:
        z1, z2: ``(N, D)``; negatives: ``(K, D)``; result: scalar.
    """
    forward = info_nce_loss(
        z1,
        z2,
        negatives,
        temperature=temperature,
        gather=gather,
        block_size=block_size,
        in_batch=True,
    )
    backward = info_nce_loss(
        z2,
        z1,
        negatives,
        temperature=temperature,
        gather=gather,
        block_size=block_size,
        in_batch=True,
    )
    return 0.5 * (forward + backward)


def _explicit_negatives(
    q: Tensor, n: Tensor, positive: Tensor, temperature: float, block_size: int | None
) -> Tensor:
    """``log(e^{pos} + Σ_k e^{q·n_k/τ}) − pos`` per query: the positive joins the denominator.

    Shape:
        q: ``(N, D)``; n: ``(K, D)`` or ``(N, K, D)``; positive, result: ``(N,)``.
    """
    if q.shape[0] == 0:
        return positive + 0.0 * n.sum()  # (0,), attached to every input
    if n.ndim == 2:
        lse_negative = masked_logsumexp(
            q, n, temperature=temperature, block_size=block_size, norm_bound=1.0
        ).all
    else:
        logits = torch.einsum("nd,nkd->nk", q, n) / temperature  # (N, K)
        lse_negative = torch.logsumexp(logits, dim=1)  # (N,), −inf when K = 0
    return torch.logaddexp(positive, lse_negative) - positive  # (N,)


def _check_negatives(negatives: object, N: int, D: int) -> Tensor:
    """Shared ``(K, D)`` or per-query ``(N, K, D)`` negatives matching ``query``'s ``(N, D)``."""
    if isinstance(negatives, Tensor) and negatives.ndim not in (2, 3):
        raise ValueError(
            f"negative_keys must be shared (K, {D}) or per-query ({N}, K, {D}), "
            f"got shape {tuple(negatives.shape)}"
        )
    ndim = negatives.ndim if isinstance(negatives, Tensor) else 2
    x = check_features(negatives, "negative_keys", ndim=ndim)
    expected = (N, x.shape[1], D) if ndim == 3 else (x.shape[0], D)
    if tuple(x.shape) != expected:
        raise ValueError(
            f"negative_keys must have shape {expected} to match query ({N}, {D}), "
            f"got {tuple(x.shape)}"
        )
    return x


class InfoNCELoss(nn.Module):
    """Module form of :func:`info_nce_loss`; checks its settings here, stores them only."""

    def __init__(
        self,
        temperature: float = DEFAULT_TEMPERATURE,
        gather: Gather = False,
        block_size: int | None = None,
        reduction: Reduction = "mean",
        in_batch: bool = False,
    ) -> None:
        super().__init__()
        self.temperature = check_positive(temperature, "temperature")
        check_block_size(block_size)
        check_reduction(reduction)
        self.gather, self.block_size = check_gather(gather), block_size
        self.reduction: Reduction = reduction
        self.in_batch = in_batch

    def forward(
        self, query: Tensor, positive_key: Tensor, negative_keys: Tensor | None = None
    ) -> Tensor:
        return info_nce_loss(
            query,
            positive_key,
            negative_keys,
            temperature=self.temperature,
            gather=self.gather,
            block_size=self.block_size,
            reduction=self.reduction,
            in_batch=self.in_batch,
        )

    def extra_repr(self) -> str:
        return (
            f"temperature={self.temperature}, gather={self.gather}, "
            f"block_size={self.block_size}, reduction={self.reduction!r}, in_batch={self.in_batch}"
        )
