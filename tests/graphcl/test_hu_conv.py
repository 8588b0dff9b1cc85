"""Hu et al.'s GIN layer (graphcl.hu_conv): the sparse-product sum against a per-node loop and
the per-bond form, gradients, edge-weight gradients, bf16, host round-trips, the options."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import Tensor, nn

with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)
    from torch_geometric.data import Batch, Data

    from graphcl.config import PretrainConfig
    from graphcl.encoders import GINEncoder
    from graphcl.hu_conv import HuGINConv, bond_graph
    from graphcl.models import encoder_from_config
    from tests.sync_counts import count_syncs

VOCABS = {"pretrain-gnns": (7, 5), "pyg": (24, 8, 4)}


def _graph(
    num_nodes: int, num_edges: int, vocab: tuple[int, ...], generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """Random directed bonds and their features, the last third repeating the first bonds: a
    node with two bonds from one neighbour, or two bonds of one type (a repeated column in a CSR
    row), is the case that a sparse product must sum, not overwrite."""
    fresh = num_edges - num_edges // 3
    edge_index = torch.randint(num_nodes, (2, fresh), generator=generator)
    edge_attr = torch.stack([torch.randint(v, (fresh,), generator=generator) for v in vocab], 1)
    repeat = num_edges - fresh
    return (
        torch.cat([edge_index, edge_index[:, :repeat]], 1),
        torch.cat([edge_attr, edge_attr[:repeat]]),
    )


def _mlp(dim: int) -> nn.Module:
    return nn.Sequential(nn.Linear(dim, 2 * dim), nn.ReLU(), nn.Linear(2 * dim, dim))


def _loop_sum(
    conv: HuGINConv, x: Tensor, edge_index: Tensor, edge_attr: Tensor, w: Tensor
) -> Tensor:
    """a_i = x_i + s + Σ_{bonds j→i} w (x_j + Σ_f E_f[e_f]), one node and one bond at a time."""
    tables = [embedding.weight for embedding in conv.edge_embedding.embeddings]
    rows = []
    for i in range(x.shape[0]):
        total = x[i] + conv.self_loop
        for b in range(edge_index.shape[1]):
            if int(edge_index[1, b]) == i:
                bond = sum(table[int(e)] for table, e in zip(tables, edge_attr[b], strict=True))
                total = total + w[b] * (x[int(edge_index[0, b])] + bond)
        rows.append(total)
    return torch.stack(rows)


@pytest.mark.parametrize("layout", sorted(VOCABS))
@pytest.mark.parametrize("weighted", [False, True])
def test_sparse_sum_equals_loop_and_per_bond(layout: str, weighted: bool) -> None:
    """Oracle: values and every gradient (x, tables, self-loop, MLP) of the sparse products equal
    the per-bond form, and the aggregate equals a per-node loop, in float64."""
    generator = torch.Generator().manual_seed(0)
    vocab = VOCABS[layout]
    torch.manual_seed(0)
    conv = HuGINConv(_mlp(6), vocab, 6).double()
    edge_index, edge_attr = _graph(9, 23, vocab, generator)
    w = torch.rand(23, generator=generator, dtype=torch.float64) if weighted else None
    x = torch.randn(9, 6, generator=generator, dtype=torch.float64, requires_grad=True)
    graph = bond_graph(edge_index, edge_attr, 9, vocab, w, dtype=torch.float64)
    with torch.no_grad():
        adjacency_sum = torch.sparse.mm(graph.adjacency, x) + torch.sparse.mm(
            graph.bond_counts, conv.combination_table()
        )
        loop = _loop_sum(conv, x, edge_index, edge_attr, torch.ones(23) if w is None else w)
        torch.testing.assert_close(adjacency_sum + x + conv.self_loop, loop)
        torch.testing.assert_close(conv.per_bond(x, edge_index, edge_attr, w), loop)
    outputs = []
    for fast in (True, False):
        out = (
            conv(x, edge_index, edge_attr, w, graph=graph)
            if fast
            else conv.mlp(conv.per_bond(x, edge_index, edge_attr, w))
        )
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        grads = torch.autograd.grad((out * weights.double()).sum(), [x, *conv.parameters()])
        outputs.append((out, grads))
    torch.testing.assert_close(outputs[0], outputs[1])


def test_edge_weight_gradients_take_the_per_bond_form() -> None:
    """GradArgmax differentiates with respect to the edge weights: that gradient exists, passes
    gradcheck, and the value equals the fast path's."""
    generator = torch.Generator().manual_seed(2)
    vocab = VOCABS["pretrain-gnns"]
    torch.manual_seed(0)
    conv = HuGINConv(_mlp(4), vocab, 4).double()
    edge_index, edge_attr = _graph(6, 12, vocab, generator)
    x = torch.randn(6, 4, generator=generator, dtype=torch.float64)
    w = torch.rand(12, generator=generator, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda w: conv(x, edge_index, edge_attr, w), (w,))
    with torch.no_grad():
        torch.testing.assert_close(
            conv(x, edge_index, edge_attr, w), conv(x, edge_index, edge_attr, w.detach())
        )


def test_bond_order_does_not_matter() -> None:
    """Invariance: shuffling the bonds (the CSR build sorts them) leaves the output unchanged."""
    generator = torch.Generator().manual_seed(3)
    vocab = VOCABS["pyg"]
    conv = HuGINConv(_mlp(5), vocab, 5).double()
    edge_index, edge_attr = _graph(8, 20, vocab, generator)
    x = torch.randn(8, 5, generator=generator, dtype=torch.float64)
    perm = torch.randperm(20, generator=generator)
    with torch.no_grad():
        torch.testing.assert_close(
            conv(x, edge_index, edge_attr), conv(x, edge_index[:, perm], edge_attr[perm])
        )


def _batch(vocab: tuple[int, ...], atoms: tuple[int, ...]) -> Batch:
    generator = torch.Generator().manual_seed(4)
    graphs = []
    for n in (5, 1, 9, 7):  # one graph of a single atom, no bond
        edge_index, edge_attr = _graph(n, 2 * n - 2, vocab, generator)
        x = torch.stack([torch.randint(v, (n,), generator=generator) for v in atoms], 1)
        graphs.append(Data(x=x, edge_index=edge_index, edge_attr=edge_attr))
    return Batch.from_data_list(graphs)


def test_encoder_step_has_no_host_round_trip() -> None:
    """The batch's A and C are built with a sort and a search, no value read on the host: a
    forward and backward of the encoder with the hu layer waits for the device nowhere."""
    batch = _batch(VOCABS["pretrain-gnns"], (120, 6))
    model = GINEncoder((120, 6), VOCABS["pretrain-gnns"], num_layers=2, hidden=8, conv="hu")
    with count_syncs() as syncs:
        model(batch).sum().backward()
    assert sum(syncs.values()) == 0, syncs


def test_bf16_autocast_sums_in_float32() -> None:
    """Under bf16 autocast the sparse products run in float32 (autocast off there): the encoder
    matches float32 to bf16 precision and the layer's sum is float32 exact."""
    batch = _batch(VOCABS["pretrain-gnns"], (120, 6))
    torch.manual_seed(0)
    model = GINEncoder((120, 6), VOCABS["pretrain-gnns"], num_layers=3, hidden=16, conv="hu")
    conv = model.convs[1]
    assert isinstance(conv, HuGINConv)
    x = torch.randn(batch.num_nodes, 16).bfloat16()
    with torch.no_grad():
        oracle = conv.per_bond(x.double(), batch.edge_index, batch.edge_attr)
        captured: list[Tensor] = []
        hook = conv.mlp.register_forward_pre_hook(lambda _, args: captured.append(args[0]))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            conv(x, batch.edge_index, batch.edge_attr)
            h_bf16 = model(batch)
        hook.remove()
        assert captured[0].dtype == torch.float32
        torch.testing.assert_close(captured[0].double(), oracle, rtol=1e-5, atol=1e-5)
        h = model(batch)
    assert h_bf16.dtype == torch.float32
    assert (h_bf16 - h).norm() <= 5e-2 * h.norm()


def test_conv_option_in_configs() -> None:
    """--conv reaches the encoder and its saved config; an encoder saved before the option
    existed is rebuilt with the gine layer; the TU GIN refuses --conv hu."""
    base = {
        "encoder": "gin",
        "layout": "pretrain-gnns",
        "num_layers": 2,
        "hidden": 8,
        "jk": "last",
        "pooling": "mean",
        "dropout": 0.0,
    }
    hu = encoder_from_config({**base, "conv": "hu"})
    assert isinstance(hu, GINEncoder) and all(isinstance(c, HuGINConv) for c in hu.convs)
    old = encoder_from_config(base)
    assert isinstance(old, GINEncoder) and old.conv == "gine"
    assert PretrainConfig(conv="hu").encoder_config()["conv"] == "hu"
    with pytest.raises(ValueError, match="--conv hu is a layer of gin, not of tu_gin"):
        PretrainConfig(encoder="tu_gin", conv="hu")
    with pytest.raises(ValueError, match="conv must be one of"):
        GINEncoder((120, 6), (7, 5), conv="gat")  # type: ignore[arg-type]
