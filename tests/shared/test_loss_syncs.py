"""No loss waits for the device: every named loss, dense and blockwise, makes 0 host syncs.

A sync op (``.item()``, ``torch.equal``, ``unique``, boolean-mask indexing, ...; see
``tests.sync_counts``) stalls the GPU's launch queue at every training step. Counted on CPU
with a dispatch mode, forward and backward, after a first call (steady state). The catalogue of
loss calls here, ``LOSS_CASES``, also drives the ``torch.compile`` tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import pytest
import torch
from torch import Tensor

from shared.losses import (
    conditional_contrastive_loss,
    data_to_data_cross_entropy_loss,
    generalized_contrastive_loss,
    graphcl_loss,
    info_nce_loss,
    masked_logsumexp,
    npairs_loss,
    nt_logistic_loss,
    nt_xent_loss,
    sliced_wasserstein_distance,
    supcon_loss,
    triplet_loss,
    two_view_info_nce_loss,
)
from shared.losses.metrics import alignment, uniformity
from tests.sync_counts import count_syncs

N, D, K = 6, 8, 5
BLOCK = 2  # rows per block: several blocks at N = 6


class Inputs(NamedTuple):
    """Leaf tensors every case draws from (labels with repeats: SupCon has positives)."""

    z1: Tensor  # (N, D)
    z2: Tensor  # (N, D)
    z3: Tensor  # (N, D)
    queue: Tensor  # (K, D) shared negatives
    per_query: Tensor  # (N, K, D) negatives per query
    labels: Tensor  # (N,)
    generator: torch.Generator


def make_inputs(dtype: torch.dtype = torch.float64, seed: int = 0) -> Inputs:
    g = torch.Generator().manual_seed(seed)

    def leaf(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_()

    labels = torch.tensor([0, 1, 0, 2, 1, 0])
    return Inputs(
        leaf(N, D),
        leaf(N, D),
        leaf(N, D),
        leaf(K, D),
        leaf(N, K, D),
        labels,
        torch.Generator().manual_seed(seed + 1),
    )


LossCall = Callable[[Inputs, int | None], Tensor]  # (inputs, block_size) -> scalar loss


@dataclass(frozen=True)
class Case:
    loss: LossCall
    blockwise: bool = True  # takes block_size (the core's blockwise path)


def _views(x: Inputs) -> Tensor:
    return torch.stack([x.z1, x.z2], dim=1)  # (N, 2, D)


LOSS_CASES: dict[str, Case] = {
    **{
        f"supcon_{variant}_{mode}_{'labelled' if labelled else 'simclr'}": Case(
            lambda x, b, variant=variant, mode=mode, labelled=labelled: supcon_loss(
                _views(x),
                x.labels if labelled else None,
                variant=variant,
                contrast_mode=mode,
                block_size=b,
            )
        )
        for variant in ("out", "in")
        for mode in ("all", "one")
        for labelled in (True, False)
    },
    "nt_xent": Case(lambda x, b: nt_xent_loss(x.z1, x.z2, block_size=b)),
    "graphcl": Case(lambda x, b: graphcl_loss(x.z1, x.z2, block_size=b)),
    "info_nce_in_batch": Case(lambda x, b: info_nce_loss(x.z1, x.z2, block_size=b)),
    "info_nce_queue": Case(lambda x, b: info_nce_loss(x.z1, x.z2, x.queue, block_size=b)),
    "info_nce_in_batch_and_queue": Case(
        lambda x, b: info_nce_loss(x.z1, x.z2, x.queue, in_batch=True, block_size=b)
    ),
    "info_nce_per_query": Case(
        lambda x, b: info_nce_loss(x.z1, x.z2, x.per_query), blockwise=False
    ),
    "two_view_info_nce": Case(
        lambda x, b: two_view_info_nce_loss(x.z1, x.z2, x.queue, temperature=0.2, block_size=b)
    ),
    "conditional_contrastive": Case(
        lambda x, b: conditional_contrastive_loss(x.z1, x.z2, x.labels, block_size=b)
    ),
    "conditional_contrastive_proxy": Case(
        lambda x, b: conditional_contrastive_loss(
            x.z1, x.z2, x.labels, positives="proxy", block_size=b
        )
    ),
    **{
        f"d2d_ce_{form}": Case(
            lambda x, b, form=form: data_to_data_cross_entropy_loss(
                x.z1, x.z2, x.labels, form=form, block_size=b
            )
        )
        for form in ("studiogan", "paper")
    },
    "npairs": Case(lambda x, b: npairs_loss(x.z1, x.z2, block_size=b)),
    "masked_logsumexp_normalised": Case(
        lambda x, b: masked_logsumexp(
            x.z1 / x.z1.norm(dim=1, keepdim=True),
            x.z2 / x.z2.norm(dim=1, keepdim=True),
            temperature=0.1,
            self_index="diagonal",
            block_size=b,
            norm_bound=1.0,
        ).all.sum()
    ),
    "nt_logistic": Case(lambda x, b: nt_logistic_loss(x.z1, x.z2), blockwise=False),
    "triplet": Case(lambda x, b: triplet_loss(x.z1, x.z2, x.z3), blockwise=False),
    **{
        f"generalized_{prior}": Case(
            lambda x, b, prior=prior: generalized_contrastive_loss(x.z1, x.z2, prior=prior),
            blockwise=False,
        )
        for prior in ("uniform_hypersphere", "normal", "uniform_hypercube", "decoupled_nt_xent")
    },
    "generalized_seeded": Case(
        lambda x, b: generalized_contrastive_loss(x.z1, x.z2, generator=x.generator),
        blockwise=False,
    ),
    "sliced_wasserstein": Case(
        lambda x, b: sliced_wasserstein_distance(x.z1, x.z2.detach()), blockwise=False
    ),
    "alignment": Case(lambda x, b: alignment(x.z1, x.z2), blockwise=False),
    "uniformity": Case(lambda x, b: uniformity(x.z1), blockwise=False),
}


def _paths() -> list[tuple[str, int | None]]:
    dense: list[tuple[str, int | None]] = [(name, None) for name in LOSS_CASES]
    return dense + [(name, BLOCK) for name, case in LOSS_CASES.items() if case.blockwise]


def _step(case: Case, block_size: int | None) -> None:
    x = make_inputs(torch.float32)
    case.loss(x, block_size).backward()


@pytest.mark.parametrize(("name", "block_size"), _paths())
def test_loss_call_makes_no_host_sync(name: str, block_size: int | None) -> None:
    case = LOSS_CASES[name]
    _step(case, block_size)  # steady state: buffers and caches exist
    x = make_inputs(torch.float32)
    with count_syncs() as syncs:
        loss = case.loss(x, block_size)
        loss.backward()
    assert sum(syncs.values()) == 0, dict(syncs)
    assert loss.ndim == 0 and x.z1.grad is not None  # a real loss ran, with its backward


def test_only_an_unknown_norm_bound_reads_the_device() -> None:
    # raw rows and no bound: the core measures the norms, its one documented host read
    x = make_inputs(torch.float32)
    with count_syncs() as syncs:
        masked_logsumexp(x.z1, x.z2, temperature=0.5)
        npairs_loss(x.z1, x.z2, normalize=False)
    assert syncs == {"aten._local_scalar_dense": 2}
    with count_syncs() as syncs:
        masked_logsumexp(x.z1, x.z2, temperature=0.5, norm_bound=float(D))
    assert sum(syncs.values()) == 0


def test_a_nan_input_gives_a_nan_loss_for_the_loop_to_catch() -> None:
    # the losses read no values, so they cannot raise on NaN: the loop's finiteness check does
    x = make_inputs(torch.float32)
    with torch.no_grad():
        x.z1[2, 3] = float("nan")
    for name, case in LOSS_CASES.items():
        assert not torch.isfinite(case.loss(x, None)), name
