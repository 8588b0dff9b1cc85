"""Hu et al.'s GIN layer, its neighbourhood sum computed as two sparse matrix products.

The molecular GIN of Hu et al. 2019 ("Strategies for Pre-training Graph Neural Networks", the
network GraphCL pre-trains for transfer) aggregates, over the neighbours of i and i itself,

    a_i = Σ_{j ∈ N(i) ∪ {i}} w_ji · (x_j + E(e_ji)),        x'_i = MLP(a_i),

the self-loop carrying a bond type of its own and the message x_j + E(e_ji) having no
non-linearity (PyG's ``GINEConv`` applies a ReLU to it, which :class:`graphcl.encoders.
WeightedGINConv` follows). Because that message is linear in x_j and in the bond embedding, the
sum splits into products with two matrices that depend on the batch alone, not on the layer:

    a = A x + x + C T + s

- A (n × n), A[i, j] = Σ w_ji over the bonds j → i: the weighted adjacency;
- C (n × K), C[i, k] = Σ w_ji over the bonds j → i whose features are combination k: K is the
  number of bond-feature combinations, Π_f vocab_f (35 for the pretrain-gnns layout);
- T (K × D), T[k] = Σ_f E_f[k_f]: every combination embedded once, from the layer's tables;
- s (D,), the self-loop's bond embedding (w = 1).

:class:`BondGraph` holds A and C in compressed sparse row form, built once per batch (one sort
of the bonds by target, no host round-trip) and shared by every layer. A layer then runs two
sparse-dense products instead of gathering an (E, D) tensor of messages, adding the (E, D) bond
embeddings and scattering the sum — and their backward — where E is about twice the number of
nodes. The per-bond form is kept (:meth:`HuGINConv.per_bond`): it is the oracle the tests
compare against, and the path taken when the loss is differentiated with respect to the edge
weights (GradArgmax), which the sparse products do not propagate to.

The sums run in float32 or wider with autocast off, as the encoders' message sums do.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch_geometric.utils import scatter

from graphcl.embeddings import CategoricalEmbedding
from graphcl.embeddings import upcast as _upcast

__all__ = ["BondGraph", "HuGINConv", "bond_graph"]


class BondGraph(NamedTuple):
    """The batch's weighted adjacency A (n, n) and bond-combination counts C (n, K), CSR."""

    adjacency: Tensor
    bond_counts: Tensor


def _combination(edge_attr: Tensor, vocab: Sequence[int]) -> Tensor:
    """Each bond's feature combination as one index in [0, Π vocab) (row-major)."""
    index = edge_attr[:, 0]
    for column in range(1, len(vocab)):
        index = index * vocab[column] + edge_attr[:, column]
    return index


def bond_graph(
    edge_index: Tensor,
    edge_attr: Tensor,
    num_nodes: int,
    vocab: Sequence[int],
    edge_weight: Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> BondGraph:
    """A and C of the module doc for one batch, rows sorted by target node.

    Shape:
        - Input: edge_index (2, E), edge_attr (E, len(vocab)) long, edge_weight (E,)
        - Output: adjacency (n, n) and bond_counts (n, Π vocab), sparse CSR, ``dtype``
    """
    source, target = edge_index
    combination = _combination(edge_attr, vocab)
    # stable sort by target, then by source within a target: the CSR column order
    order = torch.argsort(target * num_nodes + source, stable=True)
    target_sorted = target[order]
    rows = torch.searchsorted(
        target_sorted, torch.arange(num_nodes + 1, device=target.device, dtype=target.dtype)
    )
    values = (
        torch.ones(order.numel(), dtype=dtype, device=target.device)
        if edge_weight is None
        else edge_weight[order].to(dtype)
    )
    combinations = math.prod(vocab)
    with warnings.catch_warnings():  # torch calls its CSR tensors "beta" once per process
        warnings.filterwarnings("ignore", "Sparse CSR tensor support", UserWarning)
        adjacency = torch.sparse_csr_tensor(
            rows, source[order], values, (num_nodes, num_nodes), check_invariants=False
        )
        counts = torch.sparse_csr_tensor(
            rows, combination[order], values, (num_nodes, combinations), check_invariants=False
        )
    return BondGraph(adjacency, counts)


class HuGINConv(nn.Module):
    """x'_i = MLP(Σ_{j ∈ N(i) ∪ {i}} w_ji (x_j + E(e_ji))): Hu et al.'s GIN layer (module doc).

    ``edge_embedding`` embeds the bonds; ``self_loop`` (D,) is the self-loop's bond embedding,
    a learned vector (Hu et al.: the embedding of a reserved bond type), initialised as the sum
    of one Xavier-uniform row per bond feature, as the tables' rows are.

    Shape:
        - Input: x (n, D), edge_index (2, E), edge_attr (E, F_bond) long, edge_weight (E,),
          graph: the batch's :class:`BondGraph` (built when not given)
        - Output: (n, D_out)
    """

    def __init__(self, mlp: nn.Module, bond_vocab: Sequence[int], dim: int) -> None:
        super().__init__()
        self.mlp = mlp
        self.edge_embedding = CategoricalEmbedding(bond_vocab, dim)
        rows = torch.empty(len(bond_vocab), dim)
        nn.init.xavier_uniform_(rows)
        self.self_loop = nn.Parameter(rows.sum(dim=0))

    def combination_table(self) -> Tensor:
        """T (K, D): the embedding of every bond-feature combination, row-major."""
        tables: list[Tensor] = [
            embedding.weight  # type: ignore[misc]  # an nn.Embedding's weight
            for embedding in self.edge_embedding.embeddings
        ]
        table = tables[0]  # (v_0, D)
        for other in tables[1:]:
            table = (table[:, None, :] + other[None, :, :]).reshape(-1, other.shape[-1])
        return table

    def forward(
        self,
        x: Tensor,
        edge_index: Tensor,
        edge_attr: Tensor,
        edge_weight: Tensor | None = None,
        graph: BondGraph | None = None,
    ) -> Tensor:
        if edge_weight is not None and edge_weight.requires_grad:
            aggregated = self.per_bond(x, edge_index, edge_attr, edge_weight)
        else:
            if graph is None:
                graph = bond_graph(
                    edge_index, edge_attr, x.shape[0], self.edge_embedding.vocab, edge_weight
                )
            with torch.autocast(x.device.type, enabled=False):
                h = _upcast(x)  # (n, D)
                table = self.combination_table().to(h.dtype)  # (K, D)
                adjacency = graph.adjacency.to(h.dtype)
                counts = graph.bond_counts.to(h.dtype)
                neighbours = torch.sparse.mm(adjacency, h) + torch.sparse.mm(counts, table)
                aggregated = neighbours + h + self.self_loop.to(h.dtype)  # (n, D)
        out: Tensor = self.mlp(aggregated)  # (n, D_out)
        return out

    def per_bond(
        self, x: Tensor, edge_index: Tensor, edge_attr: Tensor, edge_weight: Tensor | None = None
    ) -> Tensor:
        """The neighbourhood sum a (n, D) the message-passing way: one (E, D) message per bond."""
        source, target = edge_index
        message = _upcast(x[source] + self.edge_embedding(edge_attr))  # (E, D)
        if edge_weight is not None:
            message = message * edge_weight.unsqueeze(-1)
        summed: Tensor = scatter(message, target, dim=0, dim_size=x.shape[0], reduce="sum")
        return summed + _upcast(x) + self.self_loop.to(summed.dtype)
