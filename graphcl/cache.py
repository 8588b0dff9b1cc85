"""The on-disk cache of parsed molecule sources (:func:`graphcl.data.load_molecules`).

A parsed source is stored in ``cache_dir`` (default ``$CONTRASTKIT_CACHE`` if set, else
``~/.cache/contrastkit/graphcl``) under a key hashing the bytes of every file of the source, the
parse options and the layout's ``version`` (:func:`cache_path`), so a changed file or layout
misses. The file holds plain tensors and lists only, written atomically (:func:`write_state`)
and read with ``torch.load(weights_only=True)`` (:func:`read_state`); what they hold is
:mod:`graphcl.data`'s business. ``cache_dir=False`` turns the cache off.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import warnings
from pathlib import Path
from typing import Any, Literal

import torch

from graphcl.features import LAYOUTS
from graphcl.sources import Plan
from shared.checkpoint import atomic_write

__all__ = ["CACHE_FORMAT", "cache_folder", "cache_path", "read_state", "write_state"]

CACHE_FORMAT = 1


def cache_path(
    plan: Plan,
    smiles_column: str,
    targets: tuple[str, ...],
    layout: str,
    cache_dir: Path | Literal[False] | None,
) -> Path | None:
    """The cache file of a source read with these options, or None when the cache is off."""
    folder = cache_folder(cache_dir)
    if folder is None:
        return None
    key = _cache_key(plan, smiles_column, targets, layout)
    return folder / f"{_slug(plan.name)}-{key[:20]}.pt"


def write_state(path: Path, state: dict[str, Any]) -> None:
    """Store ``state`` (plain tensors and lists, weights-only loadable) atomically; a failure
    to write is a warning, not an error (the data was parsed all the same)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(path) as handle:
            torch.save({"format": CACHE_FORMAT, **state}, handle)
    except OSError as error:
        warnings.warn(
            f"could not write the molecule cache {path}: {error}", RuntimeWarning, stacklevel=3
        )


def read_state(path: Path) -> dict[str, Any] | None:
    """The state stored by :func:`write_state`, or None when the file is unreadable (a
    warning) or of another format."""
    try:
        state = torch.load(path, weights_only=True)
    except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as error:
        warnings.warn(
            f"ignoring unreadable molecule cache {path}: {error}", RuntimeWarning, stacklevel=3
        )
        return None
    if not isinstance(state, dict) or state.get("format") != CACHE_FORMAT:
        return None
    return state


def cache_folder(cache_dir: Path | Literal[False] | None) -> Path | None:
    """The cache's folder: ``cache_dir``, else ``$CONTRASTKIT_CACHE``, else the user's cache;
    None when ``cache_dir`` is False (no cache)."""
    if cache_dir is False:
        return None
    if cache_dir is None:
        env = os.environ.get("CONTRASTKIT_CACHE")
        cache_dir = Path(env) if env else Path.home() / ".cache" / "contrastkit" / "graphcl"
    return Path(cache_dir)


def _cache_key(plan: Plan, smiles_column: str, targets: tuple[str, ...], layout: str) -> str:
    digest = hashlib.sha256()
    options = {
        "format": CACHE_FORMAT,
        "source": plan.name,
        "smiles_column": smiles_column,
        "targets": list(targets),
        "task": plan.task,
        "dedup": plan.dedup,
        "layout": LAYOUTS[layout].version,
    }
    digest.update(json.dumps(options, sort_keys=True).encode())
    for path in plan.files:
        digest.update(path.name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
