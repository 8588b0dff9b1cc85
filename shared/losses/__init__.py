"""Contrastive losses: one masked log-softmax core (dense or blockwise) and the named losses.

Every loss is a function (tensors and hyper-parameters in, a tensor out) with a thin
``nn.Module`` that stores the settings.
"""

from shared.losses.conditional import ConditionalContrastiveLoss, conditional_contrastive_loss
from shared.losses.core import LogSumExps, masked_logsumexp
from shared.losses.generalized import (
    GeneralizedContrastiveLoss,
    generalized_contrastive_loss,
    random_orthogonal,
    sample_prior,
    sliced_wasserstein_distance,
)
from shared.losses.metrics import alignment, uniformity
from shared.losses.supcon import (
    GraphCLLoss,
    NPairsLoss,
    NTXentLoss,
    SupConLoss,
    TripletLoss,
    graphcl_loss,
    npairs_loss,
    nt_xent_loss,
    supcon_loss,
    triplet_loss,
)

__all__ = [
    "ConditionalContrastiveLoss",
    "GeneralizedContrastiveLoss",
    "GraphCLLoss",
    "LogSumExps",
    "NPairsLoss",
    "NTXentLoss",
    "SupConLoss",
    "TripletLoss",
    "alignment",
    "conditional_contrastive_loss",
    "generalized_contrastive_loss",
    "graphcl_loss",
    "masked_logsumexp",
    "npairs_loss",
    "nt_xent_loss",
    "random_orthogonal",
    "sample_prior",
    "sliced_wasserstein_distance",
    "supcon_loss",
    "triplet_loss",
    "uniformity",
]

from shared.losses.info_nce import InfoNCELoss, info_nce_loss
from shared.losses.queue import MemoryQueue

__all__ += ["InfoNCELoss", "MemoryQueue", "info_nce_loss"]
