"""A molecule corpus featurised once into shards of flat arrays, built in worker processes.

A corpus of a million molecules does not fit the per-molecule path of :mod:`graphcl.data` (one
``Data`` per molecule, parsed in the main process, one file for the whole set): parsing alone
takes most of an hour on one core, and 1.5 M ``Data`` objects hold several GB. Here the rows
are cut into chunks of :data:`ROWS_PER_SHARD`, and each chunk is parsed and featurised by a
worker process into its own shard folder:

- ``x.npy`` ``(n_atoms, F_atom)``, ``edge_index.npy`` ``(2, n_edges)`` (atom indices local to
  the molecule), ``edge_attr.npy`` ``(n_edges, F_bond)``: the categorical features of
  :func:`graphcl.features.featurize`, in the smallest unsigned integer type that holds them;
- ``node_ptr.npy``, ``edge_ptr.npy`` ``(m + 1,)`` int64: where each molecule's atoms and edges
  start; ``smiles.npy`` (UTF-8 bytes) and ``smiles_ptr.npy``: the canonical SMILES;
- ``meta.json``, written last: the rows it covers, the skipped records (where, text, reason)
  and, per array, its shape, dtype and BLAKE2b digest.

A shard is written into a temporary folder and renamed into place, so a shard folder that
exists is complete. An interrupted build resumes from its finished shards; a shard whose
files do not match their digests (a damaged disk, a truncated copy) is reported and rebuilt,
never read. The store's folder is keyed like :mod:`graphcl.cache`: the source's bytes, the
rows chosen, the layout's version and :data:`SHARD_FORMAT`.

A finished store opens in seconds (:mod:`graphcl.sharded`): the arrays are memory-mapped and
batches are sliced from them, without a ``Data`` per molecule.
"""

from __future__ import annotations

import hashlib
import json
import math
import multiprocessing
import os
import shutil
import sys
import uuid
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from graphcl.features import LAYOUTS, featurize, quiet_rdkit
from graphcl.sources import parse_smiles
from shared.checkpoint import atomic_write

__all__ = [
    "ARRAYS",
    "ROWS_PER_SHARD",
    "SHARD_FORMAT",
    "BuildStats",
    "build_store",
    "chunks",
    "store_folder",
    "verify_shard",
]

SHARD_FORMAT = 1  # bump when the files of a shard change
ROWS_PER_SHARD = 20_000
ARRAYS = ("x", "edge_index", "edge_attr", "node_ptr", "edge_ptr", "smiles", "smiles_ptr")


class BuildStats(NamedTuple):
    """What :func:`build_store` did: shards built now and found finished, molecules featurised
    now, seconds spent, the damaged shards it rebuilt (their names), and the peak resident
    memory (MiB) of this process and of the largest worker process so far (NaN when every
    shard was built in this process: no worker ran)."""

    built: int
    reused: int
    molecules: int
    seconds: float
    damaged: tuple[str, ...]
    peak_rss_mib: float
    worker_peak_rss_mib: float


def store_folder(
    cache_root: Path, name: str, key_parts: dict[str, Any], files: Sequence[Path]
) -> Path:
    """The folder of a store: ``<name>-<key>`` under ``cache_root``, the key hashing
    ``key_parts`` (options, rows), the shard format and every file's name and bytes."""
    digest = hashlib.sha256()
    digest.update(json.dumps({"format": SHARD_FORMAT, **key_parts}, sort_keys=True).encode())
    for path in files:
        digest.update(path.name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    slug = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
    return cache_root / f"{slug}-shards-{digest.hexdigest()[:20]}"


# --------------------------------------------------------------------------- building


def _digest(path: Path) -> str:
    digest = hashlib.blake2b(digest_size=16)
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _smallest_unsigned(values: np.ndarray) -> np.ndarray:
    top = int(values.max()) if values.size else 0
    if int(values.min(initial=0)) < 0:
        return values.astype(np.int64)
    for dtype in (np.uint8, np.uint16, np.uint32):
        if top <= np.iinfo(dtype).max:
            return values.astype(dtype)
    return values.astype(np.int64)


def _featurise_rows(
    texts: Sequence[str], lines: Sequence[int], label: str, layout: str
) -> tuple[dict[str, np.ndarray], list[list[str]]]:
    """The arrays of one shard and its skipped records (``label:line``, text, reason)."""
    features = LAYOUTS[layout]
    xs: list[Tensor] = []
    edges: list[Tensor] = []
    attrs: list[Tensor] = []
    smiles: list[bytes] = []
    skipped: list[list[str]] = []
    with quiet_rdkit():
        for text, line in zip(texts, lines, strict=True):
            mol, reason = parse_smiles(text)
            graph = None if mol is None else featurize(mol, layout)
            if graph is None:
                skipped.append([f"{label}:{line}", text, reason or "empty molecule: no atoms"])
                continue
            xs.append(graph.x)
            edges.append(graph.edge_index)
            attrs.append(graph.edge_attr)
            smiles.append(graph.smiles.encode())
    nodes = np.array([0, *(len(x) for x in xs)], dtype=np.int64).cumsum()
    edge_counts = np.array([0, *(e.shape[1] for e in edges)], dtype=np.int64).cumsum()
    text_ptr = np.array([0, *(len(s) for s in smiles)], dtype=np.int64).cumsum()
    num_atom, num_bond = len(features.atom_vocab), len(features.bond_vocab)
    arrays = {
        "x": _smallest_unsigned(torch.cat(xs).numpy() if xs else np.zeros((0, num_atom), np.int64)),
        "edge_index": _smallest_unsigned(
            torch.cat(edges, dim=1).numpy() if edges else np.zeros((2, 0), np.int64)
        ),
        "edge_attr": _smallest_unsigned(
            torch.cat(attrs).numpy() if attrs else np.zeros((0, num_bond), np.int64)
        ),
        "node_ptr": nodes,
        "edge_ptr": edge_counts,
        "smiles": np.frombuffer(b"".join(smiles), dtype=np.uint8).copy(),
        "smiles_ptr": text_ptr,
    }
    return arrays, skipped


def _write_shard(
    folder: Path,
    rows: tuple[int, int],
    texts: Sequence[str],
    lines: Sequence[int],
    label: str,
    layout: str,
) -> int:
    """Featurise ``texts`` into the shard ``folder`` (temporary folder, then a rename);
    returns the molecules it holds."""
    arrays, skipped = _featurise_rows(texts, lines, label, layout)
    partial = folder.parent / f".{folder.name}.partial-{uuid.uuid4().hex[:8]}"
    partial.mkdir(parents=True)
    try:
        files = {}
        for name in ARRAYS:
            with atomic_write(partial / f"{name}.npy") as handle:
                np.save(handle, arrays[name], allow_pickle=False)
            files[name] = {
                "shape": list(arrays[name].shape),
                "dtype": arrays[name].dtype.str,
                "blake2b": _digest(partial / f"{name}.npy"),
            }
        molecules = len(arrays["node_ptr"]) - 1
        meta = {
            "format": SHARD_FORMAT,
            "rows": list(rows),
            "molecules": molecules,
            "skipped": skipped,
            "files": files,
        }
        with atomic_write(partial / "meta.json") as handle:
            handle.write(json.dumps(meta).encode())
        if folder.exists():  # a damaged shard that is being replaced
            shutil.rmtree(folder)
        os.replace(partial, folder)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return molecules


def _shard_job(
    job: tuple[str, tuple[int, int], list[str], list[int], str, str],
) -> tuple[int, int, float]:
    """A worker's unit: one shard. Returns (rows featurised, molecules kept, the peak resident
    memory of the process that built it, MiB)."""
    folder, rows, texts, lines, label, layout = job
    torch.set_num_threads(1)
    molecules = _write_shard(Path(folder), rows, texts, lines, label, layout)
    return len(texts), molecules, _own_peak_rss_mib()


def verify_shard(folder: Path, rows: tuple[int, int]) -> str:
    """Why the shard ``folder`` cannot be used ("" when it is complete and every file matches
    its digest): missing, of another format or rows, a file missing, resized or changed."""
    meta_path = folder / "meta.json"
    if not meta_path.is_file():
        return "missing"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if meta.get("format") != SHARD_FORMAT or tuple(meta["rows"]) != tuple(rows):
            return "of another format or rows"
        for name in ARRAYS:
            path, entry = folder / f"{name}.npy", meta["files"][name]
            if not path.is_file():
                return f"{path.name} is missing"
            if _digest(path) != entry["blake2b"]:
                return f"{path.name} does not match its digest"
    except (OSError, ValueError, KeyError, TypeError) as error:
        return f"meta.json is unreadable ({error})"
    return ""


def chunks(total: int, per_shard: int) -> list[tuple[int, int]]:
    return [(start, min(start + per_shard, total)) for start in range(0, total, per_shard)]


def build_store(
    folder: Path,
    texts: Sequence[str],
    lines: Sequence[int] | np.ndarray,
    label: str,
    layout: str,
    *,
    workers: int | None = None,
    per_shard: int = ROWS_PER_SHARD,
    progress: bool = True,
) -> BuildStats:
    """Featurise ``texts`` (SMILES; row i is on line ``lines[i]`` of the file ``label``, for the
    skipped list) into the shards of ``folder``; finished shards are kept, damaged ones rebuilt.

    Args:
        workers: processes that featurise shards; None: every CPU core (one process when one
            shard is left, or ``workers`` is 1: in this process, no pool)
        per_shard: rows per shard (part of the store's layout: a folder is built with one value)
        progress: a tqdm bar of molecules on stderr
    """
    import time

    from tqdm.auto import tqdm

    start = time.perf_counter()
    if layout not in LAYOUTS:
        raise ValueError(f"unknown feature layout {layout!r}; choose one of {sorted(LAYOUTS)}")
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_write(folder / "store.json") as handle:
        store = {"format": SHARD_FORMAT, "rows": len(texts), "per_shard": per_shard}
        handle.write(json.dumps(store).encode())
    for stale in folder.glob(".shard-*.partial-*"):  # a build killed mid-shard
        shutil.rmtree(stale, ignore_errors=True)
    every_shard = chunks(len(texts), per_shard)
    todo: list[tuple[Path, tuple[int, int]]] = []
    damaged: list[str] = []
    for index, rows in enumerate(every_shard):
        shard = folder / f"shard-{index:05d}"
        why = verify_shard(shard, rows) if shard.exists() else "missing"
        if why and why != "missing":
            damaged.append(shard.name)
            warnings.warn(
                f"molecule shard {shard} is damaged ({why}); rebuilding it",
                RuntimeWarning,
                stacklevel=2,
            )
        if why:
            todo.append((shard, rows))

    def jobs() -> Iterator[tuple[str, tuple[int, int], list[str], list[int], str, str]]:
        # made one at a time as workers ask for them: one shard's rows in flight per worker
        for shard, (a, b) in todo:
            texts_of, lines_of = list(texts[a:b]), [int(n) for n in lines[a:b]]
            yield str(shard), (a, b), texts_of, lines_of, label, layout

    cores = workers or os.cpu_count() or 1
    bar = tqdm(
        total=sum(b - a for _, (a, b) in todo),
        unit="mol",
        desc="featurising",
        disable=not progress or not todo,
    )
    kept = 0
    worker_peak = float("nan")  # no worker ran (yet)
    pooled = cores > 1 and len(todo) > 1
    try:
        if not pooled:
            for job in jobs():
                rows_done, molecules, _ = _shard_job(job)
                kept += molecules
                bar.update(rows_done)
        else:
            context = multiprocessing.get_context("spawn")  # no forked torch/OpenMP state
            with context.Pool(min(cores, len(todo))) as pool:
                for rows_done, molecules, peak in pool.imap_unordered(_shard_job, jobs()):
                    kept += molecules
                    worker_peak = peak if math.isnan(worker_peak) else max(worker_peak, peak)
                    bar.update(rows_done)
    finally:
        bar.close()
    return BuildStats(
        len(todo),
        len(every_shard) - len(todo),
        kept,
        time.perf_counter() - start,
        tuple(damaged),
        _own_peak_rss_mib(),
        worker_peak,
    )


def _own_peak_rss_mib() -> float:
    """This process's peak resident memory in MiB: Linux's ``VmHWM``, which ``exec`` resets
    (a spawned worker's ``ru_maxrss`` still counts the parent's pages it held between fork and
    exec), else ``getrusage`` (macOS reports bytes); NaN where neither exists (Windows)."""
    try:
        for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 2**10, 1)  # kB
    except OSError:
        pass
    try:
        import resource
    except ImportError:
        return float("nan")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (2**20 if sys.platform == "darwin" else 2**10), 1)
