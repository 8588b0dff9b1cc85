"""Executable specification of InfoNCE and the memory queue: loop oracles, MoCo's pseudocode,
the exact relations to NT-Xent and N-pairs, gradients, the empty-batch rule, bad input, FIFO
behaviour, and an exact resume of a MoCo-style run. Oracles are float64 loops."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from shared.checkpoint import load_checkpoint, save_checkpoint
from shared.losses import (
    InfoNCELoss,
    MemoryQueue,
    info_nce_loss,
    npairs_loss,
    nt_xent_loss,
    two_view_info_nce_loss,
)
from shared.runs import RunDir
from shared.runtime import make_loader, seed_everything
from shared.train import LoopConfig, fit

SEEDS = (0, 1, 2)
MODES = ("in_batch", "shared", "per_query")


def _lse(values: list[float]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def info_nce_oracle(q: Tensor, k: Tensor, negatives: Tensor | None, tau: float) -> list[float]:
    """ℓ_i = −log(e^{q_i·k_i/τ} / Σ_{c ∈ C(i)} e^{q_i·c/τ}) with loops, C(i) ∋ k_i; q, k, c
    L2-normalised. In-batch: C(i) = every positive key; else {k_i} ∪ the negatives of query i."""
    q, k = F.normalize(q.double(), dim=-1), F.normalize(k.double(), dim=-1)
    losses = []
    for i in range(q.shape[0]):
        positive = float(q[i] @ k[i]) / tau
        if negatives is None:
            contrasts = [k[j] for j in range(k.shape[0])]
        else:
            rows = negatives if negatives.ndim == 2 else negatives[i]
            contrasts = [k[i], *F.normalize(rows.double(), dim=-1)]
        losses.append(_lse([float(q[i] @ c) / tau for c in contrasts]) - positive)
    return losses


def moco_pseudocode(q: Tensor, k: Tensor, queue: Tensor, tau: float) -> Tensor:
    """MoCo Algorithm 1 transcribed (queue stored as rows): cross-entropy with target 0."""
    q, k, queue = (F.normalize(x.double(), dim=1) for x in (q, k, queue))
    l_pos = torch.einsum("nc,nc->n", q, k).unsqueeze(-1)  # (N, 1)
    l_neg = torch.einsum("nc,kc->nk", q, queue)  # (N, K)
    logits = torch.cat([l_pos, l_neg], dim=1) / tau  # (N, 1 + K)
    labels = torch.zeros(q.shape[0], dtype=torch.long)
    return F.cross_entropy(logits, labels)


def _randn(seed: int, *shape: int) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def _inputs(seed: int, mode: str, N: int, K: int = 4, D: int = 5) -> tuple[Tensor, ...]:
    """query, positive_key and, for explicit modes, negatives: (K, D) or (N, K, D)."""
    q, k = _randn(seed, N, D), _randn(seed + 100, N, D)
    if mode == "in_batch":
        return q, k
    shape = (K, D) if mode == "shared" else (N, K, D)
    return q, k, _randn(seed + 200, *shape)


def _negatives(inputs: tuple[Tensor, ...]) -> Tensor | None:
    return inputs[2] if len(inputs) == 3 else None


# ---------------------------------------------------------------- oracles


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("N", [1, 2, 5])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("block_size", [None, 1, 3])
def test_info_nce_matches_loop_oracle(seed: int, N: int, mode: str, block_size: int | None) -> None:
    inputs = _inputs(seed, mode, N)
    expected = info_nce_oracle(inputs[0], inputs[1], _negatives(inputs), 0.3)
    per_query = info_nce_loss(*inputs, temperature=0.3, block_size=block_size, reduction="none")
    assert per_query.dtype == torch.float64 and per_query.shape == (N,)
    assert per_query.tolist() == pytest.approx(expected, abs=1e-10)
    mean = info_nce_loss(*inputs, temperature=0.3, block_size=block_size)
    total = info_nce_loss(*inputs, temperature=0.3, block_size=block_size, reduction="sum")
    assert mean.item() == pytest.approx(sum(expected) / N, abs=1e-10)
    assert total.item() == pytest.approx(sum(expected), abs=1e-10)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("N", "K"), [(1, 1), (3, 7), (8, 16)])
def test_shared_negatives_match_moco_pseudocode(seed: int, N: int, K: int) -> None:
    q, k, queue = _inputs(seed, "shared", N, K=K)
    for tau in (0.07, 0.2):
        got = info_nce_loss(q, k, queue, temperature=tau)
        assert got.item() == pytest.approx(moco_pseudocode(q, k, queue, tau).item(), abs=1e-10)


# ---------------------------------------------------------------- exact relations


def _others(x: Tensor) -> Tensor:
    """Per-query rows ``x_j, j ≠ i``, in order.  # (N, N−1, D)"""
    N = x.shape[0]
    keep = ~torch.eye(N, dtype=torch.bool)  # (N, N)
    return x.unsqueeze(0).expand(N, -1, -1)[keep].view(N, N - 1, x.shape[1])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("N", [1, 2, 6])
def test_in_batch_equals_npairs_and_the_other_keys_as_negatives(seed: int, N: int) -> None:
    """In-batch InfoNCE = N-pairs with cosine similarities = per-query negatives k_{j≠i}."""
    q, k = _inputs(seed, "in_batch", N)
    in_batch = info_nce_loss(q, k, temperature=0.4, reduction="none")
    npairs = npairs_loss(q, k, temperature=0.4, normalize=True, reduction="none")
    explicit = info_nce_loss(q, k, _others(k), temperature=0.4, reduction="none")
    assert torch.allclose(in_batch, npairs, atol=1e-12, rtol=0)
    assert torch.allclose(in_batch, explicit, atol=1e-12, rtol=0)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("N", [1, 2, 6])
def test_nt_xent_is_the_mean_of_two_info_nce_directions(seed: int, N: int) -> None:
    """NT-Xent anchor (i, view 1) = InfoNCE(q = z1_i, k⁺ = z2_i, negatives = z2_{j≠i} ∪ z1_{j≠i}),
    and view 2 likewise with z1 and z2 swapped; so NT-Xent = ½ (both directions' means).
    In-batch InfoNCE alone (negatives z2_{j≠i} only) lacks the same-view terms: it is not NT-Xent.
    """
    z1, z2 = _inputs(seed, "in_batch", N)
    negatives_1 = torch.cat([_others(z2), _others(z1)], dim=1)  # (N, 2N−2, D)
    negatives_2 = torch.cat([_others(z1), _others(z2)], dim=1)  # (N, 2N−2, D)
    forward = info_nce_loss(z1, z2, negatives_1, temperature=0.5, reduction="none")
    backward = info_nce_loss(z2, z1, negatives_2, temperature=0.5, reduction="none")
    per_anchor = nt_xent_loss(z1, z2, temperature=0.5, reduction="none")  # (N, 2)
    assert torch.allclose(per_anchor[:, 0], forward, atol=1e-12, rtol=0)
    assert torch.allclose(per_anchor[:, 1], backward, atol=1e-12, rtol=0)
    mean = nt_xent_loss(z1, z2, temperature=0.5)
    assert mean.item() == pytest.approx((forward.mean() + backward.mean()).item() / 2, abs=1e-12)
    if N > 1:
        assert info_nce_loss(z1, z2, temperature=0.5).item() < mean.item()


@pytest.mark.parametrize("seed", SEEDS)
def test_shared_negatives_equal_per_query_copies(seed: int) -> None:
    q, k, queue = _inputs(seed, "shared", 5, K=6)
    shared = info_nce_loss(q, k, queue, reduction="none")
    copies = info_nce_loss(q, k, queue.expand(5, -1, -1), reduction="none")  # (N, K, D)
    assert torch.allclose(shared, copies, atol=1e-12, rtol=0)


@pytest.mark.parametrize("seed", SEEDS)
def test_in_batch_plus_a_queue_equals_per_query_negatives_of_both(seed: int) -> None:
    """in_batch=True: the other samples' keys and the shared negatives, for every query."""
    q, k, queue = _inputs(seed, "shared", 5, K=6)
    both = info_nce_loss(q, k, queue, in_batch=True, reduction="none")
    others = torch.stack([torch.cat([k[:i], k[i + 1 :], queue]) for i in range(5)])  # (N, 10, D)
    assert torch.allclose(both, info_nce_loss(q, k, others, reduction="none"), atol=1e-12)
    empty = queue[:0]  # an empty queue: plain in-batch InfoNCE
    assert torch.allclose(info_nce_loss(q, k, empty, in_batch=True), info_nce_loss(q, k))
    with pytest.raises(ValueError, match="not per-query"):
        info_nce_loss(q, k, others, in_batch=True)


def test_two_view_loss_is_the_mean_of_both_directions() -> None:
    q, k, queue = _inputs(3, "shared", 5, K=6)
    both = two_view_info_nce_loss(q, k, queue, temperature=0.3)
    one = info_nce_loss(q, k, queue, temperature=0.3, in_batch=True)
    other = info_nce_loss(k, q, queue, temperature=0.3, in_batch=True)
    assert torch.allclose(both, (one + other) / 2, atol=1e-12)


@pytest.mark.parametrize("N", [1, 2, 5])
def test_identical_embeddings_give_log_of_the_number_of_contrasts(N: int) -> None:
    z = torch.ones(N, 3)
    assert info_nce_loss(z, z).item() == pytest.approx(math.log(N), abs=1e-6)
    assert info_nce_loss(z, z, torch.ones(7, 3)).item() == pytest.approx(math.log(8), abs=1e-6)


def test_empty_negatives_give_zero_loss_and_gradient() -> None:
    """K = 0 (an empty queue at the first MoCo step): the positive alone, ℓ = 0 exactly."""
    q, k = _inputs(0, "in_batch", 4)
    q.requires_grad_()
    for negatives in (torch.zeros(0, 5, dtype=torch.float64), torch.zeros(4, 0, 5)):
        per_query = info_nce_loss(q, k, negatives, reduction="none")
        assert torch.equal(per_query, torch.zeros(4, dtype=torch.float64))
        (grad,) = torch.autograd.grad(per_query.sum(), q)
        assert torch.equal(grad, torch.zeros_like(grad))


# ---------------------------------------------------------------- gradients


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("block_size", [None, 2])
def test_gradcheck_info_nce(mode: str, block_size: int | None) -> None:
    inputs = tuple(x.requires_grad_() for x in _inputs(3, mode, 4, K=3, D=3))

    def fn(*xs: Tensor) -> Tensor:
        return info_nce_loss(*xs, temperature=0.5, block_size=block_size, reduction="none")

    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_empty_batch_gives_zero_loss_still_in_the_graph(mode: str, reduction: str) -> None:
    inputs = tuple(x.requires_grad_() for x in _inputs(0, mode, 0))
    loss = info_nce_loss(*inputs, reduction=reduction)  # type: ignore[arg-type]
    if reduction == "none":
        assert loss.shape == (0,)
        return
    assert loss.shape == () and loss.item() == 0.0 and loss.requires_grad
    for grad in torch.autograd.grad(loss, inputs):
        assert torch.equal(grad, torch.zeros_like(grad))


# ---------------------------------------------------------------- invariances and precision


def test_invariances_rescaling_permutation_and_inputs_unchanged() -> None:
    q, k, queue = _inputs(4, "shared", 6, K=5)
    before = [x.clone() for x in (q, k, queue)]
    perm = torch.randperm(6, generator=torch.Generator().manual_seed(0))
    for negatives in (None, queue, queue.expand(6, -1, -1)):
        base = info_nce_loss(q, k, negatives, reduction="none")
        rescaled = info_nce_loss(2.5 * q, 0.3 * k, None if negatives is None else 4 * negatives)
        assert rescaled.item() == pytest.approx(base.mean().item(), abs=1e-12)
        permuted_negatives = (
            negatives if negatives is None or negatives.ndim == 2 else negatives[perm]
        )
        permuted = info_nce_loss(q[perm], k[perm], permuted_negatives, reduction="none")
        assert torch.allclose(permuted, base[perm], atol=1e-12, rtol=0)
    reordered = info_nce_loss(q, k, queue.flip(0), reduction="none")  # the order of negatives
    assert torch.allclose(reordered, info_nce_loss(q, k, queue, reduction="none"), atol=1e-12)
    for x, y in zip((q, k, queue), before, strict=True):
        assert torch.equal(x, y)


def test_dtypes_fp32_stays_fp32_and_any_fp64_input_gives_fp64() -> None:
    q, k, queue = (x.float() for x in _inputs(1, "shared", 4))
    assert info_nce_loss(q, k).dtype == torch.float32
    assert info_nce_loss(q, k, queue).dtype == torch.float32
    assert info_nce_loss(q, k, queue.double()).dtype == torch.float64
    assert info_nce_loss(q.half(), k.bfloat16(), queue.half()).dtype == torch.float32


@pytest.mark.parametrize("amp_dtype", [torch.bfloat16, torch.float16])
def test_low_precision_autocast_stays_finite(amp_dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 16, generator=g)
    layer = nn.Linear(16, 16)
    queue = torch.randn(40, 16, generator=g)
    with torch.autocast("cpu", dtype=amp_dtype):
        z = layer(x)  # low-precision activations
        losses = [
            info_nce_loss(z[:32], z[32:], temperature=0.05),
            info_nce_loss(z[:32], z[32:], queue, temperature=0.05),
            info_nce_loss(z[:32], z[32:], z[32:].unsqueeze(0).expand(32, -1, -1)),
        ]
    for loss in losses:
        assert loss.dtype == torch.float32 and torch.isfinite(loss)
        loss.backward(retain_graph=True)
        assert layer.weight.grad is not None and torch.isfinite(layer.weight.grad).all()


# ---------------------------------------------------------------- bad input and the module


def test_bad_input_raises_value_error_naming_the_problem() -> None:
    q, k, queue = _inputs(0, "shared", 4, K=3)
    with pytest.raises(ValueError, match="query must have 2 dims"):
        info_nce_loss(q.unsqueeze(0), k)
    with pytest.raises(ValueError, match="query and positive_key must have the same shape"):
        info_nce_loss(q, k[:3])
    with pytest.raises(ValueError, match=r"negative_keys must have shape \(3, 5\) to match"):
        info_nce_loss(q, k, queue[:, :4])
    with pytest.raises(ValueError, match=r"negative_keys must have shape \(4, 3, 5\) to match"):
        info_nce_loss(q, k, queue.expand(2, -1, -1))
    with pytest.raises(ValueError, match=r"shared \(K, 5\) or per-query \(4, K, 5\)"):
        info_nce_loss(q, k, queue[0])
    with pytest.raises(ValueError, match="negative_keys must be a floating tensor"):
        info_nce_loss(q, k, queue.long())
    bad = k.clone()
    bad[2, 1] = float("nan")
    # values are not read (a host wait): NaN in, NaN out, and the loop checks the loss
    assert torch.isnan(info_nce_loss(q, bad))
    for tau in (0.0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="temperature must be"):
            info_nce_loss(q, k, temperature=tau)
        with pytest.raises(ValueError, match="temperature must be"):
            InfoNCELoss(temperature=tau)
    with pytest.raises(ValueError, match="reduction must be one of"):
        info_nce_loss(q, k, reduction="avg")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="block_size must be a positive int"):
        info_nce_loss(q, k, queue, block_size=0)
    with pytest.raises(ValueError, match="gather=True applies to in-batch negatives only"):
        info_nce_loss(q, k, queue, gather=True)
    with pytest.raises(ValueError, match="gather=True applies to in-batch negatives only"):
        InfoNCELoss(gather=True)(q, k, queue)
    with pytest.raises(ValueError, match="block_size must be a positive int"):
        InfoNCELoss(block_size=0)
    with pytest.raises(ValueError, match="reduction must be one of"):
        InfoNCELoss(reduction="avg")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gather must be a bool"):
        InfoNCELoss(gather="yes")  # type: ignore[arg-type]


def test_module_delegates_to_the_function() -> None:
    q, k, queue = _inputs(2, "shared", 5)
    module = InfoNCELoss(temperature=0.3, block_size=2, reduction="none")
    assert "temperature=0.3" in repr(module) and "block_size=2" in repr(module)
    for negatives in (None, queue, queue.expand(5, -1, -1)):
        expected = info_nce_loss(q, k, negatives, temperature=0.3, block_size=2, reduction="none")
        assert torch.equal(module(q, k, negatives), expected)
    assert InfoNCELoss()(q, k).item() == info_nce_loss(q, k, temperature=0.2).item()


# ---------------------------------------------------------------- the queue


def _numbered(start: int, B: int, D: int = 2) -> Tensor:
    """Rows ``t`` filled with their global key number ``t``: the order is readable."""
    return torch.arange(start, start + B, dtype=torch.float32).unsqueeze(1).expand(B, D)


@pytest.mark.parametrize(
    "batches", [[1] * 7, [3, 4, 2], [7], [2, 0, 9, 3], [5, 5], [4, 1, 5, 6, 2, 3]]
)
def test_queue_is_fifo_and_keeps_the_last_k_keys_oldest_first(batches: list[int]) -> None:
    K = 5
    queue = MemoryQueue(K, 2, normalize=False)
    assert queue.negatives().shape == (0, 2) and queue.num_filled == 0
    seen = 0
    for B in batches:
        queue.enqueue(_numbered(seen, B))
        seen += B
        expected = list(range(max(0, seen - K), seen))  # the last K key numbers, oldest first
        held = queue.negatives()
        assert held.shape == (len(expected), 2)
        assert held[:, 0].tolist() == expected and torch.equal(held[:, 0], held[:, 1])
        assert queue.num_filled == int(queue.filled) == min(seen, K)
        assert int(queue.ptr) == seen % K  # key number t is stored in slot t mod K


def test_queue_detaches_normalises_and_hands_out_copies() -> None:
    keys = _randn(0, 3, 4).float().requires_grad_()
    before = keys.detach().clone()
    queue = MemoryQueue(4, 4)
    queue.enqueue(keys)
    held = queue.negatives()
    assert not held.requires_grad and not queue.keys.requires_grad
    assert torch.equal(keys.detach(), before)  # input untouched
    assert torch.allclose(held, F.normalize(before, dim=1), atol=1e-7)
    held.zero_()  # a copy: the queue is unaffected
    earlier = queue.negatives()
    queue.enqueue(_numbered(0, 3, 4))  # wraps around and overwrites slot 0
    assert torch.allclose(earlier, F.normalize(before, dim=1), atol=1e-7)
    raw = MemoryQueue(4, 4, normalize=False)
    raw.enqueue(keys)
    assert torch.equal(raw.negatives(), before)


def test_moco_order_loss_then_enqueue_then_backward() -> None:
    """The negatives of a step may be overwritten before its backward (Algorithm 1's order)."""
    encoder = nn.Linear(4, 3).double()
    queue = MemoryQueue(4, 3, dtype=torch.float64)
    queue.enqueue(_randn(1, 4, 3))
    x = _randn(2, 4, 4)
    q, k = encoder(x), encoder(x.flip(0)).detach()
    loss = info_nce_loss(q, k, queue.negatives())
    queue.enqueue(k)
    loss.backward()
    assert encoder.weight.grad is not None and torch.isfinite(encoder.weight.grad).all()


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
        ),
    ],
)
def test_queue_dtype_and_device_follow_the_module(device: str) -> None:
    queue = MemoryQueue(3, 2, normalize=False).double().to(device)
    assert queue.keys.dtype == torch.float64 and queue.ptr.dtype == torch.long
    queue.enqueue(_numbered(0, 2).half())  # cast to the buffer on the way in
    held = queue.negatives()
    assert held.dtype == torch.float64 and held.device.type == device
    assert held[:, 0].tolist() == [0.0, 1.0]


def test_queue_rejects_bad_settings_and_keys() -> None:
    for size in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="size must be a positive int"):
            MemoryQueue(size, 4)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dim must be a positive int"):
        MemoryQueue(4, 0)
    with pytest.raises(ValueError, match="dtype must be a floating dtype"):
        MemoryQueue(4, 2, dtype=torch.long)
    queue = MemoryQueue(4, 3)
    with pytest.raises(ValueError, match=r"keys must have shape \(B, 3\), got \(2, 4\)"):
        queue.enqueue(torch.zeros(2, 4))
    with pytest.raises(ValueError, match=r"keys must have shape \(B, 3\), got \(3,\)"):
        queue.enqueue(torch.zeros(3))
    with pytest.raises(ValueError, match="keys must be a floating tensor"):
        queue.enqueue(torch.zeros(2, 3, dtype=torch.long))
    assert "size=4, dim=3, normalize=True" in repr(queue)


def test_queue_state_dict_round_trip_and_continuation() -> None:
    queue = MemoryQueue(5, 2, normalize=False)
    for start, B in ((0, 3), (3, 4)):  # wrapped: ptr 2, full
        queue.enqueue(_numbered(start, B))
    state = queue.state_dict()
    assert list(state) == ["keys", "ptr", "filled"]
    restored = MemoryQueue(5, 2, normalize=False)
    restored.load_state_dict(state)
    assert torch.equal(restored.negatives(), queue.negatives()) and restored.num_filled == 5
    for q in (queue, restored):
        q.enqueue(_numbered(7, 2))
    assert torch.equal(restored.negatives(), queue.negatives())
    assert restored.negatives()[:, 0].tolist() == [4.0, 5.0, 6.0, 7.0, 8.0]

    partial = MemoryQueue(5, 2, normalize=False)
    partial.enqueue(_numbered(0, 2))
    broken = {**partial.state_dict(), "ptr": torch.tensor(4)}  # not full, so ptr must be 2
    target = MemoryQueue(5, 2, normalize=False)
    with pytest.raises(RuntimeError, match="ptr=4 and filled=2 are not a valid state"):
        target.load_state_dict(broken)
    assert target.num_filled == 0 and int(target.filled) == 0  # nothing was loaded


class _TinyMoCo(nn.Module):
    """A query encoder, its momentum copy and a queue: MoCo at the smallest scale."""

    def __init__(self, momentum: float = 0.9) -> None:
        super().__init__()
        self.encoder_q = nn.Linear(4, 3)
        self.encoder_k = copy.deepcopy(self.encoder_q).requires_grad_(False)
        self.queue = MemoryQueue(6, 3)
        self.momentum = momentum

    @torch.no_grad()
    def momentum_update(self) -> None:
        for p_k, p_q in zip(self.encoder_k.parameters(), self.encoder_q.parameters(), strict=True):
            p_k.mul_(self.momentum).add_(p_q, alpha=1 - self.momentum)


def _moco_step(model: nn.Module, batch: list[Tensor]) -> dict[str, Tensor]:
    assert isinstance(model, _TinyMoCo)
    (x,) = batch
    view_q = x + 0.1 * torch.randn_like(x)  # global RNG: the resume must restore it
    view_k = x + 0.1 * torch.randn_like(x)
    model.momentum_update()
    q = model.encoder_q(view_q)
    with torch.no_grad():
        k = model.encoder_k(view_k)
    loss = info_nce_loss(q, k, model.queue.negatives(), temperature=0.2)
    model.queue.enqueue(k)
    return {"loss": loss}


def test_queue_inside_a_model_survives_a_weights_only_checkpoint(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = _TinyMoCo()
    for _ in range(3):
        _moco_step(model, [torch.randn(4, 4)])
    path = save_checkpoint(tmp_path / "moco.pt", {"model": model.state_dict()})
    restored = _TinyMoCo()
    restored.load_state_dict(load_checkpoint(path)["model"])  # weights_only=True inside
    for (name, a), b in zip(
        model.state_dict().items(), restored.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name
    assert torch.equal(restored.queue.negatives(), model.queue.negatives())
    keys = torch.randn(4, 3)
    model.queue.enqueue(keys)
    restored.queue.enqueue(keys)
    assert torch.equal(restored.queue.negatives(), model.queue.negatives())


def _moco_fit(
    run_dir: RunDir, step: object = _moco_step, *, resume: bool = False
) -> tuple[nn.Module, object]:
    """Everything a fresh process builds: 20 samples, batches of 4, 3 epochs of 5 steps."""
    seed_everything(0)
    model = _TinyMoCo()
    optimizer = torch.optim.AdamW(model.encoder_q.parameters(), lr=0.05)
    x = torch.randn(20, 4, generator=torch.Generator().manual_seed(1))
    loader = make_loader(torch.utils.data.TensorDataset(x), 4, shuffle=True, seed=0)
    cfg = LoopConfig(epochs=3, log_every=1, checkpoint_every=4, progress=False)
    result = fit(
        model,
        optimizer,
        loader,
        step,
        loop_cfg=cfg,
        run_dir=run_dir,  # type: ignore[arg-type]
        device=torch.device("cpu"),
        resume=resume,
    )
    return model, result


def test_moco_resume_after_a_crash_equals_an_uninterrupted_run(tmp_path: Path) -> None:
    whole = RunDir.create("t", "whole", root=tmp_path)
    reference, expected = _moco_fit(whole)
    assert isinstance(reference, _TinyMoCo) and reference.queue.num_filled == 6

    calls = iter(range(1, 10**6))

    def crashing_step(model: nn.Module, batch: list[Tensor]) -> dict[str, Tensor]:
        if next(calls) == 11:  # step 11; the last checkpoint is step 8's
            raise RuntimeError("preempted")
        return _moco_step(model, batch)

    parts = RunDir.create("t", "parts", root=tmp_path)
    with pytest.raises(RuntimeError, match="preempted"):
        _moco_fit(parts, crashing_step)
    assert load_checkpoint(parts.last_checkpoint)["step"] == 8
    resumed, result = _moco_fit(
        RunDir.create("t", "parts", root=tmp_path, resume=True), resume=True
    )
    assert result == expected
    for (name, a), b in zip(
        reference.state_dict().items(), resumed.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name  # weights, momentum encoder, queue keys, ptr, filled
    assert parts.metrics_path.read_bytes() == whole.metrics_path.read_bytes()
