"""GraphCL's graph augmentations (You et al. 2020) on a collated batch, with exact per-graph
semantics (DESIGN.md decision 7).

Every augmentation takes a collated PyG ``Batch`` (``Batch.from_data_list`` or a DataLoader) on
any device and returns a NEW ``Batch`` with the same graphs in the same order; the input is
never modified (attributes an augmentation leaves as they are are shared with it, as PyG's
transforms do). ``p`` is always the fraction of each graph that is removed or changed: graph g
with ``n_g`` nodes and ``m_g`` undirected bonds loses (or has masked) exactly ``⌊p·n_g⌋`` nodes,
or has exactly ``⌊p·m_g⌋`` bonds perturbed (``⌊·⌋`` of the float64 product, as Python's
``int(p * n)`` in the reference code). All graphs are augmented at once, never in a Python loop
over graphs: exact-size uniform choices per graph come from vectorised sequential rejection
sampling (:func:`graphcl.sampling._choose`), growth from a first-passage relaxation
(:func:`graphcl.sampling._growth_times`).

Node-level attributes (``x``, ``pos``, ...), edge-level attributes (``edge_attr``, ...) and
graph-level ones (``y``, ``smiles``, ...) are told apart by their collation slices; dropped
nodes disappear from all node-level attributes, ``batch``, ``ptr`` and ``num_nodes``, and the
result still splits with ``get_example``/``to_data_list`` (the batch is rebuilt by
:mod:`graphcl.batching`).

Randomness comes from ``generator`` when given, drawn on the generator's device and moved to the
batch's (so a seed gives the same augmentation on the CPU and on a GPU, and the global RNG is
untouched), else from torch's global RNG of the batch's device. Output sizes depend on the draw,
so each call synchronises with the device a few times (a handful, plus one per relaxation round
in ``subgraph``), never once per graph.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from torch import Tensor
from torch_geometric.data import Batch
from torch_geometric.transforms import BaseTransform

from graphcl.batching import (
    _assemble,
    _at,
    _columns,
    _counts,
    _indices,
    _layout,
    _merge,
    _merge_sorted,
    _ptr,
    _select,
)
from graphcl.sampling import (
    _Bonds,
    _choose,
    _draw,
    _enumerate_non_bonds,
    _floor_fraction,
    _growth_times,
    _one_hop,
    _sample_non_bonds,
)

__all__ = [
    "AUGMENTATIONS",
    "DropNodes",
    "MaskAttributes",
    "PerturbEdges",
    "Subgraph",
    "drop_nodes",
    "identity",
    "mask_attributes",
    "perturb_edges",
    "random_choice",
    "subgraph",
]

# GraphCL TU code replaces masked continuous features with N(0.5, 0.5²) samples
NOISE_MEAN, NOISE_STD = 0.5, 0.5


def _check_p(name: str, p: float, *, allow_one: bool) -> None:
    ok = isinstance(p, (int, float)) and not isinstance(p, bool) and 0 <= p <= 1
    if not ok or (p == 1 and not allow_one):
        interval = "[0, 1]" if allow_one else "[0, 1)"
        raise ValueError(f"{name}: p must be in {interval}, got p={p!r}")


def _nodes_per_graph(batch: Batch) -> Tensor:
    ptr: Tensor = batch.ptr
    return ptr.diff()  # (G,)


# --------------------------------------------------------------------------- augmentations


def drop_nodes(batch: Batch, p: float = 0.2, *, generator: torch.Generator | None = None) -> Batch:
    """Node dropping: remove exactly ``⌊p·n_g⌋`` uniformly chosen nodes of every graph g,
    with their edges (GraphCL, You et al. 2020, §3.1; aug ratio 0.2).

    Dropped nodes really disappear: from every node-level attribute, ``batch``, ``ptr`` and the
    ``edge_index``/``edge_attr`` of their edges (renumbered). Since ``p < 1`` a graph keeps at
    least one node.

    Shape:
        batch: ``num_nodes`` nodes in G graphs; returns G graphs with
        ``Σ_g (n_g − ⌊p·n_g⌋)`` nodes.
    """
    _check_p("drop_nodes", p, allow_one=False)
    layout = _layout(batch)
    dropped = _choose(batch.ptr, _floor_fraction(p, _nodes_per_graph(batch)), generator)
    return _select(batch, layout, ~dropped)


def mask_attributes(
    batch: Batch,
    p: float = 0.2,
    *,
    mask_index: Sequence[int] | Tensor | None = None,
    mode: str = "mask",
    generator: torch.Generator | None = None,
) -> Batch:
    """Attribute masking: exactly ``⌊p·n_g⌋`` uniformly chosen atoms of every graph g get
    masked features ``x`` (GraphCL §3.1; aug ratio 0.2).

    Modes:
        ``"mask"``: every column of a masked row is set to its ``mask_index`` (one value per
        column of ``x``: the mask index of each categorical atom feature; GraphCL's chem code);
        ``"zero"`` (float ``x``): masked rows are zeros;
        ``"noise"`` (float ``x``): masked rows are replaced by N(0.5, 0.5²) samples, as GraphCL's
        TU code does.

    Shape:
        batch.x: ``(num_nodes, F)``; mask_index: ``(F,)``; the output has the input's shapes.
    """
    _check_p("mask_attributes", p, allow_one=True)
    if mode not in ("mask", "zero", "noise"):
        raise ValueError(f"mode must be 'mask', 'zero' or 'noise', got {mode!r}")
    layout = _layout(batch)
    x = batch.x
    if x is None:
        raise ValueError("mask_attributes needs node features x")
    width = x[0].numel() if x.size(0) else int(torch.Size(x.shape[1:]).numel())
    if mode == "mask":
        if mask_index is None:
            raise ValueError("mode='mask' needs mask_index: one mask value per column of x")
        value = torch.as_tensor(mask_index).to(device=x.device, dtype=x.dtype)
        if value.numel() != width:
            raise ValueError(f"mask_index has {value.numel()} values for {width} columns of x")
        value = value.view(x.shape[1:])
    elif not x.is_floating_point():
        raise ValueError(f"mode={mode!r} needs float x; categorical x is masked with mode='mask'")
    masked = _choose(batch.ptr, _floor_fraction(p, _nodes_per_graph(batch)), generator)
    rows = _indices(masked)  # (M,) masked atoms
    if mode == "zero":
        value = x.new_zeros(x.shape[1:])
    elif mode == "noise":
        noise = _draw(torch.randn, rows.numel(), *x.shape[1:], generator=generator,
                      device=x.device, dtype=x.dtype)  # fmt: skip
        value = noise * NOISE_STD + NOISE_MEAN  # (M, F)
    new_x = x.clone().index_copy_(0, rows, value.expand(rows.numel(), *x.shape[1:]))
    return _assemble(batch, layout, {"x": new_x})


def identity(batch: Batch, p: float = 0.0, *, generator: torch.Generator | None = None) -> Batch:
    """No augmentation: a new batch sharing the input's tensors (``p`` and ``generator`` are
    accepted and unused, so it mixes with the others in :func:`random_choice` and JOAO's
    pairs)."""
    return _assemble(batch, _layout(batch), {})


def random_choice(
    augmentations: Sequence[Callable[..., Batch]],
    batch: Batch,
    p: float = 0.2,
    *,
    generator: torch.Generator | None = None,
    **kwargs: Any,
) -> Batch:
    """Apply one augmentation per graph, chosen uniformly and independently for every graph
    (GraphCL's chem "random" view is ``[drop_nodes, subgraph]``: 50/50 per graph per view).

    The graphs that drew augmentation k are augmented together as one sub-batch; ``p`` and
    ``kwargs`` go to every augmentation (bind per-augmentation options with
    ``functools.partial``).
    """
    if len(augmentations) == 0:
        raise ValueError("random_choice needs at least one augmentation")
    layout = _layout(batch)
    device = batch.batch.device
    choice = torch.randint(
        len(augmentations), (batch.num_graphs,), generator=generator,
        device=device if generator is None else generator.device,
    ).cpu()  # fmt: skip
    parts, graph_ids = [], []
    for k, augmentation in enumerate(augmentations):
        graphs = (choice == k).nonzero().view(-1)
        if graphs.numel() == 0:
            continue
        node_mask = _at((choice == k).to(device), batch.batch)
        part = _select(batch, layout, node_mask, graphs)
        parts.append(augmentation(part, p, generator=generator, **kwargs))
        graph_ids.append(graphs)
    return _merge(batch, layout, parts, graph_ids)


def perturb_edges(
    batch: Batch,
    p: float = 0.2,
    *,
    edge_attr_sampler: Literal["empirical", "zeros"] = "empirical",
    generator: torch.Generator | None = None,
) -> Batch:
    """Edge perturbation: remove exactly ``⌊p·m_g⌋`` uniformly chosen bonds of every graph g
    (m_g undirected bonds) and add as many new bonds between unbonded distinct nodes of the same
    graph (GraphCL §3.1; aug ratio 0.2).

    Bonds are undirected: the directed edges ``u→v`` and ``v→u`` form one bond, removed or added
    together; added bonds appear in both directions with the same attributes. New bonds are
    drawn uniformly among the pairs not bonded in the input (never a self-loop, a duplicate or
    a pair across graphs); a graph with fewer free pairs than ``⌊p·m_g⌋`` (a nearly complete
    graph) gets all of them. ``edge_attr`` and every other edge-level attribute stay aligned
    with ``edge_index``: kept edges keep theirs, and added bonds get, with
    ``edge_attr_sampler="empirical"``, the attributes of one directed edge drawn uniformly from
    the whole input batch, or zeros with ``"zeros"``. (The reference code instead misaligns
    about half of the kept bonds' attributes and may add self-loops and duplicates.) Each
    graph's edges are its kept edges in their order, then its added bonds.

    Shape:
        batch.edge_index: ``(2, num_edges)``; the output has the same nodes and
        ``num_edges − 2·Σ_g ⌊p·m_g⌋ + 2·(bonds added)`` edges.
    """
    _check_p("perturb_edges", p, allow_one=True)
    if edge_attr_sampler not in ("empirical", "zeros"):
        raise ValueError(f"edge_attr_sampler must be 'empirical' or 'zeros', got "
                         f"{edge_attr_sampler!r}")  # fmt: skip
    layout = _layout(batch)
    edge_index, batch_vector, ptr = batch.edge_index, batch.batch, batch.ptr
    device, num_nodes, num_graphs = edge_index.device, batch.num_nodes, batch.num_graphs
    counts = ptr.diff()  # (G,)

    # bonds: the distinct unordered pairs {u, v}, grouped by graph in ascending key order
    lo, hi = torch.minimum(edge_index[0], edge_index[1]), torch.maximum(*edge_index)
    keys, order = torch.sort(lo * num_nodes + hi, stable=True)  # (E,)
    first = torch.ones_like(keys, dtype=torch.bool)
    first[1:] = keys[1:] != keys[:-1]
    bond_of_edge = torch.empty_like(order).scatter_(0, order, first.long().cumsum(0) - 1)
    bond_keys = keys.masked_select(first)  # (M,) ascending
    bond_lo, bond_hi = bond_keys // num_nodes, bond_keys % num_nodes
    bond_graph = _at(batch_vector, bond_lo)
    bonds = _counts(bond_graph, num_graphs)  # m_g
    perturbed = _floor_fraction(p, bonds)  # (G,)
    removed = _choose(_ptr(bond_graph, num_graphs), perturbed, generator)  # (M,)
    kept = _indices(~_at(removed, bond_of_edge))  # (E_kept,) grouped by graph

    # additions among the free pairs; each graph by enumeration or rejection (see docstrings)
    pairs = counts * (counts - 1) // 2
    free = pairs - _counts(bond_graph, num_graphs, bond_lo != bond_hi)
    wanted = torch.minimum(perturbed, free)
    listed = (wanted > 0) & ((2 * free < pairs) | (free < 2 * wanted))
    bonded = _Bonds(bond_keys, batch_vector, ptr)
    new_keys = torch.cat([
        _enumerate_non_bonds(bonded, torch.where(listed, wanted, 0), generator),
        _sample_non_bonds(bonded, torch.where(listed, 0, wanted), generator),
    ]).sort().values  # fmt: skip  # (A,) grouped by graph
    u, v = new_keys // num_nodes, new_keys % num_nodes
    added = torch.stack([torch.stack([u, v], 1).view(-1), torch.stack([v, u], 1).view(-1)])

    # each graph's kept edges, then its added bonds (both directions): a merge by graph
    kept_edges = _columns(edge_index, kept)  # (2, E_kept)
    at_kept, at_added = _merge_sorted(
        _at(batch_vector, kept_edges[0]), _at(batch_vector, added[0]), num_graphs
    )
    size = kept.numel() + added.size(1)
    out_edges = edge_index.new_empty(2, size)
    out_edges[0].index_copy_(0, at_kept, kept_edges[0]).index_copy_(0, at_added, added[0])
    out_edges[1].index_copy_(0, at_kept, kept_edges[1]).index_copy_(0, at_added, added[1])
    if edge_attr_sampler == "empirical" and new_keys.numel():
        source = _draw(torch.randint, edge_index.size(1), (new_keys.numel(),),
                       generator=generator, device=device).repeat_interleave(2)  # fmt: skip
    values = {}
    for key, dim in layout.edge.items():
        value = batch[key]
        shape = list(value.shape)
        shape[dim] = size
        out = value.new_zeros(shape).index_copy_(dim, at_kept, value.index_select(dim, kept))
        if edge_attr_sampler == "empirical" and new_keys.numel():
            out.index_copy_(dim, at_added, value.index_select(dim, source))
        values[key] = out
    return _assemble(batch, layout, values, out_edges)


def subgraph(
    batch: Batch,
    p: float = 0.2,
    *,
    graphcl_compat: bool = False,
    generator: torch.Generator | None = None,
) -> Batch:
    """Subgraph: keep exactly ``n_g − ⌊p·n_g⌋`` connected nodes of every graph g, grown from a
    uniformly random seed node (GraphCL §3.1), with the edges among them.

    ``p`` is the fraction REMOVED, as for the other augmentations: ``p=0.2`` keeps 80 % (JOAO's
    setting). The GraphCL reference's ``aug_ratio`` for subgraph is the fraction KEPT (0.2 keeps
    about 20 %): pass ``p = 1 − aug_ratio`` to match it.

    Growth adds one uniformly chosen frontier node (an unchosen neighbour of the set) at a time,
    as the fixed reference code (GraphCL's bio folder) does, so the subgraph is connected and
    spreads over many hops; all graphs are grown at once (see
    :func:`graphcl.sampling._growth_times`). If the seed's connected component is smaller than
    the target (a salt, an isolated atom), the whole component is taken and growth restarts
    from a uniformly chosen unchosen node, which lies in another component.

    ``graphcl_compat=True`` reproduces the reference's behaviour: its set union is discarded
    (``idx_neigh.union(...)`` without assignment, GraphCL issue #24), so only the seed's
    neighbours are ever added; it keeps ``min(n_g − ⌊p·n_g⌋, 1 + deg(seed))`` nodes.

    Shape:
        batch: ``num_nodes`` nodes in G graphs; returns G graphs with
        ``Σ_g (n_g − ⌊p·n_g⌋)`` nodes (fewer with ``graphcl_compat``).
    """
    _check_p("subgraph", p, allow_one=False)
    layout = _layout(batch)
    counts = _nodes_per_graph(batch)
    target = counts - _floor_fraction(p, counts)  # (G,)
    if graphcl_compat:
        return _select(batch, layout, _one_hop(batch, target, generator))
    times = _growth_times(batch, generator)
    order = torch.sort(times, stable=True).indices
    order = _at(order, torch.sort(_at(batch.batch, order), stable=True).indices)  # (graph, t)
    start = _ptr(batch.batch, batch.num_graphs)
    rank_sorted = torch.arange(batch.num_nodes, device=times.device) - _at(start, batch.batch)
    chosen = torch.zeros_like(batch.batch, dtype=torch.bool).scatter_(
        0, order, rank_sorted < _at(target, batch.batch)
    )
    return _select(batch, layout, chosen)


AUGMENTATIONS: dict[str, Callable[..., Batch]] = {
    "drop_nodes": drop_nodes,
    "perturb_edges": perturb_edges,
    "mask_attributes": mask_attributes,
    "subgraph": subgraph,
    "identity": identity,
}


# --------------------------------------------------------------------------- transforms


class _PerGraph(BaseTransform):  # type: ignore[misc]  # PyG is untyped
    """Apply a batch augmentation to one ``Data`` (batched alone) or to a ``Batch``; the
    randomness is torch's global RNG (seeded per DataLoader worker)."""

    @abstractmethod
    def _augment(self, batch: Batch) -> Batch:
        """The batch augmentation with this transform's settings (each subclass names one)."""

    def forward(self, data: Any) -> Any:
        if isinstance(data, Batch):
            return self._augment(data)
        return self._augment(Batch.from_data_list([data])).get_example(0)


class DropNodes(_PerGraph):
    """:func:`drop_nodes` as a transform."""

    def __init__(self, p: float = 0.2) -> None:
        _check_p("DropNodes", p, allow_one=False)
        self.p = p

    def _augment(self, batch: Batch) -> Batch:
        return drop_nodes(batch, self.p)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(p={self.p})"


class PerturbEdges(_PerGraph):
    """:func:`perturb_edges` as a transform."""

    def __init__(
        self, p: float = 0.2, edge_attr_sampler: Literal["empirical", "zeros"] = "empirical"
    ) -> None:
        _check_p("PerturbEdges", p, allow_one=True)
        self.p, self.edge_attr_sampler = p, edge_attr_sampler

    def _augment(self, batch: Batch) -> Batch:
        return perturb_edges(batch, self.p, edge_attr_sampler=self.edge_attr_sampler)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(p={self.p}, edge_attr_sampler={self.edge_attr_sampler!r})"


class MaskAttributes(_PerGraph):
    """:func:`mask_attributes` as a transform."""

    def __init__(
        self,
        p: float = 0.2,
        mask_index: Sequence[int] | Tensor | None = None,
        mode: Literal["mask", "zero", "noise"] = "mask",
    ) -> None:
        _check_p("MaskAttributes", p, allow_one=True)
        if mode == "mask" and mask_index is None:
            raise ValueError("mode='mask' needs mask_index: one mask value per column of x")
        self.p, self.mode = p, mode
        self.mask_index = None if mask_index is None else torch.as_tensor(mask_index).clone()

    def _augment(self, batch: Batch) -> Batch:
        return mask_attributes(batch, self.p, mask_index=self.mask_index, mode=self.mode)

    def __repr__(self) -> str:
        mask = None if self.mask_index is None else self.mask_index.tolist()
        return f"{type(self).__name__}(p={self.p}, mask_index={mask}, mode={self.mode!r})"


class Subgraph(_PerGraph):
    """:func:`subgraph` as a transform."""

    def __init__(self, p: float = 0.2, graphcl_compat: bool = False) -> None:
        _check_p("Subgraph", p, allow_one=False)
        self.p, self.graphcl_compat = p, graphcl_compat

    def _augment(self, batch: Batch) -> Batch:
        return subgraph(batch, self.p, graphcl_compat=self.graphcl_compat)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(p={self.p}, graphcl_compat={self.graphcl_compat})"
