"""ContraGAN's conditional contrastive (2C) loss (Kang & Park 2020, Eq. 8)."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from shared.distributed import gather_no_grad, gather_with_offset
from shared.losses.common import (
    Gather,
    Reduction,
    autocast_off,
    check_block_size,
    check_choice,
    check_features,
    check_gather,
    check_labels,
    check_positive,
    check_reduction,
    check_same_shape,
    reduce,
)
from shared.losses.core import masked_logsumexp

__all__ = ["ConditionalContrastiveLoss", "conditional_contrastive_loss"]

Positives = Literal["all", "proxy"]
POSITIVES = ("all", "proxy")


def conditional_contrastive_loss(
    embeddings: Tensor,
    proxies: Tensor,
    labels: Tensor,
    *,
    temperature: float = 1.0,
    positives: Positives = "all",
    gather: Gather = False,
    block_size: int | None = None,
    reduction: Reduction = "mean",
) -> Tensor:
    """The 2C loss: pull each embedding to its class proxy and to same-class embeddings.

    With l_i the L2-normalised embeddings and e(y_i) the L2-normalised class proxies,
    num_i = e^{s(l_i,e(y_i))/τ} + Σ_{k≠i, y_k=y_i} e^{s(l_i,l_k)/τ},
    den_i = e^{s(l_i,e(y_i))/τ} + Σ_{k≠i} e^{s(l_i,l_k)/τ}, and L = −mean_i log(num_i/den_i).
    No margin and no false-negative removal; τ = 1 in every reference config. The proxy is one
    extra column per anchor, added to both sums with ``logaddexp`` around the core's
    log-sum-exps. With ``gather=True`` the embeddings and labels of every rank are the contrasts
    (StudioGAN gathers everything first); see :func:`shared.losses.supcon_loss` for the scaling.
    ``gather="equal"`` promises every rank holds N rows and skips the exchange of the row counts.
    N = 0 gives a zero loss with a zero gradient (see :mod:`shared.losses.core`). Inputs are not
    checked for NaN (that would wait for the device): the training loop checks the loss.

    ``positives``: ``"all"`` is the paper's numerator above. ``"proxy"`` keeps only the proxy,
    num_i = e^{s(l_i,e(y_i))/τ}, with the same denominator (same-class samples stay in it, as
    negatives): StudioGAN's former ``pos_collected_numerator: false`` (its
    ``Conditional_Contrastive_loss`` up to July 2021, whose value also carries the constant
    −log τ). Only the proxy then pulls an embedding; other samples of its class push it away
    like any other sample. An anchor alone in the batch has loss 0 with either choice (the
    proxy is its whole denominator).

    Shape:
        embeddings: ``(N, D)``; proxies: ``(N, D)`` holding e(y_i) for row i; labels: ``(N,)``;
        result: scalar, or ``(N,)`` with ``reduction="none"``.
    """
    check_features(embeddings, "embeddings", ndim=2)
    check_features(proxies, "proxies", ndim=2)
    check_same_shape(embeddings, proxies, "embeddings and proxies")
    y = check_labels(labels, embeddings.shape[0])
    check_positive(temperature, "temperature")
    check_choice(positives, POSITIVES, "positives")
    check_reduction(reduction)
    check_gather(gather)
    equal = gather == "equal"
    with autocast_off(embeddings):
        dtype = torch.float64 if embeddings.dtype == torch.float64 else torch.float32
        l = F.normalize(embeddings.to(dtype), dim=1)  # (N, D)
        e = F.normalize(proxies.to(dtype), dim=1)  # (N, D)
        l_all, offset = gather_with_offset(l, equal_sizes=equal) if gather else (l, 0)  # (Ng, D)
        proxy_logit = (l * e).sum(1) / temperature  # (N,)
        if positives == "proxy":  # no labels needed; without gather the core's symmetric path
            columns: Tensor | Literal["diagonal"] = "diagonal"
            if gather:
                columns = offset + torch.arange(l.shape[0], device=l.device)  # (N,)
            lse_all = masked_logsumexp(
                l,
                l_all,
                temperature=temperature,
                self_index=columns,
                block_size=block_size,
                norm_bound=1.0,
            ).all  # (N,)
            return reduce(torch.logaddexp(proxy_logit, lse_all) - proxy_logit, reduction)
        y_all = gather_no_grad(y, equal_sizes=equal) if gather else y  # (Ng,)
        own = offset + torch.arange(l.shape[0], device=l.device)  # (N,)
        lse = masked_logsumexp(
            l,
            l_all,
            temperature=temperature,
            self_index=own,
            anchor_labels=y,
            contrast_labels=y_all,
            block_size=block_size,
            norm_bound=1.0,
        )
        assert lse.positive is not None
        per_anchor = torch.logaddexp(proxy_logit, lse.all) - torch.logaddexp(
            proxy_logit, lse.positive
        )  # (N,)
        return reduce(per_anchor, reduction)


class ConditionalContrastiveLoss(nn.Module):
    """Module form of :func:`conditional_contrastive_loss`."""

    def __init__(
        self,
        temperature: float = 1.0,
        positives: Positives = "all",
        gather: Gather = False,
        block_size: int | None = None,
        reduction: Reduction = "mean",
    ) -> None:
        super().__init__()
        self.temperature = check_positive(temperature, "temperature")
        self.positives: Positives = positives
        check_choice(positives, POSITIVES, "positives")
        self.gather, self.block_size = check_gather(gather), check_block_size(block_size)
        self.reduction: Reduction = reduction
        check_reduction(reduction)

    def forward(self, embeddings: Tensor, proxies: Tensor, labels: Tensor) -> Tensor:
        return conditional_contrastive_loss(
            embeddings,
            proxies,
            labels,
            temperature=self.temperature,
            positives=self.positives,
            gather=self.gather,
            block_size=self.block_size,
            reduction=self.reduction,
        )
