"""MoCo's dictionary queue (He et al. 2020, Sec. 3.2): the last K keys, first in, first out.

The queue is part of the model's state: its keys, write pointer and fill count are persistent
buffers, so they go into ``state_dict()``, into every checkpoint, and move with ``.to(device)``;
a resumed run continues with exactly the negatives the uninterrupted run would have had. A MoCo
step uses the queue *before* adding the current keys (Algorithm 1)::

    loss = info_nce_loss(q, k, queue.negatives())  # (K, D) shared negatives
    queue.enqueue(k)                               # then the batch's keys join the queue

The pointer and the count are mirrored as Python ints, so :meth:`MemoryQueue.negatives` and
:meth:`MemoryQueue.enqueue` never read a device tensor back to the host; loading a state dict
refreshes the mirror.

Under DDP the queue is a buffer of the wrapped model, but :func:`shared.runtime.wrap_ddp` keeps
it out of DDP's per-forward broadcast of rank 0's buffers (``ddp_broadcast_buffers = False``):
``enqueue`` all-gathers every rank's keys, so every rank holds the same queue already, and
sending K×D floats from rank 0 at every forward would only cost bandwidth.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from shared.distributed import gather_no_grad
from shared.losses.common import l2_normalize

__all__ = ["MemoryQueue"]


class MemoryQueue(nn.Module):
    """The last ``size`` keys seen, detached, oldest first; every rank's keys under DDP.

    ``enqueue(keys)`` all-gathers the keys of every rank (rank 0's rows first, as
    :func:`shared.distributed.gather_no_grad` orders them), so every rank holds the same queue;
    with ``normalize=True`` (the default, as MoCo enqueues normalised keys) rows are
    L2-normalised in fp32 first (the losses normalise again, which changes nothing but
    rounding). A batch larger than the queue keeps its last ``size`` rows. Keys are cast to the
    buffer's dtype and device, which follow the module (``.to``, ``.double()``).

    Args:
        size: K, the number of keys kept (MoCo: 65536 on ImageNet).
        dim: D, the key dimension.
        normalize: L2-normalise keys on the way in.
        dtype, device: of the key buffer.

    Shape:
        buffers: ``keys`` ``(K, D)``, ``ptr`` and ``filled`` ``()`` (long);
        enqueue's keys: ``(B, D)``; negatives(): ``(min(enqueued, K), D)``.
    """

    keys: Tensor
    ptr: Tensor
    filled: Tensor
    # wrap_ddp leaves these buffers out of DDP's broadcast: enqueue keeps the ranks equal
    ddp_broadcast_buffers: ClassVar[bool] = False

    def __init__(
        self,
        size: int,
        dim: int,
        *,
        normalize: bool = True,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        for value, name in ((size, "size"), (dim, "dim")):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating dtype, got {dtype}")
        self.size, self.dim, self.normalize = size, dim, normalize
        self.register_buffer("keys", torch.zeros(size, dim, dtype=dtype, device=device))
        # slot of the next write; while the queue is not full it equals the fill count
        self.register_buffer("ptr", torch.zeros((), dtype=torch.long, device=device))
        self.register_buffer("filled", torch.zeros((), dtype=torch.long, device=device))
        self._ptr, self._filled = 0, 0

    @property
    def num_filled(self) -> int:
        """How many slots hold a key: ``min(keys enqueued so far, size)``."""
        return self._filled

    @torch.no_grad()
    def enqueue(self, keys: Tensor) -> None:
        """Append this batch's keys (every rank's, in rank order), dropping the oldest.

        A collective under DDP: every rank must call it, with any number of rows.

        Shape:
            keys: ``(B, D)`` on this rank, any B ≥ 0.
        """
        if not isinstance(keys, Tensor) or keys.ndim != 2 or keys.shape[1] != self.dim:
            shape = tuple(keys.shape) if isinstance(keys, Tensor) else type(keys).__name__
            raise ValueError(f"keys must have shape (B, {self.dim}), got {shape}")
        if not keys.is_floating_point():
            raise ValueError(f"keys must be a floating tensor, got dtype {keys.dtype}")
        new = gather_no_grad(keys.detach())  # (B, D), every rank's rows in rank order
        if self.normalize:
            new = l2_normalize(new)
        new = new.to(self.keys)  # (B, D) in the buffer's dtype and device
        B, K = new.shape[0], self.size
        if B == 0:
            return
        kept = new[-K:]  # (m, D), m = min(B, K): only the last K rows can survive
        m = kept.shape[0]
        start = (self._ptr + B - m) % K  # key number t lives in slot t mod K
        first = min(m, K - start)
        self.keys[start : start + first] = kept[:first]  # (first, D) up to the end
        self.keys[: m - first] = kept[first:]  # (m − first, D) wrapped to the front
        self._ptr, self._filled = (self._ptr + B) % K, min(self._filled + B, K)
        self.ptr.fill_(self._ptr)
        self.filled.fill_(self._filled)

    def negatives(self) -> Tensor:
        """The keys held, oldest first, as a copy (safe to keep while the queue moves on).

        Shape:
            result: ``(min(enqueued, K), D)``.
        """
        if self._filled < self.size:  # never wrapped: slots 0 … filled−1 in order
            return self.keys[: self._filled].clone()  # (filled, D)
        return torch.cat([self.keys[self._ptr :], self.keys[: self._ptr]])  # (K, D)

    def _load_from_state_dict(
        self,
        state_dict: Mapping[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        ptr_t = state_dict.get(f"{prefix}ptr", self.ptr)
        filled_t = state_dict.get(f"{prefix}filled", self.filled)
        if ptr_t.numel() == 1 and filled_t.numel() == 1:  # else the size check below reports
            ptr, filled = int(ptr_t), int(filled_t)  # once per load, not per step
            if not (0 <= filled <= self.size and 0 <= ptr < self.size) or (
                filled < self.size and ptr != filled
            ):
                error_msgs.append(
                    f"{prefix}ptr={ptr} and {prefix}filled={filled} are not a valid state of "
                    f"a MemoryQueue of size {self.size}"
                )
                return  # nothing loaded: the queue keeps its state
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        self._ptr, self._filled = int(self.ptr), int(self.filled)

    def extra_repr(self) -> str:
        return f"size={self.size}, dim={self.dim}, normalize={self.normalize}"
