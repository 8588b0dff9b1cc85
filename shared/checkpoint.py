"""Safe files: atomic writes, weights-only checkpoints, safetensors encoders and RNG state.

A checkpoint is written to a temporary file in the same folder and renamed over the old one, so
a crash mid-write never destroys the last good checkpoint; loading uses
``torch.load(..., weights_only=True)`` only, so a checkpoint can never run code; exported encoders
are ``safetensors`` files. Because of ``weights_only``, a checkpoint holds tensors, primitives,
dicts, lists and tuples only, which is why the RNG states below are encoded as tensors rather
than pickled Python objects. See docs/architecture.md, "Safe files".
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import struct
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any

import numpy as np
import safetensors
import safetensors.torch
import torch
from torch import Tensor, nn

__all__ = [
    "append_whole",
    "atomic_write",
    "export_encoder",
    "load_checkpoint",
    "load_encoder",
    "load_state",
    "rng_state",
    "save_checkpoint",
    "set_rng_state",
    "writable_folder",
]

PathLike = str | os.PathLike[str]


@contextmanager
def atomic_write(path: PathLike) -> Iterator[IO[bytes]]:
    """Open a temporary binary file that replaces ``path`` only if the block succeeds.

    The temporary file lives in the same folder (``os.replace`` is atomic only within one file
    system) and is flushed and fsynced before the rename, so after a crash ``path`` holds either
    the old or the new content in full, never a torn mix. On an exception the temporary file is
    removed and ``path`` is left untouched. A write that fails (a full disk, a read-only folder)
    raises an ``OSError`` naming ``path`` and the cause, also where ``torch.save`` turned it
    into its own ``RuntimeError``.
    """
    target = Path(path)
    if not target.parent.is_dir():
        raise FileNotFoundError(f"cannot write {target}: folder {target.parent} does not exist")
    try:
        fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as exc:
        raise _write_error(target, exc) from exc
    tmp = Path(tmp_name)
    try:
        # mkstemp makes the file private (0600); give it the mode the file had, or the mode a
        # plain open() would give it, so a shared run folder stays readable to its group.
        os.fchmod(fd, target.stat().st_mode & 0o7777 if target.exists() else _default_mode())
        with os.fdopen(fd, "w+b") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        cause = _failed_write(exc)
        if cause is None:
            raise
        raise _write_error(target, cause) from exc
    _fsync_dir(target.parent)


def _default_mode() -> int:
    """``0o666`` less the process's umask: the mode ``open(path, "w")`` creates a file with."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _failed_write(exc: BaseException) -> OSError | None:
    """The ``OSError`` behind ``exc``: itself, or what ``torch.save``'s ``RuntimeError`` hides
    (its file writer reports a failed ``write`` as ``unexpected pos ...``)."""
    if isinstance(exc, OSError):
        return exc
    if isinstance(exc, RuntimeError) and isinstance(exc.__context__, OSError):
        return exc.__context__
    return None


def _write_error(target: Path, exc: OSError) -> OSError:
    """``exc`` naming the file meant (not its temporary twin); the same ``errno``, so the same
    ``OSError`` subclass (``PermissionError``, ...)."""
    return OSError(exc.errno, f"cannot write {target}: {exc.strerror or exc}")


def append_whole(path: PathLike, data: bytes) -> None:
    """Append ``data`` to the file ``path``; a write that fails (a full disk) is cut off again.

    A full disk may take part of ``data`` before it fails: the file is truncated back to its
    old length, so it never ends in a torn record, and the ``OSError`` names the file.
    """
    target = Path(path)
    size = target.stat().st_size
    try:
        with target.open("ab") as handle:
            handle.write(data)
    except OSError as exc:
        with suppress(OSError):
            os.truncate(target, size)
        raise _write_error(target, exc) from exc


def writable_folder(path: PathLike) -> Path:
    """Create the folder ``path`` (and its parents) and check that files can be created in it.

    A probe file is created and removed, as a write would be: ``os.access`` says yes to root
    in a ``chmod 0o555`` folder. Raises an ``OSError`` naming the folder and the cause
    (``Permission denied``, ``Read-only file system``, ...).
    """
    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-check-", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot write in the folder {folder}: {exc.strerror}") from exc
    return folder


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
    if source.stat().st_size == 0:
        raise ValueError(f"checkpoint {source} is empty (0 bytes): not a checkpoint")
    try:
        state = torch.load(source, map_location=map_location, weights_only=True)
    except (RuntimeError, pickle.UnpicklingError, EOFError, ValueError) as exc:
        raise ValueError(f"checkpoint {source} {_load_problem(exc)}") from exc
    if not isinstance(state, dict):
        raise ValueError(f"checkpoint {source} holds a {type(state).__name__}, expected a dict")
    return state


def _load_problem(exc: BaseException) -> str:
    """One line for what ``torch.load(weights_only=True)`` refused (its own text spans several
    lines and suggests ``weights_only=False``, which would run whatever the pickle says)."""
    text = str(exc)
    unsafe = re.search(r"GLOBAL ([\w.]+)", text)
    if unsafe:
        return (
            f"refers to the Python object {unsafe.group(1)}, which a weights-only checkpoint "
            "cannot hold: refused, nothing in it was run"
        )
    if "WeightsUnpickler error:" in text:
        detail = text.split("WeightsUnpickler error:", 1)[1]
    else:
        detail = text
    lines = [line.strip() for line in detail.splitlines() if line.strip()]
    first = lines[0].split(". ")[0] if lines else type(exc).__name__
    return f"is truncated or corrupt, not a complete torch.save file ({first})"


def load_state(
    module: nn.Module, state: Mapping[str, Any], *, source: str, strict: bool = True
) -> None:
    """``module.load_state_dict(state, strict=strict)``; a mismatch is one ``ValueError`` line.

    ``load_state_dict`` raises a ``RuntimeError`` listing every missing, unexpected and
    mis-shaped tensor over many lines; this names ``source`` and says how many of each, with
    the first few names.
    """
    try:
        module.load_state_dict(state, strict=strict)
    except RuntimeError as exc:
        own = module.state_dict()
        problems = []
        missing = [key for key in own if key not in state]
        unexpected = [key for key in state if key not in own]
        if strict and missing:
            problems.append(f"missing {len(missing)} tensor(s) ({_few(missing)})")
        if strict and unexpected:
            problems.append(f"{len(unexpected)} unexpected tensor(s) ({_few(unexpected)})")
        shapes = [
            f"{key} {tuple(value.shape)} where the model has {tuple(own[key].shape)}"
            for key, value in state.items()
            if isinstance(value, Tensor)
            and isinstance(own.get(key), Tensor)
            and value.shape != own[key].shape
        ]
        if shapes:
            problems.append(f"wrong shape of {len(shapes)} tensor(s): {_few(shapes)}")
        if not problems:
            problems.append(str(exc).strip().splitlines()[0])
        raise ValueError(
            f"{source} does not fit {type(module).__name__}: {'; '.join(problems)}"
        ) from exc


def _few(names: list[str], count: int = 3) -> str:
    more = f", ... {len(names) - count} more" if len(names) > count else ""
    return ", ".join(names[:count]) + more


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
        handle.write(_sorted_metadata(safetensors.torch.save(tensors, metadata=header)))
    return target


def _sorted_metadata(blob: bytes) -> bytes:
    """``blob`` (a serialised safetensors file) with its ``__metadata__`` keys in sorted order.

    safetensors writes the metadata from a hash map, so the same export gets its keys in a
    different order in every process and two exports of equal weights differ in bytes. The
    header is JSON after an 8-byte little-endian length and padded with spaces; the sorted
    header has the same characters, so it is padded to the same length and the tensor data
    after it is unchanged.
    """
    (length,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + length])
    if "__metadata__" in header:
        header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if len(text) > length:  # an escape spelled differently from safetensors': keep its header
        return blob
    return blob[:8] + text.ljust(length, b" ") + blob[8 + length :]


def load_encoder(module: nn.Module, path: PathLike, *, strict: bool = True) -> dict[str, str]:
    """Load a ``safetensors`` file from :func:`export_encoder` into ``module``; return its metadata.

    With ``strict=True`` (the default) missing or unexpected keys raise, as in
    ``nn.Module.load_state_dict``, but as one ``ValueError`` line (:func:`load_state`).
    """
    source = Path(path)
    if not source.is_file():
        raise FileNotFoundError(f"encoder file {source} does not exist")
    if source.stat().st_size == 0:
        raise ValueError(f"encoder file {source} is empty (0 bytes): not a safetensors file")
    try:
        with safetensors.safe_open(str(source), framework="pt") as reader:
            meta = dict(reader.metadata() or {})
        tensors = safetensors.torch.load_file(str(source), device="cpu")
    except (safetensors.SafetensorError, OSError) as exc:
        raise ValueError(f"encoder file {source} is not a valid safetensors file: {exc}") from exc
    load_state(module, tensors, source=f"encoder file {source}", strict=strict)
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
