"""Edge-flip attacks: one contract for both (exact flip counts, symmetry, no cross-graph edge,
aligned attributes, input untouched, slicing), seeded randomness, and GradArgmax beating random
flips against a small trained ring-vs-chain classifier."""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

# torch_geometric scripts a class at import time, which torch >= 2.10 reports as a FutureWarning
# (an error under our pytest settings) until pyproject filters it for every test file
with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)
    from torch_geometric.data import Batch, Data
    from torch_geometric.utils import from_smiles
    from torch_geometric.utils.smiles import e_map, x_map

    from graphcl.attacks import gradargmax_edge_flips, random_edge_flips
    from graphcl.encoders import GINEncoder

ATOM_VOCAB = tuple(len(values) + 2 for values in x_map.values())
BOND_VOCAB = tuple(len(values) + 2 for values in e_map.values())
SMILES = ("CCO", "c1ccccc1O", "C", "CC(=O)Nc1ccc(O)cc1", "O=C=O")  # methane: no pair to flip

Attack = Callable[[Batch, int], Batch]


def _molecules(smiles: tuple[str, ...] = SMILES) -> Batch:
    batch = Batch.from_data_list([from_smiles(s) for s in smiles])
    batch.y = torch.arange(len(smiles)) % 2
    return batch


class _Victim(nn.Module):
    """A GIN encoder and a linear classifier: logits (G, 2)."""

    def __init__(self, hidden: int = 16) -> None:
        super().__init__()
        self.encoder = GINEncoder(ATOM_VOCAB, BOND_VOCAB, num_layers=3, hidden=hidden)
        self.head = nn.Linear(hidden, 2)

    def forward(self, batch: Batch) -> Tensor:
        logits: Tensor = self.head(self.encoder(batch))  # (G, 2)
        return logits


def _loss_fn(victim: nn.Module) -> Callable[[Batch], Tensor]:
    return lambda batch: F.cross_entropy(victim(batch), batch.y, reduction="none")  # (G,)


def _random(seed: int = 0, **kwargs: object) -> Attack:
    generator = torch.Generator().manual_seed(seed)
    return lambda batch, k: random_edge_flips(batch, k, generator=generator, **kwargs)  # type: ignore[arg-type]


def _gradargmax(**kwargs: object) -> Attack:
    torch.manual_seed(0)
    victim = _Victim().eval()
    return lambda batch, k: gradargmax_edge_flips(_loss_fn(victim), batch, k, **kwargs)  # type: ignore[arg-type]


ATTACKS: dict[str, Callable[..., Attack]] = {"random": _random, "gradargmax": _gradargmax}


def _bonds(batch: Batch) -> dict[tuple[int, int], tuple[int, ...]]:
    """Directed edge (i, j) -> attribute row, checking that no edge is stored twice."""
    edges = batch.edge_index.t().tolist()
    attrs = batch.edge_attr.tolist() if batch.edge_attr is not None else [()] * len(edges)
    bonds = {(i, j): tuple(a) for (i, j), a in zip(edges, attrs, strict=True)}
    assert len(bonds) == len(edges), "an edge is stored twice"
    return bonds


def check_edge_flips(
    attack: Attack, batch: Batch, k: int, bond_attr: tuple[int, ...] | None = None
) -> Batch:
    """The contract of every edge-flip attack; returns the attacked batch."""
    before = {key: value.clone() for key, value in batch.items() if isinstance(value, Tensor)}
    out = attack(batch, k)
    for key, value in before.items():  # the input is untouched
        torch.testing.assert_close(batch[key], value, rtol=0, atol=0)
    for key in ("x", "batch", "ptr", "y"):  # nodes and labels as they were
        torch.testing.assert_close(out[key], batch[key], rtol=0, atol=0)
    old, new = _bonds(batch), _bonds(out)
    src, dst = out.edge_index
    assert torch.equal(out.batch[src], out.batch[dst]), "an edge crosses graphs"
    assert all(new[(j, i)] == a for (i, j), a in new.items()), "edges are not symmetric"
    for pair in old.keys() & new.keys():  # kept bonds keep their attribute
        assert new[pair] == old[pair]
    if bond_attr is not None:
        assert all(new[pair] == bond_attr for pair in new.keys() - old.keys())
    flipped = {(i, j) for i, j in old.keys() ^ new.keys() if i < j}
    ptr = batch.ptr.tolist()
    for graph, (start, end) in enumerate(itertools.pairwise(ptr)):
        size = end - start
        count = sum(start <= i < end for i, _ in flipped)
        assert count == min(k, size * (size - 1) // 2), f"graph {graph}: {count} flips"
    for graph, data in enumerate(out.to_data_list()):  # slicing still finds each graph's edges
        mask = out.batch[src] == graph
        assert torch.equal(data.edge_index, out.edge_index[:, mask] - ptr[graph])
        if out.edge_attr is not None:
            assert torch.equal(data.edge_attr, out.edge_attr[mask])
    return out


@pytest.mark.parametrize("k", [0, 1, 3, 100])  # 100: every pair of these molecules flips
@pytest.mark.parametrize("name", ATTACKS)
def test_edge_flip_contract(name: str, k: int) -> None:
    bond_attr = (1, 0, 0)
    out = check_edge_flips(ATTACKS[name](bond_attr=bond_attr), _molecules(), k, bond_attr)
    if k == 0:
        assert torch.equal(out.edge_index, _molecules().edge_index)


@pytest.mark.parametrize("name", ATTACKS)
def test_default_bond_attr_is_the_most_common_row(name: str) -> None:
    batch = _molecules()
    rows, counts = torch.unique(batch.edge_attr, dim=0, return_counts=True)
    most_common = tuple(rows[counts.argmax()].tolist())
    assert counts.max() > counts.min()  # the default is not a tie
    check_edge_flips(ATTACKS[name](), batch, 5, most_common)


def test_random_flips_without_edge_attr() -> None:
    batch = _molecules()
    del batch.edge_attr
    out = check_edge_flips(_random(), batch, 2)
    assert out.edge_attr is None
    with pytest.raises(ValueError, match="no edge_attr"):
        random_edge_flips(batch, 1, bond_attr=(1, 0, 0))


def test_random_flips_are_seeded() -> None:
    batch = _molecules()
    first = random_edge_flips(batch, 2, generator=torch.Generator().manual_seed(3))
    again = random_edge_flips(batch, 2, generator=torch.Generator().manual_seed(3))
    other = random_edge_flips(batch, 2, generator=torch.Generator().manual_seed(4))
    assert torch.equal(first.edge_index, again.edge_index)
    assert torch.equal(first.edge_attr, again.edge_attr)
    assert not torch.equal(first.edge_index, other.edge_index)


def test_random_flips_are_uniform_and_independent_per_graph() -> None:
    """2000 copies of the path 0-1-2-3 in one batch, k = 2 of its 6 pairs: each pair flips in
    a third of the graphs, and the graphs do not all get the same flips."""
    path = Data(
        x=torch.zeros(4, len(ATOM_VOCAB), dtype=torch.long),
        edge_index=torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]]),
        edge_attr=torch.zeros(6, len(BOND_VOCAB), dtype=torch.long),
    )
    copies = 2000
    batch = Batch.from_data_list([path] * copies)
    out = random_edge_flips(batch, 2, generator=torch.Generator().manual_seed(0))
    before = torch.zeros(copies, 4, 4, dtype=torch.bool)
    after = torch.zeros(copies, 4, 4, dtype=torch.bool)
    for adjacency, edge_index in ((before, batch.edge_index), (after, out.edge_index)):
        graph = batch.batch[edge_index[0]]
        adjacency[graph, edge_index[0] % 4, edge_index[1] % 4] = True
    upper = torch.triu_indices(4, 4, offset=1)
    flipped = (before ^ after)[:, upper[0], upper[1]]  # (copies, 6)
    assert (flipped.sum(1) == 2).all()
    torch.testing.assert_close(flipped.float().mean(0), torch.full((6,), 1 / 3), atol=0.05, rtol=0)
    assert len({tuple(row) for row in flipped.tolist()}) == 15  # all C(6, 2) choices occur


def test_bad_arguments_raise() -> None:
    batch = _molecules()
    with pytest.raises(ValueError, match="k must be"):
        random_edge_flips(batch, -1)
    with pytest.raises(ValueError, match="bond_attr must have shape"):
        random_edge_flips(batch, 1, bond_attr=(1, 0))
    crossing = batch.clone()
    crossing.edge_index = torch.cat([batch.edge_index, torch.tensor([[0], [5]])], dim=1)
    crossing.edge_attr = torch.cat([batch.edge_attr, batch.edge_attr[:1]])
    with pytest.raises(ValueError, match="between different graphs"):
        random_edge_flips(crossing, 1)
    weighted = batch.clone()
    weighted.edge_weight = torch.ones(batch.num_edges)
    with pytest.raises(ValueError, match="edge_weight"):
        random_edge_flips(weighted, 1)
    blind = nn.Linear(len(ATOM_VOCAB), 1)  # a victim that ignores the edges
    for loss_fn in (lambda b: blind(b.x.float()).sum(), lambda b: b.x.float().sum()):
        with pytest.raises(ValueError, match=r"does not depend on batch\.edge_weight"):
            gradargmax_edge_flips(loss_fn, batch, 1)


def test_gradargmax_relaxation_is_exact_and_leaves_parameters_alone() -> None:
    """The victim sees every pair as an edge, non-bonds with weight 0: its logits are those of
    the clean batch. The attack takes the gradient of the weights only."""
    torch.manual_seed(0)
    victim = _Victim().eval()
    batch = _molecules()
    seen: list[Batch] = []

    def loss_fn(relaxed: Batch) -> Tensor:
        seen.append(relaxed)
        return _loss_fn(victim)(relaxed)

    with torch.no_grad():  # the attack turns gradients on for itself
        gradargmax_edge_flips(loss_fn, batch, 2)
    (relaxed,) = seen
    sizes = (batch.ptr[1:] - batch.ptr[:-1]).tolist()
    assert relaxed.num_edges == sum(n * (n - 1) for n in sizes)  # every pair, both ways
    assert relaxed.edge_weight.requires_grad
    with torch.no_grad():
        torch.testing.assert_close(victim(relaxed), victim(batch))
    assert all(param.grad is None for param in victim.parameters())


def _ring_or_chain(size: int, ring: bool) -> Data:
    """Carbon atoms (all features 0) joined by single bonds into a path, closed if ``ring``."""
    nodes = torch.arange(size)
    src, dst = nodes[:-1], nodes[1:]
    if ring:
        src, dst = torch.cat([src, nodes[-1:]]), torch.cat([dst, nodes[:1]])
    edge_index = torch.cat([torch.stack([src, dst]), torch.stack([dst, src])], dim=1)
    return Data(
        x=torch.zeros(size, len(ATOM_VOCAB), dtype=torch.long),
        edge_index=edge_index,
        edge_attr=torch.zeros(edge_index.shape[1], len(BOND_VOCAB), dtype=torch.long),
        y=torch.tensor([int(ring)]),
    )


def _trained_victim(batch: Batch, seed: int, steps: int = 60) -> _Victim:
    """A victim fitted to ``batch`` (label smoothing keeps its softmax off saturation), with
    batch-norm statistics recomputed from the final weights, in eval mode."""
    torch.manual_seed(seed)
    victim = _Victim(hidden=32)
    optimizer = torch.optim.Adam(victim.parameters(), lr=1e-2)
    for _ in range(steps):
        optimizer.zero_grad()
        F.cross_entropy(victim(batch), batch.y, label_smoothing=0.1).backward()
        optimizer.step()
    norms = [m for m in victim.modules() if isinstance(m, nn.BatchNorm1d)]
    for norm in norms:  # momentum None: a cumulative average, exact after one pass
        norm.reset_running_stats()
        norm.momentum = None
    with torch.no_grad():
        victim(batch)
    return victim.eval()


def test_gradargmax_hurts_trained_classifiers_more_than_random_flips() -> None:
    """Victims trained to tell rings from chains: one GradArgmax flip per graph raises their
    loss more than one random flip, on average over 10 victims (10 random draws each). One-shot
    GradArgmax is a first-order guess, so it need not win against every single victim."""
    graphs = [_ring_or_chain(size, ring) for size in range(4, 12) for ring in (False, True)]
    batch = Batch.from_data_list(graphs)
    clean, adversarial, random = [], [], []
    for seed in range(10):
        victim = _trained_victim(batch, seed)
        loss_fn = _loss_fn(victim)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            assert (victim(batch).argmax(1) == batch.y).all()  # the victim learned the task
            clean.append(loss_fn(batch).mean())
            adversarial.append(loss_fn(gradargmax_edge_flips(loss_fn, batch, 1)).mean())
            draws = [random_edge_flips(batch, 1, generator=generator) for _ in range(10)]
            random.append(torch.stack([loss_fn(draw).mean() for draw in draws]).mean())
    assert torch.stack(adversarial).mean() > torch.stack(random).mean() > torch.stack(clean).mean()
