"""Executable specification of ReACGAN's D2D-CE loss and of the 2C loss with proxy-only positives.

Oracles are per-anchor Python loops over the formulas, float64: ℓ_i = p_i + log(e^{−p_i} +
Σ_{y_k≠y_i} e^{n_ik − M_i}), p_i = relu((m_p − f_i·v_i)/τ), n_ik = relu((f_i·f_k − m_n)/τ), M_i
StudioGAN's detached max_{k≠i} (f_i·f_k − m_n)/τ or 0 (the paper's form). StudioGAN's own class
is run beside ours by ``benchmarks/studiogan_losses.py`` (it needs StudioGAN's code).
"""

from __future__ import annotations

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
from torch import Tensor

import shared.losses.core as core
import shared.losses.d2d_ce as d2d_ce
from shared.losses import (
    ConditionalContrastiveLoss,
    DataToDataCrossEntropyLoss,
    conditional_contrastive_loss,
    data_to_data_cross_entropy_loss,
)
from shared.losses.d2d_ce import negative_logsumexp
from tests.processes import exit_without_teardown

FORMS: tuple[Any, ...] = ("studiogan", "paper")


def d2d_oracle(
    emb: Tensor, proxies: Tensor, labels: Tensor, tau: float, m_p: float, m_n: float, form: str
) -> list[float]:
    """Per-anchor D2D-CE, straight from the formula."""
    f = F.normalize(emb.double(), dim=1).tolist()
    v = F.normalize(proxies.double(), dim=1).tolist()
    y = labels.tolist()

    def dot(a: list[float], b: list[float]) -> float:
        return sum(x * z for x, z in zip(a, b, strict=True))

    out = []
    for i in range(len(y)):
        pos = max(0.0, (m_p - dot(f[i], v[i])) / tau)
        others = [k for k in range(len(y)) if k != i]
        shift = 0.0
        if form == "studiogan" and others:
            shift = max((dot(f[i], f[k]) - m_n) / tau for k in others)
        negatives = sum(
            math.exp(max(0.0, (dot(f[i], f[k]) - m_n) / tau) - shift)
            for k in others
            if y[k] != y[i]
        )
        out.append(pos + math.log(math.exp(-pos) + negatives))
    return out


def d2d_torch_reference(
    emb: Tensor, proxies: Tensor, labels: Tensor, tau: float, m_p: float, m_n: float, form: str
) -> Tensor:
    """The same, dense, in plain autograd ops (the max detached): the gradient to compare."""
    f, v = F.normalize(emb, dim=1), F.normalize(proxies, dim=1)
    n = len(labels)
    x = (f @ f.T - m_n) / tau  # (N, N)
    off_diagonal = ~torch.eye(n, dtype=torch.bool)
    shift = x.masked_fill(~off_diagonal, -math.inf).amax(1).detach()  # (N,)
    if form == "paper":
        shift = torch.zeros_like(shift)
    negative = labels[:, None] != labels[None, :]  # (N, N)
    pos = F.relu((m_p - (f * v).sum(1)) / tau)  # (N,)
    terms = torch.exp(F.relu(x) - shift[:, None]) * negative  # (N, N)
    return pos + torch.log(torch.exp(-pos) + terms.sum(1))  # (N,)


def proxy_2c_oracle(emb: Tensor, proxies: Tensor, tau: float) -> list[float]:
    """2C with only the proxy in the numerator: −log(e^{s(l_i,e_i)/τ} / (that + Σ_{k≠i} ...))."""
    l_ = F.normalize(emb.double(), dim=1)
    e = F.normalize(proxies.double(), dim=1)
    out = []
    for i in range(len(l_)):
        proxy = math.exp(float(l_[i] @ e[i]) / tau)
        others = sum(math.exp(float(l_[i] @ l_[k]) / tau) for k in range(len(l_)) if k != i)
        out.append(-math.log(proxy / (proxy + others)))
    return out


def _batch(seed: int, n: int, classes: int, d: int = 5) -> tuple[Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(n, d, generator=g, dtype=torch.float64)
    table = torch.randn(classes, d, generator=g, dtype=torch.float64)
    labels = torch.randint(0, classes, (n,), generator=g)
    return emb, table[labels], labels


# ---------------------------------------------------------------- oracles


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("n", "classes"), [(1, 1), (2, 2), (6, 1), (7, 3), (9, 9)])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("block_size", [None, 1, 3])
def test_d2d_ce_matches_loop_oracle(
    seed: int, n: int, classes: int, form: Any, block_size: int | None
) -> None:
    emb, proxies, labels = _batch(seed, n, classes)
    for tau, m_p, m_n in ((0.5, 0.98, None), (0.1, 0.9, None), (1.0, 0.5, -0.3)):
        per_anchor = data_to_data_cross_entropy_loss(
            emb,
            proxies,
            labels,
            temperature=tau,
            margin_pos=m_p,
            margin_neg=m_n,
            form=form,
            block_size=block_size,
            reduction="none",
        )
        assert per_anchor.dtype == torch.float64 and per_anchor.shape == (n,)
        neg_margin = 1.0 - m_p if m_n is None else m_n
        expected = d2d_oracle(emb, proxies, labels, tau, m_p, neg_margin, form)
        assert per_anchor.tolist() == pytest.approx(expected, abs=1e-12)
        mean = data_to_data_cross_entropy_loss(
            emb, proxies, labels, temperature=tau, margin_pos=m_p, margin_neg=m_n, form=form
        )
        assert mean.item() == pytest.approx(sum(expected) / n, abs=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("block_size", [None, 2])
def test_proxy_only_2c_matches_loop_oracle(seed: int, block_size: int | None) -> None:
    emb, proxies, labels = _batch(seed, 8, 3)
    for tau in (1.0, 0.1):
        got = conditional_contrastive_loss(
            emb,
            proxies,
            labels,
            temperature=tau,
            positives="proxy",
            block_size=block_size,
            reduction="none",
        )
        assert got.tolist() == pytest.approx(proxy_2c_oracle(emb, proxies, tau), abs=1e-10)
    # the labels play no part: a relabelled batch gives the same loss
    relabelled = conditional_contrastive_loss(emb, proxies, labels.flip(0), positives="proxy")
    assert relabelled.item() == pytest.approx(
        sum(proxy_2c_oracle(emb, proxies, 1.0)) / 8, abs=1e-10
    )


def test_d2d_ce_on_hand_made_vectors() -> None:
    # two orthogonal samples of two classes, each on its own proxy: p = 0, n_12 = relu(−m_n/τ) = 0
    emb = torch.eye(2, dtype=torch.float64)
    labels = torch.tensor([0, 1])
    paper = data_to_data_cross_entropy_loss(emb, emb, labels, form="paper")
    assert paper.item() == pytest.approx(math.log(2), abs=1e-15)  # log(e^0 + e^0)
    # StudioGAN subtracts M = (0 − 0.02)/0.5 = −0.04 from the negative only
    studiogan = data_to_data_cross_entropy_loss(emb, emb, labels)
    assert studiogan.item() == pytest.approx(math.log(1 + math.exp(0.04)), abs=1e-15)


def test_all_distinct_labels_paper_form_is_a_cross_entropy() -> None:
    emb, proxies, _ = _batch(3, 6, 6)
    labels = torch.arange(6)  # every other sample is a negative
    tau, m_p, m_n = 0.3, 0.9, 0.1
    f, v = F.normalize(emb, dim=1), F.normalize(proxies, dim=1)
    positive = -F.relu((m_p - (f * v).sum(1)) / tau)  # (N,) the target logit
    negatives = F.relu((f @ f.T - m_n) / tau)  # (N, N)
    negatives = negatives[~torch.eye(6, dtype=torch.bool)].view(6, 5)
    logits = torch.cat([positive[:, None], negatives], dim=1)  # (N, 1 + N − 1)
    expected = F.cross_entropy(logits, torch.zeros(6, dtype=torch.long))
    got = data_to_data_cross_entropy_loss(
        emb, proxies, labels, temperature=tau, margin_pos=m_p, margin_neg=m_n, form="paper"
    )
    assert got.item() == pytest.approx(expected.item(), abs=1e-12)


@pytest.mark.parametrize("form", FORMS)
def test_no_negatives_gives_zero_loss_and_zero_gradient(form: Any) -> None:
    for n in (1, 5):  # one sample; five of one class
        emb, proxies, _ = _batch(4, n, 1)
        emb.requires_grad_()
        proxies.requires_grad_()
        labels = torch.zeros(n, dtype=torch.long)
        loss = data_to_data_cross_entropy_loss(emb, proxies, labels, form=form)
        assert loss.item() == 0.0  # p + log e^{−p}: the proxy only pulls against negatives
        grads = torch.autograd.grad(loss, (emb, proxies))
        assert all(torch.isfinite(g).all() and g.abs().max() <= 1e-15 for g in grads)
        per_anchor = data_to_data_cross_entropy_loss(
            emb, proxies, labels, form=form, reduction="none"
        )
        assert per_anchor.shape == (n,) and torch.equal(per_anchor, torch.zeros(n).double())
    one = conditional_contrastive_loss(emb[:1], proxies[:1], labels[:1], positives="proxy")
    assert one.item() == 0.0  # the proxy is its whole denominator


# ---------------------------------------------------------------- gradients and paths


@pytest.mark.parametrize("block_size", [None, 2])
def test_gradcheck_negative_logsumexp(block_size: int | None) -> None:
    g = torch.Generator().manual_seed(0)
    a = F.normalize(torch.randn(5, 3, generator=g, dtype=torch.float64), dim=1).requires_grad_()
    c = F.normalize(torch.randn(7, 3, generator=g, dtype=torch.float64), dim=1).requires_grad_()
    own = torch.tensor([0, 2, 4, 6, 1])
    yc = torch.tensor([0, 0, 1, 1, 0, 2, 1])
    ya = yc[own]

    def fn(a: Tensor, c: Tensor) -> Tensor:
        out = negative_logsumexp(
            a, c, own, ya, yc, temperature=0.4, margin=-0.2, block_size=block_size
        )
        return out.lse  # every anchor here has negatives: finite

    assert torch.autograd.gradcheck(fn, (a, c), eps=1e-6, atol=1e-8)

    def same(z: Tensor) -> Tensor:  # one tensor as anchors and contrasts
        return negative_logsumexp(
            z, z, torch.arange(7), yc, yc, temperature=0.4, margin=-0.2, block_size=block_size
        ).lse

    assert torch.autograd.gradcheck(same, (c,), eps=1e-6, atol=1e-8)


@pytest.mark.parametrize("block_size", [None, 2])
def test_gradcheck_paper_form(block_size: int | None) -> None:
    emb, proxies, labels = _batch(5, 6, 3, d=4)
    emb.requires_grad_()
    proxies.requires_grad_()

    def fn(e: Tensor, p: Tensor) -> Tensor:
        return data_to_data_cross_entropy_loss(
            e, p, labels, margin_neg=-0.3, form="paper", block_size=block_size, reduction="none"
        )

    assert torch.autograd.gradcheck(fn, (emb, proxies), eps=1e-6, atol=1e-8)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("block_size", [None, 3])
def test_gradient_equals_the_autograd_reference(form: Any, block_size: int | None) -> None:
    """StudioGAN's max is detached: its gradient is not the value's, so compare with autograd."""
    emb, proxies, labels = _batch(6, 10, 3, d=6)
    weights = torch.randn(10, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    grads = []
    for ours in (True, False):
        e, p = emb.clone().requires_grad_(), proxies.clone().requires_grad_()
        if ours:
            per_anchor = data_to_data_cross_entropy_loss(
                e, p, labels, form=form, block_size=block_size, reduction="none"
            )
        else:
            per_anchor = d2d_torch_reference(e, p, labels, 0.5, 0.98, 0.02, form)
        grads.append(torch.autograd.grad((per_anchor * weights).sum(), (e, p)))
    for got, expected in zip(*grads, strict=True):
        assert torch.allclose(got, expected, atol=1e-13)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("tau", [0.5, 0.01])
def test_blockwise_equals_dense(dtype: torch.dtype, form: Any, tau: float) -> None:
    tol = 1e-11 if dtype == torch.float64 else 2e-6 / tau
    emb, proxies, labels = _batch(7, 40, 4, d=16)
    emb, proxies = emb.to(dtype).requires_grad_(), proxies.to(dtype)
    dense = data_to_data_cross_entropy_loss(emb, proxies, labels, temperature=tau, form=form)
    (g_dense,) = torch.autograd.grad(dense, emb)
    assert torch.isfinite(dense) and dense.dtype == dtype
    for block in (1, 7, 33, 80):
        blocked = data_to_data_cross_entropy_loss(
            emb, proxies, labels, temperature=tau, form=form, block_size=block
        )
        (g_block,) = torch.autograd.grad(blocked, emb)
        assert abs(blocked.item() - dense.item()) <= tol * max(1.0, abs(dense.item()))
        assert (g_block - g_dense).abs().max().item() <= tol * max(1.0, g_dense.abs().max().item())


def test_auto_mode_switches_to_blocks_above_the_dense_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    emb, proxies, labels = _batch(1, 30, 3)
    emb.requires_grad_()
    dense = data_to_data_cross_entropy_loss(emb, proxies, labels)
    (g_dense,) = torch.autograd.grad(dense, emb)
    monkeypatch.setattr(core, "DENSE_MAX_ELEMENTS", 100)  # 30 × 30 is above it
    monkeypatch.setattr(core, "BLOCK_ELEMENTS", 300)  # blocks of 10 rows
    seen: list[int] = []
    original = d2d_ce._block

    def spy(*args: Any) -> Any:
        seen.append(args[-1].stop - args[-1].start)  # rows of the block
        return original(*args)

    monkeypatch.setattr(d2d_ce, "_block", spy)
    blocked = data_to_data_cross_entropy_loss(emb, proxies, labels)
    (g_block,) = torch.autograd.grad(blocked, emb)
    assert seen == [10] * 6  # 3 blocks forward, recomputed in backward
    assert blocked.item() == pytest.approx(dense.item(), abs=1e-12)
    assert torch.allclose(g_block, g_dense, atol=1e-12)


def test_small_temperature_in_float32_is_exact() -> None:
    emb, proxies, labels = _batch(8, 12, 3)
    for form in FORMS:
        got = data_to_data_cross_entropy_loss(
            emb.float(), proxies.float(), labels, temperature=0.002, form=form
        )
        expected = sum(d2d_oracle(emb, proxies, labels, 0.002, 0.98, 0.02, form)) / 12
        assert got.dtype == torch.float32 and torch.isfinite(got)
        assert got.item() == pytest.approx(expected, rel=1e-4)


def test_autocast_computes_in_float32() -> None:
    g = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(8, 16)
    x = torch.randn(12, 8, generator=g)
    labels = torch.randint(0, 3, (12,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z = layer(x)  # bf16
        loss = data_to_data_cross_entropy_loss(z[:, :8], z[:, 8:], labels, temperature=0.1)
    assert z.dtype == torch.bfloat16 and loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    assert layer.weight.grad is not None and torch.isfinite(layer.weight.grad).all()


# ---------------------------------------------------------------- settings and modules


def test_reduction_and_module_equal_the_function() -> None:
    emb, proxies, labels = _batch(2, 7, 3)
    per_anchor = data_to_data_cross_entropy_loss(emb, proxies, labels, reduction="none")
    total = data_to_data_cross_entropy_loss(emb, proxies, labels, reduction="sum")
    assert total.item() == pytest.approx(per_anchor.sum().item(), abs=1e-13)
    settings: dict[str, Any] = {
        "temperature": 0.2, "margin_pos": 0.7, "margin_neg": 0.1, "form": "paper",
        "block_size": 2, "reduction": "none",
    }  # fmt: skip
    module = DataToDataCrossEntropyLoss(**settings)
    assert torch.equal(
        module(emb, proxies, labels),
        data_to_data_cross_entropy_loss(emb, proxies, labels, **settings),
    )
    two_c = ConditionalContrastiveLoss(0.3, positives="proxy")(emb, proxies, labels)
    assert torch.equal(
        two_c,
        conditional_contrastive_loss(emb, proxies, labels, temperature=0.3, positives="proxy"),
    )
    assert DataToDataCrossEntropyLoss().temperature == 0.5  # StudioGAN's ReACGAN CIFAR-10 config
    assert DataToDataCrossEntropyLoss().margin_pos == 0.98


def test_bad_input_raises_value_error_naming_the_problem() -> None:
    emb, proxies, labels = _batch(0, 4, 2)
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: data_to_data_cross_entropy_loss(emb[0], proxies, labels), "embeddings must have"),
        (lambda: data_to_data_cross_entropy_loss(emb, proxies[:3], labels), "must have the same"),
        (lambda: data_to_data_cross_entropy_loss(emb, proxies, labels[:3]), r"labels must have"),
        (lambda: data_to_data_cross_entropy_loss(emb, proxies, labels.double()), "integers"),
        (lambda: data_to_data_cross_entropy_loss(emb, proxies, labels, temperature=0), "temper"),
        (
            lambda: data_to_data_cross_entropy_loss(emb, proxies, labels, margin_pos=math.nan),
            "margin_pos must be a finite number, got nan",
        ),
        (
            lambda: data_to_data_cross_entropy_loss(emb, proxies, labels, margin_neg="0.1"),  # type: ignore[arg-type]
            "margin_neg must be a finite number, got '0.1'",
        ),
        (
            lambda: data_to_data_cross_entropy_loss(emb, proxies, labels, form="reacgan"),  # type: ignore[arg-type]
            r"form must be one of \('studiogan', 'paper'\), got 'reacgan'",
        ),
        (
            lambda: data_to_data_cross_entropy_loss(emb, proxies, labels, block_size=0),
            "block_size must be a positive int or None, got 0",
        ),
        (
            lambda: data_to_data_cross_entropy_loss(emb, proxies, labels, gather="all"),  # type: ignore[arg-type]
            "gather must be a bool or 'equal'",
        ),
        (
            lambda: data_to_data_cross_entropy_loss(emb, proxies, labels, reduction="avg"),  # type: ignore[arg-type]
            "reduction must be one of",
        ),
        (lambda: DataToDataCrossEntropyLoss(margin_pos=math.inf), "margin_pos must be a finite"),
        (lambda: DataToDataCrossEntropyLoss(form="x"), "form must be one of"),  # type: ignore[arg-type]
        (
            lambda: conditional_contrastive_loss(emb, proxies, labels, positives="same"),  # type: ignore[arg-type]
            r"positives must be one of \('all', 'proxy'\), got 'same'",
        ),
        (lambda: ConditionalContrastiveLoss(positives="none"), "positives must be one of"),  # type: ignore[arg-type]
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()


# ------------------------------------------- gather: 2 gloo processes with uneven batches

GATHER_ROWS = (5, 3)  # rank 0 and rank 1
GATHER_CASES: dict[str, Callable[[Tensor, Tensor, Tensor, bool], Tensor]] = {
    "d2d_studiogan": lambda e, p, y, gather: data_to_data_cross_entropy_loss(
        e, p, y, temperature=0.3, gather=gather, reduction="sum"
    ),
    "d2d_paper_blocked": lambda e, p, y, gather: data_to_data_cross_entropy_loss(
        e, p, y, form="paper", gather=gather, block_size=2, reduction="sum"
    ),
    "two_c_proxy": lambda e, p, y, gather: conditional_contrastive_loss(
        e, p, y, temperature=0.2, positives="proxy", gather=gather, reduction="sum"
    ),
    "two_c_proxy_blocked": lambda e, p, y, gather: conditional_contrastive_loss(
        e, p, y, positives="proxy", gather=gather, block_size=2, reduction="sum"
    ),
}


def _gather_batch() -> tuple[Tensor, Tensor, Tensor]:
    emb, proxies, _ = _batch(11, sum(GATHER_ROWS), 4, d=4)
    return emb, proxies, torch.tensor([0, 1, 2, 0, 1, 2, 0, 3])  # classes across both ranks


def _gather_worker(rank: int, port: int, queue: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=60))
    try:
        emb, proxies, labels = _gather_batch()
        start = sum(GATHER_ROWS[:rank])
        rows = slice(start, start + GATHER_ROWS[rank])
        results = {}
        for name, loss_fn in GATHER_CASES.items():
            e, p = emb[rows].clone().requires_grad_(), proxies[rows].clone().requires_grad_()
            loss = loss_fn(e, p, labels[rows], True)
            loss.backward()
            assert e.grad is not None and p.grad is not None
            results[name] = (loss.detach().clone(), e.grad.clone(), p.grad.clone())
        buffer = io.BytesIO()  # plain bytes: shared-memory tensors would die with the process
        torch.save((rank, results), buffer)
        queue.put(buffer.getvalue())
    finally:
        dist.destroy_process_group()
    exit_without_teardown(queue)


def test_gathered_losses_sum_to_one_process_on_the_concatenated_batch() -> None:
    """Local anchors against every rank's rows: the ranks' sums add up to the whole batch's,
    and each rank's gradient is its slice of the whole batch's (the gather's backward sums the
    contrast gradients over ranks). With ``"mean"`` and equal batches DDP's averaging then gives
    one process's gradient (tests/shared/test_distributed.py)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    procs = [ctx.Process(target=_gather_worker, args=(r, port, queue)) for r in range(2)]
    for proc in procs:
        proc.start()
    per_rank = {}
    for _ in procs:
        rank, results = torch.load(io.BytesIO(queue.get(timeout=120)), weights_only=True)
        per_rank[rank] = results
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    emb, proxies, labels = _gather_batch()
    for name, loss_fn in GATHER_CASES.items():
        e, p = emb.clone().requires_grad_(), proxies.clone().requires_grad_()
        expected = loss_fn(e, p, labels, False)
        e_grad, p_grad = torch.autograd.grad(expected, (e, p))
        total = sum(per_rank[rank][name][0].item() for rank in range(2))
        assert total == pytest.approx(expected.item(), abs=1e-12), name
        for rank in range(2):
            start = sum(GATHER_ROWS[:rank])
            rows = slice(start, start + GATHER_ROWS[rank])
            _, got_e, got_p = per_rank[rank][name]
            assert torch.allclose(got_e, e_grad[rows], atol=1e-12), name
            assert torch.allclose(got_p, p_grad[rows], atol=1e-12), name
