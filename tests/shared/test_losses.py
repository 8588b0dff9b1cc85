"""Executable specification of the contrastive losses: oracles, analytic values, invariances,
gradients, precision and bad input. Oracles are literal loops over the paper formulas, float64."""

from __future__ import annotations

import inspect
import io
import math
import os
import socket
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import Tensor, nn

import shared.losses.common as common
import shared.losses.core as core
from shared.losses import (
    ConditionalContrastiveLoss,
    DataToDataCrossEntropyLoss,
    GeneralizedContrastiveLoss,
    GraphCLLoss,
    NPairsLoss,
    NTXentLoss,
    SupConLoss,
    TripletLoss,
    conditional_contrastive_loss,
    data_to_data_cross_entropy_loss,
    generalized_contrastive_loss,
    graphcl_loss,
    masked_logsumexp,
    npairs_loss,
    nt_xent_loss,
    sliced_wasserstein_distance,
    supcon_loss,
    triplet_loss,
)
from shared.losses.supcon import _supcon_rows
from tests.processes import exit_without_teardown

SEEDS = (0, 1, 2)


def _lse(values: list[float]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def supcon_oracle(
    features: Tensor, labels: Tensor | None, tau: float, variant: str, mode: str
) -> float:
    """Khosla et al. Eq. 2 / Eq. 3 with loops; anchors without positives are left out."""
    z = F.normalize(features.double(), dim=-1)
    N, V, _ = z.shape
    y = list(range(N)) if labels is None else labels.tolist()
    rows = [(n, v) for n in range(N) for v in range(V)]
    anchors = rows if mode == "all" else [(n, 0) for n in range(N)]
    losses = []
    for n, v in anchors:
        others = [(m, w) for (m, w) in rows if (m, w) != (n, v)]
        pos = [(m, w) for (m, w) in others if y[m] == y[n]]
        if not pos:
            continue
        logit = {r: float(z[n, v] @ z[r[0], r[1]]) / tau for r in others}
        denominator = _lse([logit[r] for r in others])
        if variant == "out":
            losses.append(-sum(logit[p] - denominator for p in pos) / len(pos))
        else:
            mean_pos = sum(math.exp(logit[p]) for p in pos) / len(pos)
            losses.append(-(math.log(mean_pos) - denominator))
    return sum(losses) / len(losses) if losses else 0.0


def simclr_oracle(z1: Tensor, z2: Tensor, tau: float) -> float:
    """SimCLR Algorithm 1 transcribed: ℓ(i, j) over the 2N views, mean of ℓ(2k−1,2k)+ℓ(2k,2k−1)."""
    z = []
    for k in range(z1.shape[0]):
        z += [F.normalize(z1[k].double(), dim=0), F.normalize(z2[k].double(), dim=0)]
    n2 = len(z)

    def ell(i: int, j: int) -> float:
        num = float(z[i] @ z[j]) / tau
        return -(num - _lse([float(z[i] @ z[k]) / tau for k in range(n2) if k != i]))

    return sum(ell(2 * k, 2 * k + 1) + ell(2 * k + 1, 2 * k) for k in range(n2 // 2)) / n2


def two_c_oracle(emb: Tensor, proxies: Tensor, labels: Tensor, tau: float) -> float:
    """ContraGAN Eq. 8 with loops."""
    l_ = F.normalize(emb.double(), dim=1)
    e = F.normalize(proxies.double(), dim=1)
    y = labels.tolist()
    total = 0.0
    for i in range(len(y)):
        proxy = math.exp(float(l_[i] @ e[i]) / tau)
        others = [k for k in range(len(y)) if k != i]
        num = proxy + sum(math.exp(float(l_[i] @ l_[k]) / tau) for k in others if y[k] == y[i])
        den = proxy + sum(math.exp(float(l_[i] @ l_[k]) / tau) for k in others)
        total += -math.log(num / den)
    return total / len(y)


def _features(seed: int, N: int, V: int, D: int = 5) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(N, V, D, generator=g, dtype=torch.float64)


def _labels(seed: int, N: int, classes: int) -> Tensor:
    return torch.randint(0, classes, (N,), generator=torch.Generator().manual_seed(seed + 100))


# ---------------------------------------------------------------- oracles


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("N", "V"), [(1, 1), (1, 2), (2, 1), (5, 2), (7, 3)])
@pytest.mark.parametrize("variant", ["out", "in"])
@pytest.mark.parametrize("mode", ["all", "one"])
@pytest.mark.parametrize("block_size", [None, 1, 3])
def test_supcon_matches_loop_oracle(
    seed: int, N: int, V: int, variant: str, mode: str, block_size: int | None
) -> None:
    features = _features(seed, N, V)
    for labels in (None, _labels(seed, N, 3)):
        got = supcon_loss(
            features,
            labels,
            temperature=0.3,
            variant=variant,  # type: ignore[arg-type]
            contrast_mode=mode,
            block_size=block_size,  # type: ignore[arg-type]
        )
        assert got.dtype == torch.float64
        assert got.item() == pytest.approx(
            supcon_oracle(features, labels, 0.3, variant, mode), abs=1e-10
        )


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("N", [1, 2, 6])
def test_nt_xent_matches_simclr_pseudocode(seed: int, N: int) -> None:
    f = _features(seed, N, 2, D=4)
    got = nt_xent_loss(f[:, 0], f[:, 1], temperature=0.5)
    assert got.item() == pytest.approx(simclr_oracle(f[:, 0], f[:, 1], 0.5), abs=1e-10)


def test_supcon_out_agrees_with_pytorch_metric_learning() -> None:
    # the peer comes with the dev and bench extras; without them the comparison is skipped
    pml_losses = pytest.importorskip("pytorch_metric_learning.losses")

    features = _features(0, 12, 2, D=8)
    labels = torch.tensor([0, 1, 2, 3] * 3)  # every anchor has positives: no reducer quirks
    ours = supcon_loss(features, labels, temperature=0.1)
    peer_loss = pml_losses.SupConLoss(temperature=0.1)
    peer = peer_loss(features.reshape(24, 8), labels.repeat_interleave(2))  # a row per view
    assert ours.item() == pytest.approx(peer.item(), abs=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_graphcl_loss_matches_oracle_and_can_be_negative(seed: int) -> None:
    f = _features(seed, 6, 2)
    z1, z2 = F.normalize(f[:, 0], dim=1), F.normalize(f[:, 1], dim=1)
    tau = 0.2
    expected = 0.0
    for i in range(6):
        negatives = [float(z1[i] @ z2[j]) / tau for j in range(6) if j != i]
        expected += -(float(z1[i] @ z2[i]) / tau - _lse(negatives))
    assert graphcl_loss(f[:, 0], f[:, 1], temperature=tau).item() == pytest.approx(
        expected / 6, abs=1e-10
    )
    same = graphcl_loss(z1, z1 + 1e-3 * z2, temperature=tau)  # positives far above negatives
    assert same.item() < 0


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("normalize", [True, False])
def test_npairs_matches_sohn_formula(seed: int, normalize: bool) -> None:
    f = _features(seed, 5, 2) * 0.5
    a, p = f[:, 0], f[:, 1]
    if normalize:
        a, p = F.normalize(a, dim=1), F.normalize(p, dim=1)
    expected = 0.0
    for i in range(5):
        expected += math.log1p(
            sum(math.exp(float(a[i] @ p[j] - a[i] @ p[i])) for j in range(5) if j != i)
        )
    got = npairs_loss(f[:, 0], f[:, 1], temperature=1.0, normalize=normalize)
    assert got.item() == pytest.approx(expected / 5, abs=1e-10)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("block_size", [None, 2])
def test_conditional_contrastive_matches_oracle(seed: int, block_size: int | None) -> None:
    f = _features(seed, 8, 2)
    labels = _labels(seed, 8, 3)
    for tau in (1.0, 0.1):
        got = conditional_contrastive_loss(
            f[:, 0], f[:, 1], labels, temperature=tau, block_size=block_size
        )
        assert got.item() == pytest.approx(two_c_oracle(f[:, 0], f[:, 1], labels, tau), abs=1e-10)


# ---------------------------------------------------------------- analytic values


@pytest.mark.parametrize("N", [1, 2, 5, 64])
def test_nt_xent_of_identical_embeddings_is_log_2n_minus_1(N: int) -> None:
    z = torch.ones(N, 3)
    assert nt_xent_loss(z, z, temperature=0.5).item() == pytest.approx(math.log(2 * N - 1), 1e-6)


def test_supcon_with_one_positive_equals_nt_xent() -> None:
    f = _features(3, 6, 2)
    instance_labels = torch.arange(6)
    for variant in ("out", "in"):
        assert supcon_loss(f, instance_labels, temperature=0.2, variant=variant).item() == (  # type: ignore[arg-type]
            pytest.approx(nt_xent_loss(f[:, 0], f[:, 1], temperature=0.2).item(), abs=1e-12)
        )


def test_two_c_loss_on_hand_made_vectors() -> None:
    emb = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    proxies = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    labels = torch.tensor([0, 0, 1])
    e = math.e
    expected = (
        -math.log((e + 1) / (2 * e + 1)) - math.log(2 / 3) - math.log(1 / (e + 2))
    ) / 3  # worked by hand from Eq. 8 with τ = 1
    got = conditional_contrastive_loss(emb, proxies, labels, temperature=1.0)
    assert got.item() == pytest.approx(expected, abs=1e-12)


def test_supcon_with_one_positive_one_negative_is_a_soft_triplet_loss() -> None:
    g = torch.Generator().manual_seed(0)
    a, p, n = (
        F.normalize(torch.randn(4, 6, generator=g, dtype=torch.float64), dim=1) for _ in "apn"
    )
    labels = torch.tensor([0, 0, 1])
    for tau in (1.0, 0.1, 0.01):
        for i in range(4):
            features = torch.stack([a[i], p[i], n[i]]).unsqueeze(1)  # (3, 1, D): one view
            per_anchor = supcon_loss(features, labels, temperature=tau, reduction="none")
            gap = ((a[i] - p[i]).pow(2).sum() - (a[i] - n[i]).pow(2).sum()).item()
            assert per_anchor[0, 0].item() == pytest.approx(
                math.log1p(math.exp(gap / (2 * tau))), rel=1e-9
            )
            hinge = triplet_loss(a[i : i + 1], p[i : i + 1], n[i : i + 1], margin=0.0).item()
            # 2τ·softplus(x/2τ) lies in [relu(x), relu(x) + 2τ·log 2]: → triplet as τ → 0
            scaled = 2 * tau * per_anchor[0, 0].item()
            assert hinge - 1e-12 <= scaled <= hinge + 2 * tau * math.log(2) + 1e-12


def test_supcon_with_one_positive_many_negatives_is_npairs() -> None:
    g = torch.Generator().manual_seed(1)
    a, p = torch.randn(5, 4, generator=g, dtype=torch.float64).unbind(0)[0], None
    anchors = torch.randn(5, 4, generator=g, dtype=torch.float64)
    positives = torch.randn(5, 4, generator=g, dtype=torch.float64)
    per_npairs = npairs_loss(anchors, positives, temperature=0.5, reduction="none")
    for i in range(5):
        # anchor i, its positive, and the other positives as negatives: labels i, i, then others
        others = [j for j in range(5) if j != i]
        rows = torch.stack([anchors[i], positives[i], *positives[others]]).unsqueeze(1)
        labels = torch.tensor([0, 0, *range(1, 5)])
        features = rows
        per_supcon = supcon_loss(features, labels, temperature=0.5, reduction="none")
        # SupCon's anchor also sees its positive's row; N-pairs has no anchor-anchor term,
        # and neither does this construction (the anchor is the only anchor-side row).
        assert per_supcon[0, 0].item() == pytest.approx(per_npairs[i].item(), abs=1e-12)
    del a, p


def test_anchors_without_positives_are_excluded_and_never_nan() -> None:
    f = _features(0, 4, 1).requires_grad_()
    labels = torch.tensor([0, 1, 2, 2])  # only samples 2 and 3 have a positive
    loss = supcon_loss(f, labels, temperature=0.1)
    assert loss.item() == pytest.approx(supcon_oracle(f.detach(), labels, 0.1, "out", "all"))
    per_anchor = supcon_loss(f, labels, temperature=0.1, reduction="none")
    assert per_anchor[0].item() == 0.0 and per_anchor[1].item() == 0.0
    assert loss.item() == pytest.approx(per_anchor[2:].mean().item(), abs=1e-12)
    for variant in ("out", "in"):
        none_positive = supcon_loss(f, torch.arange(4), variant=variant)  # type: ignore[arg-type]
        assert none_positive.item() == 0.0
        (grad,) = torch.autograd.grad(none_positive, f)
        assert torch.equal(grad, torch.zeros_like(grad))


# ---------------------------------------------------------------- fast path vs blockwise path


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("variant", ["out", "in"])
@pytest.mark.parametrize("tau", [0.1, 0.005])  # 0.005 takes the max-shifted path in fp32
def test_dense_and_blockwise_agree_in_value_and_gradient(
    dtype: torch.dtype, variant: str, tau: float
) -> None:
    # fp32 logits carry a rounding error of ~1e-7/τ: below τ = 0.1 the bound grows with 1/τ
    tol = 1e-10 if dtype == torch.float64 else 1e-6 * max(1.0, 0.1 / tau)
    f = _features(7, 40, 2, D=16).to(dtype).requires_grad_()
    labels = _labels(7, 40, 4)
    dense = supcon_loss(f, labels, temperature=tau, variant=variant)  # type: ignore[arg-type]
    (g_dense,) = torch.autograd.grad(dense, f)
    for block in (1, 7, 33, 80):
        blocked = supcon_loss(f, labels, temperature=tau, variant=variant, block_size=block)  # type: ignore[arg-type]
        (g_block,) = torch.autograd.grad(blocked, f)
        assert abs(blocked.item() - dense.item()) <= tol * max(1.0, abs(dense.item()))
        assert (g_block - g_dense).abs().max().item() <= tol * max(1.0, g_dense.abs().max().item())


def test_repeated_backward_recomputes_the_consumed_cache() -> None:
    f = _features(2, 20, 2).requires_grad_()
    labels = _labels(2, 20, 3)
    for variant in ("out", "in"):
        loss = supcon_loss(f, labels, variant=variant)  # type: ignore[arg-type]
        (first,) = torch.autograd.grad(loss, f, retain_graph=True)
        (second,) = torch.autograd.grad(loss, f)
        assert torch.allclose(first, second, atol=1e-14)


def test_dense_path_reuses_its_workspace_between_steps() -> None:
    f = _features(4, 16, 2).requires_grad_()
    labels = _labels(4, 16, 3)
    grads, pointers = [], []
    key = ("cpu", torch.float64)
    for _ in range(3):
        loss = supcon_loss(f, labels)
        assert key not in core._WORKSPACE._free  # taken by the forward until its backward
        (grad,) = torch.autograd.grad(loss, f)
        grads.append(grad)
        pointers.append(core._WORKSPACE._free[key].data_ptr())
    assert pointers[0] == pointers[1] == pointers[2]  # the same buffer, step after step
    assert torch.equal(grads[0], grads[1]) and torch.equal(grads[1], grads[2])
    with torch.no_grad():  # no backward will come: nothing is kept from the workspace
        supcon_loss(f, labels)
    assert ("cpu", torch.float64) in core._WORKSPACE._free


def test_auto_mode_switches_to_blocks_above_the_dense_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    f = _features(1, 30, 2).requires_grad_()
    labels = _labels(1, 30, 3)
    dense = supcon_loss(f, labels)
    (g_dense,) = torch.autograd.grad(dense, f)
    seen: list[tuple[int, bool]] = []
    original = core._MaskedLogSumExp.forward

    def spy(ctx, a, c, scale, shift, self_index, ya, yc, block_size, cache, sym):  # type: ignore[no-untyped-def]
        seen.append((block_size, cache))
        return original(ctx, a, c, scale, shift, self_index, ya, yc, block_size, cache, sym)

    monkeypatch.setattr(core._MaskedLogSumExp, "forward", staticmethod(spy))
    monkeypatch.setattr(core, "DENSE_MAX_ELEMENTS", 100)
    monkeypatch.setattr(core, "BLOCK_ELEMENTS", 600)
    blocked = supcon_loss(f, labels)
    (g_block,) = torch.autograd.grad(blocked, f)
    assert seen == [(10, False)]  # 600 elements // 60 contrasts
    assert blocked.item() == pytest.approx(dense.item(), abs=1e-12)
    assert torch.allclose(g_block, g_dense, atol=1e-12)


def test_auto_block_rows_by_device() -> None:
    """A CPU's blocks hold about BLOCK_ELEMENTS logits (its caches); CUDA's 4096 anchor rows,
    the size measured near the matrix-product floor on an H200, within 2**28 logits."""
    cpu, cuda, e = torch.device("cpu"), torch.device("cuda"), core.BLOCK_ELEMENTS
    assert common.auto_block_rows(16384, cpu, e) == e // 16384 == 128
    assert common.auto_block_rows(10**9, cpu, e) == 1
    assert common.auto_block_rows(16384, cuda, e) == common.auto_block_rows(65536, cuda, e) == 4096
    assert common.auto_block_rows(262144, cuda, e) == 1024
    assert common.auto_block_rows(2**30, cuda, e) == 1
    assert common.auto_block_rows(0, cuda, e) == 4096


@pytest.mark.parametrize("shifted", [True, False])
@pytest.mark.parametrize("labelled", [True, False])
@pytest.mark.parametrize("block_size", [None, 2])
def test_gradcheck_masked_logsumexp(shifted: bool, labelled: bool, block_size: int | None) -> None:
    g = torch.Generator().manual_seed(0)
    a = F.normalize(torch.randn(5, 3, generator=g, dtype=torch.float64), dim=1).requires_grad_()
    c = F.normalize(torch.randn(7, 3, generator=g, dtype=torch.float64), dim=1).requires_grad_()
    self_index = torch.tensor([0, 2, 4, 6, 1])
    ya, yc = torch.tensor([0, 1, 0, 1, 2]), torch.tensor([0, 0, 1, 1, 0, 2, 1])
    tau = 0.5 if shifted else 0.0013  # 2/τ > 700: the fp64 max-shifted path

    def fn(a: Tensor, c: Tensor) -> tuple[Tensor, ...]:
        out = masked_logsumexp(
            a,
            c,
            temperature=tau,
            self_index=self_index,
            block_size=block_size,
            anchor_labels=ya if labelled else None,
            contrast_labels=yc if labelled else None,
        )
        if out.positive is None:
            return (out.all,)
        # a row without positives has lse = -inf: gradcheck only the finite entries
        return out.all, torch.where(torch.isfinite(out.positive), out.positive, 0.0)

    assert torch.autograd.gradcheck(fn, (a, c), eps=1e-6, atol=1e-7 if shifted else 1e-4)


@pytest.mark.parametrize("block_size", [None, 2])
def test_gradcheck_symmetric_self_contrast(block_size: int | None) -> None:
    g = torch.Generator().manual_seed(3)
    z = F.normalize(torch.randn(6, 3, generator=g, dtype=torch.float64), dim=1).requires_grad_()

    def fn(z: Tensor) -> Tensor:  # the same tensor as anchors and contrasts
        out = masked_logsumexp(z, z, temperature=0.4, self_index="diagonal", block_size=block_size)
        return out.all

    assert torch.autograd.gradcheck(fn, (z,), eps=1e-6, atol=1e-7)
    # and it equals the general path, fed a copy so the symmetry is not detected
    weights = torch.randn(6, generator=g, dtype=torch.float64)
    (sym,) = torch.autograd.grad((fn(z) * weights).sum(), z)
    other = z.detach().clone().requires_grad_()
    general = masked_logsumexp(z, other, temperature=0.4, self_index=torch.arange(6)).all
    grads = torch.autograd.grad((general * weights).sum(), (z, other))
    assert torch.allclose(sym, grads[0] + grads[1], atol=1e-12)


def test_the_symmetric_backward_is_chosen_by_the_arguments_not_by_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    z = F.normalize(_features(4, 6, 1)[:, 0], dim=1).requires_grad_()  # (6, D)
    calls: list[int] = []
    symmetric_backward = core._backward_sym
    monkeypatch.setattr(core, "_backward_sym", lambda *a: calls.append(1) or symmetric_backward(*a))
    results = {}
    for self_index in ("diagonal", torch.arange(6)):  # the same columns, said two ways
        calls.clear()
        lse = masked_logsumexp(z, z, temperature=0.3, self_index=self_index, norm_bound=1.0)
        (grad,) = torch.autograd.grad(lse.all.sum(), z)
        results[isinstance(self_index, str)] = (lse.all, grad, len(calls))
    # "diagonal" with one tensor in both roles takes the symmetric backward; an index tensor
    # is never compared on the host, so it takes the general one, with the same result
    (lse_d, grad_d, n_d), (lse_t, grad_t, n_t) = results[True], results[False]
    assert (n_d, n_t) == (1, 0)
    assert torch.allclose(lse_d, lse_t, atol=1e-12) and torch.allclose(grad_d, grad_t, atol=1e-12)


@pytest.mark.parametrize("N", [0, 1, 7, 40])
def test_class_ids_number_labels_as_unique_does(N: int) -> None:
    from shared.losses.class_sums import class_ids

    g = torch.Generator().manual_seed(N)
    labels = torch.randint(-3, 1000, (N,), generator=g)
    labels[N // 2 :] = labels[: N - N // 2].clone()  # repeats
    assert torch.equal(class_ids(labels), torch.unique(labels, return_inverse=True)[1])


@pytest.mark.parametrize("same", [True, False])
def test_gradcheck_positive_logit_sums(same: bool) -> None:
    from shared.losses.class_sums import positive_logit_sums

    g = torch.Generator().manual_seed(5)
    c = torch.randn(7, 3, generator=g, dtype=torch.float64, requires_grad=True)
    a = c if same else torch.randn(4, 3, generator=g, dtype=torch.float64, requires_grad=True)
    yc = torch.tensor([0, 2, 2, 1, 0, 2, 3])
    ya = yc if same else torch.tensor([2, 0, 3, 2])
    own_rows = torch.arange(7) if same else torch.tensor([1, 0, 6, 2])

    def fn(*inputs: Tensor) -> Tensor:
        c_, a_ = inputs[0], inputs[0] if same else inputs[1]
        return positive_logit_sums(a_, c_, c_[own_rows], ya, yc, classes=7)[0]

    inputs = (c,) if same else (c, a)
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-8)
    # the dense definition: Σ over same-class contrast rows but the anchor's own
    positive = (ya.unsqueeze(1) == yc.unsqueeze(0)).double()  # (M, K)
    positive[torch.arange(len(ya)), own_rows] = 0.0
    sums, n_pos = positive_logit_sums(a, c, c[own_rows], ya, yc, classes=7)
    assert torch.allclose(sums, ((a @ c.T) * positive).sum(1), atol=1e-12)
    assert torch.equal(n_pos, positive.sum(1).long())


def test_masked_logsumexp_matches_torch_logsumexp() -> None:
    g = torch.Generator().manual_seed(0)
    a, c = torch.randn(6, 4, generator=g), torch.randn(9, 4, generator=g)
    self_index = torch.arange(6)
    out = masked_logsumexp(a, c, temperature=0.7, self_index=self_index)
    logits = a @ c.T / 0.7
    logits[torch.arange(6), self_index] = -math.inf
    assert torch.allclose(out.all, torch.logsumexp(logits, 1), atol=1e-5)


# ---------------------------------------------------------------- invariances


def test_invariances_view_swap_rescaling_permutation_and_inputs_unchanged() -> None:
    f = _features(4, 10, 2)
    labels = _labels(4, 10, 3)
    before = (f.clone(), labels.clone())
    base = supcon_loss(f, labels)
    assert supcon_loss(f.flip(1), labels).item() == pytest.approx(base.item(), abs=1e-12)
    assert supcon_loss(f * 3.7, labels).item() == pytest.approx(base.item(), abs=1e-12)
    perm = torch.randperm(10, generator=torch.Generator().manual_seed(0))
    assert supcon_loss(f[perm], labels[perm]).item() == pytest.approx(base.item(), abs=1e-12)
    relabelled = labels * 10 + 5  # class ids are names, not indices
    assert supcon_loss(f, relabelled).item() == pytest.approx(base.item(), abs=1e-12)
    nt = nt_xent_loss(f[:, 0], f[:, 1])
    assert nt_xent_loss(f[:, 1], f[:, 0]).item() == pytest.approx(nt.item(), abs=1e-12)
    assert torch.equal(f, before[0]) and torch.equal(labels, before[1])


def test_per_anchor_reduction_shapes() -> None:
    f = _features(0, 4, 3)
    assert supcon_loss(f, reduction="none").shape == (4, 3)
    assert supcon_loss(f, contrast_mode="one", reduction="none").shape == (4,)
    assert nt_xent_loss(f[:, 0], f[:, 1], reduction="none").shape == (4, 2)
    total = supcon_loss(f, reduction="sum")
    assert total.item() == pytest.approx(supcon_loss(f).item() * 12, rel=1e-12)


# ---------------------------------------------------------------- precision


@pytest.mark.parametrize("amp_dtype", [torch.bfloat16, torch.float16])
def test_low_precision_autocast_stays_finite(amp_dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 16, generator=g)
    layer = torch.nn.Linear(16, 16)
    labels = torch.randint(0, 4, (32,), generator=g)
    with torch.autocast("cpu", dtype=amp_dtype):
        z = layer(x)  # low-precision activations, as in a bf16 training loop
        losses = [
            supcon_loss(z.view(32, 2, 16), labels, temperature=0.05),
            supcon_loss(z.view(32, 2, 16), labels, temperature=0.05, variant="in"),
            nt_xent_loss(z[:32], z[32:], temperature=0.05),
            conditional_contrastive_loss(z[:32], z[32:], labels, temperature=0.05),
            conditional_contrastive_loss(
                z[:32], z[32:], labels, temperature=0.05, positives="proxy"
            ),
            data_to_data_cross_entropy_loss(z[:32], z[32:], labels, temperature=0.05),
            data_to_data_cross_entropy_loss(z[:32], z[32:], labels, temperature=0.05, form="paper"),
            graphcl_loss(z[:32], z[32:], temperature=0.05),
        ]
    for loss in losses:
        assert loss.dtype == torch.float32 and torch.isfinite(loss)
        loss.backward(retain_graph=True)
        assert layer.weight.grad is not None and torch.isfinite(layer.weight.grad).all()


def test_tiny_temperature_is_exact_in_float32() -> None:
    f = _features(5, 8, 2).float()
    labels = _labels(5, 8, 2)
    for variant in ("out", "in"):
        got = supcon_loss(f, labels, temperature=0.002, variant=variant)  # type: ignore[arg-type]
        assert torch.isfinite(got)
        assert got.item() == pytest.approx(
            supcon_oracle(f.double(), labels, 0.002, variant, "all"), rel=1e-5
        )


# ---------------------------------------------------------------- bad input


def test_bad_input_raises_value_error_naming_the_problem() -> None:
    f = torch.randn(4, 2, 8)
    with pytest.raises(ValueError, match="features must have 3 dims"):
        supcon_loss(f[:, 0])
    with pytest.raises(ValueError, match=r"labels must have shape \(4,\)"):
        supcon_loss(f, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="labels must be integers"):
        supcon_loss(f, torch.zeros(4))
    bad = f.clone()
    bad[1, 0, 3] = float("nan")
    # values are not read (a host wait): a NaN input makes a NaN loss, which the loop checks
    assert torch.isnan(supcon_loss(bad))
    for tau in (0.0, -0.1, float("nan")):
        with pytest.raises(ValueError, match="temperature must be"):
            supcon_loss(f, temperature=tau)
        with pytest.raises(ValueError, match="temperature must be"):
            NTXentLoss(temperature=tau)
    with pytest.raises(ValueError, match="variant must be one of"):
        supcon_loss(f, variant="both")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="z1 and z2 must have the same shape"):
        nt_xent_loss(f[:, 0], f[:3, 1])
    with pytest.raises(ValueError, match="at least 2 samples"):
        graphcl_loss(f[:1, 0], f[:1, 1])
    for call in (
        lambda: supcon_loss(f, gather="yes"),  # type: ignore[arg-type]
        lambda: nt_xent_loss(f[:, 0], f[:, 1], gather=1),  # type: ignore[arg-type]
        lambda: graphcl_loss(f[:, 0], f[:, 1], gather="equal_sizes"),  # type: ignore[arg-type]
        lambda: conditional_contrastive_loss(f[:, 0], f[:, 1], torch.arange(4), gather=None),  # type: ignore[arg-type]
        lambda: NTXentLoss(gather="all"),  # type: ignore[arg-type]
    ):
        with pytest.raises(ValueError, match="gather must be a bool or 'equal'"):
            call()
    with pytest.raises(ValueError, match="self_index must be a tensor, None or 'diagonal'"):
        masked_logsumexp(f[:, 0], f[:, 1], temperature=0.5, self_index="diag")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"'diagonal' \(M = K\), got 'diagonal' with M = 3"):
        masked_logsumexp(f[:3, 0], f[:, 1], temperature=0.5, self_index="diagonal")
    with pytest.raises(ValueError, match="norm_bound must be a number >= 0 or None"):
        masked_logsumexp(f[:, 0], f[:, 1], temperature=0.5, norm_bound=-1.0)
    with pytest.raises(ValueError, match="embeddings must have 2 dims"):
        conditional_contrastive_loss(f, f, torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="block_size must be a positive int"):
        supcon_loss(f, block_size=0)
    with pytest.raises(ValueError, match="margin must be >= 0"):
        triplet_loss(f[:, 0], f[:, 1], f[:, 0], margin=-1.0)


def test_modules_delegate_to_the_functions() -> None:
    f = _features(2, 6, 2)
    labels = _labels(2, 6, 2)
    z1, z2 = f[:, 0], f[:, 1]
    assert SupConLoss(0.2)(f, labels).item() == supcon_loss(f, labels, temperature=0.2).item()
    assert NTXentLoss(0.3)(z1, z2).item() == nt_xent_loss(z1, z2, temperature=0.3).item()
    assert GraphCLLoss(0.2)(z1, z2).item() == graphcl_loss(z1, z2, temperature=0.2).item()
    assert NPairsLoss(0.5)(z1, z2).item() == npairs_loss(z1, z2, temperature=0.5).item()
    assert TripletLoss(0.1)(z1, z2, z1.flip(0)).item() == (
        triplet_loss(z1, z2, z1.flip(0), margin=0.1).item()
    )
    two_c = ConditionalContrastiveLoss(0.5)(z1, z2, labels).item()
    assert two_c == conditional_contrastive_loss(z1, z2, labels, temperature=0.5).item()
    d2d_ce = DataToDataCrossEntropyLoss(0.3)(z1, z2, labels).item()
    assert d2d_ce == data_to_data_cross_entropy_loss(z1, z2, labels, temperature=0.3).item()


def test_supcon_rows_hold_each_anchors_positives() -> None:
    z = F.normalize(_features(0, 5, 2), dim=-1)  # (5, 2, D)
    labels = torch.tensor([3, 1, 3, 3, 1])
    rows = _supcon_rows(z, labels, "all", gather=False)
    assert rows.anchors is rows.contrasts  # (10, D): the core may use the symmetry
    assert rows.self_index == "diagonal"  # own column i for anchor i, said without a tensor
    same = rows.ya.unsqueeze(1) == rows.yc.unsqueeze(0)  # (10, 10)
    same.fill_diagonal_(False)
    assert torch.equal(rows.n_pos, same.sum(1))
    dense = (rows.anchors @ rows.contrasts.T * same).sum(1)  # (10,)
    assert torch.allclose(rows.positive_sum, dense, atol=1e-12)
    one = _supcon_rows(z, None, "one", gather=False)  # SimCLR, view 0 anchors
    assert torch.equal(one.anchors, z[:, 0]) and torch.equal(one.self_index, torch.arange(5) * 2)
    assert torch.equal(one.n_pos, torch.ones(5, dtype=torch.long))
    assert torch.allclose(one.positive_sum, (z[:, 0] * z[:, 1]).sum(1), atol=1e-12)


# ---------------------------------------------------------------- empty batches

# every loss on an empty batch x: (0, V=3, D); (loss(x, labels, reduction), shape of "none")
EmptyCase = tuple[Callable[[Tensor, Tensor, str], Tensor], tuple[int, ...] | None]
EMPTY_CASES: dict[str, EmptyCase] = {
    **{
        f"supcon_{variant}_{mode}_{'labelled' if labelled else 'simclr'}": (
            lambda x, y, r, variant=variant, mode=mode, labelled=labelled: supcon_loss(
                x, y if labelled else None, variant=variant, contrast_mode=mode, reduction=r
            ),
            (0, 3) if mode == "all" else (0,),
        )
        for variant in ("out", "in")
        for mode in ("all", "one")
        for labelled in (False, True)
    },
    "supcon_blockwise": (lambda x, y, r: supcon_loss(x, y, block_size=2, reduction=r), (0, 3)),
    "nt_xent": (lambda x, y, r: nt_xent_loss(x[:, 0], x[:, 1], reduction=r), (0, 2)),
    "graphcl": (lambda x, y, r: graphcl_loss(x[:, 0], x[:, 1], reduction=r), (0,)),
    "npairs": (lambda x, y, r: npairs_loss(x[:, 0], x[:, 1], reduction=r), (0,)),
    "triplet": (lambda x, y, r: triplet_loss(x[:, 0], x[:, 1], x[:, 2], reduction=r), (0,)),
    "two_c": (
        lambda x, y, r: conditional_contrastive_loss(x[:, 0], x[:, 1], y, reduction=r),
        (0,),
    ),
    "two_c_proxy": (
        lambda x, y, r: conditional_contrastive_loss(
            x[:, 0], x[:, 1], y, positives="proxy", reduction=r
        ),
        (0,),
    ),
    **{
        f"d2d_ce_{form}": (
            lambda x, y, r, form=form: data_to_data_cross_entropy_loss(
                x[:, 0], x[:, 1], y, form=form, reduction=r
            ),
            (0,),
        )
        for form in ("studiogan", "paper")
    },
    "d2d_ce_blockwise": (
        lambda x, y, r: data_to_data_cross_entropy_loss(
            x[:, 0], x[:, 1], y, block_size=2, reduction=r
        ),
        (0,),
    ),
    **{
        f"generalized_{prior}": (
            lambda x, y, r, prior=prior: generalized_contrastive_loss(
                x[:, 0], x[:, 1], prior=prior, generator=torch.Generator().manual_seed(0)
            ),
            None,
        )
        for prior in ("uniform_hypersphere", "normal", "uniform_hypercube", "decoupled_nt_xent")
    },
    "sliced_wasserstein": (lambda x, y, r: sliced_wasserstein_distance(x[:, 0], x[:, 1]), None),
}
EMPTY_PARAMS = [
    (name, reduction)
    for name, (_, none_shape) in sorted(EMPTY_CASES.items())
    for reduction in (("mean", "sum", "none") if none_shape is not None else ("mean",))
]


@pytest.mark.parametrize(("name", "reduction"), EMPTY_PARAMS)
def test_empty_batch_gives_zero_loss_and_zero_gradient(name: str, reduction: str) -> None:
    """The rule of shared.losses.core: no rows, a zero loss that still runs backward."""
    loss_fn, none_shape = EMPTY_CASES[name]
    torch.manual_seed(0)
    layer = nn.Linear(4, 3 * 5).double()
    x = layer(torch.empty(0, 4, dtype=torch.float64)).view(0, 3, 5)  # (0, V, D)
    loss = loss_fn(x, torch.empty(0, dtype=torch.long), reduction)
    if reduction == "none":
        assert loss.shape == none_shape
    else:
        assert loss.shape == () and loss.item() == 0.0
    assert loss.grad_fn is not None  # attached to the graph: every DDP rank can run backward
    loss.sum().backward()
    for param in layer.parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all()
        assert torch.equal(param.grad, torch.zeros_like(param.grad))


@pytest.mark.parametrize("labelled", [False, True])
@pytest.mark.parametrize("block_size", [None, 1])
def test_masked_logsumexp_with_no_anchors_or_no_contrasts(
    labelled: bool, block_size: int | None
) -> None:
    rows = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    rows.requires_grad_()
    empty = torch.empty(0, 4, dtype=torch.float64, requires_grad=True)

    def labels(n: int) -> Tensor | None:
        return torch.zeros(n, dtype=torch.long) if labelled else None

    # M = 0 anchors: empty results, and a backward that gives zero gradients
    out = masked_logsumexp(
        empty,
        rows,
        temperature=0.5,
        anchor_labels=labels(0),
        contrast_labels=labels(3),
        block_size=block_size,
    )
    assert out.all.shape == (0,)
    assert (out.positive is not None and out.positive.shape == (0,)) == labelled
    grads = torch.autograd.grad(out.all.sum(), (empty, rows))
    assert grads[0].shape == (0, 4) and torch.equal(grads[1], torch.zeros_like(rows))
    # K = 0 contrasts: every sum is over nothing, log 0 = -inf, and no gradient
    out = masked_logsumexp(
        rows,
        empty,
        temperature=0.5,
        anchor_labels=labels(3),
        contrast_labels=labels(0),
        block_size=block_size,
    )
    minus_inf = torch.full((3,), -math.inf, dtype=torch.float64)
    assert torch.equal(out.all, minus_inf)
    assert out.positive is None or torch.equal(out.positive, minus_inf)
    (grad,) = torch.autograd.grad(out.all.sum(), rows)
    assert torch.equal(grad, torch.zeros_like(rows))
    # no rows contrasted with themselves (the symmetric path)
    out = masked_logsumexp(
        empty, empty, temperature=0.5, self_index=torch.arange(0), block_size=block_size
    )
    assert out.all.shape == (0,)
    (grad,) = torch.autograd.grad(out.all.sum(), empty)
    assert grad.shape == (0, 4)


# ------------------------------------------------- a rank without rows (2 gloo processes)

EMPTY_RANK_ROWS = 4
GATHER_LOSSES: dict[str, Callable[[Tensor, Tensor, bool], Tensor]] = {
    "nt_xent": lambda x, y, gather: nt_xent_loss(x[:, 0], x[:, 1], gather=gather),
    "supcon_out": lambda x, y, gather: supcon_loss(x, y, gather=gather),
    "supcon_in_blocked": lambda x, y, gather: supcon_loss(
        x, y, variant="in", gather=gather, block_size=3
    ),
    "supcon_one_simclr": lambda x, y, gather: supcon_loss(x, contrast_mode="one", gather=gather),
    "two_c": lambda x, y, gather: conditional_contrastive_loss(x[:, 0], x[:, 1], y, gather=gather),
    "two_c_proxy": lambda x, y, gather: conditional_contrastive_loss(
        x[:, 0], x[:, 1], y, positives="proxy", gather=gather
    ),
    "d2d_ce": lambda x, y, gather: data_to_data_cross_entropy_loss(
        x[:, 0], x[:, 1], y, gather=gather
    ),
}


def _empty_rank_batch() -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(EMPTY_RANK_ROWS, 2, 3, generator=g, dtype=torch.float64)  # (N, V, D)
    return x, torch.tensor([0, 1, 0, 1])


def _empty_rank_worker(rank: int, port: int, queue: Any) -> None:
    """Rank 0 holds the whole batch, rank 1 none; both run every gather and its backward."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=60))
    try:
        x, labels = _empty_rank_batch()
        rows = slice(0, EMPTY_RANK_ROWS) if rank == 0 else slice(0, 0)
        results = {}
        for name, loss_fn in GATHER_LOSSES.items():
            x_leaf = x[rows].clone().requires_grad_()
            loss = loss_fn(x_leaf, labels[rows], True)
            loss.backward()
            assert x_leaf.grad is not None
            results[name] = (loss.detach().clone(), x_leaf.grad.clone())
        buffer = io.BytesIO()  # plain bytes: shared-memory tensors would die with the process
        torch.save((rank, results), buffer)
        queue.put(buffer.getvalue())
    finally:
        dist.destroy_process_group()
    exit_without_teardown(queue)


def test_a_rank_without_rows_takes_part_in_the_gather() -> None:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    procs = [ctx.Process(target=_empty_rank_worker, args=(r, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    per_rank = {}
    for _ in procs:
        rank, results = torch.load(io.BytesIO(queue.get(timeout=120)), weights_only=True)
        per_rank[rank] = results
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    x, labels = _empty_rank_batch()
    for name, loss_fn in GATHER_LOSSES.items():
        x_leaf = x.clone().requires_grad_()
        expected = loss_fn(x_leaf, labels, False)
        (expected_grad,) = torch.autograd.grad(expected, x_leaf)
        loss, grad = per_rank[0][name]  # the whole batch, plus rank 1's zero loss
        assert loss.item() == pytest.approx(expected.item(), abs=1e-12), name
        assert torch.allclose(grad, expected_grad, atol=1e-12), name
        loss, grad = per_rank[1][name]
        assert loss.item() == 0.0 and grad.shape == (0, 2, 3), name


# ---------------------------------------------------------------- module wrappers

# module, function, inputs, non-default value of every keyword-only option of the function
# ("generator" is the module's seed: the function gets a generator seeded with it)
WRAPPERS: list[tuple[type[nn.Module], Callable[..., Tensor], str, dict[str, Any]]] = [
    (SupConLoss, supcon_loss, "features_labels", {
        "temperature": 0.3, "variant": "in", "contrast_mode": "one", "gather": True,
        "block_size": 2, "reduction": "none",
    }),
    (NTXentLoss, nt_xent_loss, "pair", {
        "temperature": 0.3, "gather": True, "block_size": 2, "reduction": "none",
    }),
    (GraphCLLoss, graphcl_loss, "pair", {
        "temperature": 0.3, "gather": True, "block_size": 2, "reduction": "sum",
    }),
    (NPairsLoss, npairs_loss, "pair", {
        "temperature": 0.3, "normalize": False, "block_size": 2, "reduction": "none",
    }),
    (TripletLoss, triplet_loss, "triplet", {
        "margin": 0.5, "normalize": False, "reduction": "none",
    }),
    (ConditionalContrastiveLoss, conditional_contrastive_loss, "pair_labels", {
        "temperature": 0.3, "positives": "proxy", "gather": True, "block_size": 2,
        "reduction": "none",
    }),
    (DataToDataCrossEntropyLoss, data_to_data_cross_entropy_loss, "pair_labels", {
        "temperature": 0.3, "margin_pos": 0.7, "margin_neg": 0.1, "form": "paper",
        "gather": True, "block_size": 2, "reduction": "none",
    }),
    (GeneralizedContrastiveLoss, generalized_contrastive_loss, "pair", {
        "prior": "normal", "lam": 0.5, "temperature": 0.3, "scale": 2.0, "generator": 7,
    }),
]  # fmt: skip


@pytest.mark.parametrize(("module_cls", "function", "inputs", "settings"), WRAPPERS)
def test_module_wrappers_expose_every_option_of_their_function(
    module_cls: type[nn.Module],
    function: Callable[..., Tensor],
    inputs: str,
    settings: dict[str, Any],
) -> None:
    options = {
        name: param.default
        for name, param in inspect.signature(function).parameters.items()
        if param.kind is inspect.Parameter.KEYWORD_ONLY
    }
    assert set(settings) == set(options)  # this case sets every option ...
    assert all(settings[name] != default for name, default in options.items())  # ... changed
    module_settings = {("seed" if k == "generator" else k): v for k, v in settings.items()}
    assert set(module_settings) <= set(inspect.signature(module_cls).parameters)
    f = _features(2, 6, 3)
    labels = _labels(2, 6, 2)
    args = {
        "features_labels": (f, labels),
        "pair": (f[:, 0], f[:, 1]),
        "pair_labels": (f[:, 0], f[:, 1], labels),
        "triplet": (f[:, 0], f[:, 1], f[:, 2]),
    }[inputs]
    if "generator" in settings:
        settings = {**settings, "generator": torch.Generator().manual_seed(settings["generator"])}
    got = module_cls(**module_settings)(*args)
    assert torch.equal(got, function(*args, **settings))


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (lambda: SupConLoss(reduction="avg"), "reduction must be one of"),
        (lambda: SupConLoss(block_size=0), "block_size must be a positive int or None, got 0"),
        (lambda: NTXentLoss(reduction="avg"), "reduction must be one of"),
        (lambda: NTXentLoss(block_size=-2), "block_size must be a positive int or None, got -2"),
        (lambda: GraphCLLoss(reduction="avg"), "reduction must be one of"),
        (lambda: NPairsLoss(block_size=0), "block_size must be a positive int or None, got 0"),
        (lambda: NPairsLoss(reduction="avg"), "reduction must be one of"),
        (lambda: TripletLoss(margin=-0.1), "margin must be >= 0, got -0.1"),
        (lambda: TripletLoss(margin=float("nan")), "margin must be >= 0, got nan"),
        (lambda: TripletLoss(reduction="avg"), "reduction must be one of"),
        (lambda: ConditionalContrastiveLoss(reduction="avg"), "reduction must be one of"),
        (lambda: ConditionalContrastiveLoss(block_size=0), "block_size must be a positive int"),
        (lambda: ConditionalContrastiveLoss(positives="same"), "positives must be one of"),
        (lambda: DataToDataCrossEntropyLoss(reduction="avg"), "reduction must be one of"),
        (lambda: DataToDataCrossEntropyLoss(block_size=0), "block_size must be a positive int"),
        (lambda: DataToDataCrossEntropyLoss(margin_neg=math.nan), "margin_neg must be a finite"),
        (lambda: DataToDataCrossEntropyLoss(temperature=0.0), "temperature must be"),
        (lambda: GeneralizedContrastiveLoss(scale=float("nan")), "scale must be a finite number"),
        (lambda: GeneralizedContrastiveLoss(seed=1.5), "seed must be an int or None, got 1.5"),
    ],
)
def test_module_wrappers_check_their_settings_at_construction(
    factory: Callable[[], nn.Module], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        factory()
