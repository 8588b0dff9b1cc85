"""Safe files: atomic writes, weights-only checkpoints, safetensors encoders and RNG state.

A checkpoint is written to a temporary file in the same folder and renamed over the old one, so
a crash mid-write never destroys the last good checkpoint; loading uses
``torch.load(..., weights_only=True)`` only, so a checkpoint can never run code; exported encoders
are ``safetensors`` files. Because of ``weights_only``, a checkpoint holds tensors, primitives,
dicts, lists and tuples only, which is why the RNG states below are encoded as tensors rather
than pickled Python objects. See docs/architecture.md, "Safe files".
"""

from __future__ import annotations

import os
import pickle
import random
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import numpy as np
import safetensors
import safetensors.torch
import torch
from torch import Tensor, nn

__all__ = [
    "atomic_write",
    "export_encoder",
    "load_checkpoint",
    "load_encoder",
    "rng_state",
    "save_checkpoint",
    "set_rng_state",
]

PathLike = str | os.PathLike[str]


@contextmanager
def atomic_write(path: PathLike) -> Iterator[IO[bytes]]:
    """Open a temporary binary file that replaces ``path`` only if the block succeeds.

    The temporary file lives in the same folder (``os.replace`` is atomic only within one file
    system) and is flushed and fsynced before the rename, so after a crash ``path`` holds either
    the old or the new content in full, never a torn mix. On an exception the temporary file is
    removed and ``path`` is left untouched.
    """
    target = Path(path)
    if not target.parent.is_dir():
        raise FileNotFoundError(f"cannot write {target}: folder {target.parent} does not exist")
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w+b") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(target.parent)


def _fsync_dir(folder: Path) -> None:
    """Persist a rename: the directory entry itself must reach the disk (POSIX only)."""
    if os.name != "posix":
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(path: PathLike, state: Mapping[str, Any]) -> Path:
    """Write ``state`` to ``path`` atomically, refusing anything ``weights_only`` cannot load.

    The serialized file is checked with ``torch.serialization.get_unsafe_globals_in_checkpoint``
    before the rename, so a state holding arbitrary Python objects fails here, at save time,
    instead of on resume days later, and the previous checkpoint stays in place.
    """
    target = Path(path)
    with atomic_write(target) as handle:
        torch.save(dict(state), handle)
        handle.flush()
        handle.seek(0)
        unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(handle)
        if unsafe:
            raise ValueError(
                f"checkpoint {target} would not load with weights_only=True: it holds "
                f"{sorted(unsafe)}; store tensors, numbers, strings, lists and dicts only"
            )
        handle.seek(0, os.SEEK_END)
    return target


def load_checkpoint(
    path: PathLike, map_location: str | torch.device | None = "cpu"
) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint` with ``weights_only=True``.

    Raises ``FileNotFoundError`` for a missing file and ``ValueError`` naming the file for a
    truncated, corrupt or unsafe one.
    """
    source = Path(path)
    if not source.is_file():
        raise FileNotFoundError(f"checkpoint {source} does not exist")
    try:
        state = torch.load(source, map_location=map_location, weights_only=True)
    except (RuntimeError, pickle.UnpicklingError, EOFError, ValueError) as exc:
        raise ValueError(
            f"checkpoint {source} is corrupt or not weights-only loadable: {exc}"
        ) from exc
    if not isinstance(state, dict):
        raise ValueError(f"checkpoint {source} holds a {type(state).__name__}, expected a dict")
    return state


def export_encoder(
    module: nn.Module, path: PathLike, *, metadata: Mapping[str, str] | None = None
) -> Path:
    """Export ``module.state_dict()`` as a ``safetensors`` file, atomically.

    Tensors are copied to contiguous CPU memory first: safetensors refuses tensors that share
    storage (tied weights, views), and a copy makes every entry self-contained. ``metadata``
    (string to string, the safetensors header format) is stored beside the module's class name.
    """
    target = Path(path)
    header = {"format": "pt", "module": type(module).__qualname__}
    for key, value in (metadata or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ValueError(f"safetensors metadata must map str to str, got {key!r}: {value!r}")
        header[key] = value
    tensors = {
        name: tensor.detach().to("cpu").clone(memory_format=torch.contiguous_format)
        for name, tensor in module.state_dict().items()
    }
    with atomic_write(target) as handle:
        handle.write(safetensors.torch.save(tensors, metadata=header))
    return target


def load_encoder(module: nn.Module, path: PathLike, *, strict: bool = True) -> dict[str, str]:
    """Load a ``safetensors`` file from :func:`export_encoder` into ``module``; return its metadata.

    With ``strict=True`` (the default) missing or unexpected keys raise, as in
    ``nn.Module.load_state_dict``.
    """
    source = Path(path)
    if not source.is_file():
        raise FileNotFoundError(f"encoder file {source} does not exist")
    try:
        with safetensors.safe_open(str(source), framework="pt") as reader:
            meta = dict(reader.metadata() or {})
        tensors = safetensors.torch.load_file(str(source), device="cpu")
    except (safetensors.SafetensorError, OSError) as exc:
        raise ValueError(f"encoder file {source} is not a valid safetensors file: {exc}") from exc
    module.load_state_dict(tensors, strict=strict)
    return meta


def rng_state() -> dict[str, Tensor]:
    """Capture the torch CPU, CUDA (all devices), Python ``random`` and numpy RNG states as tensors.

    Tensors, not Python objects, so the state fits in a ``weights_only`` checkpoint.
    """
    version, internal, gauss_next = random.getstate()
    np_state = np.random.get_state(legacy=True)  # noqa: NPY002 - capturing the global state
    if not isinstance(np_state, tuple):
        raise TypeError("numpy returned a non-legacy RNG state; expected the MT19937 tuple")
    _, np_keys, np_pos, np_has_gauss, np_gauss = np_state
    state = {
        "torch": torch.get_rng_state(),
        "python": torch.tensor([version, *internal], dtype=torch.int64),
        "python_gauss": torch.tensor(
            [] if gauss_next is None else [gauss_next], dtype=torch.float64
        ),
        "numpy": torch.from_numpy(np.asarray(np_keys, dtype=np.int64)),
        "numpy_extra": torch.tensor([np_pos, np_has_gauss], dtype=torch.int64),
        "numpy_gauss": torch.tensor([np_gauss], dtype=torch.float64),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.stack(torch.cuda.get_rng_state_all())  # (devices, state_bytes)
    return state


def set_rng_state(state: Mapping[str, Tensor]) -> None:
    """Restore the RNG states captured by :func:`rng_state`.

    CUDA states are restored on as many devices as both the capture and this machine have; a
    CUDA state is ignored on a machine without CUDA (such a resume cannot be bit-exact anyway).
    """
    required = ("torch", "python", "python_gauss", "numpy", "numpy_extra", "numpy_gauss")
    missing = [key for key in required if key not in state]
    if missing:
        raise ValueError(f"RNG state lacks {missing}; it holds {sorted(state)}")
    torch.set_rng_state(state["torch"].to("cpu", torch.uint8))
    python = [int(v) for v in state["python"].tolist()]
    gauss = state["python_gauss"].tolist()
    random.setstate((python[0], tuple(python[1:]), gauss[0] if gauss else None))
    pos, has_gauss = (int(v) for v in state["numpy_extra"].tolist())
    np.random.set_state(  # noqa: NPY002 - restoring the global state
        (
            "MT19937",
            state["numpy"].numpy().astype(np.uint32),
            pos,
            has_gauss,
            float(state["numpy_gauss"].item()),
        )
    )
    if "cuda" in state and torch.cuda.is_available():
        saved = state["cuda"].to("cpu", torch.uint8)
        for device in range(min(saved.shape[0], torch.cuda.device_count())):
            torch.cuda.set_rng_state(saved[device], device)
