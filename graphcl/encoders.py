"""GNN encoders f: graph -> h, the representation that GraphCL pre-trains and probes.

Two encoders, as in GraphCL (You et al. 2020):

- ``GINEncoder``: the molecular GIN of Hu et al. 2019 ("Strategies for Pre-training Graph Neural
  Networks", the transfer experiments): 5 layers × 300, a bond embedding per layer, batch norm,
  jumping knowledge, mean pooling.
- ``TUGIN``: the GIN of GraphCL's unsupervised TU experiments (inherited from InfoGraph): 3 layers
  × 32, ReLU then batch norm after each layer, sum pooling of every layer, concatenated.

Precision. Under bf16 autocast a layer's input is bf16 (the previous layer's MLP ran in bf16),
and PyG's scatter-add (torch_geometric 2.8, no torch_scatter) sums in the messages' dtype: bf16
messages are summed in bf16, ~1e-3 relative error on a 64-neighbour sum from the accumulation
alone. Messages are therefore cast to float32 before the aggregation (``_upcast``), and so are
node embeddings before pooling and the attention gate before its softmax; the linear layers still
run in bf16. float64 inputs stay float64.

Edge weights. Both encoders read ``batch.edge_weight`` (E,) when present and multiply every
message by it: w = 1 is the plain graph, w = 0 removes the edge. GradArgmax
(``graphcl.attacks``) differentiates the loss with respect to these weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.data import Data
from torch_geometric.nn import MessagePassing, global_add_pool, global_mean_pool
from torch_geometric.nn.aggr import AttentionalAggregation

from graphcl.embeddings import CategoricalEmbedding
from graphcl.embeddings import upcast as _upcast
from graphcl.hu_conv import BondGraph, HuGINConv, bond_graph

__all__ = [
    "ENCODERS",
    "GIN_CONVS",
    "TUGIN",
    "CategoricalEmbedding",
    "GINEncoder",
    "SafeBatchNorm1d",
    "WeightedGINConv",
    "build_encoder",
]

ENCODERS = ("gin", "tu_gin")

JumpingKnowledge = Literal["last", "concat", "max", "sum"]
Pooling = Literal["mean", "sum", "attention"]
GINConvKind = Literal["gine", "hu"]
GIN_CONVS: tuple[str, ...] = get_args(GINConvKind)


class _Upcast(nn.Module):
    """``_upcast`` as a module, to end the attention gate so that its softmax runs in float32."""

    def forward(self, x: Tensor) -> Tensor:
        return _upcast(x)


def _graph_index(batch: Data) -> tuple[Tensor, int]:
    """The graph of every node (n,) and the number of graphs G; a lone ``Data`` is one graph.

    ``Batch.num_graphs`` is a Python int, so pooling needs no host round-trip to size its output.
    """
    if batch.batch is None:
        return torch.zeros(batch.num_nodes, dtype=torch.long, device=batch.x.device), 1
    return batch.batch, int(batch.num_graphs)


class SafeBatchNorm1d(nn.BatchNorm1d):
    """BatchNorm1d that accepts a single row in training.

    torch raises "Expected more than 1 value per channel" when training on one row (a batch
    holding only methane, one node; a graph-level batch of one graph). With one row the batch
    variance is undefined, so that row is normalised with the running statistics, which are
    left unchanged (as in eval mode); with two rows or more this is plain BatchNorm1d.

    Shape:
        - Input: (n, C)
        - Output: (n, C)
    """

    def forward(self, x: Tensor) -> Tensor:
        if self.training and x.shape[0] <= 1:
            return F.batch_norm(
                x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps
            )
        out: Tensor = super().forward(x)
        return out


class WeightedGINConv(MessagePassing):  # type: ignore[misc]  # PyG is untyped
    """One GIN layer, with edge features (GINE) when given a bond embedding, and edge weights.

    x'_i = MLP(x_i + Σ_{j∈N(i)} w_ji · m_ji), with m_ji = ReLU(x_j + E(e_ji)) (GINE: PyG's
    ``GINEConv`` with ε = 0, after Hu et al. 2019) or m_ji = x_j (GIN-0, Xu et al. 2019).
    w_ji = 1 when no weights are given. Messages are summed in float32 or wider (module doc).

    No self-loops are added. Hu et al.'s code sums x_j + E(e_ji) without the ReLU over N(i) ∪ {i},
    the self-loop carrying a special bond type; here the x_i term plays the self-loop's role, so no
    bond vocabulary needs a "self-loop" row.

    Shape:
        - Input: x (n, D), edge_index (2, E), edge_attr (E, F_bond) long, edge_weight (E,)
        - Output: (n, D_out), float32 or wider where x was lower precision
    """

    def __init__(self, mlp: nn.Module, edge_embedding: CategoricalEmbedding | None = None) -> None:
        super().__init__(aggr="add")
        self.mlp = mlp
        self.edge_embedding = edge_embedding

    def forward(
        self,
        x: Tensor,
        edge_index: Tensor,
        edge_attr: Tensor | None = None,
        edge_weight: Tensor | None = None,
    ) -> Tensor:
        edge_emb = None
        if self.edge_embedding is not None:
            if edge_attr is None:
                raise ValueError("this layer embeds bonds: edge_attr is required")
            edge_emb = self.edge_embedding(edge_attr)  # (E, D)
        aggregated = self.propagate(edge_index, x=x, edge_emb=edge_emb, edge_weight=edge_weight)
        out: Tensor = self.mlp(aggregated + x)  # (n, D_out)
        return out

    def message(self, x_j: Tensor, edge_emb: Tensor | None, edge_weight: Tensor | None) -> Tensor:
        message = x_j if edge_emb is None else F.relu(x_j + edge_emb)  # (E, D)
        message = _upcast(message)  # scatter-add sums in the messages' dtype
        if edge_weight is not None:
            message = message * edge_weight.unsqueeze(-1)  # (E, D)
        return message


def _check_encoder_sizes(num_layers: int, hidden: int) -> None:
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    if hidden < 1:
        raise ValueError(f"hidden must be >= 1, got {hidden}")


class GINEncoder(nn.Module):
    """The molecular GIN of Hu et al. 2019 (GraphCL transfer learning): h = pool(JK(h^1..h^L)).

    h^0 = AtomEmbedding(x); h^l = Dropout(ReLU(BN(GINConv_l(h^{l-1})))), without the ReLU on the
    last layer (Hu et al.). GINConv_l has its own bond embedding and the MLP
    Linear(D, 2D) -> ReLU -> Linear(2D, D). Defaults: 5 layers × 300, jk "last", mean pooling
    (Hu et al.; GraphCL transfer); dropout 0.5 is Hu et al.'s fine-tuning setting.

    ``conv`` picks the layer: "gine" (:class:`WeightedGINConv`: a ReLU on every message, the
    node's own term without a bond embedding) or "hu" (:class:`graphcl.hu_conv.HuGINConv`:
    Hu et al.'s and GraphCL's own layer, linear messages and a self-loop bond embedding, its sum
    computed as sparse matrix products; with GraphCL's weights it gives GraphCL's outputs).
    Both cost about the same: the MLP's matrix products dominate either layer.

    Jumping knowledge combines the L layer outputs h^1..h^L ("concat": (n, L·D); "max", "sum":
    element-wise; "last": h^L). Hu et al. also include h^0 in concat/max/sum; here it is left out,
    so that ``feature_dim`` is D or L·D.

    ``node_embeddings`` reads ``batch.edge_weight`` (E,) when present (module doc).

    Shape:
        - Input: a ``Batch`` with x (n, len(atom_vocab)) long, edge_index (2, E), edge_attr
          (E, len(bond_vocab)) long, batch (n,)
        - Output: h of shape (G, feature_dim), float32 or wider
    """

    def __init__(
        self,
        atom_vocab: Sequence[int],
        bond_vocab: Sequence[int],
        *,
        num_layers: int = 5,  # Hu et al. 2019, Sec. 5.1
        hidden: int = 300,  # Hu et al. 2019, Sec. 5.1
        jk: JumpingKnowledge = "last",
        pooling: Pooling = "mean",
        dropout: float = 0.0,  # 0.5 in fine-tuning (Hu et al.; GraphCL transfer)
        batch_norm: bool = True,
        conv: GINConvKind = "gine",
    ) -> None:
        super().__init__()
        _check_encoder_sizes(num_layers, hidden)
        if conv not in GIN_CONVS:
            raise ValueError(f"conv must be one of {GIN_CONVS}, got {conv!r}")
        if jk not in get_args(JumpingKnowledge):
            raise ValueError(f"jk must be one of {get_args(JumpingKnowledge)}, got {jk!r}")
        if pooling not in get_args(Pooling):
            raise ValueError(f"pooling must be one of {get_args(Pooling)}, got {pooling!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.jk = jk
        self.pooling = pooling
        self.dropout = dropout
        self.feature_dim = hidden * num_layers if jk == "concat" else hidden
        self.conv = conv
        self.atom_embedding = CategoricalEmbedding(atom_vocab, hidden)

        def mlp() -> nn.Module:
            return nn.Sequential(
                nn.Linear(hidden, 2 * hidden), nn.ReLU(), nn.Linear(2 * hidden, hidden)
            )

        self.convs = nn.ModuleList(
            HuGINConv(mlp(), bond_vocab, hidden)
            if conv == "hu"
            else WeightedGINConv(mlp(), CategoricalEmbedding(bond_vocab, hidden))
            for _ in range(num_layers)
        )
        self.norms = nn.ModuleList(
            SafeBatchNorm1d(hidden) if batch_norm else nn.Identity() for _ in range(num_layers)
        )
        self.attention = (
            AttentionalAggregation(nn.Sequential(nn.Linear(self.feature_dim, 1), _Upcast()))
            if pooling == "attention"
            else None
        )

    def node_embeddings(self, batch: Data) -> Tensor:
        """Node representations after jumping knowledge.

        Shape:
            - Output: (n, feature_dim), in the dtype of the last layer's output
        """
        edge_weight = getattr(batch, "edge_weight", None)
        h: Tensor = self.atom_embedding(batch.x)  # (n, D)
        extra: dict[str, BondGraph] = {}
        if self.conv == "hu" and (edge_weight is None or not edge_weight.requires_grad):
            # A and C of graphcl.hu_conv, built once for every layer
            first = self.convs[0]
            assert isinstance(first, HuGINConv)
            vocab = first.edge_embedding.vocab
            extra["graph"] = bond_graph(
                batch.edge_index, batch.edge_attr, h.shape[0], vocab, edge_weight
            )
        layers = []
        for index, (conv, norm) in enumerate(zip(self.convs, self.norms, strict=True)):
            h = norm(conv(h, batch.edge_index, batch.edge_attr, edge_weight, **extra))  # (n, D)
            if index < len(self.convs) - 1:
                h = F.relu(h)
            h = F.dropout(h, self.dropout, self.training)
            layers.append(h)
        if self.jk == "last":
            return h
        if self.jk == "concat":
            return torch.cat(layers, dim=1)  # (n, L·D)
        stacked = torch.stack(layers)  # (L, n, D)
        return stacked.amax(dim=0) if self.jk == "max" else stacked.sum(dim=0)  # (n, D)

    def forward(self, batch: Data) -> Tensor:
        node = _upcast(self.node_embeddings(batch))  # (n, feature_dim): pool in float32
        index, num_graphs = _graph_index(batch)
        if self.attention is not None:
            pooled: Tensor = self.attention(node, index, dim_size=num_graphs)  # (G, feature_dim)
            return pooled
        pool = global_add_pool if self.pooling == "sum" else global_mean_pool
        pooled = pool(node, index, size=num_graphs)  # (G, feature_dim)
        return pooled


class TUGIN(nn.Module):
    """The GIN of GraphCL's unsupervised TU experiments: h = [Σ_i h^1_i, ..., Σ_i h^L_i].

    h^l = BN(ReLU(GINConv_l(h^{l-1}))), GIN-0 with the MLP Linear -> ReLU -> Linear and no edge
    features; every layer is sum-pooled and the L sums are concatenated (GraphCL
    ``unsupervised_TU/gin.py``, from InfoGraph). Defaults 3 layers × 32 (GraphCL, App. A).

    Node features are either float (``in_dim``, TU data; graphs without features take a constant
    column of ones) or categorical (``atom_vocab``, embedded by a ``CategoricalEmbedding`` of
    width ``hidden``). ``batch.edge_weight`` (E,) is read when present (module doc).

    Shape:
        - Input: a ``Batch`` with x (n, in_dim) float or (n, len(atom_vocab)) long,
          edge_index (2, E), batch (n,)
        - Output: h of shape (G, num_layers · hidden), float32 or wider
    """

    def __init__(
        self,
        in_dim: int | None = None,
        *,
        atom_vocab: Sequence[int] | None = None,
        num_layers: int = 3,  # GraphCL unsupervised TU
        hidden: int = 32,  # GraphCL unsupervised TU
    ) -> None:
        super().__init__()
        if (in_dim is None) == (atom_vocab is None):
            raise ValueError(
                f"give exactly one of in_dim and atom_vocab, got {in_dim=} and {atom_vocab=}"
            )
        if in_dim is not None and in_dim < 1:
            raise ValueError(f"in_dim must be >= 1, got {in_dim}")
        _check_encoder_sizes(num_layers, hidden)
        self.feature_dim = num_layers * hidden
        self.atom_embedding = (
            None if atom_vocab is None else CategoricalEmbedding(atom_vocab, hidden)
        )
        first_dim = hidden if in_dim is None else in_dim
        self.convs = nn.ModuleList(
            WeightedGINConv(
                nn.Sequential(
                    nn.Linear(first_dim if layer == 0 else hidden, hidden),
                    nn.ReLU(),
                    nn.Linear(hidden, hidden),
                )
            )
            for layer in range(num_layers)
        )
        self.norms = nn.ModuleList(SafeBatchNorm1d(hidden) for _ in range(num_layers))

    def node_embeddings(self, batch: Data) -> Tensor:
        """The L layer outputs of every node, concatenated.

        Shape:
            - Output: (n, num_layers · hidden)
        """
        if self.atom_embedding is not None:
            h = self.atom_embedding(batch.x)  # (n, D)
        elif batch.x.is_floating_point():
            h = batch.x
        else:
            raise ValueError(f"TUGIN(in_dim=...) expects float x, got {batch.x.dtype}")
        edge_weight = getattr(batch, "edge_weight", None)
        layers = []
        for conv, norm in zip(self.convs, self.norms, strict=True):
            h = norm(F.relu(conv(h, batch.edge_index, edge_weight=edge_weight)))  # (n, D)
            layers.append(h)
        return torch.cat(layers, dim=1)  # (n, L·D)

    def forward(self, batch: Data) -> Tensor:
        node = _upcast(self.node_embeddings(batch))  # (n, L·D): pool in float32
        index, num_graphs = _graph_index(batch)
        pooled: Tensor = global_add_pool(node, index, size=num_graphs)  # (G, L·D)
        return pooled


def build_encoder(
    name: Literal["gin", "tu_gin"],
    *,
    atom_vocab: Sequence[int] | None = None,
    bond_vocab: Sequence[int] | None = None,
    in_dim: int | None = None,
    **kwargs: object,
) -> GINEncoder | TUGIN:
    """The encoder called ``name`` (one of ``ENCODERS``); ``kwargs`` go to its constructor.

    "gin" needs ``atom_vocab`` and ``bond_vocab``; "tu_gin" needs ``in_dim`` or ``atom_vocab`` and
    ignores ``bond_vocab`` (so one call site can build either encoder for molecules).
    """
    if name == "gin":
        if atom_vocab is None or bond_vocab is None:
            raise ValueError("the 'gin' encoder needs atom_vocab and bond_vocab")
        if in_dim is not None:
            raise ValueError(f"the 'gin' encoder embeds categorical atoms; got {in_dim=}")
        return GINEncoder(atom_vocab, bond_vocab, **kwargs)  # type: ignore[arg-type]
    if name == "tu_gin":
        return TUGIN(in_dim, atom_vocab=atom_vocab, **kwargs)  # type: ignore[arg-type]
    raise ValueError(f"encoder must be one of {ENCODERS}, got {name!r}")
