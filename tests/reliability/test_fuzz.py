"""Property tests (hypothesis) of the pieces every training step runs on arbitrary input.

* graph augmentations (``graphcl.augment``) on random collated batches: single atoms, graphs
  without bonds, isolated atoms, several components, a very high degree atom, with and without
  ``edge_attr``, ``p`` in {0, 1, random}: the contract of the module docstring per graph;
* every loss of ``shared.losses.__all__`` on random shapes (N from 0), labels, dtypes and
  magnitudes: a finite value with a finite gradient, or a ``ValueError`` of one clear line;
* ``imagecl.augment.SimCLRViews`` and its presets on random sizes, channel counts and dtypes:
  the documented shape, dtype and pixel range, or a ``ValueError``.

Every property runs a bounded, derandomized number of examples, so CI is reproducible.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import Tensor
from torch_geometric.data import Batch, Data

import shared.losses as losses
from graphcl.augment import (
    AUGMENTATIONS,
    DropNodes,
    MaskAttributes,
    PerturbEdges,
    Subgraph,
    drop_nodes,
    mask_attributes,
    perturb_edges,
    random_choice,
    subgraph,
)
from imagecl.augment import PRESETS, SimCLRViews, ViewConfig

pytestmark = pytest.mark.reliability

FUZZ = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
MASK = (9998, 9999)  # mask index of the two columns of x: never a node id


def _one_line_value_error(err: ValueError) -> None:
    text = str(err)
    assert text.strip() and "\n" not in text.strip(), f"not one clear line: {text!r}"


# --------------------------------------------------------------------------- graphs


@st.composite
def molecule(draw: st.DrawFn, tag: int) -> Data:
    """One graph of a kind that breaks naive code, with unique node ids in ``x[:, 0]``."""
    kind = draw(st.sampled_from(["single", "no_bonds", "random", "star", "components"]))
    n = 1 if kind == "single" else draw(st.integers(2, 14 if kind != "star" else 40))
    pairs: set[tuple[int, int]] = set()
    if kind == "star":  # one atom bonded to every other: a very high degree
        pairs = {(0, i) for i in range(1, n)}
        pairs |= set(draw(st.sets(st.tuples(st.integers(1, n - 1), st.integers(1, n - 1)))))
    elif kind == "random":
        pairs = set(draw(st.sets(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)))))
    elif kind == "components":  # two parts, no bond between them, maybe isolated atoms
        cut = draw(st.integers(1, n - 1))
        left = st.tuples(st.integers(0, cut - 1), st.integers(0, cut - 1))
        right = st.tuples(st.integers(cut, n - 1), st.integers(cut, n - 1))
        pairs = set(draw(st.sets(left))) | set(draw(st.sets(right)))
    bonds = sorted({(min(u, v), max(u, v)) for u, v in pairs if u != v})
    ids = torch.arange(n) + 100 * tag
    pair = torch.tensor(bonds, dtype=torch.long).view(-1, 2)
    edge_index = torch.stack([pair, pair.flip(1)], 1).reshape(-1, 2).t().contiguous()
    data = Data(x=torch.stack([ids, ids % 7], 1), edge_index=edge_index, y=torch.tensor([tag]))
    data.num_nodes = n
    if draw(st.booleans()):  # a bond id per bond, both directions alike
        bond_ids = torch.arange(len(bonds)) + 100 * tag
        data.edge_attr = torch.stack([bond_ids, bond_ids % 3], 1).repeat_interleave(2, 0)
    return data


@st.composite
def graph_batch(draw: st.DrawFn) -> Batch:
    graphs = [draw(molecule(tag)) for tag in range(draw(st.integers(1, 5)))]
    if len({"edge_attr" in g for g in graphs}) > 1:  # collation needs one layout
        for g in graphs:
            if "edge_attr" in g:
                del g.edge_attr
    return Batch.from_data_list(graphs)


FRACTIONS = st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0.0, 1.0))


def _snapshot(batch: Batch) -> dict[str, Any]:
    return {k: v.clone() if isinstance(v, Tensor) else v for k, v in batch.items()}


def _bonds(data: Data) -> dict[tuple[int, int], tuple[int, ...]]:
    """Bond (pair of node ids) -> its attributes; asserts the two directions go together."""
    ids = data.x[:, 0].tolist()
    attrs = data.edge_attr.tolist() if "edge_attr" in data else [()] * data.num_edges
    assert len(attrs) == data.edge_index.size(1), "edge_attr is not aligned with edge_index"
    directed: dict[tuple[int, int], tuple[int, ...]] = {}
    for (u, v), attr in zip(data.edge_index.t().tolist(), attrs, strict=True):
        assert ids[u] != ids[v], "a self-loop"
        assert (ids[u], ids[v]) not in directed, "a duplicate edge"
        directed[ids[u], ids[v]] = tuple(attr)
    for (u, v), attr in directed.items():
        assert directed.get((v, u)) == attr, "a bond without its other direction, or misaligned"
    return {(min(u, v), max(u, v)): attr for (u, v), attr in directed.items()}


def _check_valid(out: Batch, batch: Batch) -> None:
    """A collated batch of the same graphs: no edge crosses graphs, graph-level data kept."""
    assert isinstance(out, Batch) and out.num_graphs == batch.num_graphs
    counts = torch.bincount(out.batch, minlength=out.num_graphs)
    assert torch.equal(out.ptr, torch.cat([counts.new_zeros(1), counts.cumsum(0)]))
    assert bool((counts >= 1).all()), "a graph became empty"
    if out.num_edges:
        assert int(out.edge_index.min()) >= 0 and int(out.edge_index.max()) < out.num_nodes
        assert torch.equal(out.batch[out.edge_index[0]], out.batch[out.edge_index[1]])
    assert torch.equal(out.y, batch.y)
    assert out.x.dtype == batch.x.dtype and out.edge_index.dtype == torch.long


def _check_induced(original: Data, view: Data, keep: int) -> None:
    """The view keeps ``keep`` atoms of ``original`` and exactly the bonds among them."""
    assert view.num_nodes == keep == view.x.size(0)
    kept = view.x[:, 0].tolist()
    assert set(kept) <= set(original.x[:, 0].tolist()) and len(set(kept)) == keep
    before, after = _bonds(original), _bonds(view)
    assert after == {b: a for b, a in before.items() if b[0] in kept and b[1] in kept}


def _augment(name: str, batch: Batch, p: float, g: torch.Generator) -> Batch:
    if name == "mask_attributes":
        return mask_attributes(batch, p, mask_index=MASK, generator=g)
    if name == "random":
        return random_choice([drop_nodes, subgraph], batch, p, generator=g)
    return AUGMENTATIONS[name](batch, p, generator=g)


@pytest.mark.parametrize("name", [*sorted(AUGMENTATIONS), "random"])
@FUZZ
@given(batch=graph_batch(), p=FRACTIONS, seed=st.integers(0, 2**16))
def test_graph_augmentation_contract(name: str, batch: Batch, p: float, seed: int) -> None:
    before = _snapshot(batch)
    removes_nodes = name in ("drop_nodes", "subgraph", "random")
    if removes_nodes and p >= 1:
        with pytest.raises(ValueError) as err:  # no graph may lose every node
            _augment(name, batch, p, torch.Generator().manual_seed(seed))
        _one_line_value_error(err.value)
        return
    out = _augment(name, batch, p, torch.Generator().manual_seed(seed))
    for key, value in before.items():  # the input is untouched
        same = torch.equal(batch[key], value) if isinstance(value, Tensor) else batch[key] == value
        assert same, f"{name} modified the input's {key}"
    assert out is not batch
    _check_valid(out, batch)
    for original, view in zip(batch.to_data_list(), out.to_data_list(), strict=True):
        n, m = original.num_nodes, len(_bonds(original))
        if removes_nodes:
            _check_induced(original, view, n - int(p * n))
        elif name == "perturb_edges":
            assert torch.equal(view.x, original.x)
            bonds, new = _bonds(original), _bonds(view)
            removed, added = bonds.keys() - new.keys(), new.keys() - bonds.keys()
            assert len(removed) == int(p * m)
            assert len(added) == min(int(p * m), n * (n - 1) // 2 - m)
            assert all(new[b] == bonds[b] for b in bonds.keys() & new.keys())
        elif name == "mask_attributes":
            masked = (view.x == torch.tensor(MASK)).all(1)
            assert int(masked.sum()) == int(p * n)
            assert torch.equal(view.x[~masked], original.x[~masked])
            assert torch.equal(view.edge_index, original.edge_index)  # ids are masked: compare
            if "edge_attr" in original:
                assert torch.equal(view.edge_attr, original.edge_attr)
        else:  # identity
            assert torch.equal(view.x, original.x) and _bonds(view) == _bonds(original)


@FUZZ
@given(batch=graph_batch(), p=st.floats(0.0, 1.0), seed=st.integers(0, 2**16))
def test_graph_augmentations_are_seeded_functions_of_the_input(
    batch: Batch, p: float, seed: int
) -> None:
    """One seed, one view, whatever the batch: the global RNG is never touched."""
    state = torch.get_rng_state()
    for name in ("perturb_edges", "mask_attributes"):
        first = _augment(name, batch, p, torch.Generator().manual_seed(seed))
        again = _augment(name, batch, p, torch.Generator().manual_seed(seed))
        assert torch.equal(first.edge_index, again.edge_index) and torch.equal(first.x, again.x)
    assert torch.equal(state, torch.get_rng_state())
    with pytest.raises(ValueError):
        perturb_edges(batch, p + 1.01)


@FUZZ
@given(
    batch=graph_batch(),
    p=FRACTIONS,
    mode=st.sampled_from(["zero", "noise"]),
    seed=st.integers(0, 2**16),
)
def test_mask_attributes_of_float_features(batch: Batch, p: float, mode: str, seed: int) -> None:
    batch.x = batch.x.double() + 1  # continuous features, no row of zeros
    before = batch.x.clone()
    out = mask_attributes(batch, p, mode=mode, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(batch.x, before) and out.x.dtype == torch.float64
    assert bool(torch.isfinite(out.x).all())
    changed = (out.x != batch.x).any(1)
    per_graph = torch.zeros(batch.num_graphs, dtype=torch.long).index_add_(
        0, batch.batch, changed.long()
    )
    # noise may redraw a row's own value only with probability 0
    assert torch.equal(per_graph, (batch.ptr.diff().double() * p).long())


@FUZZ
@given(graph=molecule(0), p=st.floats(0.0, 0.99), seed=st.integers(0, 2**16))
def test_per_graph_transforms_equal_the_batch_functions(graph: Data, p: float, seed: int) -> None:
    """The transforms on one ``Data`` (a loader worker's path) keep the batch contract."""
    transforms = {
        "drop_nodes": DropNodes(p),
        "perturb_edges": PerturbEdges(p),
        "mask_attributes": MaskAttributes(p, MASK),
        "subgraph": Subgraph(p),
    }
    before = graph.clone()
    for name, transform in transforms.items():
        torch.manual_seed(seed)
        out = transform(graph)
        assert type(out) is Data
        assert torch.equal(graph.x, before.x) and torch.equal(graph.edge_index, before.edge_index)
        torch.manual_seed(seed)
        kwargs: dict[str, Any] = {"mask_index": MASK} if name == "mask_attributes" else {}
        expected = AUGMENTATIONS[name](Batch.from_data_list([graph]), p, **kwargs).get_example(0)
        assert torch.equal(out.x, expected.x) and torch.equal(out.edge_index, expected.edge_index)


# --------------------------------------------------------------------------- losses

DTYPES = [torch.float32, torch.bfloat16, torch.float64]
# magnitudes of the features: the normalising losses are scale-free, so any magnitude must give
# a finite loss; the others (normalize=False, raw priors) get the range their values fit in
SCALE_FREE = [0.0, 1e-30, 1e-6, 1.0, 1e6, 1e30]
RAW = [0.0, 1e-30, 1e-6, 1.0, 1e3]
TEMPERATURES = [1e-3, 0.05, 0.1, 0.5, 1.0, 10.0]


class Inputs:
    """Draws the tensors of one loss call; every drawn leaf is checked for a finite gradient."""

    def __init__(self, draw: st.DrawFn, scale_free: bool) -> None:
        self.draw, self.n = draw, draw(st.integers(0, 9))
        self.d = draw(st.integers(1, 6))
        self.dtype = draw(st.sampled_from(DTYPES))
        self.scale = draw(st.sampled_from(SCALE_FREE if scale_free else RAW))
        self.generator = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
        self.leaves: list[Tensor] = []

    def features(self, *shape: int) -> Tensor:
        x = torch.randn(*shape, generator=self.generator, dtype=torch.float64) * self.scale
        leaf = x.to(self.dtype).requires_grad_()
        self.leaves.append(leaf)
        return leaf

    def labels(self, n: int | None = None) -> Tensor:
        n = self.n if n is None else n
        kind = self.draw(st.sampled_from(["one_class", "distinct", "singletons", "random"]))
        if kind == "one_class":
            return torch.zeros(n, dtype=torch.long)
        if kind == "distinct":
            return torch.arange(n)
        if kind == "singletons":  # one pair of a class, every other sample alone in its class
            return torch.cat(
                [torch.zeros(min(n, 2), dtype=torch.long), torch.arange(1, max(n - 1, 1))]
            )
        return torch.randint(3, (n,), generator=self.generator)

    def option(self, values: list[Any]) -> Any:
        return self.draw(st.sampled_from(values))


def _block(x: Inputs) -> int | None:
    return x.option([None, 1, 3])


def _reduction(x: Inputs) -> Any:
    return x.option(["mean", "sum", "none"])


def _nt_xent(x: Inputs) -> Tensor:
    z1, z2 = x.features(x.n, x.d), x.features(x.n, x.d)
    return losses.nt_xent_loss(
        z1, z2, temperature=x.option(TEMPERATURES), block_size=_block(x), reduction=_reduction(x)
    )


def _supcon(x: Inputs) -> Tensor:
    views = x.option([1, 2, 3])
    labels = x.option([True, False])
    return losses.supcon_loss(
        x.features(x.n, views, x.d),
        x.labels() if labels else None,
        temperature=x.option(TEMPERATURES),
        variant=x.option(["out", "in"]),
        contrast_mode=x.option(["all", "one"]),
        block_size=_block(x),
        reduction=_reduction(x),
    )


def _graphcl(x: Inputs) -> Tensor:
    return losses.graphcl_loss(
        x.features(x.n, x.d),
        x.features(x.n, x.d),
        temperature=x.option(TEMPERATURES),
        block_size=_block(x),
        reduction=_reduction(x),
    )


def _info_nce(x: Inputs) -> Tensor:
    k = x.option([0, 1, 4])
    negatives = x.option([None, (k, x.d), (x.n, k, x.d)])
    return losses.info_nce_loss(
        x.features(x.n, x.d),
        x.features(x.n, x.d),
        None if negatives is None else x.features(*negatives),
        temperature=x.option(TEMPERATURES),
        block_size=_block(x),
        in_batch=x.option([False, True]),
        reduction=_reduction(x),
    )


def _two_view_info_nce(x: Inputs) -> Tensor:
    return losses.two_view_info_nce_loss(
        x.features(x.n, x.d),
        x.features(x.n, x.d),
        x.features(x.option([0, 1, 5]), x.d),
        temperature=x.option(TEMPERATURES),
        block_size=_block(x),
    )


def _conditional(x: Inputs) -> Tensor:
    return losses.conditional_contrastive_loss(
        x.features(x.n, x.d),
        x.features(x.n, x.d),
        x.labels(),
        temperature=x.option(TEMPERATURES),
        positives=x.option(["all", "proxy"]),
        block_size=_block(x),
        reduction=_reduction(x),
    )


def _d2d_ce(x: Inputs) -> Tensor:
    return losses.data_to_data_cross_entropy_loss(
        x.features(x.n, x.d),
        x.features(x.n, x.d),
        x.labels(),
        temperature=x.option(TEMPERATURES),
        margin_pos=x.option([0.98, 0.0, -1.0, 2.0]),
        margin_neg=x.option([None, 0.02, -1.0, 1.5]),
        form=x.option(["studiogan", "paper"]),
        block_size=_block(x),
        reduction=_reduction(x),
    )


def _npairs(x: Inputs, normalize: bool) -> Tensor:
    return losses.npairs_loss(
        x.features(x.n, x.d),
        x.features(x.n, x.d),
        temperature=x.option(TEMPERATURES[1:] if not normalize else TEMPERATURES),
        normalize=normalize,
        block_size=_block(x),
        reduction=_reduction(x),
    )


def _triplet(x: Inputs, normalize: bool) -> Tensor:
    return losses.triplet_loss(
        x.features(x.n, x.d),
        x.features(x.n, x.d),
        x.features(x.n, x.d),
        margin=x.option([1e-6, 0.2, 1.0]),
        normalize=normalize,
        reduction=_reduction(x),
    )


def _nt_logistic(x: Inputs, normalize: bool) -> Tensor:
    return losses.nt_logistic_loss(
        x.features(x.n, x.d),
        x.features(x.n, x.d),
        temperature=x.option(TEMPERATURES),
        normalize=normalize,
        negative_weight=x.option(["mean", "sum"]),
        reduction=_reduction(x),
    )


def _generalized(x: Inputs, prior: str) -> Tensor:
    return losses.generalized_contrastive_loss(
        x.features(x.n, x.d),
        x.features(x.n, x.d),
        prior=prior,  # type: ignore[arg-type]
        lam=x.option([0.0, 1.0, 100.0]),
        temperature=x.option(TEMPERATURES),
        generator=x.generator,
    )


def _sliced_wasserstein(x: Inputs) -> Tensor:
    return losses.sliced_wasserstein_distance(
        x.features(x.n, x.d),
        x.features(x.n, x.d),
        num_projections=x.option([None, 1, 2 * x.d + 1]),
        generator=x.generator,
    )


def _alignment(x: Inputs) -> Tensor:
    return losses.alignment(x.features(x.n, x.d), x.features(x.n, x.d), alpha=x.option([1, 2]))


def _uniformity(x: Inputs) -> Tensor:
    return losses.uniformity(x.features(x.n, x.d), t=x.option([0.5, 2.0]))


def _masked_logsumexp(x: Inputs) -> Tensor:
    k = x.option([x.n, 0, 3])
    a, c = x.features(x.n, x.d), x.features(k, x.d)
    labels = x.option([True, False])
    out = losses.masked_logsumexp(
        a,
        c,
        temperature=x.option(TEMPERATURES),
        self_index="diagonal" if k == x.n and x.option([True, False]) else None,
        anchor_labels=x.labels() if labels else None,
        contrast_labels=x.labels(k) if labels else None,
        block_size=_block(x),
    )
    parts = [out.all] + ([out.positive] if out.positive is not None else [])
    for part in parts:  # an empty sum is -inf (documented); never NaN or +inf
        assert not bool(torch.isnan(part).any() or torch.isposinf(part).any()), part
    # the finite sums are the loss the caller builds; their gradient must be finite
    return sum((torch.where(torch.isfinite(p), p, 0.0).sum() for p in parts), a.sum() * 0)


# name in shared.losses.__all__ -> (builder, whether it normalises its inputs)
LOSSES: dict[str, list[tuple[Callable[[Inputs], Tensor], bool]]] = {
    "nt_xent_loss": [(_nt_xent, True)],
    "supcon_loss": [(_supcon, True)],
    "graphcl_loss": [(_graphcl, True)],
    "info_nce_loss": [(_info_nce, True)],
    "two_view_info_nce_loss": [(_two_view_info_nce, True)],
    "conditional_contrastive_loss": [(_conditional, True)],
    "data_to_data_cross_entropy_loss": [(_d2d_ce, True)],
    "npairs_loss": [(lambda x: _npairs(x, True), True), (lambda x: _npairs(x, False), False)],
    "triplet_loss": [(lambda x: _triplet(x, True), True), (lambda x: _triplet(x, False), False)],
    "nt_logistic_loss": [
        (lambda x: _nt_logistic(x, True), True),
        (lambda x: _nt_logistic(x, False), False),
    ],
    "generalized_contrastive_loss": [
        (lambda x: _generalized(x, "uniform_hypersphere"), True),
        (lambda x: _generalized(x, "decoupled_nt_xent"), True),
        (lambda x: _generalized(x, "normal"), False),
        (lambda x: _generalized(x, "uniform_hypercube"), False),
    ],
    "sliced_wasserstein_distance": [(_sliced_wasserstein, False)],
    "alignment": [(_alignment, True)],
    "uniformity": [(_uniformity, True)],
    "masked_logsumexp": [(_masked_logsumexp, False)],
}
# what __all__ holds besides loss functions: their nn.Module wrappers (thin, settings only), the
# queue, the core's result type, and the samplers of the generalized loss
NOT_LOSS_FUNCTIONS = {"LogSumExps", "MemoryQueue", "random_orthogonal", "sample_prior"}
CASES = [(name, i) for name, builders in LOSSES.items() for i in range(len(builders))]


def test_every_loss_is_fuzzed() -> None:
    classes = {name for name in losses.__all__ if inspect.isclass(getattr(losses, name))}
    assert set(losses.__all__) - classes - NOT_LOSS_FUNCTIONS == set(LOSSES)


@pytest.mark.parametrize(("name", "variant"), CASES, ids=[f"{n}-{i}" for n, i in CASES])
@FUZZ
@given(data=st.data())
def test_loss_is_finite_or_a_clear_value_error(
    name: str, variant: int, data: st.DataObject
) -> None:
    builder, scale_free = LOSSES[name][variant]
    inputs = Inputs(data.draw, scale_free)
    try:
        loss = builder(inputs)
    except ValueError as err:
        _one_line_value_error(err)
        return
    what = f"{name} on N={inputs.n}, D={inputs.d}, {inputs.dtype}, scale {inputs.scale:g}"
    assert bool(torch.isfinite(loss).all()), f"{what}: {loss}"
    loss.float().sum().backward()
    for leaf in inputs.leaves:
        assert leaf.grad is None or bool(torch.isfinite(leaf.grad).all()), f"{what}: gradient"


# --------------------------------------------------------------------------- image views


@st.composite
def view_config(draw: st.DrawFn) -> str | ViewConfig:
    if draw(st.booleans()):
        return draw(st.sampled_from(sorted(PRESETS)))
    low = draw(st.floats(0.01, 1.0))
    ratio = draw(st.floats(0.2, 5.0))
    return ViewConfig(
        crop_scale=(low, draw(st.floats(low, 1.0))),
        crop_ratio=(ratio, draw(st.floats(ratio, 6.0))),
        flip_p=draw(st.sampled_from([0.0, 0.5, 1.0])),
        jitter_strength=draw(st.floats(0.0, 2.5)),
        jitter_p=draw(st.sampled_from([0.0, 0.8, 1.0])),
        gray_p=draw(st.sampled_from([0.0, 0.2, 1.0])),
        blur_p=draw(st.sampled_from([0.0, 0.5, 1.0])),
        color=draw(st.booleans()),
    )


@FUZZ
@given(
    config=view_config(),
    n=st.integers(0, 3),
    channels=st.sampled_from([1, 2, 3, 4, 5]),
    height=st.integers(1, 40),
    width=st.integers(1, 40),
    size=st.integers(1, 24),
    views=st.integers(1, 3),
    dtype=st.sampled_from([torch.uint8, torch.uint8, torch.float32, torch.int16, torch.bool]),
    seed=st.integers(0, 2**16),
)
def test_simclr_views_contract(
    config: str | ViewConfig,
    n: int,
    channels: int,
    height: int,
    width: int,
    size: int,
    views: int,
    dtype: torch.dtype,
    seed: int,
) -> None:
    mean, std = [0.5] * channels, [0.25] * channels
    aug = SimCLRViews(size, mean, std, config, views=views)
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, channels, height, width), generator=g).to(dtype)
    before = images.clone()
    if dtype != torch.uint8 or channels == 2:
        with pytest.raises(ValueError) as err:
            aug(images, generator=g)
        _one_line_value_error(err.value)
        return
    out = aug(images, generator=g)
    assert torch.equal(images, before), "the input was modified"
    assert out.shape == (n, views, channels, size, size) and out.dtype == torch.float32
    pixels = out * 0.25 + 0.5  # back to [0, 1] pixels
    assert bool(torch.isfinite(out).all())
    assert bool(((pixels > -1e-4) & (pixels < 1 + 1e-4)).all()), "views leave [0, 1] pixels"


@FUZZ
@given(
    size=st.one_of(st.integers(-3, 0), st.just(True), st.floats(0.5, 3.0)),
    views=st.integers(-2, 3),
)
def test_simclr_views_bad_settings_raise(size: Any, views: int) -> None:
    with pytest.raises(ValueError) as err:
        SimCLRViews(size, [0.5], [0.5], views=views)
    _one_line_value_error(err.value)
    for bad in ({"crop_scale": (0.0, 1.0)}, {"flip_p": math.nan}, {"jitter_strength": 3.0}):
        with pytest.raises(ValueError):
            ViewConfig(**bad)  # type: ignore[arg-type]
