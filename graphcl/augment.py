"""GraphCL's graph augmentations (You et al. 2020) on a collated batch, with exact per-graph
semantics: each graph loses exactly its own share, ``edge_attr`` stays aligned with
``edge_index``, no edge crosses graphs and no graph becomes empty.

Every augmentation takes a collated PyG ``Batch`` (``Batch.from_data_list`` or a DataLoader) on
any device and returns a NEW ``Batch`` with the same graphs in the same order; the input is
never modified (attributes an augmentation leaves as they are are shared with it, as PyG's
transforms do). ``p`` is always the fraction of each graph that is removed or changed: graph g
with ``n_g`` nodes and ``m_g`` undirected bonds loses (or has masked) exactly ``⌊p·n_g⌋`` nodes,
or has exactly ``⌊p·m_g⌋`` bonds perturbed (``⌊·⌋`` of the float64 product, as Python's
``int(p * n)`` in the reference code). All graphs are augmented at once, never in a Python loop
over graphs: exact-size uniform choices per graph come from vectorised sequential rejection
sampling (:class:`graphcl.sampling._Choice`), growth from a first-passage relaxation
(:class:`graphcl.sampling._Growth`).

Node-level attributes (``x``, ``pos``, ...), edge-level attributes (``edge_attr``, ...) and
graph-level ones (``y``, ``smiles``, ...) are told apart by their collation slices; dropped
nodes disappear from all node-level attributes, ``batch``, ``ptr`` and ``num_nodes``, and the
result still splits with ``get_example``/``to_data_list`` (the batch is rebuilt by
:mod:`graphcl.batching`).

Randomness comes from ``generator`` when given, drawn on the generator's device and moved to the
batch's (so a seed gives the same augmentation on the CPU and on a GPU, and the global RNG is
untouched), else from torch's global RNG of the batch's device.

Host round-trips: output sizes depend on the draw, and a PyG ``Batch`` keeps its sizes on the
host (collation slices, ``num_nodes``), so an augmentation that changes sizes reads the new
per-graph edge counts from the device once (the node counts follow from the slices on the
host), with the check of its random choice folded into that read: ``drop_nodes`` and
``subgraph`` read once, ``mask_attributes`` once (its choice's check), ``perturb_edges`` two
or three times (the bonds per graph, the kept edges, the check of each rejection round of the
new bonds), ``random_choice`` once plus once per part, ``identity`` never. Rarely a choice or
the subgraph relaxation needs further rounds, each read once. Every other size is derived on
the host from the slices (CPU metadata), never once per graph.
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
    _kept_edges,
    _layout,
    _merge,
    _merge_sorted,
    _node_edge_slices,
    _offsets,
    _on_host,
    _ptr,
    _read,
    _read_counts,
    _select,
    _select_graphs,
    _to_device,
    _total,
)
from graphcl.sampling import (
    _Bonds,
    _Choice,
    _choose,
    _draw,
    _enumerate_non_bonds,
    _floor_fraction,
    _Growth,
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


def _select_nodes(
    batch: Batch, layout: Any, choose: Callable[[], tuple[Tensor, Tensor | None]],
    finish: Callable[[], object], host_counts: Tensor,
) -> Batch:  # fmt: skip
    """Keep the nodes ``choose()`` returns (with its device flag: the choice may be
    unfinished), ``host_counts`` (CPU) per graph: the view's one device read, the edges each
    graph keeps with the flag; when the flag was set, ``finish()`` and choose again."""
    node_mask, unfinished = choose()
    edge_counts = _kept_edges(batch, node_mask, unfinished)
    if edge_counts is None:
        finish()
        node_mask, _ = choose()
        edge_counts = _kept_edges(batch, node_mask)
        assert edge_counts is not None
    return _select(batch, layout, node_mask, host_counts, edge_counts)


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
    host_ptr, _ = _node_edge_slices(batch)
    host_dropped = _floor_fraction(p, host_ptr.diff())  # ⌊p·n_g⌋ on the host, from the slices
    choice = _Choice(
        batch.ptr, _floor_fraction(p, _nodes_per_graph(batch)), generator, host_ptr, host_dropped
    )
    return _select_nodes(
        batch, layout, lambda: (~choice.mask(finish=False), choice.unfinished), choice.mask,
        host_ptr.diff() - host_dropped,
    )  # fmt: skip


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
    host_ptr, _ = _node_edge_slices(batch)
    host_masked = _floor_fraction(p, host_ptr.diff())  # ⌊p·n_g⌋ on the host, from the slices
    counts = _floor_fraction(p, _nodes_per_graph(batch))
    masked = _choose(batch.ptr, counts, generator, host_ptr, host_masked)  # reads once
    rows = _indices(masked, _total(host_masked))  # (M,) masked atoms
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
    device, K = batch.batch.device, len(augmentations)
    choice = torch.randint(
        K, (batch.num_graphs,), generator=generator,
        device=device if generator is None else generator.device,
    )  # fmt: skip
    host_choice = _read(choice)  # the graphs of each part, on the host
    choice = _to_device(choice, device)
    by_choice = torch.argsort(host_choice, stable=True)  # (G,) graph ids grouped by choice
    per_choice = _on_host(_counts(host_choice, K))
    parts, graph_ids = [], []
    for k, (augmentation, graphs) in enumerate(
        zip(augmentations, torch.split(by_choice, per_choice), strict=True)
    ):
        if graphs.numel() == 0:
            continue
        part = _select_graphs(batch, layout, _at(choice == k, batch.batch), graphs)
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
    key_graph = _at(batch_vector, keys // num_nodes)  # (E,)
    per_graph = torch.stack([  # (2, G): m_g, and the bonds that are no self-loop
        _counts(key_graph, num_graphs, first),
        _counts(key_graph, num_graphs, first & (keys // num_nodes != keys % num_nodes)),
    ])  # fmt: skip
    bonds, proper = per_graph
    host_bonds, host_proper = _read(per_graph)  # device read 1: the bonds of every graph
    host_ptr, _ = _node_edge_slices(batch)
    perturbed, wanted, listed = _perturbation(p, counts, bonds, proper)  # (G,) each
    host_perturbed, host_wanted, host_listed = _perturbation(
        p, host_ptr.diff(), host_bonds, host_proper
    )
    bond_keys = _at(keys, _indices(first, _total(host_bonds)))  # (M,) ascending
    bond_graph = _at(batch_vector, bond_keys // num_nodes)
    choice = _Choice(_ptr(bond_graph, num_graphs), perturbed, generator, _offsets(host_bonds),
                     host_perturbed)  # fmt: skip

    def kept_edges() -> tuple[Tensor, Tensor | None]:
        kept = ~_at(choice.mask(finish=False), bond_of_edge)
        return kept, choice.unfinished

    # device read 2: the edges each graph keeps (with the choice's check)
    edge_graph = _at(batch_vector, edge_index[0])  # (E,)
    kept_mask, unfinished = kept_edges()
    host_kept = _read_counts(edge_graph, num_graphs, kept_mask, unfinished)
    if host_kept is None:
        choice.mask()
        kept_mask, _ = kept_edges()
        host_kept = _read_counts(edge_graph, num_graphs, kept_mask)
        assert host_kept is not None
    kept = _indices(kept_mask, _total(host_kept))  # (E_kept,) grouped by graph

    # additions among the free pairs; each graph by enumeration or rejection (see docstrings)
    bonded = _Bonds(bond_keys, batch_vector, ptr, host_ptr.diff())
    host_free = _pairs(host_ptr.diff()) - host_proper
    new_keys = torch.cat([
        _enumerate_non_bonds(bonded, torch.where(listed, wanted, 0),
                             torch.where(host_listed, host_wanted, 0), host_free, generator),
        _sample_non_bonds(bonded, torch.where(listed, 0, wanted),
                          torch.where(host_listed, 0, host_wanted), generator),  # read 3
    ]).sort().values  # fmt: skip  # (A,) grouped by graph
    u, v = new_keys // num_nodes, new_keys % num_nodes
    added = torch.stack([torch.stack([u, v], 1).view(-1), torch.stack([v, u], 1).view(-1)])
    num_added = new_keys.numel()  # = Σ_g wanted_g, known on the host

    # each graph's kept edges, then its added bonds (both directions): a merge by graph
    kept_edges_index = _columns(edge_index, kept)  # (2, E_kept)
    at_kept, at_added = _merge_sorted(
        _at(batch_vector, kept_edges_index[0]), _at(batch_vector, added[0]), num_graphs
    )
    size = kept.numel() + added.size(1)
    out_edges = edge_index.new_empty(2, size)
    for row in (0, 1):
        out_edges[row].index_copy_(0, at_kept, kept_edges_index[row])
        out_edges[row].index_copy_(0, at_added, added[row])
    if edge_attr_sampler == "empirical" and num_added:
        source = _draw(torch.randint, edge_index.size(1), (num_added,), generator=generator,
                       device=device).repeat_interleave(2, output_size=2 * num_added)  # fmt: skip
    values = {}
    for key, dim in layout.edge.items():
        value = batch[key]
        shape = list(value.shape)
        shape[dim] = size
        out = value.new_zeros(shape).index_copy_(dim, at_kept, value.index_select(dim, kept))
        if edge_attr_sampler == "empirical" and num_added:
            out.index_copy_(dim, at_added, value.index_select(dim, source))
        values[key] = out
    edge_slices = _offsets(host_kept + 2 * host_wanted)  # the graphs' new edge counts
    return _assemble(batch, layout, values, edge_index=out_edges, edge_slices=edge_slices)


def _pairs(counts: Tensor) -> Tensor:
    """Unordered pairs of distinct nodes per graph, ``n_g (n_g − 1) / 2``."""
    return counts * (counts - 1) // 2


def _perturbation(
    p: float, counts: Tensor, bonds: Tensor, proper: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Per graph: the bonds removed ``⌊p·m_g⌋``, the bonds wanted among the free pairs, and
    whether they are chosen by listing the pairs (few free pairs, or most of them wanted);
    the same on the host and on the device.

    Shape:
        counts (n_g), bonds (m_g), proper (bonds that are no self-loop): ``(G,)``.
    """
    pairs = _pairs(counts)
    free = pairs - proper
    perturbed = _floor_fraction(p, bonds)
    wanted = torch.minimum(perturbed, free)
    listed = (wanted > 0) & ((2 * free < pairs) | (free < 2 * wanted))
    return perturbed, wanted, listed


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
    :class:`graphcl.sampling._Growth`). If the seed's connected component is smaller than
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
    host_ptr, _ = _node_edge_slices(batch)
    host_counts = host_ptr.diff()
    host_target = host_counts - _floor_fraction(p, host_counts)  # (G,) on the host
    if graphcl_compat:
        chosen = _one_hop(batch, target, generator)
        host_kept = _read(_counts(batch.batch, batch.num_graphs, chosen))  # fewer than target
        edge_counts = _kept_edges(batch, chosen)
        assert edge_counts is not None
        return _select(batch, layout, chosen, host_kept, edge_counts)
    growth = _Growth(batch, generator, max(_on_host(host_counts), default=0))
    growth.relax()

    def first_nodes() -> tuple[Tensor, Tensor | None]:  # each graph's first `target` nodes
        times = growth.times
        order = torch.sort(times, stable=True).indices
        order = _at(order, torch.sort(_at(batch.batch, order), stable=True).indices)
        start = _ptr(batch.batch, batch.num_graphs)
        rank_sorted = torch.arange(batch.num_nodes, device=times.device) - _at(start, batch.batch)
        chosen = torch.zeros_like(batch.batch, dtype=torch.bool).scatter_(
            0, order, rank_sorted < _at(target, batch.batch)
        )
        return chosen, growth.unsettled

    return _select_nodes(batch, layout, first_nodes, growth.settle, host_target)


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
