"""JOAO under DDP: every rank's recorded losses enter one update, so the ranks keep one
distribution over augmentation pairs (2 gloo processes on CPU)."""

from __future__ import annotations

import io
import os
from typing import Any

import torch
import torch.distributed as dist

from graphcl.adaptive import AugmentationSampler
from shared.distributed import all_reduce_sum
from tests.shared.test_distributed import WORLD, _run_workers

NAMES = ["drop_nodes", "subgraph", "identity"]
# (i, j, loss) recorded by each rank during one epoch: rank 1 alone sees pairs (1, 1) and (2, 0)
RECORDS = {
    0: [(0, 0, 1.0), (0, 0, 3.0), (0, 1, 0.5)],
    1: [(1, 1, 0.25), (0, 0, 2.0), (2, 0, 4.0), (0, 1, 1.5)],
}


def _worker(rank: int, port: int, queue: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        sampler = AugmentationSampler(NAMES, gamma=0.5)
        for epoch in range(2):
            for i, j, loss in RECORDS[rank]:
                sampler.record(i, j, torch.tensor(loss * (epoch + 1)))
            sampler.update()
        summed = all_reduce_sum(torch.tensor([rank + 1.0, 10.0]))
        buffer = io.BytesIO()
        torch.save((rank, torch.stack(sampler.history), summed), buffer)
        queue.put(buffer.getvalue())
    finally:
        dist.destroy_process_group()


def test_ranks_share_one_distribution_equal_to_one_process_with_every_record() -> None:
    per_rank = _run_workers(_worker)
    single = AugmentationSampler(NAMES, gamma=0.5)
    for epoch in range(2):
        for rank in range(WORLD):
            for i, j, loss in RECORDS[rank]:
                single.record(i, j, torch.tensor(loss * (epoch + 1)))
        single.update()
    expected = torch.stack(single.history)  # (3, K, K)
    for rank in range(WORLD):
        history, summed = per_rank[rank]
        assert torch.allclose(history, expected, atol=1e-12), rank
        assert torch.equal(summed, torch.tensor([3.0, 20.0]))
    # the local records alone would have given the ranks different distributions
    local = AugmentationSampler(NAMES, gamma=0.5)
    for i, j, loss in RECORDS[0]:
        local.record(i, j, torch.tensor(loss))
    assert not torch.allclose(local.update(), expected[1])


def test_all_reduce_sum_is_a_copy_on_one_process() -> None:
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    out = all_reduce_sum(x)
    assert torch.equal(out, x.detach()) and not out.requires_grad
    out += 1
    assert torch.equal(x.detach(), torch.tensor([1.0, 2.0]))
