"""A finished shard store (:mod:`graphcl.shards`) read back: memory-mapped, never copied.

:func:`open_store` verifies every shard against its digests (unless told it was just built)
and memory-maps its arrays. :class:`ShardedGraphs` is a read-only ``Sequence[Data]`` over them
that builds a molecule's ``Data`` only when one is asked for; training never asks:
:meth:`ShardedGraphs.collate` slices the arrays of a batch's molecules straight into the
``Batch`` that ``Batch.from_data_list`` makes of the same graphs (the same tensors, PyG's
collation slices and increments, the node counts and SMILES).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple, overload

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Batch, Data

from graphcl.collation import set_collation, set_node_counts
from graphcl.shards import ARRAYS, chunks, verify_shard

__all__ = ["ShardedGraphs", "ShardedSmiles", "open_store"]


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
    arrays = {
        name: np.load(folder / f"{name}.npy", mmap_mode="r", allow_pickle=False) for name in ARRAYS
    }
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
    for index, rows in enumerate(chunks(int(info["rows"]), int(info["per_shard"]))):
        shard = folder / f"shard-{index:05d}"
        why = verify_shard(shard, rows) if verify else ""
        if why:
            raise ValueError(f"molecule shard {shard} is {why}; build the store again")
        opened, lost = _open_shard(shard)
        shards.append(opened)
        skipped += [(a, b, c) for a, b, c in lost]
    return ShardedGraphs(shards), skipped
