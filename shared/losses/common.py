"""What every loss shares: input checks, the reduction, fp32 maths and the type aliases.

Checks raise a ``ValueError`` that names the problem, never a traceback from deep inside torch.
They read shapes, dtypes and Python settings only, never a tensor's values: reading a value
makes the host wait for the device, and a loss runs at every training step. NaN or infinite
inputs are therefore not caught here; they make the loss non-finite, which the training loops
detect (one device-side flag, read on logging steps).

The loss maths runs in fp32 whatever the loop's autocast dtype (fp64 stays fp64):
:func:`autocast_off` around it, :func:`upcast` or :func:`l2_normalize` on its inputs.
"""

from __future__ import annotations

import math
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Literal, TypeAlias

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "REDUCTIONS",
    "Gather",
    "Reduction",
    "autocast_off",
    "check_block_size",
    "check_choice",
    "check_features",
    "check_gather",
    "check_generator",
    "check_labels",
    "check_positive",
    "check_reduction",
    "check_same_shape",
    "l2_normalize",
    "reduce",
    "upcast",
]

REDUCTIONS = ("mean", "sum", "none")
Reduction = Literal["mean", "sum", "none"]
# False, True (every rank's rows; the row counts are exchanged, which reads them on the host) or
# "equal" (every rank holds as many rows as this one: nothing is exchanged or read back)
Gather: TypeAlias = bool | Literal["equal"]


def autocast_off(x: Tensor) -> AbstractContextManager[Any]:
    """Disable autocast for the loss maths: logits are fp32 whatever the loop's precision."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.autocast(device_type=x.device.type, enabled=False)
    return nullcontext()


def upcast(x: Tensor) -> Tensor:
    """fp32 for the loss maths whatever the autocast dtype (fp64 stays fp64)."""
    return x if x.dtype == torch.float64 else x.float()


def l2_normalize(x: Tensor) -> Tensor:
    """L2-normalise in fp32 (fp64 stays fp64): logits are never computed in half precision."""
    return F.normalize(upcast(x), dim=-1)


def check_features(x: object, name: str, ndim: int) -> Tensor:
    """``x`` must be a floating tensor of rank ``ndim`` with a non-empty feature dim.

    Its values are not read (see the module docstring): finiteness is the loop's check.
    """
    if not isinstance(x, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating tensor, got dtype {x.dtype}")
    if x.shape[-1] == 0:
        raise ValueError(f"{name} has an empty feature dim: shape {tuple(x.shape)}")
    return x


def check_same_shape(a: Tensor, b: Tensor, names: str) -> None:
    if a.shape != b.shape:
        raise ValueError(
            f"{names} must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}"
        )


def check_labels(labels: object, n: int, name: str = "labels") -> Tensor:
    """Integer class labels, one per sample."""
    if not isinstance(labels, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(labels).__name__}")
    if labels.ndim != 1 or labels.shape[0] != n:
        raise ValueError(
            f"{name} must have shape ({n},) to match the batch, got {tuple(labels.shape)}"
        )
    if labels.is_floating_point() or labels.is_complex():
        raise ValueError(f"{name} must be integers, got dtype {labels.dtype}")
    return labels.long()


def check_gather(gather: object) -> bool | Literal["equal"]:
    """``False``, ``True`` (every rank's rows, sizes exchanged) or ``"equal"`` (every rank holds
    the same number of rows: no size exchange, no host read)."""
    if gather not in (False, True, "equal") or not isinstance(gather, (bool, str)):
        raise ValueError(f"gather must be a bool or 'equal', got {gather!r}")
    return "equal" if gather == "equal" else bool(gather)


def check_positive(value: float, name: str) -> float:
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def check_block_size(block_size: int | None) -> int | None:
    """``None`` (automatic) or a positive number of anchor rows per block."""
    if block_size is not None and (
        isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1
    ):
        raise ValueError(f"block_size must be a positive int or None, got {block_size!r}")
    return block_size


def check_generator(generator: torch.Generator | None, x: Tensor, name: str) -> None:
    """A generator draws on its own kind of device only: say so instead of a traceback from torch.

    Only the device type is compared, as torch does: ``torch.Generator(device="cuda")`` has no
    index and serves every CUDA device.
    """
    if generator is not None and generator.device.type != x.device.type:
        raise ValueError(
            f"generator is on device {generator.device} but {name} is on device {x.device}; "
            f"pass a torch.Generator(device={str(x.device)!r})"
        )


def check_reduction(reduction: str) -> str:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    return reduction


def check_choice(value: str, choices: tuple[str, ...], name: str) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def reduce(per_row: Tensor, reduction: str, valid: Tensor | None = None) -> Tensor:
    """Mean over the valid rows (0 when none is), sum, or the rows themselves (0 where invalid).

    An empty ``per_row`` gives 0 for "mean" and "sum", still attached to ``per_row``'s graph
    (the empty-batch rule of :mod:`shared.losses.core`).
    """
    if valid is not None:
        per_row = torch.where(valid, per_row, torch.zeros_like(per_row))
    if reduction == "none":
        return per_row
    if reduction == "sum":
        return per_row.sum()
    if valid is None:  # a Python count: no host-to-device copy
        return per_row.sum() / max(per_row.numel(), 1)
    return per_row.sum() / valid.sum().clamp(min=1)


# On CUDA small blocks leave the GPU waiting on kernel launches: at N = 16384 and 65536
# (D = 128, fp32, one H200) the CPU's 8 MiB blocks cost 9× the three N×N×D products any exact
# method does, and blocks of 4096 anchor rows 1.9× and 1.7×. So there: 4096 rows, at most
# 2**28 elements (1 GiB in fp32).
CUDA_BLOCK_ROWS = 4096
CUDA_BLOCK_ELEMENTS = 2**28


def auto_block_rows(columns: int, device: torch.device, cpu_elements: int) -> int:
    """Anchor rows per block of the blockwise path when ``block_size`` is ``None``: about
    ``cpu_elements`` logits on a CPU, ``CUDA_BLOCK_ROWS`` rows (within ``CUDA_BLOCK_ELEMENTS``)
    on CUDA."""
    if device.type == "cuda":
        return max(1, min(CUDA_BLOCK_ROWS, CUDA_BLOCK_ELEMENTS // max(columns, 1)))
    return max(1, cpu_elements // max(columns, 1))
