"""Specification of graphcl.augment (batched graph augmentations) and graphcl.adaptive (JOAO).

One contract helper (as torchvision's ``check_transform``) runs for every augmentation; then
per-graph oracles (a plain loop over the graphs, PyG's ``subgraph`` for the structure that
remains), golden seeded outputs on a 4-node graph, frequencies of the random choices, the
invariances, the edge cases (methane, graphs without bonds, complete graphs, several
components), the per-graph transforms, ``random_choice``, and JOAO's sampler with its simplex
projection checked against a brute-force oracle and scipy.

Test graphs carry unique ids: ``x[:, 0]`` names each node and ``edge_attr[:, 0]`` each bond
(both directions alike), so any misalignment or renumbering error shows.
"""

from __future__ import annotations

import itertools
import os
import pickle
from typing import Any

import pytest
import torch
from torch import Tensor
from torch_geometric.data import Batch, Data
from torch_geometric.utils import subgraph as pyg_subgraph

from graphcl import edge_perturbation, sampling
from graphcl.adaptive import AugmentationSampler, project_simplex
from graphcl.augment import (
    AUGMENTATIONS,
    DropNodes,
    MaskAttributes,
    PerturbEdges,
    Subgraph,
    drop_nodes,
    identity,
    mask_attributes,
    perturb_edges,
    random_choice,
    subgraph,
)

MASK = (98, 99)  # the mask index of each of the two columns of the test graphs' x


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def graph(n: int, bonds: list[tuple[int, int]], tag: int = 0) -> Data:
    """``n`` atoms and ``bonds`` (both directions, adjacent), unique node and bond ids, a
    node-level ``pos``, and graph-level ``y`` (1 row), ``labels`` (3 rows) and ``smiles``."""
    ids = torch.arange(n) + 1000 * tag
    pairs = torch.tensor(bonds, dtype=torch.long).view(-1, 2)
    edge_index = torch.stack([pairs, pairs.flip(1)], 1).reshape(-1, 2).t().contiguous()
    bond_ids = torch.arange(len(bonds)) + 1000 * tag
    return Data(
        x=torch.stack([ids, ids % 5], 1),  # (n, 2) long
        edge_index=edge_index,  # (2, 2m)
        edge_attr=torch.stack([bond_ids, bond_ids % 3], 1).repeat_interleave(2, 0),  # (2m, 2)
        pos=ids.float()[:, None] * torch.tensor([1.0, 2.0, 3.0]),  # (n, 3)
        y=torch.tensor([float(tag)]),
        labels=torch.tensor([tag, -tag, 2 * tag]),
        smiles=f"g{tag}",
    )


def _ring(n: int) -> list[tuple[int, int]]:
    return [(i, (i + 1) % n) for i in range(n)]


def _random_connected(n: int, extra: int, seed: int) -> list[tuple[int, int]]:
    g = gen(seed)
    bonds = {(int(torch.randint(i, (), generator=g)), i) for i in range(1, n)}  # a tree
    while len(bonds) < n - 1 + extra:
        u, v = sorted(torch.randperm(n, generator=g)[:2].tolist())
        bonds.add((u, v))
    return sorted(bonds)


ZOO: dict[str, tuple[int, list[tuple[int, int]]]] = {
    "methane": (1, []),
    "ethane": (2, [(0, 1)]),
    "propane": (3, [(0, 1), (1, 2)]),
    "no_bonds": (4, []),
    "salt": (5, [(0, 1), (1, 2), (3, 4)]),  # two components
    "benzene": (6, _ring(6)),
    "k5": (5, list(itertools.combinations(range(5), 2))),  # no free pair
    "k6_minus_one": (6, [b for b in itertools.combinations(range(6), 2) if b != (0, 5)]),
    "path10": (10, [(i, i + 1) for i in range(9)]),
    "tree": (15, [((i - 1) // 2, i) for i in range(1, 15)]),
    "ring_chords": (20, [*_ring(20), (0, 10), (5, 15)]),
    "sparse30": (30, _random_connected(30, 6, seed=1)),
}


def molecules(names: list[str] | None = None, repeat: int = 1) -> Batch:
    names = list(ZOO) if names is None else names
    graphs = [graph(*ZOO[name], tag=t) for t, name in enumerate(names * repeat)]
    return Batch.from_data_list(graphs)


def _random_drop_or_subgraph(batch: Batch, p: float, **kwargs: Any) -> Batch:
    return random_choice([drop_nodes, subgraph], batch, p, **kwargs)  # GraphCL chem "random"


def _call(name: str, batch: Batch, p: float, **kwargs: Any) -> Batch:
    if name == "mask_attributes":
        kwargs.setdefault("mask_index", MASK)
    fn = _random_drop_or_subgraph if name == "random" else AUGMENTATIONS[name]
    return fn(batch, p, **kwargs)


def _tensors(batch: Batch) -> dict[str, Any]:
    return {k: v.clone() if isinstance(v, Tensor) else list(v) for k, v in batch.items()}


def _same(a: Any, b: Any) -> bool:
    return torch.equal(a, b) if isinstance(a, Tensor) else a == b


def assert_batches_equal(a: Batch, b: Batch) -> None:
    assert sorted(a.keys()) == sorted(b.keys())
    for key in a.keys():
        assert _same(a[key], b[key]), key


def check_structure(out: Batch) -> None:
    """A valid collated batch: ptr/batch agree, edges stay inside their graph, and splitting and
    re-collating gives the same batch (slices and increments are right)."""
    G, N = out.num_graphs, out.num_nodes
    counts = torch.bincount(out.batch, minlength=G)
    assert torch.equal(out.ptr, torch.cat([counts.new_zeros(1), counts.cumsum(0)]))
    assert bool((out.batch.diff() >= 0).all())
    if out.num_edges:
        assert 0 <= int(out.edge_index.min()) and int(out.edge_index.max()) < N
        assert torch.equal(out.batch[out.edge_index[0]], out.batch[out.edge_index[1]])
    examples = out.to_data_list()
    assert len(examples) == G
    assert_batches_equal(Batch.from_data_list(examples), out)


def check_augmentation(name: str, batch: Batch, p: float = 0.3, **kwargs: Any) -> Batch:
    """The contract of every augmentation: a new valid batch with the same graphs, the input
    untouched, dtype and device kept, graph-level data kept, seeded reproducibility with the
    global RNGs untouched, the global-RNG path."""
    before = _tensors(batch)
    out = _call(name, batch, p, generator=gen(0), **kwargs)
    for key, value in before.items():
        assert _same(batch[key], value), f"{name} modified the input's {key}"
    assert isinstance(out, Batch) and out is not batch and out.num_graphs == batch.num_graphs
    check_structure(out)
    for key, value in out.items():
        if isinstance(value, Tensor):
            assert value.dtype == batch[key].dtype and value.device == batch[key].device, key
    for key in ("y", "labels", "smiles"):
        assert _same(out[key], batch[key]), key

    device = batch.batch.device
    state = torch.get_rng_state()
    cuda_state = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    again = _call(name, batch, p, generator=gen(0), **kwargs)
    assert torch.equal(state, torch.get_rng_state()), f"{name} touched the global RNG"
    if cuda_state is not None:
        assert torch.equal(cuda_state, torch.cuda.get_rng_state(device)), "CUDA RNG touched"
    assert_batches_equal(out, again)
    torch.manual_seed(7)
    first = _call(name, batch, p, **kwargs)
    torch.manual_seed(7)
    assert_batches_equal(first, _call(name, batch, p, **kwargs))
    return out


@pytest.mark.parametrize("name", [*sorted(AUGMENTATIONS), "random"])
def test_contract(name: str) -> None:
    batch = molecules(repeat=2)
    check_augmentation(name, batch)
    if name != "identity":  # another seed, another augmentation
        other = _call(name, batch, 0.3, generator=gen(1))
        assert not all(_same(other[k], v) for k, v in _call(name, batch, 0.3, generator=gen(0)))


def test_registry() -> None:
    assert set(AUGMENTATIONS) == {
        "drop_nodes",
        "perturb_edges",
        "mask_attributes",
        "subgraph",
        "identity",
    }


# --------------------------------------------------------------------------- per-graph oracles


def _local(ids: Tensor, original: Data) -> Tensor:
    """Positions in ``original`` of the nodes named ``ids``."""
    positions: Tensor = (original.x[:, 0][None] == ids[:, None]).nonzero()[:, 1]
    return positions


def _bonds(data: Data) -> dict[tuple[int, int], tuple[int, ...]]:
    """Bond (pair of node ids) -> attributes; asserts both directions carry the same ones."""
    ids = data.x[:, 0].tolist()
    directed = {}
    for (u, v), attr in zip(data.edge_index.t().tolist(), data.edge_attr.tolist(), strict=True):
        assert (ids[u], ids[v]) not in directed, "a duplicate edge"
        directed[ids[u], ids[v]] = tuple(attr)
    for (u, v), attr in directed.items():
        assert directed.get((v, u)) == attr, "asymmetric or misaligned bond"
    return {(min(u, v), max(u, v)): attr for (u, v), attr in directed.items()}


def _components(data: Data) -> list[set[int]]:
    parent = list(range(data.num_nodes))

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for u, v in data.edge_index.t().tolist():
        parent[root(u)] = root(v)
    groups: dict[int, set[int]] = {}
    for i in range(data.num_nodes):
        groups.setdefault(root(i), set()).add(i)
    return list(groups.values())


def _check_induced(original: Data, view: Data) -> Tensor:
    """The view is the subgraph of ``original`` induced by its nodes (PyG's ``subgraph``)."""
    local = _local(view.x[:, 0], original)
    assert local.numel() == view.num_nodes and bool((local.diff() > 0).all())
    edge_index, edge_attr = pyg_subgraph(
        local,
        original.edge_index,
        original.edge_attr,
        relabel_nodes=True,
        num_nodes=original.num_nodes,
    )
    assert torch.equal(view.edge_index, edge_index) and torch.equal(view.edge_attr, edge_attr)
    assert torch.equal(view.x, original.x[local]) and torch.equal(view.pos, original.pos[local])
    for key in ("y", "labels", "smiles"):
        assert _same(view[key], original[key])
    return local


P_BELOW_ONE = [0.0, 0.2, 0.5, 0.9]


@pytest.mark.parametrize("p", P_BELOW_ONE)
@pytest.mark.parametrize("seed", [0, 1])
def test_drop_nodes_oracle(p: float, seed: int) -> None:
    batch = molecules()
    out = drop_nodes(batch, p, generator=gen(seed))
    for original, view in zip(batch.to_data_list(), out.to_data_list(), strict=True):
        n = original.num_nodes
        assert view.num_nodes == n - int(p * n) >= 1
        _check_induced(original, view)


@pytest.mark.parametrize("p", P_BELOW_ONE)
@pytest.mark.parametrize("seed", [0, 1])
def test_subgraph_oracle(p: float, seed: int) -> None:
    batch = molecules()
    out = subgraph(batch, p, generator=gen(seed))
    for original, view in zip(batch.to_data_list(), out.to_data_list(), strict=True):
        n = original.num_nodes
        assert view.num_nodes == n - int(p * n)
        kept = set(_check_induced(original, view).tolist())
        touched = [c for c in _components(original) if c & kept]
        assert sum(not c <= kept for c in touched) <= 1, "restarted before a component was full"
        parts = _components(view)
        assert len(parts) == len(touched), "a kept part of a component is not connected"


def _growth_law(n: int, bonds: list[tuple[int, int]], keep: int) -> dict[frozenset[int], float]:
    """Exact distribution of the kept set when a subgraph grows one uniformly chosen frontier
    node at a time from a uniform seed, restarting at a uniform unchosen node when the frontier
    is empty (GraphCL's fixed bio code, with restarts)."""
    neighbours: dict[int, set[int]] = {i: set() for i in range(n)}
    for u, v in bonds:
        neighbours[u].add(v)
        neighbours[v].add(u)
    law: dict[frozenset[int], float] = {}

    def grow(chosen: frozenset[int], probability: float) -> None:
        if len(chosen) == keep:
            law[chosen] = law.get(chosen, 0.0) + probability
            return
        frontier = set().union(*(neighbours[c] for c in chosen)) - chosen
        options = sorted(frontier or set(range(n)) - chosen)
        for node in options:
            grow(chosen | {node}, probability / len(options))

    grow(frozenset(), 1.0)
    return law


@pytest.mark.parametrize(
    ("n", "bonds", "p"),
    [
        (6, [(0, 1), (1, 2), (1, 3), (3, 4), (4, 5)], 0.5),  # a branched chain, keep 3
        (5, [(0, 1), (1, 2), (3, 4)], 0.2),  # two components, keep 4: restarts
        (6, [*_ring(4), (3, 4)], 0.5),  # a ring with a tail, and an isolated atom
    ],
)
def test_subgraph_follows_the_growth_law(n: int, bonds: list[tuple[int, int]], p: float) -> None:
    copies = 3000
    batch = Batch.from_data_list([graph(n, bonds, tag=t) for t in range(copies)])
    out = subgraph(batch, p, generator=gen(0))
    seen: dict[frozenset[int], int] = {}
    for view in out.to_data_list():
        kept = frozenset((view.x[:, 0] % 1000).tolist())
        seen[kept] = seen.get(kept, 0) + 1
    law = _growth_law(n, bonds, n - int(p * n))
    assert set(seen) <= set(law), "a kept set the process cannot produce"
    for kept, probability in law.items():
        _sigma_bound(torch.tensor([seen.get(kept, 0)]), copies, probability)


def test_subgraph_grows_beyond_one_hop_and_compat_does_not() -> None:
    batch = molecules(["path10", "tree", "sparse30"], repeat=20)
    out = subgraph(batch, 0.2, generator=gen(0))
    assert torch.equal(out.ptr.diff(), batch.ptr.diff() - (batch.ptr.diff() * 0.2).long())
    compat = subgraph(batch, 0.2, graphcl_compat=True, generator=gen(0))
    for original, view in zip(batch.to_data_list(), compat.to_data_list(), strict=True):
        local = set(_local(view.x[:, 0], original).tolist())
        target = original.num_nodes - int(0.2 * original.num_nodes)
        neighbours: dict[int, set[int]] = {i: set() for i in range(original.num_nodes)}
        for u, v in original.edge_index.t().tolist():
            neighbours[u].add(v)
        # a seed with every other kept node its neighbour, as many as the seed allows
        assert any(
            local - {s} <= neighbours[s] and len(local) == min(target, 1 + len(neighbours[s]))
            for s in local
        )


@pytest.mark.parametrize("p", [*P_BELOW_ONE, 1.0])
@pytest.mark.parametrize("sampler", ["empirical", "zeros"])
def test_perturb_edges_oracle(p: float, sampler: str) -> None:
    batch = molecules(repeat=2)
    out = perturb_edges(batch, p, edge_attr_sampler=sampler, generator=gen(3))  # type: ignore[arg-type]
    attributes = {tuple(a) for a in batch.edge_attr.tolist()}
    for original, view in zip(batch.to_data_list(), out.to_data_list(), strict=True):
        assert torch.equal(view.x, original.x) and torch.equal(view.pos, original.pos)
        before, after = _bonds(original), _bonds(view)
        n, m = original.num_nodes, len(before)
        removed, added = before.keys() - after.keys(), after.keys() - before.keys()
        assert len(removed) == int(p * m)
        assert len(added) == min(int(p * m), n * (n - 1) // 2 - m)  # all free pairs at most
        for bond in before.keys() & after.keys():
            assert after[bond] == before[bond], "a kept bond lost its attributes"
        ids = set(original.x[:, 0].tolist())
        for u, v in added:
            assert u != v and u in ids and v in ids
            assert after[u, v] in attributes if sampler == "empirical" else after[u, v] == (0, 0)


@pytest.mark.parametrize("p", [*P_BELOW_ONE, 1.0])
def test_mask_attributes_oracle(p: float) -> None:
    batch = molecules(repeat=2)
    out = mask_attributes(batch, p, mask_index=MASK, generator=gen(4))
    for original, view in zip(batch.to_data_list(), out.to_data_list(), strict=True):
        masked = (view.x == torch.tensor(MASK)).all(1)
        assert int(masked.sum()) == int(p * original.num_nodes)
        assert torch.equal(view.x[~masked], original.x[~masked])
        for key in ("edge_index", "edge_attr", "pos", "y", "labels", "smiles"):
            assert _same(view[key], original[key])


@pytest.mark.parametrize("mode", ["zero", "noise"])
def test_mask_attributes_continuous(mode: str) -> None:
    batch = molecules(repeat=3)
    batch.x = batch.x.double() + 1  # continuous features, no row of zeros
    out = mask_attributes(batch, 0.5, mode=mode, generator=gen(0))
    changed = (out.x != batch.x).any(1)
    per_graph = torch.zeros(batch.num_graphs, dtype=torch.long).index_add_(
        0, batch.batch, changed.long()
    )
    assert torch.equal(per_graph, (batch.ptr.diff() * 0.5).long())
    masked_rows = out.x[changed]
    if mode == "zero":
        assert bool((masked_rows == 0).all())
    else:  # N(0.5, 0.5²) replacement, as the GraphCL TU code
        assert abs(float(masked_rows.mean()) - 0.5) < 0.15
        assert abs(float(masked_rows.std()) - 0.5) < 0.15
    assert out.x.dtype == torch.float64


# --------------------------------------------------------------------------- golden, bad p


def four_nodes() -> Batch:
    """PyG's test graph: the path 0-1-2-3, both directions; bond ids as edge_attr."""
    data = Data(
        x=torch.tensor([[10, 0], [11, 1], [12, 2], [13, 3]]),
        edge_index=torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]]),
        edge_attr=torch.tensor([[0, 0], [0, 0], [1, 1], [1, 1], [2, 2], [2, 2]]),
    )
    return Batch.from_data_list([data])


def test_golden_four_nodes() -> None:
    batch = four_nodes()
    out = drop_nodes(batch, 0.5, generator=gen(0))  # nodes 2 and 3 out, with bonds 1 and 2
    assert out.x[:, 0].tolist() == [10, 11]
    assert out.edge_index.tolist() == [[0, 1], [1, 0]] and out.edge_attr[:, 0].tolist() == [0, 0]

    out = subgraph(batch, 0.5, generator=gen(0))  # two connected nodes
    assert out.x[:, 0].tolist() == [11, 12]
    assert out.edge_index.tolist() == [[0, 1], [1, 0]] and out.edge_attr[:, 0].tolist() == [1, 1]
    out = subgraph(batch, 0.5, graphcl_compat=True, generator=gen(0))  # seed and a neighbour
    assert out.x[:, 0].tolist() == [10, 11] and out.edge_attr[:, 0].tolist() == [0, 0]

    out = perturb_edges(batch, 0.5, generator=gen(0))
    assert out.edge_index.tolist() == [[0, 1, 1, 2, 0, 3], [1, 0, 2, 1, 3, 0]]
    assert out.edge_attr[:, 0].tolist() == [0, 0, 1, 1, 0, 0]  # bond 2 out, 0-3 in

    out = mask_attributes(batch, 0.5, mask_index=MASK, generator=gen(0))
    assert out.x.tolist() == [[10, 0], [11, 1], [98, 99], [98, 99]]
    assert torch.equal(out.edge_index, batch.edge_index)


@pytest.mark.parametrize("name", sorted(AUGMENTATIONS))
def test_p_zero_is_the_identity(name: str) -> None:
    batch = molecules()
    assert_batches_equal(_call(name, batch, 0.0, generator=gen(0)), batch)
    assert_batches_equal(random_choice([drop_nodes, subgraph], batch, 0.0), batch)


@pytest.mark.parametrize(
    ("name", "bad"),
    [(n, p) for n in ("drop_nodes", "subgraph") for p in (-0.1, 1.0, 1.5, float("nan"))]
    + [(n, p) for n in ("perturb_edges", "mask_attributes") for p in (-0.1, 1.01, float("nan"))],
)
def test_bad_p_raises(name: str, bad: float) -> None:
    with pytest.raises(ValueError, match=r"p must be in"):
        _call(name, molecules(), bad)


def test_bad_arguments_raise() -> None:
    batch = molecules()
    with pytest.raises(ValueError, match="mask_index"):
        mask_attributes(batch, 0.2)
    with pytest.raises(ValueError, match="3 values for 2 columns"):
        mask_attributes(batch, 0.2, mask_index=[1, 2, 3])
    with pytest.raises(ValueError, match="needs float x"):
        mask_attributes(batch, 0.2, mode="noise")
    with pytest.raises(ValueError, match="mode must be"):
        mask_attributes(batch, 0.2, mode="blank", mask_index=MASK)
    with pytest.raises(ValueError, match="edge_attr_sampler"):
        perturb_edges(batch, 0.2, edge_attr_sampler="uniform")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="collated"):
        drop_nodes(graph(*ZOO["benzene"]), 0.2)


# --------------------------------------------------------------------------- frequencies


def _sigma_bound(count: Tensor, trials: int, probability: float) -> None:
    """Counts agree with Binomial(trials, probability) within 5 standard deviations."""
    sigma = (trials * probability * (1 - probability)) ** 0.5
    assert bool(((count.double() - trials * probability).abs() <= 5 * sigma + 1e-9).all()), count


def test_uniform_choices() -> None:
    """Each node (bond, free pair) of a graph is chosen with the same frequency."""
    copies = 600
    batch = molecules(["k6_minus_one"], repeat=copies)  # 6 nodes, 14 bonds, 1 free pair
    for p in (0.5, 0.8):  # 3 of 6 dropped; 4 of 6 (the 2 kept are drawn instead)
        out = drop_nodes(batch, p, generator=gen(0))
        kept = torch.bincount(out.x[:, 0] % 1000, minlength=6)
        _sigma_bound(kept, copies, (6 - int(p * 6)) / 6)
    out = mask_attributes(batch, 0.5, mask_index=MASK, generator=gen(0))
    masked = torch.bincount(batch.x[(out.x[:, 0] == 98)][:, 0] % 1000, minlength=6)
    _sigma_bound(masked, copies, 0.5)
    out = perturb_edges(batch, 0.25, generator=gen(0))  # 3 of 14 bonds out, the free pair in
    local = out.x[:, 0][out.edge_index] % 1000  # (2, E) endpoints as positions in the graph
    added = (local.min(0).values == 0) & (local.max(0).values == 5)
    assert int(added.sum()) == 2 * copies
    kept_bonds = torch.bincount(out.edge_attr[~added, 0] % 1000, minlength=14) // 2
    _sigma_bound(kept_bonds, copies, 11 / 14)


@pytest.mark.parametrize("graph_name", ["path10", "k6_minus_one"])  # rejection, enumeration
def test_added_pairs_are_uniform(graph_name: str) -> None:
    copies = 400
    batch = molecules([graph_name], repeat=copies)
    n, bonds = ZOO[graph_name]
    free = [pair for pair in itertools.combinations(range(n), 2) if pair not in bonds]
    r = int(0.4 * len(bonds))
    out = perturb_edges(batch, 0.4, generator=gen(5))
    seen = torch.zeros(len(free), dtype=torch.long)
    for view in out.to_data_list():
        for u, v in _bonds(view):
            if (u % 1000, v % 1000) in free:
                seen[free.index((u % 1000, v % 1000))] += 1
    assert int(seen.sum()) == copies * min(r, len(free))
    _sigma_bound(seen, copies, min(r, len(free)) / len(free))


def test_pair_lookup_bitmap_equals_binary_search(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bond lookups by bitmap (small graphs) and by binary search (large) agree exactly."""
    batch = molecules(repeat=4)
    with_bitmap = perturb_edges(batch, 0.4, generator=gen(0))
    monkeypatch.setattr(edge_perturbation, "BITMAP_BUDGET", 0)
    assert_batches_equal(perturb_edges(batch, 0.4, generator=gen(0)), with_bitmap)


def test_further_rejection_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Graphs left short by a round draw again, excluding what was chosen: still exact."""
    lookups = []
    isin = edge_perturbation._isin_sorted

    def counted(keys: Tensor, sorted_keys: Tensor) -> Tensor:
        lookups.append(keys.numel())
        return isin(keys, sorted_keys)

    monkeypatch.setattr(edge_perturbation, "_isin_sorted", counted)
    batch = molecules(["path10", "benzene"], repeat=300)  # p = 0.5: 4 of 9 bonds, 3 of 6
    out = perturb_edges(batch, 0.5, generator=gen(0))
    assert lookups, "no second round happened: the test lost its purpose"
    for original, view in zip(batch.to_data_list(), out.to_data_list(), strict=True):
        before, after = _bonds(original), _bonds(view)
        assert len(after.keys() - before.keys()) == len(before.keys() - after.keys())
        assert len(before.keys() - after.keys()) == int(0.5 * len(before))


def test_node_choice_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Node choices that a first round leaves short draw again: exact counts, uniform."""
    rounds = []
    draw = sampling.draw

    def counted(*args: Any, **kwargs: Any) -> Tensor:
        rounds.append(1)
        return draw(*args, **kwargs)

    monkeypatch.setattr(sampling, "draw", counted)
    batch = molecules(["no_bonds"], repeat=4000)  # 4 nodes, 2 dropped: a round may fall short
    out = drop_nodes(batch, 0.5, generator=gen(0))
    assert len(rounds) > 1, "no second round happened: the test lost its purpose"
    assert bool((out.ptr.diff() == 2).all())
    _sigma_bound(torch.bincount(out.x[:, 0] % 1000, minlength=4), 4000, 0.5)


def test_random_choice_frequency_and_alignment() -> None:
    copies = 400
    batch = molecules(["benzene", "salt"], repeat=copies // 2)
    out = random_choice([drop_nodes, identity], batch, 0.5, generator=gen(0))
    check_structure(out)
    for key in ("y", "labels", "smiles"):
        assert _same(out[key], batch[key])
    nodes = out.ptr.diff()
    full = nodes == batch.ptr.diff()
    assert torch.equal(nodes[~full], batch.ptr.diff()[~full] - (batch.ptr.diff()[~full] // 2))
    _sigma_bound(full.sum().view(1), copies, 0.5)
    # every node still belongs to its own graph (ids carry the graph's tag)
    assert torch.equal(out.x[:, 0] // 1000, out.batch)


def test_random_choice_arguments() -> None:
    batch = molecules()
    out = random_choice([mask_attributes], batch, 0.5, mask_index=MASK, generator=gen(0))
    assert int((out.x == torch.tensor(MASK)).all(1).sum()) == int((batch.ptr.diff() // 2).sum())
    with pytest.raises(ValueError, match="at least one"):
        random_choice([], batch)

    def renames(b: Batch, p: float, **kwargs: Any) -> Batch:
        out = identity(b)
        out.extra = out.y
        return out

    with pytest.raises(ValueError, match="changed the attributes"):
        random_choice([renames], batch)


# --------------------------------------------------------------------------- invariances


@pytest.mark.parametrize("name", ["drop_nodes", "subgraph", "perturb_edges", "mask_attributes"])
def test_permuting_graphs_permutes_the_counts(name: str) -> None:
    graphs = molecules().to_data_list()
    order = torch.randperm(len(graphs), generator=gen(0)).tolist()
    batch = Batch.from_data_list(graphs)
    shuffled = Batch.from_data_list([graphs[i] for i in order])
    a, b = _call(name, batch, 0.4, generator=gen(1)), _call(name, shuffled, 0.4, generator=gen(2))
    assert torch.equal(a.ptr.diff()[order], b.ptr.diff())
    if name in ("perturb_edges", "mask_attributes"):  # edge counts do not depend on the draw
        edges_a = torch.bincount(a.batch[a.edge_index[0]], minlength=a.num_graphs)
        edges_b = torch.bincount(b.batch[b.edge_index[0]], minlength=b.num_graphs)
        assert torch.equal(edges_a[order], edges_b)
    assert [a.smiles[i] for i in order] == b.smiles


def _relabel(data: Data, seed: int) -> Data:
    """The same graph with its nodes renumbered and its directed edges shuffled."""
    n = data.num_nodes
    perm = torch.randperm(n, generator=gen(seed))  # new position -> old node
    new_of_old = torch.empty_like(perm)
    new_of_old[perm] = torch.arange(n)
    edge_order = torch.randperm(data.num_edges, generator=gen(seed + 1))
    out = data.clone()
    out.x, out.pos = data.x[perm], data.pos[perm]
    out.edge_index = new_of_old[data.edge_index[:, edge_order]]
    out.edge_attr = data.edge_attr[edge_order]
    return out


def test_relabelled_nodes_give_the_same_semantics() -> None:
    """Renumbered nodes and shuffled edges (not grouped by bond): counts, symmetry, alignment
    and connectivity are unchanged."""
    graphs = [_relabel(g, seed) for seed, g in enumerate(molecules().to_data_list())]
    batch = Batch.from_data_list(graphs)
    out = drop_nodes(batch, 0.4, generator=gen(0))
    for original, view in zip(graphs, out.to_data_list(), strict=True):
        assert view.num_nodes == original.num_nodes - int(0.4 * original.num_nodes)
        kept = set(view.x[:, 0].tolist())
        assert _bonds(view) == {b: a for b, a in _bonds(original).items() if set(b) <= kept}
    out = perturb_edges(batch, 0.4, generator=gen(0))
    for original, view in zip(graphs, out.to_data_list(), strict=True):
        before, after = _bonds(original), _bonds(view)
        assert len(before.keys() - after.keys()) == int(0.4 * len(before))
    out = subgraph(batch, 0.4, generator=gen(0))
    for original, view in zip(graphs, out.to_data_list(), strict=True):
        kept = set(_local(view.x[:, 0], original).tolist())
        touched = [c for c in _components(original) if c & kept]
        assert len(_components(view)) == len(touched)


@pytest.mark.parametrize("name", ["drop_nodes", "subgraph", "perturb_edges", "mask_attributes"])
def test_identical_graphs_get_different_views(name: str) -> None:
    """Randomness is per graph: 32 copies of one molecule are not all augmented alike."""
    batch = molecules(["sparse30"], repeat=32)
    views = _call(name, batch, 0.3, generator=gen(0)).to_data_list()
    keys = {
        (
            tuple((v.x[:, 0] % 1000).tolist()),
            tuple((v.edge_index).flatten().tolist()),
            tuple((v.edge_attr[:, 0] % 1000).tolist()),
        )
        for v in views
    }
    assert len(keys) > 16


# --------------------------------------------------------------------------- edge cases


@pytest.mark.parametrize("name", sorted(AUGMENTATIONS))
@pytest.mark.parametrize("p", [0.0, 0.5, 0.9])
def test_methane_and_graphs_without_bonds(name: str, p: float) -> None:
    for names in (["methane"], ["methane", "no_bonds"], ["methane", "sparse30", "methane"]):
        batch = molecules(names)
        out = _call(name, batch, p, generator=gen(0))
        check_structure(out)
        assert int(out.ptr.diff()[0]) == 1  # methane keeps its atom
    alone = _call(name, molecules(["methane"]), 0.9, generator=gen(0))
    assert alone.num_nodes == 1 and alone.num_edges == 0


@pytest.mark.parametrize("name", sorted(AUGMENTATIONS))
def test_explicit_num_nodes(name: str) -> None:
    """Graphs that store ``num_nodes`` (graphcl.features does) split with the right counts."""
    graphs = [graph(*ZOO[key], tag=t) for t, key in enumerate(["benzene", "methane", "tree"])]
    for data in graphs:
        data.num_nodes = data.x.size(0)
    out = _call(name, Batch.from_data_list(graphs), 0.5, generator=gen(0))
    check_structure(out)
    assert out.num_nodes == out.x.size(0)
    for view in out.to_data_list():
        assert view.num_nodes == view.x.size(0)


def test_complete_graph_gets_what_is_free() -> None:
    batch = molecules(["k5", "k6_minus_one", "ethane"])
    out = perturb_edges(batch, 0.5, generator=gen(0))
    bonds = [len(_bonds(v)) for v in out.to_data_list()]
    assert bonds == [10 - 5, 14 - 7 + 1, 1]  # K5: no free pair; K6−1: one; ethane: 0 of 1 out


def test_self_loops_in_the_input() -> None:
    data = graph(4, [(0, 1), (1, 2)])
    data.edge_index = torch.cat([data.edge_index, torch.tensor([[3], [3]])], 1)
    data.edge_attr = torch.cat([data.edge_attr, torch.tensor([[7, 7]])])
    batch = Batch.from_data_list([data] * 60)
    out = perturb_edges(batch, 0.5, generator=gen(0))  # 3 bonds (one a self-loop): 1 out, 1 in
    check_structure(out)
    loops_kept = 0
    for view in out.to_data_list():
        bonds = _bonds(view)
        assert len(bonds) == 3 and all(u != v for u, v in bonds.keys() - _bonds(data).keys())
        loops_kept += (3, 3) in bonds
    assert 0 < loops_kept < 60  # the self-loop is a bond like the others


# --------------------------------------------------------------------------- transforms


@pytest.mark.parametrize(
    ("transform", "name", "kwargs"),
    [
        (DropNodes(0.5), "drop_nodes", {}),
        (PerturbEdges(0.5), "perturb_edges", {}),
        (MaskAttributes(0.5, MASK), "mask_attributes", {"mask_index": MASK}),
        (Subgraph(0.5), "subgraph", {}),
    ],
)
def test_transforms(transform: Any, name: str, kwargs: dict[str, Any]) -> None:
    data = graph(*ZOO["sparse30"], tag=3)
    before = data.clone()
    torch.manual_seed(0)
    out = transform(data)
    assert_batches_equal(data, before)  # copy-on-call: the input is untouched
    assert type(out) is Data and out.smiles == "g3"
    torch.manual_seed(0)
    expected = AUGMENTATIONS[name](Batch.from_data_list([data]), 0.5, **kwargs).get_example(0)
    assert_batches_equal(out, expected)
    clone = pickle.loads(pickle.dumps(transform))
    assert repr(clone) == repr(transform)
    assert transform(molecules()).num_graphs == len(ZOO)  # a Batch is augmented as a batch


def test_transform_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="p must be"):
        DropNodes(1.0)
    with pytest.raises(ValueError, match="p must be"):
        Subgraph(-0.5)
    with pytest.raises(ValueError, match="mask_index"):
        MaskAttributes(0.2)


# --------------------------------------------------------------------------- the device


DEVICE = torch.device(os.environ.get("CONTRASTKIT_TEST_DEVICE", "cuda"))


@pytest.mark.cuda
@pytest.mark.skipif(
    DEVICE.type == "cuda" and not torch.cuda.is_available(),
    reason="CUDA is not available: run on a GPU, or set CONTRASTKIT_TEST_DEVICE=cpu",
)
@pytest.mark.parametrize("name", sorted(AUGMENTATIONS))
def test_device_equals_cpu(name: str) -> None:
    """On the device, the contract holds and a CPU generator gives the CPU's result."""
    batch = molecules(repeat=3)
    # PyG's Batch.to moves the batch in place: the CPU reference needs its own copy
    on_device = check_augmentation(name, batch.clone().to(DEVICE))
    assert batch.x.device.type == "cpu"
    assert_batches_equal(on_device.cpu(), _call(name, batch, 0.3, generator=gen(0)))
    mixed = random_choice([drop_nodes, subgraph], batch.clone().to(DEVICE), 0.3, generator=gen(0))
    assert_batches_equal(
        mixed.cpu(), random_choice([drop_nodes, subgraph], batch, 0.3, generator=gen(0))
    )


# --------------------------------------------------------------------------- JOAO


def _brute_force_projection(v: Tensor) -> Tensor:
    """The closest simplex point: over every support set S, w_S = v_S − (Σ v_S − 1)/|S|."""
    n, best, best_distance = v.numel(), None, float("inf")
    for size in range(1, n + 1):
        for support in itertools.combinations(range(n), size):
            w = torch.zeros_like(v)
            s = list(support)
            w[s] = v[s] - (v[s].sum() - 1) / size
            distance = float((w - v).norm())
            if bool((w >= 0).all()) and distance < best_distance:
                best, best_distance = w, distance
    assert best is not None
    return best


@pytest.mark.parametrize("n", [1, 2, 3, 6])
def test_simplex_projection_oracle(n: int) -> None:
    g = gen(n)
    for _ in range(20):
        v = torch.randn(n, generator=g, dtype=torch.float64) * 2
        w = project_simplex(v)
        assert bool((w >= 0).all()) and abs(float(w.sum()) - 1) < 1e-12
        assert torch.allclose(w, _brute_force_projection(v), atol=1e-12)
        assert torch.allclose(project_simplex(w), w, atol=1e-12)  # a simplex point is fixed
        # KKT: w = max(v − θ, 0) for one θ shared by the support
        theta = (v - w)[w > 0]
        assert float(theta.max() - theta.min()) < 1e-12 and bool((v[w == 0] <= theta[0]).all())
    rows = torch.randn(5, n, generator=g, dtype=torch.float64)
    assert torch.allclose(project_simplex(rows), torch.stack([project_simplex(r) for r in rows]))


def test_simplex_projection_against_scipy() -> None:
    optimize = pytest.importorskip("scipy.optimize")
    g = gen(0)
    for _ in range(4):
        v = torch.randn(8, generator=g, dtype=torch.float64)
        point = v.numpy()
        result = optimize.minimize(
            lambda w, point=point: ((w - point) ** 2).sum(),
            x0=torch.full((8,), 1 / 8).numpy(),
            jac=lambda w, point=point: 2 * (w - point),
            bounds=[(0, None)] * 8,
            method="SLSQP",
            constraints=[{"type": "eq", "fun": lambda w: w.sum() - 1}],
            tol=1e-14,
        )
        assert torch.allclose(project_simplex(v), torch.from_numpy(result.x), atol=1e-6)
    with pytest.raises(ValueError, match="float"):
        project_simplex(torch.tensor([1, 2]))


def _reference_joao_step(p: Tensor, loss: Tensor, gamma: float) -> Tensor:
    """The reference's update (GraphCL_Automated chem/pretrain_joao.py), bisection made tight."""
    K2 = p.numel()
    b = p + (loss - gamma * (p - 1 / K2))
    low, high = float(b.min()) - 1 / K2, float(b.max()) - 1 / K2
    for _ in range(200):
        mu = (low + high) / 2
        low, high = (mu, high) if float((b - mu).clamp_min(0).sum()) > 1 else (low, mu)
    w = (b - (low + high) / 2).clamp_min(0)
    return w / w.sum()


def test_joao_update_matches_the_reference_and_favours_hard_pairs() -> None:
    sampler = AugmentationSampler(["drop_nodes", "subgraph", "identity"], gamma=0.1)
    assert torch.allclose(sampler.probabilities, torch.full((3, 3), 1 / 9, dtype=torch.float64))
    losses = torch.tensor([[3.0, 2.9, 2.0], [3.1, 3.0, 2.5], [2.2, 2.4, 1.0]], dtype=torch.float64)
    losses = losses / 10  # close losses: several pairs keep probability
    expected = _reference_joao_step(sampler.probabilities.view(-1), losses.view(-1), 0.1)
    new = sampler.update(losses)
    assert torch.allclose(new.view(-1), expected, atol=1e-12)
    assert abs(float(new.sum()) - 1) < 1e-12 and bool((new >= 0).all())
    order = torch.argsort(losses.view(-1))
    assert bool((new.view(-1)[order].diff() >= 0).all()), "a harder pair got less probability"
    assert len(sampler.history) == 2


def test_joao_fixed_point_is_the_exact_maximiser() -> None:
    """Repeated steps with fixed losses reach Proj(uniform + ℓ/γ), JOAO's inner argmax."""
    sampler = AugmentationSampler(3, gamma=0.5)
    losses = torch.rand(3, 3, generator=gen(0), dtype=torch.float64)
    for _ in range(200):
        sampler.update(losses)
    exact = project_simplex((1 / 9 + losses / 0.5).view(-1)).view(3, 3)
    assert torch.allclose(sampler.probabilities, exact, atol=1e-9)


def test_joao_sample_record_and_resume() -> None:
    sampler = AugmentationSampler(["a", "b"], gamma=0.1)
    sampler.update(torch.tensor([[0.9, 0.1], [0.1, 0.1]]))  # b = 1/4 + ℓ; θ = 0.3
    assert torch.allclose(
        sampler.probabilities, torch.tensor([[0.85, 0.05], [0.05, 0.05]]).double()
    )
    sampler.update(torch.tensor([[2.0, 0.1], [0.1, 0.1]]))  # a clear winner takes it all
    assert torch.allclose(sampler.probabilities, torch.tensor([[1.0, 0], [0, 0]]).double())
    sampler = AugmentationSampler(["a", "b"], gamma=1.0)
    counts = torch.zeros(2, 2)
    g = gen(0)
    for _ in range(2000):
        i, j = sampler.sample(g)
        counts[i, j] += 1
    _sigma_bound(counts.view(-1), 2000, 0.25)
    # losses recorded per step; a pair never observed gets the mean of the observed ones
    for i, j, loss in [(0, 0, 1.0), (0, 0, 3.0), (1, 1, 0.5)]:
        sampler.record(i, j, torch.tensor(loss))
    direct = AugmentationSampler(["a", "b"], gamma=1.0)
    nan = float("nan")
    assert torch.allclose(sampler.update(), direct.update(torch.tensor([[2.0, nan], [nan, 0.5]])))
    with pytest.raises(ValueError, match="record"):
        sampler.update()
    # resume: a copy loaded from the state dict continues exactly like the original
    sampler.record(0, 1, torch.tensor(0.7))
    state = sampler.state_dict()
    assert all(isinstance(value, Tensor) for value in state.values())
    resumed = AugmentationSampler(["a", "b"])
    resumed.load_state_dict(pickle.loads(pickle.dumps(state)))
    for s in (sampler, resumed):
        s.record(1, 0, torch.tensor(0.2))
        s.update()
    assert torch.equal(sampler.probabilities, resumed.probabilities)
    assert all(torch.equal(a, b) for a, b in zip(sampler.history, resumed.history, strict=True))
    assert sampler.sample(gen(3)) == resumed.sample(gen(3))


def test_joao_bad_input() -> None:
    sampler = AugmentationSampler(2)
    with pytest.raises(ValueError, match=r"\(2, 2\)"):
        sampler.update(torch.zeros(3, 3))
    with pytest.raises(ValueError, match="finite"):
        sampler.update(torch.full((2, 2), float("inf")))
    with pytest.raises(ValueError, match="gamma"):
        AugmentationSampler(2, gamma=-1.0)
    with pytest.raises(ValueError, match="augmentations"):
        AugmentationSampler(3).load_state_dict(sampler.state_dict())


def test_views_of_one_graph_sized_batch() -> None:
    """What graphcl.report does: one molecule, every augmentation, get_example(0)."""
    batch = Batch.from_data_list([graph(*ZOO["ring_chords"])])
    for name in AUGMENTATIONS:
        view = _call(name, batch, 0.2, generator=gen(0)).get_example(0)
        assert isinstance(view, Data) and view.num_nodes >= 16
