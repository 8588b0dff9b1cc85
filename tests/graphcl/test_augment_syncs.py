"""Host round-trips of graphcl's augmentations, per call, counted on the CPU.

Two kinds are counted into one ``Counter``: the ops :func:`tests.sync_counts.count_syncs`
sees (a tensor value read on the host, a data-dependent output size), and the device→host
copies of ``graphcl.indexing.read_to_host``, which a CPU run cannot see (``.cpu()`` of a CPU tensor
dispatches nothing), counted by a spy as ``READ``. On a GPU both kinds wait for the device.

What remains, and why: an augmentation that changes graph sizes reads the new per-graph edge
counts once (PyG's ``Batch`` keeps its slices and ``num_nodes`` on the host; node counts are
known there from the slices), with the check of its random choice folded into that read.
``mask_attributes`` reads its choice's check; ``perturb_edges`` also reads the bonds per graph
and the check of its rejection sampling; ``random_choice`` reads its per-graph choice (to split
the batch) and then each part's read.
"""

from __future__ import annotations

import functools
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode
from torch_geometric.data import Batch

from graphcl import augment, collation, indexing, subgraph_growth
from tests.graphcl.test_augment import MASK, assert_batches_equal, gen, molecules
from tests.sync_counts import SyncCounter, count_syncs

READ = "graphcl.indexing.read_to_host"
LSD = "aten._local_scalar_dense"


@contextmanager
def counting_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Count every ``graphcl.indexing.read_to_host`` into the active :class:`SyncCounter` as
    ``READ`` (outside a counter it is not counted), in every graphcl module that calls it."""
    read = indexing.read_to_host

    def spy(values: torch.Tensor) -> torch.Tensor:
        mode = _get_current_dispatch_mode()
        if isinstance(mode, SyncCounter):
            mode.counts[READ] += 1
        return read(values)

    for name, module in list(sys.modules.items()):
        if name.startswith("graphcl.") and getattr(module, "read_to_host", None) is read:
            monkeypatch.setattr(module, "read_to_host", spy)
    yield


def _drop_or_subgraph(batch: Batch, p: float, **kwargs: Any) -> Batch:
    return augment.random_choice([augment.drop_nodes, augment.subgraph], batch, p, **kwargs)


CASES: dict[str, tuple[Callable[..., Batch], Counter[str]]] = {
    "drop_nodes": (augment.drop_nodes, Counter({READ: 1})),
    "subgraph": (augment.subgraph, Counter({READ: 1})),
    "subgraph_compat": (
        functools.partial(augment.subgraph, graphcl_compat=True),
        Counter({READ: 2, LSD: 1}),  # the neighbours' number, the kept nodes, their edges
    ),
    "mask_attributes": (
        functools.partial(augment.mask_attributes, mask_index=MASK),
        Counter({LSD: 1}),  # the check of the choice; the sizes do not change
    ),
    # the bonds per graph, the kept edges (with the choice's check), one check per rejection
    # round of the new bonds (one round with these seeds; small graphs sometimes need two)
    "perturb_edges": (augment.perturb_edges, Counter({READ: 2, LSD: 1})),
    "identity": (augment.identity, Counter()),
    "random_drop_or_subgraph": (_drop_or_subgraph, Counter({READ: 3})),
}


def _counted(fn: Callable[..., Batch], batch: Batch, **kwargs: Any) -> Counter[str]:
    with count_syncs() as counts:
        fn(batch, 0.2, **kwargs)
    return counts


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("seeded", [True, False], ids=["generator", "global-rng"])
def test_host_round_trips_per_call(
    monkeypatch: pytest.MonkeyPatch, name: str, seeded: bool
) -> None:
    fn, expected = CASES[name]
    batch = molecules(repeat=8)  # 96 graphs: molecules, salts, graphs without bonds
    torch.manual_seed(1)
    with counting_reads(monkeypatch):
        counts = _counted(fn, batch, **({"generator": gen(1)} if seeded else {}))
    assert counts == expected, counts


def test_the_read_spy_sees_a_read() -> None:
    """A control: the spy counts a direct read once, under the counter only."""
    with pytest.MonkeyPatch.context() as monkeypatch, counting_reads(monkeypatch):
        indexing.read_to_host(torch.ones(3))  # outside the counter: not counted
        with count_syncs() as counts:
            indexing.read_to_host(torch.ones(3))
    assert counts == Counter({READ: 1})


def test_unsettled_growth_and_unfinished_choices_give_the_same_views(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rare paths (the relaxation not settled within its first rounds; a choice short
    after its first round) finish before the view is built: the same views, more reads."""
    batch = molecules(repeat=4)
    default = augment.subgraph(batch, 0.3, generator=gen(2))
    short = molecules(["no_bonds"], repeat=4000)  # 4 nodes, 2 dropped: a round may fall short
    dropped = augment.drop_nodes(short, 0.5, generator=gen(0))
    monkeypatch.setattr(subgraph_growth, "RELAX_ROUNDS", 1)
    with counting_reads(monkeypatch):
        with count_syncs() as counts:
            few_rounds = augment.subgraph(batch, 0.3, generator=gen(2))
        assert_batches_equal(few_rounds, default)
        assert counts[READ] == 2 and counts[LSD] > 1, counts  # a check per round, read again
        with count_syncs() as counts:
            out = augment.drop_nodes(short, 0.5, generator=gen(0))
    assert counts[READ] == 2 and counts[LSD] >= 1, counts  # the flag said "short": read again
    assert_batches_equal(out, dropped)
    assert bool((out.ptr.diff() == 2).all())


@pytest.mark.parametrize("seed", range(3))
def test_indices_with_a_known_count_equal_nonzero(seed: int) -> None:
    mask = torch.rand(200, generator=gen(seed)) < 0.3
    mask[:2] = seed == 1  # empty and full starts
    expected = mask.nonzero().view(-1)
    assert torch.equal(indexing.true_indices(mask, expected.numel()), expected)
    assert indexing.true_indices(torch.zeros(0, dtype=torch.bool), 0).numel() == 0


def test_layout_is_carried_by_the_views() -> None:
    """A view carries its layout, so augmenting it again derives nothing; a user's new
    attribute makes it derive the layout again (and refuse the attribute)."""
    batch = molecules(repeat=2)
    view = augment.drop_nodes(batch, 0.3, generator=gen(0))
    assert collation.batch_layout(view) is collation.batch_layout(view)
    assert collation.batch_layout(view) == collation.batch_layout(batch)
    view.extra = torch.zeros(view.num_nodes)
    with pytest.raises(ValueError, match="not made by collation"):
        augment.drop_nodes(view, 0.3)
