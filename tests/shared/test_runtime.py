"""Process set-up: seeding, devices, torchrun environment, loaders whose order is (seed, epoch)."""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from shared.runtime import (
    DistEnv,
    autocast_dtype,
    cleanup_distributed,
    eval_mode,
    init_distributed,
    is_main_process,
    local_device,
    make_loader,
    move_to_device,
    rank_seed,
    seed_everything,
    select_device,
    set_epoch,
    unwrap,
    wrap_ddp,
)
from tests.processes import exit_without_teardown

TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _draws() -> tuple[float, float, float]:
    return random.random(), float(np.random.rand()), torch.rand(1).item()  # noqa: NPY002


def test_seed_everything_seeds_all_generators() -> None:
    generator = seed_everything(5)
    first = (*_draws(), torch.rand(1, generator=generator).item())
    generator = seed_everything(5)
    assert (*_draws(), torch.rand(1, generator=generator).item()) == first
    seed_everything(6)
    assert _draws() != first[:3]


@pytest.mark.parametrize("seed", [-1, 2**32, 1.5, True])
def test_seed_everything_rejects_bad_seeds(seed: object) -> None:
    with pytest.raises(ValueError, match="seed"):
        seed_everything(seed)  # type: ignore[arg-type]


def _all_draws(generator: torch.Generator) -> tuple[float, ...]:
    return (*_draws(), torch.rand(1, generator=generator).item())


def test_every_rank_gets_its_own_streams() -> None:
    assert rank_seed(7, 0) == 7  # rank 0 is the single-process run
    seeds = {rank_seed(seed, rank) for seed in range(4) for rank in range(4)}
    assert len(seeds) == 16  # no (seed, rank) replays another, unlike seed + rank
    rank0 = _all_draws(seed_everything(7))
    assert _all_draws(seed_everything(7, rank=0)) == rank0
    rank1 = _all_draws(seed_everything(7, rank=1))
    assert all(a != b for a, b in zip(rank0, rank1, strict=True))
    assert _all_draws(seed_everything(7, rank=1)) == rank1
    with pytest.raises(ValueError, match="rank must be an int >= 0, got -1"):
        seed_everything(7, rank=-1)


def _seeded_rank_worker(rank: int, port: int, folder: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    env = init_distributed(torch.device("cpu"))
    try:
        runs = [_all_draws(seed_everything(11, rank=env.rank)) for _ in range(2)]
        torch.save(torch.tensor(runs), Path(folder) / f"draws{rank}.pt")
    finally:
        cleanup_distributed()
    exit_without_teardown()


def test_two_gloo_ranks_draw_different_numbers_reproducibly(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = [
        ctx.Process(target=_seeded_rank_worker, args=(r, port, str(tmp_path))) for r in range(2)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    assert [proc.exitcode for proc in procs] == [0, 0]
    rank0, rank1 = (torch.load(tmp_path / f"draws{r}.pt", weights_only=True) for r in range(2))
    assert torch.equal(rank0[0], rank0[1]) and torch.equal(rank1[0], rank1[1])  # a rerun
    assert (rank0[0] != rank1[0]).all()  # every generator differs between the ranks
    assert torch.equal(rank0[0], torch.tensor(_all_draws(seed_everything(11))))  # = one process


def test_select_device() -> None:
    assert select_device("cpu") == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert select_device("auto").type == expected
    with pytest.raises(ValueError, match="'tpu'"):
        select_device("tpu")  # type: ignore[arg-type]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a CPU-only machine")
def test_select_cuda_without_cuda_is_an_error() -> None:
    with pytest.raises(ValueError, match="CUDA is not available"):
        select_device("cuda")


def test_single_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in TORCHRUN_VARS:
        monkeypatch.delenv(name, raising=False)
    env = init_distributed(torch.device("cpu"))
    assert env == DistEnv(rank=0, local_rank=0, world_size=1, is_distributed=False)
    assert is_main_process()
    cleanup_distributed()  # nothing to clean: must not raise
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert not init_distributed(torch.device("cpu")).is_distributed


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two'"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE must be >= 1"),
        ({"WORLD_SIZE": "2", "RANK": "2"}, r"RANK must be in \[0, WORLD_SIZE=2\)"),
        ({"WORLD_SIZE": "2", "RANK": "1"}, "MASTER_ADDR"),
    ],
)
def test_bad_torchrun_environment(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    for name in TORCHRUN_VARS:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=message):
        init_distributed(torch.device("cpu"))


def test_local_device() -> None:
    env = DistEnv(rank=3, local_rank=1, world_size=4, is_distributed=True)
    assert local_device(torch.device("cuda"), env) == torch.device("cuda", 1)
    assert local_device(torch.device("cpu"), env) == torch.device("cpu")


def _dataset(n: int = 10) -> TensorDataset:
    return TensorDataset(torch.arange(n))


def _epoch(loader: DataLoader[tuple[torch.Tensor]], epoch: int) -> list[int]:
    set_epoch(loader, epoch)
    return [int(i) for (batch,) in loader for i in batch]


def test_loader_order_is_a_function_of_seed_and_epoch() -> None:
    loader = make_loader(_dataset(), 3, shuffle=True, drop_last=False, seed=1)
    torch.manual_seed(0)
    e0, e1 = _epoch(loader, 0), _epoch(loader, 1)
    torch.manual_seed(123)  # the global RNG plays no part
    again = make_loader(_dataset(), 3, shuffle=True, drop_last=False, seed=1)
    assert _epoch(again, 1) == e1 and _epoch(again, 0) == e0
    assert sorted(e0) == list(range(10)) and e0 != e1
    other = make_loader(_dataset(), 3, shuffle=True, drop_last=False, seed=2)
    assert _epoch(other, 0) != e0
    plain = make_loader(_dataset(), 3, shuffle=False, drop_last=False, seed=1)
    assert _epoch(plain, 0) == list(range(10))


def test_drop_last_drops_the_partial_batch() -> None:
    loader = make_loader(_dataset(10), 4, shuffle=False, drop_last=True, seed=0)
    assert len(loader) == 2 and _epoch(loader, 0) == list(range(8))


def test_contrastive_loaders_drop_the_partial_batch_by_default() -> None:
    """A short last batch has fewer negatives and a lower loss: a saw-tooth in the curve."""
    loader = make_loader(_dataset(10), 4, shuffle=True, seed=0)
    assert len(loader) == 2
    assert all(len(batch) == 4 for (batch,) in loader)
    keep = make_loader(_dataset(10), 4, shuffle=False, seed=0, drop_last=False)
    assert [len(batch) for (batch,) in keep] == [4, 4, 2]


def test_sharded_loaders_split_the_single_process_batches() -> None:
    single = make_loader(_dataset(16), 4, shuffle=True, drop_last=False, seed=3)
    ranks = [
        make_loader(
            _dataset(16),
            2,
            shuffle=True,
            drop_last=False,
            seed=3,
            dist=DistEnv(rank=r, local_rank=r, world_size=2, is_distributed=True),
        )
        for r in range(2)
    ]
    for epoch in range(2):
        set_epoch(single, epoch)
        for loader in ranks:
            set_epoch(loader, epoch)
        for (whole,), (part0,), (part1,) in zip(single, *ranks, strict=True):
            assert sorted(whole.tolist()) == sorted(part0.tolist() + part1.tolist())


def test_make_loader_validates() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        make_loader(_dataset(), 0, shuffle=False, drop_last=False, seed=0)
    with pytest.raises(ValueError, match="num_workers"):
        make_loader(_dataset(), 2, shuffle=False, drop_last=False, seed=0, num_workers=-1)


def test_set_epoch_ignores_loaders_without_sampler_epoch() -> None:
    set_epoch(DataLoader(_dataset(), batch_size=2), 3)
    set_epoch([1, 2, 3], 3)


class Pair(NamedTuple):
    x: torch.Tensor
    y: torch.Tensor


class Moves:
    def __init__(self) -> None:
        self.device: torch.device | None = None

    def to(self, device: torch.device) -> Moves:
        self.device = device
        return self


def test_move_to_device_keeps_structure() -> None:
    device = torch.device("cpu")
    moved = move_to_device(
        {"a": [torch.ones(1), (torch.zeros(1), 3)], "p": Pair(torch.ones(1), torch.ones(2))},
        device,
    )
    assert isinstance(moved["a"], list) and isinstance(moved["a"][1], tuple)
    assert moved["a"][1][1] == 3
    assert isinstance(moved["p"], Pair) and moved["p"].y.shape == (2,)
    assert move_to_device(Moves(), device).device == device


class MovesNonBlocking:
    def __init__(self) -> None:
        self.non_blocking: bool | None = None

    def to(self, device: torch.device, *args: str, non_blocking: bool = False) -> MovesNonBlocking:
        self.non_blocking = non_blocking
        return self


def test_move_to_device_asks_objects_for_a_non_blocking_copy() -> None:
    """A PyG Batch's ``to`` copies synchronously unless asked for ``non_blocking``."""
    from torch_geometric.data import Batch, Data

    device = torch.device("cpu")
    assert move_to_device(MovesNonBlocking(), device).non_blocking is True
    batch = Batch.from_data_list([Data(x=torch.ones(2, 3)), Data(x=torch.zeros(1, 3))])
    moved = move_to_device(batch, device)
    assert torch.equal(moved.x, batch.x) and moved.num_graphs == 2
    assert move_to_device(Moves(), device).device == device  # no such keyword: a plain to()


def test_autocast_dtype_is_decided_once() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert autocast_dtype("auto", cpu) is None
    assert autocast_dtype("off", cuda) is None
    assert autocast_dtype("bf16", cpu) is torch.bfloat16
    with pytest.raises(ValueError, match="'fp16'"):
        autocast_dtype("fp16", cpu)  # type: ignore[arg-type]


def test_wrap_ddp_is_identity_without_a_process_group() -> None:
    model = nn.Linear(2, 2)
    env = DistEnv(rank=0, local_rank=0, world_size=1, is_distributed=False)
    assert wrap_ddp(model, env) is model and unwrap(model) is model


def test_eval_mode_restores_every_submodules_own_mode() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    model[1].eval()  # a deliberately frozen batch norm inside a training model
    with eval_mode(model):
        assert not any(m.training for m in model.modules())
    assert model.training and model[0].training and not model[1].training
    with pytest.raises(RuntimeError, match="boom"), eval_mode(model):
        raise RuntimeError("boom")
    assert model.training and not model[1].training
