"""Distributed specification: with 2 gloo processes on CPU, ``gather=True`` losses and the
DDP-averaged gradients equal one process holding the whole batch."""

from __future__ import annotations

import io
import os
import socket
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils._python_dispatch import TorchDispatchMode

from shared.distributed import (
    all_reduce_mean,
    gather_no_grad,
    gather_with_grad,
    gather_with_offset,
)
from shared.losses import (
    MemoryQueue,
    conditional_contrastive_loss,
    data_to_data_cross_entropy_loss,
    graphcl_loss,
    info_nce_loss,
    nt_xent_loss,
    supcon_loss,
)
from tests.processes import exit_without_teardown
from tests.sync_counts import count_syncs

N, D_IN, D = 12, 6, 4
WORLD = 2


def _batch() -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(N, D_IN, generator=g, dtype=torch.float64), torch.tensor([0, 1, 2] * 4)


def _model() -> nn.Module:
    torch.manual_seed(1)
    return nn.Linear(D_IN, 2 * D).double()


def _losses(out: Tensor, labels: Tensor, gather: bool | str) -> dict[str, Tensor]:
    """Every gather-capable loss on the outputs of one linear layer."""
    return {
        "nt_xent": nt_xent_loss(out[:, :D], out[:, D:], temperature=0.5, gather=gather),
        "supcon_out": supcon_loss(out.view(-1, 2, D), labels, temperature=0.1, gather=gather),
        "supcon_in": supcon_loss(out.view(-1, 2, D), labels, variant="in", gather=gather),
        "supcon_one_blocked": supcon_loss(
            out.view(-1, 2, D), labels, contrast_mode="one", gather=gather, block_size=2
        ),
        "two_c": conditional_contrastive_loss(out[:, :D], out[:, D:], labels, gather=gather),
        "two_c_proxy": conditional_contrastive_loss(
            out[:, :D], out[:, D:], labels, temperature=0.1, positives="proxy", gather=gather
        ),
        "d2d_ce": data_to_data_cross_entropy_loss(out[:, :D], out[:, D:], labels, gather=gather),
        "d2d_ce_paper_blocked": data_to_data_cross_entropy_loss(
            out[:, :D], out[:, D:], labels, form="paper", gather=gather, block_size=2
        ),
        "graphcl": graphcl_loss(out[:, :D], out[:, D:], temperature=0.5, gather=gather),
        "graphcl_blocked": graphcl_loss(out[:, D:], out[:, :D], gather=gather, block_size=2),
        "info_nce": info_nce_loss(out[:, :D], out[:, D:], temperature=0.2, gather=gather),
        "info_nce_blocked": info_nce_loss(out[:, D:], out[:, :D], gather=gather, block_size=2),
    }


def _single_process() -> dict[str, tuple[float, Tensor, Tensor]]:
    x, labels = _batch()
    results = {}
    for name in _losses(_model()(x), labels, gather=False):
        model = _model()
        x_leaf = x.clone().requires_grad_()
        loss = _losses(model(x_leaf), labels, gather=False)[name]
        loss.backward()
        assert model.weight.grad is not None and x_leaf.grad is not None
        results[name] = (loss.item(), model.weight.grad.clone(), x_leaf.grad.clone())
    return results


def _worker(rank: int, port: int, queue: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        x, labels = _batch()
        rows = slice(rank * N // WORLD, (rank + 1) * N // WORLD)
        results = {}
        for name in _losses(_model()(x[rows]), labels[rows], gather=False):
            model = DistributedDataParallel(_model())
            x_leaf = x[rows].clone().requires_grad_()
            loss = _losses(model(x_leaf), labels[rows], gather=True)[name]
            loss.backward()
            weight_grad = model.module.weight.grad
            assert weight_grad is not None and x_leaf.grad is not None
            results[name] = (all_reduce_mean(loss).item(), weight_grad.clone(), x_leaf.grad.clone())
        # gather="equal": both ranks hold N / 2 rows, so the sizes need no exchange
        equal: dict[str, tuple[Tensor, Tensor, int]] = {}
        for name in results:
            x_leaf = x[rows].clone().requires_grad_()
            out = _model()(x_leaf)
            with count_syncs() as syncs:
                loss = _losses(out, labels[rows], gather="equal")[name]
                loss.backward()
            assert x_leaf.grad is not None
            equal[name] = (loss.detach(), x_leaf.grad.clone(), sum(syncs.values()))
        collectives = []
        for equal_sizes in (True, False):
            with _CountCollectives() as counted, count_syncs() as syncs:
                gather_with_offset(torch.zeros(3, 2, requires_grad=True), equal_sizes=equal_sizes)
                gather_no_grad(torch.zeros(3), equal_sizes=equal_sizes)
            collectives.append((counted.calls, sum(syncs.values())))
        # ranks with different numbers of rows: the gather pads and cuts
        n_local = 2 + rank
        local = torch.full((n_local, 3), float(rank), requires_grad=True)
        gathered, offset = gather_with_offset(local)
        weights = torch.arange(gathered.numel(), dtype=torch.float32).view_as(gathered)
        (gathered * weights).sum().backward()
        assert local.grad is not None
        uneven = (gathered.detach(), offset, local.grad.clone(), weights[offset : offset + n_local])
        # a queue of 6: 2 + 3 rows, then 1 + 1 rows, so the second enqueue wraps around
        memory = MemoryQueue(6, 2, normalize=False)
        memory.enqueue(torch.full((2 + rank, 2), 10.0 + rank))
        memory.enqueue(torch.full((1, 2), 20.0 + rank))
        held: tuple[Any, ...] = (memory.negatives(), memory.state_dict())
        # rank 0 holds no queries: its zero loss still runs the gather's backward all-reduce
        empty_q = torch.randn(3 * rank, D, dtype=torch.float64, requires_grad=True)
        empty_k = empty_q.detach().flip(0).requires_grad_()
        empty_loss = info_nce_loss(empty_q, empty_k, gather=True)
        empty_loss.backward()
        assert empty_q.grad is not None and empty_k.grad is not None
        held += (empty_loss.detach(), empty_q.detach(), empty_k.grad.clone())
        # plain bytes: tensors sent as shared memory would die with this process
        buffer = io.BytesIO()
        torch.save((rank, results, uneven, held, equal, collectives), buffer)
        queue.put(buffer.getvalue())
    finally:
        dist.destroy_process_group()
    exit_without_teardown(queue)


class _CountCollectives(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Counts the ``torch.distributed`` collectives (``c10d`` ops) issued inside the block."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.calls = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.calls += str(func.namespace) == "c10d"
        return func(*args, **(kwargs or {}))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_workers(worker: Callable[[int, int, Any], None]) -> dict[int, Any]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=worker, args=(r, port, queue)) for r in range(WORLD)]
    for p in procs:
        p.start()
    out = {}
    for _ in procs:
        rank, *rest = torch.load(io.BytesIO(queue.get(timeout=120)), weights_only=True)
        out[rank] = rest
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return out


@pytest.fixture(scope="module")
def per_rank() -> dict[int, Any]:
    """One 2-process run serves every test of this file (spawning costs seconds)."""
    return _run_workers(_worker)


def test_gather_losses_equal_the_single_process_run_on_the_whole_batch(
    per_rank: dict[int, Any],
) -> None:
    expected = _single_process()
    for rank in range(WORLD):
        results = per_rank[rank][0]
        rows = slice(rank * N // WORLD, (rank + 1) * N // WORLD)
        for name, (loss, weight_grad, x_grad) in results.items():
            full_loss, full_weight_grad, full_x_grad = expected[name]
            assert abs(loss - full_loss) < 1e-12, name
            # DDP averages over ranks: parameters see exactly the whole-batch gradient
            assert torch.allclose(weight_grad, full_weight_grad, atol=1e-12), name
            # each rank's inputs carry WORLD × their slice, which DDP's 1/WORLD cancels
            assert torch.allclose(x_grad, WORLD * full_x_grad[rows], atol=1e-12), name


def test_equal_sizes_gather_skips_the_size_exchange_and_gives_the_same_losses(
    per_rank: dict[int, Any],
) -> None:
    for rank in range(WORLD):
        results, equal, collectives = per_rank[rank][0], *per_rank[rank][3:]
        assert set(equal) == set(results)
        for name, (loss, x_grad, syncs) in equal.items():
            _, _, exchanged_x_grad = results[name]
            # the loss is this rank's share, the input gradient its slice (no DDP here)
            assert torch.allclose(x_grad, exchanged_x_grad, atol=1e-12), name
            assert torch.isfinite(loss), name
            assert syncs == 0, name  # no size exchange, nothing read back
        # two gathers: one collective each with equal sizes, one more each for the sizes
        (equal_calls, equal_syncs), (exchanged_calls, _) = collectives
        assert (equal_calls, exchanged_calls, equal_syncs) == (2, 4, 0)


def test_gather_with_uneven_batches_pads_and_cuts(per_rank: dict[int, Any]) -> None:
    for rank in range(WORLD):
        gathered, offset, grad, weights = per_rank[rank][1]
        assert gathered.shape == (5, 3)
        assert torch.equal(gathered[:, 0], torch.tensor([0.0, 0.0, 1.0, 1.0, 1.0]))
        assert offset == (0 if rank == 0 else 2)
        assert torch.equal(grad, WORLD * weights)  # both ranks' sums used these rows


def test_gather_is_the_identity_without_a_process_group() -> None:
    x = torch.randn(3, 2)
    assert gather_with_grad(x) is x
    assert gather_with_offset(x).offset == 0


def test_memory_queue_holds_every_ranks_keys_in_rank_order(per_rank: dict[int, Any]) -> None:
    for rank in range(WORLD):
        negatives, state, *_ = per_rank[rank][2]
        # oldest first: rank 0's 2 rows, rank 1's 3, then rank 0's and rank 1's single rows,
        # the oldest of the 7 dropped
        assert negatives[:, 0].tolist() == [10.0, 11.0, 11.0, 11.0, 20.0, 21.0]
        assert torch.equal(negatives[:, 0], negatives[:, 1])
        assert (int(state["ptr"]), int(state["filled"])) == (7 % 6, 6)


def test_info_nce_gather_with_an_empty_rank(per_rank: dict[int, Any]) -> None:
    *_, loss0, q0, k_grad0 = per_rank[0][2]
    *_, loss1, q1, k_grad1 = per_rank[1][2]
    assert loss0.item() == 0.0 and q0.shape == (0, D) and k_grad0.shape == (0, D)
    k1 = q1.flip(0).requires_grad_()
    expected = info_nce_loss(q1, k1)  # rank 1's queries against rank 1's keys only
    expected.backward()
    assert abs(loss1.item() - expected.item()) < 1e-12
    assert k1.grad is not None and torch.allclose(k_grad1, k1.grad, atol=1e-12)
