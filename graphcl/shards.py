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

A finished store opens in seconds: the arrays are memory-mapped, and :class:`ShardedGraphs`
(a ``Sequence[Data]``) builds a graph only when one is asked for. Training never builds one:
:meth:`ShardedGraphs.collate` slices the arrays of a batch's molecules straight into the
``Batch`` that ``Batch.from_data_list`` makes of the same graphs.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import sys
import uuid
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple, overload

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Batch, Data

from graphcl.collation import set_collation, set_node_counts
from graphcl.features import LAYOUTS, featurize, quiet_rdkit
from graphcl.sources import parse_smiles

__all__ = [
    "ROWS_PER_SHARD",
    "SHARD_FORMAT",
    "BuildStats",
    "ShardedGraphs",
    "ShardedSmiles",
    "build_store",
    "open_store",
    "store_folder",
    "verify_shard",
]

SHARD_FORMAT = 1  # bump when the files of a shard change
ROWS_PER_SHARD = 20_000
_ARRAYS = ("x", "edge_index", "edge_attr", "node_ptr", "edge_ptr", "smiles", "smiles_ptr")


class BuildStats(NamedTuple):
    """What :func:`build_store` did: shards built now and found finished, molecules featurised
    now, seconds spent, the damaged shards it rebuilt (their names), and the peak resident
    memory (MiB) of this process and of the largest worker process so far."""

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
        for name in _ARRAYS:
            np.save(partial / f"{name}.npy", arrays[name], allow_pickle=False)
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
        (partial / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
        if folder.exists():  # a damaged shard that is being replaced
            shutil.rmtree(folder)
        os.replace(partial, folder)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return molecules


def _shard_job(job: tuple[str, tuple[int, int], list[str], list[int], str, str]) -> tuple[int, int]:
    """A worker's unit: one shard. Returns (rows featurised, molecules kept)."""
    folder, rows, texts, lines, label, layout = job
    torch.set_num_threads(1)
    return len(texts), _write_shard(Path(folder), rows, texts, lines, label, layout)


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
        for name in _ARRAYS:
            path, entry = folder / f"{name}.npy", meta["files"][name]
            if not path.is_file():
                return f"{path.name} is missing"
            if _digest(path) != entry["blake2b"]:
                return f"{path.name} does not match its digest"
    except (OSError, ValueError, KeyError, TypeError) as error:
        return f"meta.json is unreadable ({error})"
    return ""


def _chunks(total: int, per_shard: int) -> list[tuple[int, int]]:
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
    (folder / "store.json").write_text(
        json.dumps({"format": SHARD_FORMAT, "rows": len(texts), "per_shard": per_shard}),
        encoding="utf-8",
    )
    for stale in folder.glob(".shard-*.partial-*"):  # a build killed mid-shard
        shutil.rmtree(stale, ignore_errors=True)
    chunks = _chunks(len(texts), per_shard)
    todo: list[tuple[Path, tuple[int, int]]] = []
    damaged: list[str] = []
    for index, rows in enumerate(chunks):
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
    try:
        if cores == 1 or len(todo) <= 1:
            for job in jobs():
                rows_done, molecules = _shard_job(job)
                kept += molecules
                bar.update(rows_done)
        else:
            context = multiprocessing.get_context("spawn")  # no forked torch/OpenMP state
            with context.Pool(min(cores, len(todo))) as pool:
                for rows_done, molecules in pool.imap_unordered(_shard_job, jobs()):
                    kept += molecules
                    bar.update(rows_done)
    finally:
        bar.close()
    return BuildStats(
        len(todo),
        len(chunks) - len(todo),
        kept,
        time.perf_counter() - start,
        tuple(damaged),
        _peak_rss_mib(children=False),
        _peak_rss_mib(children=True),
    )


def _peak_rss_mib(*, children: bool) -> float:
    """The peak resident memory of this process or of its largest finished child, in MiB
    (Linux reports KiB, macOS bytes); NaN where the platform has no ``resource`` (Windows)."""
    try:
        import resource
    except ImportError:
        return float("nan")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF)
    return round(peak.ru_maxrss / (2**20 if sys.platform == "darwin" else 2**10), 1)


# --------------------------------------------------------------------------- reading


class _Shard(NamedTuple):
    x: np.ndarray
    edge_index: np.ndarray
    edge_attr: np.ndarray
    node_ptr: np.ndarray
    edge_ptr: np.ndarray
    smiles: np.ndarray
    smiles_ptr: np.ndarray


def _open_shard(folder: Path) -> tuple[_Shard, list[list[str]]]:
    meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    arrays = {name: np.load(folder / f"{name}.npy", mmap_mode="r") for name in _ARRAYS}
    for name, entry in meta["files"].items():
        if list(arrays[name].shape) != entry["shape"] or arrays[name].dtype.str != entry["dtype"]:
            raise ValueError(f"molecule shard {folder}: {name}.npy is not what meta.json says")
    return _Shard(**arrays), meta["skipped"]


class ShardedGraphs(Sequence[Data]):
    """The molecules of a store as a read-only ``Sequence[Data]``, memory-mapped.

    ``graphs[i]`` builds molecule i's ``Data`` (``x``, ``edge_index``, ``edge_attr`` long,
    ``smiles``, ``num_nodes``, as :func:`graphcl.features.featurize` made it);
    :meth:`collate` builds a batch without them; :meth:`subset` is a view of some molecules.
    """

    def __init__(self, shards: list[_Shard], ids: np.ndarray | None = None) -> None:
        self._shards = shards
        counts = np.array([len(s.node_ptr) - 1 for s in shards], dtype=np.int64)
        self._starts = np.concatenate([[0], counts.cumsum()])  # (S + 1,) first global id
        self._ids = np.arange(self._starts[-1]) if ids is None else ids  # (N,) global ids

    def __len__(self) -> int:
        return len(self._ids)

    @overload
    def __getitem__(self, index: int) -> Data: ...
    @overload
    def __getitem__(self, index: slice) -> ShardedGraphs: ...
    def __getitem__(self, index: int | slice) -> Data | ShardedGraphs:
        if isinstance(index, slice):
            return self.subset(np.arange(len(self))[index])
        if not -len(self) <= index < len(self):
            raise IndexError(f"molecule {index} of {len(self)}")
        shard, local = self._locate(int(self._ids[index]))
        nodes, edges = (
            slice(*shard.node_ptr[local : local + 2]),
            slice(*shard.edge_ptr[local : local + 2]),
        )
        return Data(
            x=torch.from_numpy(shard.x[nodes].astype(np.int64)),
            edge_index=torch.from_numpy(shard.edge_index[:, edges].astype(np.int64)),
            edge_attr=torch.from_numpy(shard.edge_attr[edges].astype(np.int64)),
            smiles=self._smiles(shard, local),
            num_nodes=nodes.stop - nodes.start,
        )

    def __iter__(self) -> Iterator[Data]:
        for i in range(len(self)):
            yield self[i]

    def subset(self, positions: Sequence[int] | np.ndarray) -> ShardedGraphs:
        """The molecules at ``positions`` of this view, in that order."""
        return ShardedGraphs(self._shards, self._ids[np.asarray(positions, dtype=np.int64)])

    @property
    def smiles(self) -> ShardedSmiles:
        """The canonical SMILES of the molecules, decoded one at a time."""
        return ShardedSmiles(self)

    def smiles_at(self, index: int) -> str:
        shard, local = self._locate(int(self._ids[index]))
        return self._smiles(shard, local)

    def _locate(self, gid: int) -> tuple[_Shard, int]:
        s = int(np.searchsorted(self._starts, gid, side="right")) - 1
        return self._shards[s], gid - int(self._starts[s])

    @staticmethod
    def _smiles(shard: _Shard, local: int) -> str:
        a, b = shard.smiles_ptr[local : local + 2]
        return bytes(shard.smiles[a:b]).decode()

    def collate(self, positions: Sequence[int]) -> Batch:
        """The ``Batch`` that ``Batch.from_data_list([self[i] for i in positions])`` makes,
        sliced from the arrays (tensors, PyG's collation slices and increments, the node
        counts and SMILES alike); a DataLoader ``collate_fn`` over molecule positions.

        Vectorised per shard: the rows of every molecule of a shard are gathered with one
        fancy index per array, straight into their place in the batch.
        """
        gids = self._ids[np.asarray(positions, dtype=np.int64)]  # (G,) global ids
        which = np.searchsorted(self._starts, gids, side="right") - 1  # (G,) shard of each
        local = gids - self._starts[which]  # (G,) id within its shard
        num_graphs = len(gids)
        node_begin, sizes = np.zeros(num_graphs, np.int64), np.zeros(num_graphs, np.int64)
        edge_begin, edge_sizes = np.zeros(num_graphs, np.int64), np.zeros(num_graphs, np.int64)
        groups = [(int(s), np.flatnonzero(which == s)) for s in np.unique(which)]
        for s, members in groups:
            shard, ids = self._shards[s], local[members]
            node_begin[members], edge_begin[members] = shard.node_ptr[ids], shard.edge_ptr[ids]
            sizes[members] = shard.node_ptr[ids + 1] - node_begin[members]
            edge_sizes[members] = shard.edge_ptr[ids + 1] - edge_begin[members]
        node_offsets = np.concatenate([[0], sizes.cumsum()])  # (G + 1,)
        edge_offsets = np.concatenate([[0], edge_sizes.cumsum()])  # (G + 1,)
        first = self._shards[0]
        x = np.empty((node_offsets[-1], first.x.shape[1]), np.int64)  # (N, F_atom)
        edge_index = np.empty((2, edge_offsets[-1]), np.int64)  # (2, E)
        edge_attr = np.empty((edge_offsets[-1], first.edge_attr.shape[1]), np.int64)  # (E, F)
        smiles: list[str] = [""] * num_graphs
        for s, members in groups:
            shard = self._shards[s]
            rows = _ranges(node_begin[members], sizes[members])
            x[_ranges(node_offsets[members], sizes[members])] = shard.x[rows]
            rows = _ranges(edge_begin[members], edge_sizes[members])
            into = _ranges(edge_offsets[members], edge_sizes[members])
            edge_attr[into] = shard.edge_attr[rows]
            shift = np.repeat(node_offsets[members], edge_sizes[members])  # atoms before
            edge_index[:, into] = shard.edge_index[:, rows] + shift
            ids = local[members]
            text_begin, text_end = shard.smiles_ptr[ids], shard.smiles_ptr[ids + 1]
            text = shard.smiles[_ranges(text_begin, text_end - text_begin)].tobytes()
            cut = np.concatenate([[0], (text_end - text_begin).cumsum()]).tolist()
            for n, member in enumerate(members.tolist()):
                smiles[member] = text[cut[n] : cut[n + 1]].decode()
        node_slices = torch.from_numpy(node_offsets)  # (G + 1,)
        edge_slices = torch.from_numpy(edge_offsets)  # (G + 1,)
        starts = node_slices[:-1]  # (G,) atoms before each molecule
        counts = torch.from_numpy(sizes)
        batch_vector = torch.repeat_interleave(torch.arange(num_graphs), counts)
        out = Batch(
            x=torch.from_numpy(x),
            edge_index=torch.from_numpy(edge_index),
            edge_attr=torch.from_numpy(edge_attr),
            smiles=smiles,
            batch=batch_vector,
            ptr=node_slices.clone(),
        )
        sizes_list = sizes.tolist()
        set_node_counts(out, sizes_list)
        zeros = torch.zeros(num_graphs, dtype=torch.long)
        slices = {
            "x": node_slices,
            "edge_index": edge_slices,
            "edge_attr": edge_slices,
            "smiles": torch.arange(num_graphs + 1),
        }
        increments: dict[str, Tensor | None] = {
            "x": zeros,
            "edge_index": starts,
            "edge_attr": zeros.clone(),
            "smiles": None,
        }
        set_collation(out, slices, increments, num_graphs)
        return out


class ShardedSmiles(Sequence[str]):
    """The canonical SMILES of a :class:`ShardedGraphs`, decoded when read."""

    def __init__(self, graphs: ShardedGraphs) -> None:
        self._graphs = graphs

    def __len__(self) -> int:
        return len(self._graphs)

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> list[str]: ...
    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return [self._graphs.smiles_at(i) for i in range(len(self))[index]]
        if not -len(self) <= index < len(self):
            raise IndexError(f"molecule {index} of {len(self)}")
        return self._graphs.smiles_at(index % len(self))


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``concatenate([arange(a, a + n) for a, n in zip(starts, lengths)])`` without the loop."""
    ends = lengths.cumsum()
    total = int(ends[-1]) if len(ends) else 0
    return np.repeat(starts - (ends - lengths), lengths) + np.arange(total)


def open_store(
    folder: Path, *, verify: bool = True
) -> tuple[ShardedGraphs, list[tuple[str, str, str]]]:
    """The molecules of a finished store and its skipped records; every shard is verified
    first (:func:`verify_shard`), so a damaged one raises ValueError naming it. ``verify=False``
    right after :func:`build_store`, which has just verified or written every shard."""
    info = json.loads((folder / "store.json").read_text(encoding="utf-8"))
    shards: list[_Shard] = []
    skipped: list[tuple[str, str, str]] = []
    for index, rows in enumerate(_chunks(int(info["rows"]), int(info["per_shard"]))):
        shard = folder / f"shard-{index:05d}"
        why = verify_shard(shard, rows) if verify else ""
        if why:
            raise ValueError(f"molecule shard {shard} is {why}; build the store again")
        opened, lost = _open_shard(shard)
        shards.append(opened)
        skipped += [(a, b, c) for a, b, c in lost]
    return ShardedGraphs(shards), skipped
