"""Count the ops that make the host wait for the device (test utility).

On CUDA a handful of ATen ops cannot return before the device has finished: they read a
tensor's value on the host (``.item()``, ``float(t)``, ``bool(t)``, ``torch.equal``) or need
a data-dependent output size (``nonzero``, ``unique``, ``masked_select``, boolean-mask
indexing, ``repeat_interleave`` without ``output_size``). Each one stalls the launch queue.
``count_syncs`` records them on any device, so a CPU test can assert that a training step
has none::

    with count_syncs() as syncs:
        step()
    assert sum(syncs.values()) == 0, syncs

Ops issued from ``torch.optim`` and ``torch.utils.data`` are left out by default: the
optimizers' ``step`` counters and the data loader's indices live on the host even when the
model is on a GPU, so reading them is no device wait.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["SYNC_OPS", "SyncCounter", "count_syncs"]

aten = torch.ops.aten

# Ops that always wait for the device, by overload packet.
SYNC_OPS: frozenset[str] = frozenset(
    {
        "aten._local_scalar_dense",  # .item(), float(t), int(t), bool(t)
        "aten.equal",
        "aten.is_nonzero",
        "aten.nonzero",
        "aten.argwhere",
        "aten.unique",
        "aten.unique_dim",
        "aten.unique_consecutive",
        "aten._unique",
        "aten._unique2",
        "aten.masked_select",
        "aten.bincount",  # the output length is max(input) + 1
    }
)

# Ops that wait only with some arguments: a bool/uint8 index, or no static output size.
_MASK_INDEX_OPS = frozenset(
    {"aten.index", "aten.index_put", "aten.index_put_", "aten._index_put_impl_"}
)
_REPEAT_OPS = frozenset({"aten.repeat_interleave"})

_HOST_SIDE_MODULES = ("torch.optim", "torch.utils.data")
# inside those, modules whose counters live on the device: AveragedModel's ``n_averaged`` is a
# buffer that moves with the model, and ``update_parameters`` reads it on the host every call
# (seen on an H200 under ``torch.cuda.set_sync_debug_mode("error")``: one wait per G step)
_DEVICE_SIDE_MODULES = ("torch.optim.swa_utils",)


def _has_mask_index(indices: Any) -> bool:
    """Whether an ``index``/``index_put`` index list holds a boolean (or uint8) mask."""
    if not isinstance(indices, (list, tuple)):
        return False
    return any(
        isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8)
        for index in indices
    )


def _in(name: str, modules: tuple[str, ...]) -> bool:
    return any(name == module or name.startswith(module + ".") for module in modules)


def _called_from(modules: tuple[str, ...]) -> bool:
    """Whether the innermost Python frame of ``modules`` (or their submodules) on the stack is
    not one of :data:`_DEVICE_SIDE_MODULES`, whose ops are counted wherever they are called."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if _in(name, _DEVICE_SIDE_MODULES):
            return False
        if _in(name, modules):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


class SyncCounter(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """A dispatch mode that counts host-synchronising ops into ``self.counts``.

    Args:
        ignore_modules: Python modules whose calls are not counted (their host-side
            counters are no device wait); matched as a prefix of ``__name__``.
    """

    def __init__(self, ignore_modules: tuple[str, ...] = _HOST_SIDE_MODULES) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.counts: Counter[str] = Counter()
        self.ignore_modules = ignore_modules

    def _is_sync(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        if name in SYNC_OPS:
            return True
        if name in _MASK_INDEX_OPS:
            indices = kwargs.get("indices", args[1] if len(args) > 1 else None)
            return _has_mask_index(indices)
        if name in _REPEAT_OPS:
            return kwargs.get("output_size") is None
        return False

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        name = str(func.overloadpacket)  # "aten.nonzero"
        if self._is_sync(name, args, kwargs) and not _called_from(self.ignore_modules):
            self.counts[name] += 1
        return func(*args, **kwargs)


@contextmanager
def count_syncs(
    ignore_modules: tuple[str, ...] = _HOST_SIDE_MODULES,
) -> Iterator[Counter[str]]:
    """Count the device→host waits of the code inside the ``with`` block.

    Args:
        ignore_modules: Python modules whose ops are left out; by default the optimizers and
            the data loader, whose step counters and indices are host tensors on any device.

    Yields:
        A ``Counter`` from op name (``"aten._local_scalar_dense"``, ``"aten.index"``, ...) to
        the number of calls; it is filled while the block runs.
    """
    mode = SyncCounter(ignore_modules)
    with mode:
        yield mode.counts
