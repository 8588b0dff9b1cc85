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
sampling (:class:`graphcl.sampling.Choice`), growth from a first-passage relaxation
(:mod:`graphcl.subgraph_growth`).

Node-level attributes (``x``, ``pos``, ...), edge-level attributes (``edge_attr``, ...) and
graph-level ones (``y``, ``smiles``, ...) are told apart by their collation slices; dropped
nodes disappear from all node-level attributes, ``batch``, ``ptr`` and ``num_nodes``, and the
result still splits with ``get_example``/``to_data_list`` (the batch is rebuilt by
:mod:`graphcl.batching`). :func:`perturb_edges` lives in :mod:`graphcl.edge_perturbation` and
:func:`subgraph` in :mod:`graphcl.subgraph_growth`; this module is the public home of all of them.

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

from graphcl.batching import assemble, merge, select_graphs, select_nodes
from graphcl.collation import batch_layout, node_edge_slices
from graphcl.edge_perturbation import perturb_edges
from graphcl.indexing import (
    group_counts,
    host_list,
    host_total,
    read_to_host,
    rows_at,
    to_device,
    true_indices,
)
from graphcl.sampling import Choice, check_fraction, choose, draw, floor_fraction
from graphcl.subgraph_growth import subgraph

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
    check_fraction("drop_nodes", p, allow_one=False)
    layout = batch_layout(batch)
    host_ptr, _ = node_edge_slices(batch)
    host_dropped = floor_fraction(p, host_ptr.diff())  # ⌊p·n_g⌋ on the host, from the slices
    choice = Choice(
        batch.ptr, floor_fraction(p, batch.ptr.diff()), generator, host_ptr, host_dropped
    )
    return select_nodes(
        batch,
        layout,
        lambda: (~choice.mask(finish=False), choice.unfinished),
        choice.mask,
        host_ptr.diff() - host_dropped,
    )


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
    check_fraction("mask_attributes", p, allow_one=True)
    if mode not in ("mask", "zero", "noise"):
        raise ValueError(f"mode must be 'mask', 'zero' or 'noise', got {mode!r}")
    layout = batch_layout(batch)
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
    host_ptr, _ = node_edge_slices(batch)
    host_masked = floor_fraction(p, host_ptr.diff())  # ⌊p·n_g⌋ on the host, from the slices
    counts = floor_fraction(p, batch.ptr.diff())
    masked = choose(batch.ptr, counts, generator, host_ptr, host_masked)  # reads once
    rows = true_indices(masked, host_total(host_masked))  # (M,) masked atoms
    if mode == "zero":
        value = x.new_zeros(x.shape[1:])
    elif mode == "noise":
        noise = draw(
            torch.randn,
            rows.numel(),
            *x.shape[1:],
            generator=generator,
            device=x.device,
            dtype=x.dtype,
        )
        value = noise * NOISE_STD + NOISE_MEAN  # (M, F)
    new_x = x.clone().index_copy_(0, rows, value.expand(rows.numel(), *x.shape[1:]))
    return assemble(batch, layout, {"x": new_x})


def identity(batch: Batch, p: float = 0.0, *, generator: torch.Generator | None = None) -> Batch:
    """No augmentation: a new batch sharing the input's tensors (``p`` and ``generator`` are
    accepted and unused, so it mixes with the others in :func:`random_choice` and JOAO's
    pairs)."""
    return assemble(batch, batch_layout(batch), {})


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
    layout = batch_layout(batch)
    device, K = batch.batch.device, len(augmentations)
    choice = torch.randint(
        K,
        (batch.num_graphs,),
        generator=generator,
        device=device if generator is None else generator.device,
    )
    host_choice = read_to_host(choice)  # the graphs of each part, on the host
    choice = to_device(choice, device)
    by_choice = torch.argsort(host_choice, stable=True)  # (G,) graph ids grouped by choice
    per_choice = host_list(group_counts(host_choice, K))
    parts, graph_ids = [], []
    for k, (augmentation, graphs) in enumerate(
        zip(augmentations, torch.split(by_choice, per_choice), strict=True)
    ):
        if graphs.numel() == 0:
            continue
        part = select_graphs(batch, layout, rows_at(choice == k, batch.batch), graphs)
        parts.append(augmentation(part, p, generator=generator, **kwargs))
        graph_ids.append(graphs)
    return merge(batch, layout, parts, graph_ids)


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
        check_fraction("DropNodes", p, allow_one=False)
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
        check_fraction("PerturbEdges", p, allow_one=True)
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
        check_fraction("MaskAttributes", p, allow_one=True)
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
        check_fraction("Subgraph", p, allow_one=False)
        self.p, self.graphcl_compat = p, graphcl_compat

    def _augment(self, batch: Batch) -> Batch:
        return subgraph(batch, self.p, graphcl_compat=self.graphcl_compat)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(p={self.p}, graphcl_compat={self.graphcl_compat})"
