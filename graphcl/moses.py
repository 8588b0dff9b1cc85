"""The MOSES benchmark's molecules (Polykovskiy et al. 2020, MIT licence) as a pre-training corpus.

The molsets 0.3.1 wheel ships the benchmark's SMILES, ZINC Clean Leads molecules: 1,584,663
for training, 176,074 for testing and 176,226 in the scaffold test set, as gzipped CSV files in
``moses/dataset/data/``. Installed with ``pip install --no-deps molsets==0.3.1`` (its pinned
pomegranate does not build on current Pythons), the package cannot be imported, so its files
are found with ``importlib.util.find_spec`` and read as plain files.

:func:`load_store` featurises the rows (all, or a seeded subset) once into a shard store
(:mod:`graphcl.shards`) and memory-maps them from then on; :func:`store_line` is the console's
line on what that took.
"""

from __future__ import annotations

import atexit
import math
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

import numpy as np

from graphcl.cache import cache_folder
from graphcl.features import LAYOUTS
from graphcl.sharded import ShardedGraphs, open_store
from graphcl.shards import build_store, store_folder
from graphcl.splits import draw_subset

__all__ = ["MOSES", "MOSES_INSTALL", "load_store", "moses_file", "read_moses_rows", "store_line"]

# The MOSES benchmark's SMILES (ZINC Clean Leads; Polykovskiy et al. 2020), as the molsets wheel
# ships them: source name -> file of moses/dataset/data/
MOSES = {
    "moses": "train.csv.gz",
    "moses-test": "test.csv.gz",
    "moses-scaffolds": "test_scaffolds.csv.gz",
}
MOSES_INSTALL = "pip install --no-deps molsets==0.3.1"


def moses_file(name: str) -> Path:
    """The file of the MOSES source ``name`` (a key of :data:`MOSES`), read where the molsets
    package installed it; the package is located without importing it (its ``__init__``
    imports modules that need pomegranate, which it does not get with ``--no-deps``).

    Raises:
        FileNotFoundError: molsets is not installed (one line says how to install it)
    """
    import importlib.util

    spec = importlib.util.find_spec("moses")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = Path(folder) / "dataset" / "data" / MOSES[name]
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{name}: the MOSES data files are not installed (moses/dataset/data/{MOSES[name]}); "
        f"install them with: {MOSES_INSTALL}"
    )


def read_moses_rows(path: Path) -> list[str]:
    """The SMILES of a MOSES ``.csv.gz`` file (a header line ``SMILES``, then one molecule per
    line: row i is on line i + 2); nothing is parsed."""
    import gzip

    with gzip.open(path, "rt", encoding="utf-8") as handle:
        header = handle.readline().strip().split(",")
        if header[0].lower() != "smiles":
            raise ValueError(f"{path}:1: expected a header line starting with SMILES, got {header}")
        return [line.split(",", 1)[0].strip() for line in handle]


def store_line(store: dict[str, Any]) -> str:
    """One line on a shard store (``MoleculeData.store``): how many rows, what was built now
    and how fast, its size on disk, how long it took to open, where it is."""
    shards = store["shards_built"] + store["shards_reused"]
    if store["shards_built"]:
        memory = f"{store['peak_rss_mib']:,.0f} MiB here"
        if store["worker_peak_rss_mib"] is not None:
            memory += f", {store['worker_peak_rss_mib']:,.0f} MiB in a worker"
        built = (
            f"{store['shards_built']} built now in {store['build_seconds']:.1f} s "
            f"({store['build_molecules_per_s']:,.0f} molecules/s; peak memory {memory})"
        )
        if store["damaged_shards"]:
            built += f", {len(store['damaged_shards'])} of them damaged and rebuilt"
        if store["shards_reused"]:
            built += f", {store['shards_reused']} found finished"
    else:
        built = "all found finished"
    return (
        f"molecule store: {store['rows']:,} rows in {shards} shards ({built}), "
        f"{store['size_bytes'] / 2**20:,.1f} MiB on disk, opened in {store['open_seconds']:.2f} s: "
        f"{store['folder']}"
    )


def load_store(
    name: str,
    layout: str,
    cache_dir: Path | Literal[False] | None,
    max_molecules: int | None,
    seed: int,
    workers: int | None,
    progress: bool,
) -> tuple[ShardedGraphs, list[tuple[str, str, str]], dict[str, Any]]:
    """A MOSES file through the shard store (:mod:`graphcl.shards`): the rows (all, or a
    seeded subset) are featurised once, in worker processes, and memory-mapped from then on.
    Returns the molecules, the skipped records (where, text, reason) and what the store did
    (the ``store`` of a :class:`graphcl.data.MoleculeData`; :func:`store_line` says it)."""
    path = moses_file(name)
    start = time.perf_counter()
    texts = read_moses_rows(path)
    lines = np.arange(2, len(texts) + 2)  # row i is on line i + 2, after the header
    subset: dict[str, Any] = {"rows": "all"}
    if max_molecules is not None and max_molecules < len(texts):
        rows = draw_subset(len(texts), max_molecules, seed)
        texts, lines = [texts[i] for i in rows.tolist()], lines[rows]
        subset = {"rows": max_molecules, "seed": seed}
    root = cache_folder(cache_dir)
    if root is None:  # no cache: the shards live in a temporary folder until exit
        root = Path(tempfile.mkdtemp(prefix="graphcl-shards-"))
        atexit.register(shutil.rmtree, root, ignore_errors=True)
    key = {"source": name, "layout": LAYOUTS[layout].version, **subset}
    folder = store_folder(root, name, key, [path])
    built = build_store(folder, texts, lines, path.name, layout, workers=workers, progress=progress)
    opened = time.perf_counter()
    graphs, skipped = open_store(folder, verify=False)  # build_store verified every shard
    now = time.perf_counter()
    store = {
        "folder": str(folder),
        "rows": len(texts),
        "shards_built": built.built,
        "shards_reused": built.reused,
        "damaged_shards": list(built.damaged),
        "build_seconds": round(built.seconds, 2),
        "build_molecules_per_s": round(built.molecules / built.seconds, 1) if built.built else None,
        "peak_rss_mib": built.peak_rss_mib,
        "worker_peak_rss_mib": (  # None: no worker process ran
            built.worker_peak_rss_mib if math.isfinite(built.worker_peak_rss_mib) else None
        ),
        "open_seconds": round(now - opened, 2),
        "total_seconds": round(now - start, 2),
        "size_bytes": sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()),
    }
    return graphs, skipped, store
