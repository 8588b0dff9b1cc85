"""Edge-flip attacks on a collated batch of undirected graphs, for GraphCL's robustness table.

GraphCL (You et al. 2020, Sec. 4.4) reports the accuracy of a fine-tuned classifier under the
RandSampling and GradArgmax attacks of Dai et al. 2018 ("Adversarial Attack on Graph Structured
Data"). A flip toggles one unordered pair {i, j} of distinct nodes of the same graph: an existing
bond is removed (both directions), a missing one is added (both directions, with the attribute
row ``bond_attr``; default: the batch's most common bond attribute row). Each graph gets exactly
min(k, n_g(n_g - 1)/2) flips; edges never cross graphs; the input batch is not modified.

Both attacks work on the candidate set of every pair of each graph (Σ_g n_g(n_g - 1)/2 pairs),
which is small for molecules; nothing loops over graphs. GradArgmax evaluates the victim with
every pair as an edge: memory grows as Σ_g n_g² × width, so attack large graphs in small
batches. The batch must store every bond in both directions; self-loops are kept and never
flipped; other edge-level attributes (``edge_*`` besides ``edge_attr``, e.g. ``edge_weight``) are
refused, as their values for added bonds would be unknown.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor
from torch_geometric.data import Batch

from graphcl.collation import is_collated, replace_slices

__all__ = ["gradargmax_edge_flips", "random_edge_flips"]


class _Pairs(NamedTuple):
    """The candidate pairs i < j of every graph, in lexicographic order, and the batch's bonds.

    Shape:
        - row, col, graph, existing: (P,)
        - edge_pair: (E,), the candidate of each edge (undefined where ``edge_is_loop``)
        - edge_is_loop: (E,)
    """

    row: Tensor
    col: Tensor
    graph: Tensor
    existing: Tensor
    edge_pair: Tensor
    edge_is_loop: Tensor
    num_graphs: int


def _check_k(k: int) -> None:
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")


def _candidate_pairs(batch: Batch) -> _Pairs:
    """Every unordered pair i < j of nodes of the same graph, and which of them are bonds."""
    num_nodes = int(batch.num_nodes)
    device = batch.edge_index.device
    graph_of_node = batch.batch
    num_graphs = int(batch.num_graphs)
    nodes = torch.arange(num_nodes, device=device)  # (n,)
    graph_end = torch.bincount(graph_of_node, minlength=num_graphs).cumsum(0)  # (G,)
    partners = graph_end[graph_of_node] - nodes - 1  # (n,) nodes j > i in i's graph
    row = torch.repeat_interleave(nodes, partners)  # (P,)
    first_pair = partners.cumsum(0) - partners  # (n,)
    col = row + 1 + torch.arange(row.numel(), device=device) - first_pair[row]  # (P,)
    pair_key = row * num_nodes + col  # (P,) sorted ascending

    src, dst = batch.edge_index
    edge_is_loop = src == dst  # (E,)
    edge_key = torch.minimum(src, dst) * num_nodes + torch.maximum(src, dst)  # (E,)
    edge_pair = torch.searchsorted(pair_key, edge_key).clamp(max=max(row.numel() - 1, 0))
    bonds = ~edge_is_loop
    if bonds.any() and (
        row.numel() == 0 or not torch.equal(pair_key[edge_pair[bonds]], edge_key[bonds])
    ):
        raise ValueError("the batch has edges between different graphs")
    existing = torch.zeros(row.numel(), dtype=torch.bool, device=device)  # (P,)
    existing[edge_pair[bonds]] = True
    return _Pairs(row, col, graph_of_node[row], existing, edge_pair, edge_is_loop, num_graphs)


def _bond_row(batch: Batch, bond_attr: Sequence[int] | Tensor | None) -> Tensor | None:
    """The attribute row of added bonds: ``bond_attr``, else the batch's most common row.

    None when the batch has no ``edge_attr``, or has no bond to take the most common row from.
    """
    edge_attr: Tensor | None = batch.edge_attr
    if edge_attr is None:
        if bond_attr is not None:
            raise ValueError("bond_attr given, but the batch has no edge_attr")
        return None
    if bond_attr is None:
        if edge_attr.shape[0] == 0:
            return None
        rows, counts = torch.unique(edge_attr, dim=0, return_counts=True)  # ties: smallest row
        most_common: Tensor = rows[counts.argmax()]  # (F_bond,)
        return most_common
    row = torch.as_tensor(bond_attr, dtype=edge_attr.dtype, device=edge_attr.device)
    if row.shape != edge_attr.shape[1:]:
        raise ValueError(
            f"bond_attr must have shape {tuple(edge_attr.shape[1:])}, got {tuple(row.shape)}"
        )
    return row


def _check_edge_keys(batch: Batch) -> None:
    # by name (PyG's convention): shape-based detection mistakes a (G,) label for an edge
    # attribute whenever G equals the number of edges
    others = [
        key for key in batch.keys() if "edge" in key and key not in ("edge_index", "edge_attr")
    ]
    if others:
        raise ValueError(f"edge-level attributes other than edge_attr are not supported: {others}")


def _new_bond_attr(bond_row: Tensor | None, count: int) -> Tensor:
    if bond_row is None:
        raise ValueError("the batch has no bond to take a default bond_attr from; pass bond_attr")
    return bond_row.expand(count, *bond_row.shape)  # (count, F_bond)


def _with_edges(batch: Batch, edge_index: Tensor, edge_attr: Tensor | None) -> Batch:
    """A shallow copy of ``batch`` with new edges, grouped by graph so that slicing still works.

    Shape:
        - Input: edge_index (2, E'), edge_attr (E', F_bond)
    """
    graph_of_edge = batch.batch[edge_index[0]]  # (E',)
    order = torch.argsort(graph_of_edge, stable=True)  # (E',) a graph's edges keep their order
    out = copy.copy(batch)
    out.edge_index = edge_index[:, order]  # (2, E')
    if edge_attr is not None:
        out.edge_attr = edge_attr[order]  # (E', F_bond)
    if is_collated(batch):
        counts = torch.bincount(graph_of_edge, minlength=int(batch.num_graphs)).cpu()  # (G,)
        slices = torch.cat([counts.new_zeros(1), counts.cumsum(0)])  # (G + 1,)
        keys = ["edge_index"] if edge_attr is None else ["edge_index", "edge_attr"]
        replace_slices(out, dict.fromkeys(keys, slices))
    return out


def _apply_flips(batch: Batch, pairs: _Pairs, flip: Tensor, bond_row: Tensor | None) -> Batch:
    """Toggle the flagged candidate pairs: remove flagged bonds, add flagged non-bonds.

    Shape:
        - Input: flip (P,) bool
    """
    bonds = ~pairs.edge_is_loop  # (E,)
    removed = torch.zeros_like(bonds)  # (E,)
    removed[bonds] = flip[pairs.edge_pair[bonds]]
    added = flip & ~pairs.existing  # (P,)
    new_row, new_col = pairs.row[added], pairs.col[added]  # (A,)
    new_edges = torch.stack([torch.stack([new_row, new_col]), torch.stack([new_col, new_row])])
    new_edges = new_edges.permute(1, 2, 0).reshape(2, -1)  # (2, 2A): i->j, j->i side by side
    edge_index = torch.cat([batch.edge_index[:, ~removed], new_edges], dim=1)  # (2, E')
    edge_attr = batch.edge_attr
    if edge_attr is not None:
        new_attr = _new_bond_attr(bond_row, new_edges.shape[1]) if new_edges.shape[1] else None
        kept = edge_attr[~removed]  # (E - removed, F_bond)
        edge_attr = kept if new_attr is None else torch.cat([kept, new_attr])  # (E', F_bond)
    return _with_edges(batch, edge_index, edge_attr)


def _top_k_per_graph(score: Tensor, graph: Tensor, k: int, num_graphs: int) -> Tensor:
    """Mask of the k highest-scoring pairs of each graph (all of a graph's pairs if fewer).

    Shape:
        - Input: score, graph (P,)
        - Output: (P,) bool
    """
    order = torch.argsort(score, descending=True, stable=True)  # (P,)
    order = order[torch.argsort(graph[order], stable=True)]  # (P,) by graph, then by score
    counts = torch.bincount(graph, minlength=num_graphs)  # (G,)
    first = counts.cumsum(0) - counts  # (G,)
    rank = torch.arange(score.numel(), device=score.device) - first[graph[order]]  # (P,)
    mask = torch.zeros_like(graph, dtype=torch.bool)
    mask[order[rank < k]] = True
    return mask


def random_edge_flips(
    batch: Batch,
    k: int,
    *,
    generator: torch.Generator | None = None,
    bond_attr: Sequence[int] | Tensor | None = None,
) -> Batch:
    """RandSampling (Dai et al. 2018): flip k pairs of each graph drawn uniformly without
    replacement among its n_g(n_g - 1)/2 pairs.

    Shape:
        - Input: a ``Batch`` with edge_index (2, E) (both directions), edge_attr (E, F_bond)
        - Output: a new ``Batch``, edge_index (2, E'), edge_attr (E', F_bond); nodes unchanged
    """
    _check_k(k)
    _check_edge_keys(batch)
    pairs = _candidate_pairs(batch)
    score = torch.rand(pairs.row.numel(), generator=generator, device=pairs.row.device)  # (P,)
    flip = _top_k_per_graph(score, pairs.graph, k, pairs.num_graphs)  # (P,)
    return _apply_flips(batch, pairs, flip, _bond_row(batch, bond_attr))


def _relaxed_batch(batch: Batch, pairs: _Pairs, weight: Tensor, bond_row: Tensor | None) -> Batch:
    """The batch with every candidate pair as an edge, messages weighted by the pair's weight.

    Bonds keep their edges and attributes and take the weight of their pair; every non-bond pair
    is added in both directions with the attribute it would get if flipped; self-loops weigh 1.
    At weight = pairs.existing the encoder's output equals that on ``batch``.

    Shape:
        - Input: weight (P,)
        - Output: edge_index (2, E + 2·#non-bonds), edge_weight of the same length
    """
    absent = ~pairs.existing  # (P,)
    row, col = pairs.row[absent], pairs.col[absent]  # (B,)
    edge_index = torch.cat(
        [batch.edge_index, torch.stack([row, col]), torch.stack([col, row])], dim=1
    )  # (2, E + 2B)
    loop_weight = torch.ones_like(weight[:1]).expand(pairs.edge_pair.numel())  # (E,)
    bond_weight = torch.where(pairs.edge_is_loop, loop_weight, weight[pairs.edge_pair])  # (E,)
    absent_weight = weight[absent]  # (B,)
    out = copy.copy(batch)
    out.edge_index = edge_index
    out.edge_weight = torch.cat([bond_weight, absent_weight, absent_weight])  # (E + 2B,)
    if batch.edge_attr is not None:
        new_attr = _new_bond_attr(bond_row, 2 * row.numel()) if row.numel() else None
        if new_attr is not None:
            out.edge_attr = torch.cat([batch.edge_attr, new_attr])  # (E + 2B, F_bond)
    return out


def gradargmax_edge_flips(
    loss_fn: Callable[[Batch], Tensor],
    batch: Batch,
    k: int,
    *,
    bond_attr: Sequence[int] | Tensor | None = None,
) -> Batch:
    """GradArgmax (Dai et al. 2018): flip the k pairs of each graph whose flip raises the loss
    most to first order.

    The adjacency is relaxed to a weight w_ij per candidate pair (1 for bonds, 0 otherwise) and
    the victim is evaluated on the batch with every pair as an edge (``batch.edge_weight``, which
    our encoders multiply into the messages). With g = ∂loss/∂w, the gain of a flip is −g for a
    bond (w: 1 -> 0) and +g for a non-bond (w: 0 -> 1). One gradient is taken and the k
    largest gains of each graph are flipped at once, even negative ones, so that every graph gets
    exactly min(k, n_g(n_g - 1)/2) flips, like ``random_edge_flips``.

    ``loss_fn`` maps a batch to the victim's loss on its true labels, per graph (G,) or reduced
    (e.g. cross-entropy of model(batch) against batch.y); it must read ``batch.edge_weight``.
    Put the victim in eval mode first. Parameter gradients are left untouched.

    Shape:
        - Input: a ``Batch`` with edge_index (2, E) (both directions), edge_attr (E, F_bond)
        - Output: a new ``Batch``, edge_index (2, E'), edge_attr (E', F_bond); nodes unchanged
    """
    _check_k(k)
    _check_edge_keys(batch)
    pairs = _candidate_pairs(batch)
    bond_row = _bond_row(batch, bond_attr)
    if k == 0 or pairs.row.numel() == 0:
        return _apply_flips(batch, pairs, torch.zeros_like(pairs.existing), bond_row)
    with torch.enable_grad():
        weight = pairs.existing.float().requires_grad_()  # (P,)
        loss = loss_fn(_relaxed_batch(batch, pairs, weight, bond_row))
        grad = None
        if loss.requires_grad:
            (grad,) = torch.autograd.grad(loss.sum(), weight, allow_unused=True)  # (P,)
    if grad is None:
        raise ValueError("loss_fn does not depend on batch.edge_weight; GradArgmax needs it")
    gain = torch.where(pairs.existing, -grad, grad)  # (P,)
    flip = _top_k_per_graph(gain, pairs.graph, k, pairs.num_graphs)  # (P,)
    return _apply_flips(batch, pairs, flip, bond_row)
