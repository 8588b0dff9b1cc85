"""Process set-up: seeding, device choice, the torchrun environment and data loaders.

Multi-GPU and multi-node runs go through ``torchrun`` + DDP + ``DistributedSampler`` (see
docs/architecture.md, "Distributed"). This module reads the variables torchrun sets (``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), starts and ends the process
group, seeds each rank's random streams, and builds loaders whose sample order is a pure function
of ``(seed, epoch)``, which is what makes an interrupted run resume to the same result.
"""

from __future__ import annotations

import functools
import inspect
import os
import random
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Literal, NamedTuple

import numpy as np
import torch
import torch.distributed as torch_dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

__all__ = [
    "DistEnv",
    "autocast_dtype",
    "cleanup_distributed",
    "eval_mode",
    "init_distributed",
    "is_main_process",
    "local_device",
    "make_loader",
    "move_to_device",
    "rank_seed",
    "runs_on_this_rank",
    "seed_everything",
    "select_device",
    "set_epoch",
    "unwrap",
    "wrap_ddp",
]


class DistEnv(NamedTuple):
    """Where this process sits in a (possibly single-process) job."""

    rank: int
    local_rank: int
    world_size: int
    is_distributed: bool


SINGLE_PROCESS = DistEnv(rank=0, local_rank=0, world_size=1, is_distributed=False)


def rank_seed(seed: int, rank: int) -> int:
    """The seed of rank ``rank``'s random streams: ``seed`` itself on rank 0, a distinct one else.

    Rank 0 keeps ``seed`` so a one-process run and rank 0 of a distributed run draw the same
    numbers. Other ranks get a 32-bit seed derived from ``(seed, rank)`` by numpy's
    ``SeedSequence`` rather than nanoGPT's ``seed + rank``, under which rank 1 of seed 0 would
    replay rank 0 of seed 1.
    """
    _check_seed(seed)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank must be an int >= 0, got {rank!r}")
    if rank == 0:
        return seed
    sequence = np.random.SeedSequence(seed, spawn_key=(rank,))
    return int(sequence.generate_state(1, dtype=np.uint32)[0])


def _check_seed(seed: object) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ValueError(f"seed must be an int in [0, 2**32), got {seed!r}")


def seed_everything(seed: int, *, rank: int = 0) -> torch.Generator:
    """Seed Python ``random``, numpy, torch and every CUDA device; return a fresh generator.

    Every rank of a distributed job must draw *different* augmentation parameters and latents
    (else each rank repeats the others' randomness on its own images), so the streams are
    seeded with :func:`rank_seed` ``(seed, rank)``. Model initialisation should instead be the
    same on every rank: call ``seed_everything(seed)`` before building the model and
    ``seed_everything(seed, rank=env.rank)`` after it, before training (DDP also broadcasts
    rank 0's parameters and buffers when it wraps the model). The data order does not depend on
    these streams (:func:`make_loader` seeds its sampler with ``seed`` on every rank).

    The global seeds cover third-party code that draws from the global RNGs; the returned
    ``torch.Generator`` (seeded the same way) is what our own augmentations and attacks should
    take explicitly.
    """
    _check_seed(seed)
    seed = rank_seed(seed, rank)
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002 - the global state is what third-party code draws from
    torch.manual_seed(seed)  # also seeds every CUDA device
    generator = torch.Generator()
    generator.manual_seed(seed)
    return generator


def select_device(spec: Literal["auto", "cpu", "cuda"]) -> torch.device:
    """Resolve a device choice: ``auto`` is CUDA when available, else CPU.

    Asking for ``cuda`` on a machine without it is an error rather than a silent CPU run.
    """
    if spec == "cpu":
        return torch.device("cpu")
    if spec == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device 'cuda' was requested but CUDA is not available here")
        return torch.device("cuda")
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {spec!r}")


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"environment variable {name}={text!r} is not an integer") from None


def init_distributed(device: torch.device) -> DistEnv:
    """Join the process group described by torchrun's environment, if there is one.

    Without ``WORLD_SIZE`` (or with ``WORLD_SIZE=1``) this is a single-process run and nothing is
    initialised. Otherwise the backend is NCCL for CUDA and gloo for CPU, and on CUDA the
    process's device is set to ``LOCAL_RANK`` before the group starts (NCCL needs it).
    """
    world_size = _env_int("WORLD_SIZE", 1)
    if world_size < 1:
        raise ValueError(f"WORLD_SIZE must be >= 1, got {world_size}")
    if world_size == 1:
        return SINGLE_PROCESS
    rank = _env_int("RANK", -1)
    local_rank = _env_int("LOCAL_RANK", rank)
    if not 0 <= rank < world_size:
        raise ValueError(f"RANK must be in [0, WORLD_SIZE={world_size}), got {rank}")
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
    if missing:
        raise ValueError(f"WORLD_SIZE={world_size} but {missing} are not set; launch with torchrun")
    if not torch_dist.is_available():
        raise RuntimeError("torch.distributed is not available in this build of torch")
    if device.type == "cuda":
        torch.cuda.set_device(local_rank)
    if not torch_dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        torch_dist.init_process_group(backend=backend, rank=rank, world_size=world_size)
    return DistEnv(rank=rank, local_rank=local_rank, world_size=world_size, is_distributed=True)


def local_device(device: torch.device, env: DistEnv) -> torch.device:
    """The device this process should use: ``cuda:LOCAL_RANK`` for a CUDA job, else ``device``."""
    if device.type == "cuda" and env.is_distributed:
        return torch.device("cuda", env.local_rank)
    return device


def cleanup_distributed() -> None:
    """Destroy the process group if one was started (safe to call in every run)."""
    if torch_dist.is_available() and torch_dist.is_initialized():
        torch_dist.destroy_process_group()


def is_main_process() -> bool:
    """True on rank 0 and in single-process runs: only the main process writes files."""
    if torch_dist.is_available() and torch_dist.is_initialized():
        return torch_dist.get_rank() == 0
    return True


def runs_on_this_rank(command: str) -> bool:
    """Whether a one-process command (evaluation, sampling, fine-tuning) runs in this process.

    Always true without torchrun. Under torchrun only rank 0 runs the command, as one process
    (no process group is started); every other rank prints one line to stderr and should return
    at once with exit status 0, so the job neither writes a second run folder nor races rank 0
    for its files.
    """
    world_size, rank = _env_int("WORLD_SIZE", 1), _env_int("RANK", 0)
    if world_size > 1 and rank != 0:
        print(f"{command}: runs in one process, rank 0; rank {rank} exits", file=sys.stderr)
        return False
    return True


def make_loader(
    dataset: Dataset[Any],
    batch_size: int,
    *,
    shuffle: bool,
    seed: int,
    drop_last: bool = True,
    num_workers: int = 0,
    dist: DistEnv | None = None,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    pin_memory: bool = False,
) -> DataLoader[Any]:
    """A ``DataLoader`` whose order depends only on ``(seed, epoch)``; sharded when distributed.

    ``batch_size`` is per process. A ``DistributedSampler`` is used in single-process runs too
    (one replica): its permutation is seeded with ``seed + epoch``, so epoch order is
    reproducible on resume, and a 1-process and an N-process run see the same global batches
    (rank ``r`` takes every N-th index). Call :func:`set_epoch` before each epoch.

    ``drop_last=True`` (the default) drops the last incomplete batch, as SimCLR does: a
    contrastive loss over fewer samples has fewer negatives and a lower value, so a short last
    batch would put a saw-tooth into the loss curve and give its samples a different objective.
    Pass ``drop_last=False`` for evaluation, where every sample counts.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers}")
    env = dist or SINGLE_PROCESS
    sampler: DistributedSampler[Any] = DistributedSampler(
        dataset,
        num_replicas=env.world_size,
        rank=env.rank,
        shuffle=shuffle,
        seed=seed,
        drop_last=drop_last,
    )
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=num_workers,
        collate_fn=collate_fn,
        pin_memory=pin_memory,
        drop_last=drop_last,
    )


def set_epoch(loader: object, epoch: int) -> None:
    """Tell the loader's sampler which epoch starts, so its shuffle differs per epoch.

    A no-op for loaders whose sampler has no ``set_epoch`` (a sequential sampler, a list).
    """
    sampler = getattr(loader, "sampler", None)
    if sampler is None or not hasattr(sampler, "set_epoch"):
        batch_sampler = getattr(loader, "batch_sampler", None)
        sampler = getattr(batch_sampler, "sampler", None)
    if sampler is not None and hasattr(sampler, "set_epoch"):
        sampler.set_epoch(epoch)


def wrap_ddp(
    model: nn.Module, dist_env: DistEnv, *, find_unused_parameters: bool = False
) -> nn.Module:
    """Wrap ``model`` in ``DistributedDataParallel`` when the job is distributed, else return it.

    The model must already be on this process's device (``cuda:LOCAL_RANK`` or CPU). DDP sends
    rank 0's buffers to every rank before each forward (``broadcast_buffers=True``); the buffers
    of submodules whose class sets ``ddp_broadcast_buffers = False`` (a
    :class:`~shared.losses.MemoryQueue`, which all-gathers on its own) are left out of that
    broadcast and of the initial one.
    """
    if not dist_env.is_distributed:
        return model
    kept = _rank_kept_buffers(model)
    if kept:
        ignored = [*getattr(model, "_ddp_params_and_buffers_to_ignore", ()), *kept]
        # DDP's documented hook for this (torch.nn.parallel.distributed); it sets an attribute
        set_ignored = DistributedDataParallel._set_params_and_buffers_to_ignore_for_model
        set_ignored(model, ignored)  # type: ignore[no-untyped-call]
    param = next(model.parameters(), None)
    on_cuda = param is not None and param.device.type == "cuda"
    return DistributedDataParallel(
        model,
        device_ids=[dist_env.local_rank] if on_cuda else None,
        find_unused_parameters=find_unused_parameters,
    )


def _rank_kept_buffers(model: nn.Module) -> list[str]:
    """Qualified names of the buffers DDP must not broadcast (see :func:`wrap_ddp`)."""
    names: dict[str, None] = {}
    for prefix, module in model.named_modules():
        if getattr(type(module), "ddp_broadcast_buffers", True) is False:
            for name, _ in module.named_buffers(prefix=prefix):
                names[name] = None
    return list(names)


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module inside a DDP wrapper (what checkpoints and evaluation use)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


@contextmanager
def eval_mode(module: nn.Module) -> Iterator[nn.Module]:
    """``module`` in eval mode inside the block; every submodule's own mode restored after.

    Not ``module.train(previous)``: that would also reset submodules that were deliberately in
    another mode (a frozen batch norm inside a training model).
    """
    modes = [(sub, sub.training) for sub in module.modules()]
    module.eval()
    try:
        yield module
    finally:
        for sub, training in modes:
            sub.training = training


def autocast_dtype(amp: Literal["auto", "bf16", "off"], device: torch.device) -> torch.dtype | None:
    """Decide the precision once: bf16 autocast on a GPU that has bf16 when ``auto``, else fp32.

    Returns the autocast dtype, or ``None`` for plain fp32.
    """
    if amp == "off":
        return None
    if amp == "bf16":
        return torch.bfloat16
    if amp == "auto":
        on_cuda = device.type == "cuda" and torch.cuda.is_bf16_supported()
        return torch.bfloat16 if on_cuda else None
    raise ValueError(f"amp must be 'auto', 'bf16' or 'off', got {amp!r}")


def move_to_device(batch: Any, device: torch.device) -> Any:
    """Move tensors in nested tuples, lists and dicts (and objects with ``.to``, e.g. a PyG
    ``Batch``) to ``device``; other leaves are returned as they are."""
    if isinstance(batch, Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return {key: move_to_device(value, device) for key, value in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(move_to_device(value, device) for value in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_to_device(value, device) for value in batch)
    to = getattr(batch, "to", None)
    if not callable(to):
        return batch
    # PyG's Batch.to copies without non_blocking unless asked: from pageable or pinned memory
    # alike that copy makes the host wait for the GPU (seen under sync debug mode)
    takes = _takes_non_blocking(getattr(type(batch), "to", to))  # once per class, not per step
    return to(device, non_blocking=True) if takes else to(device)


@functools.lru_cache(maxsize=64)
def _takes_non_blocking(method: Callable[..., Any]) -> bool:
    """Whether ``method`` accepts a ``non_blocking`` keyword."""
    try:
        parameters = inspect.signature(method).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return False
    return "non_blocking" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )
