"""Contrastive losses: one masked log-softmax core (dense or blockwise) and the named losses.

Every loss is a function (tensors and hyper-parameters in, a tensor out) with a thin
``nn.Module`` that stores the settings. A batch with zero rows gives a zero loss with a zero
gradient (see :mod:`shared.losses.core`).
"""

from shared.losses.conditional import ConditionalContrastiveLoss, conditional_contrastive_loss
from shared.losses.core import LogSumExps, masked_logsumexp
from shared.losses.d2d_ce import DataToDataCrossEntropyLoss, data_to_data_cross_entropy_loss
from shared.losses.generalized import (
    GeneralizedContrastiveLoss,
    generalized_contrastive_loss,
    random_orthogonal,
    sample_prior,
    sliced_wasserstein_distance,
)
from shared.losses.graphcl import GraphCLLoss, graphcl_loss
from shared.losses.info_nce import InfoNCELoss, info_nce_loss, two_view_info_nce_loss
from shared.losses.metrics import alignment, uniformity
from shared.losses.nt_logistic import NTLogisticLoss, nt_logistic_loss
from shared.losses.pairs import NPairsLoss, TripletLoss, npairs_loss, triplet_loss
from shared.losses.queue import MemoryQueue
from shared.losses.supcon import NTXentLoss, SupConLoss, nt_xent_loss, supcon_loss

__all__ = [
    "ConditionalContrastiveLoss",
    "DataToDataCrossEntropyLoss",
    "GeneralizedContrastiveLoss",
    "GraphCLLoss",
    "InfoNCELoss",
    "LogSumExps",
    "MemoryQueue",
    "NPairsLoss",
    "NTLogisticLoss",
    "NTXentLoss",
    "SupConLoss",
    "TripletLoss",
    "alignment",
    "conditional_contrastive_loss",
    "data_to_data_cross_entropy_loss",
    "generalized_contrastive_loss",
    "graphcl_loss",
    "info_nce_loss",
    "masked_logsumexp",
    "npairs_loss",
    "nt_logistic_loss",
    "nt_xent_loss",
    "random_orthogonal",
    "sample_prior",
    "sliced_wasserstein_distance",
    "supcon_loss",
    "triplet_loss",
    "two_view_info_nce_loss",
    "uniformity",
]
