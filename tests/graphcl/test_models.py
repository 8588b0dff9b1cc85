"""GNN encoders: timm's test_model_backward over every encoder × jk × pooling, one-node and
one-graph batches, node relabelling and batching invariance, edge weights, bf16 aggregation."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, cast

import pytest
import torch
from torch import Tensor, nn

# torch_geometric scripts a class at import time, which torch >= 2.10 reports as a FutureWarning
# (an error under our pytest settings) until pyproject filters it for every test file
with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)
    from torch_geometric.data import Batch, Data
    from torch_geometric.utils import from_smiles
    from torch_geometric.utils.smiles import e_map, x_map

    from graphcl.encoders import (
        ENCODERS,
        TUGIN,
        CategoricalEmbedding,
        GINEncoder,
        SafeBatchNorm1d,
        WeightedGINConv,
        build_encoder,
    )

ATOM_VOCAB = tuple(len(values) + 2 for values in x_map.values())  # + "other" and mask rows
BOND_VOCAB = tuple(len(values) + 2 for values in e_map.values())
SMILES = ("CCO", "c1ccccc1O", "CC(=O)Nc1ccc(O)cc1", "C", "O=C=O")  # "C": methane, 1 atom
TU_IN_DIM = 5

# (encoder, jk, pooling); the TU GIN has neither (sum pooling of every layer, concatenated)
CONFIGS = [
    ("gin", jk, pooling)
    for jk in ("last", "concat", "max", "sum")
    for pooling in ("mean", "sum", "attention")
] + [("gin_hu", "last", "mean"), ("tu_gin_atoms", "", ""), ("tu_gin_float", "", "")]
HU = CONFIGS[-3]  # gin with Hu et al.'s layer (graphcl.hu_conv)


def _build(config: tuple[str, str, str], **kwargs: Any) -> GINEncoder | TUGIN:
    name, jk, pooling = config
    if name in ("gin", "gin_hu"):
        return build_encoder(
            "gin",
            atom_vocab=ATOM_VOCAB,
            bond_vocab=BOND_VOCAB,
            num_layers=3,
            hidden=16,
            jk=jk,
            pooling=pooling,
            conv="hu" if name == "gin_hu" else "gine",
            **kwargs,
        )
    if name == "tu_gin_atoms":
        return build_encoder("tu_gin", atom_vocab=ATOM_VOCAB, bond_vocab=BOND_VOCAB, **kwargs)
    return build_encoder("tu_gin", in_dim=TU_IN_DIM, **kwargs)


def _molecules(config: tuple[str, str, str], smiles: tuple[str, ...] = SMILES) -> list[Data]:
    """Molecules in PyG's from_smiles layout; float features for the TU GIN on float input."""
    graphs = [from_smiles(s) for s in smiles]
    if config[0] == "tu_gin_float":
        generator = torch.Generator().manual_seed(0)
        for graph in graphs:
            graph.x = torch.randn(graph.num_nodes, TU_IN_DIM, generator=generator)
    return graphs


def _to_double(graphs: list[Data]) -> list[Data]:
    for graph in graphs:
        if graph.x.is_floating_point():
            graph.x = graph.x.double()
    return graphs


def _warm_up(model: nn.Module, batch: Batch) -> nn.Module:
    """A few training-mode passes, so that eval-mode batch norm has non-trivial statistics."""
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(batch)
    return model.eval()


def _relabelled(graph: Data, generator: torch.Generator) -> Data:
    """The same graph with its nodes in a random order."""
    perm = torch.randperm(graph.num_nodes, generator=generator)  # new node p is old node perm[p]
    new_id = torch.argsort(perm)  # old node i is new node new_id[i]
    return Data(x=graph.x[perm], edge_index=new_id[graph.edge_index], edge_attr=graph.edge_attr)


@pytest.mark.parametrize("config", CONFIGS, ids=["-".join(filter(None, c)) for c in CONFIGS])
def test_encoder_backward(config: tuple[str, str, str]) -> None:
    """Output (G, feature_dim), finite, input untouched; every parameter gets a finite gradient."""
    torch.manual_seed(0)
    model = _build(config).train()
    batch = Batch.from_data_list(_molecules(config))
    before = {key: value.clone() for key, value in batch.items() if isinstance(value, Tensor)}
    h = model(batch)
    assert h.shape == (len(SMILES), model.feature_dim) and h.dtype == torch.float32
    assert torch.isfinite(h).all()
    for key, value in before.items():
        torch.testing.assert_close(batch[key], value, rtol=0, atol=0)
    (h * torch.randn_like(h)).sum().backward()  # a random readout reaches every parameter
    for name, param in model.named_parameters():
        assert param.grad is not None, f"{config}: {name} got no gradient"
        assert torch.isfinite(param.grad).all(), f"{config}: {name} has a non-finite gradient"


def test_feature_dims() -> None:
    assert ENCODERS == ("gin", "tu_gin")
    assert GINEncoder(ATOM_VOCAB, BOND_VOCAB).feature_dim == 300  # Hu et al. defaults
    assert GINEncoder(ATOM_VOCAB, BOND_VOCAB, jk="concat").feature_dim == 5 * 300
    assert TUGIN(7).feature_dim == 3 * 32  # GraphCL unsupervised TU


@pytest.mark.parametrize("config", CONFIGS[::3] + CONFIGS[-2:])
@pytest.mark.parametrize("training", [True, False])
def test_methane_alone_and_in_a_batch(config: tuple[str, str, str], training: bool) -> None:
    """One atom and no bond: alone (node batch norm sees one row) and beside other molecules."""
    torch.manual_seed(0)
    model = _build(config).train(training)
    norm = next(m for m in model.modules() if isinstance(m, SafeBatchNorm1d))
    assert norm.running_mean is not None and norm.running_var is not None
    alone = Batch.from_data_list(_molecules(config, ("C",)))
    assert alone.num_nodes == 1 and alone.num_edges == 0
    stats = (norm.running_mean.clone(), norm.running_var.clone())
    h = model(alone)
    assert h.shape == (1, model.feature_dim) and torch.isfinite(h).all()
    # one row has no batch variance: the running statistics are used and left unchanged
    torch.testing.assert_close((norm.running_mean, norm.running_var), stats, rtol=0, atol=0)
    h.sum().backward()
    mixed = model(Batch.from_data_list(_molecules(config, ("C", "CCO", "C"))))
    assert mixed.shape == (3, model.feature_dim) and torch.isfinite(mixed).all()


@pytest.mark.parametrize("config", CONFIGS[::3] + CONFIGS[-2:])
def test_batch_of_one_graph_in_train_mode(config: tuple[str, str, str]) -> None:
    torch.manual_seed(0)
    model = _build(config, **({"dropout": 0.5} if config[0] == "gin" else {})).train()
    h = model(Batch.from_data_list(_molecules(config, ("c1ccccc1O",))))
    assert h.shape == (1, model.feature_dim) and torch.isfinite(h).all()
    h.sum().backward()


def test_safe_batch_norm() -> None:
    """Plain BatchNorm1d for two rows or more; one row in training is normalised as in eval."""
    torch.manual_seed(0)
    safe, plain = SafeBatchNorm1d(4), nn.BatchNorm1d(4)
    x = torch.randn(6, 4)
    torch.testing.assert_close(safe(x), plain(x))
    torch.testing.assert_close(safe.running_var, plain.running_var)
    row = torch.randn(1, 4)
    assert safe.running_mean is not None and safe.running_var is not None
    stats = (safe.running_mean.clone(), safe.running_var.clone())
    in_training = safe(row)
    torch.testing.assert_close((safe.running_mean, safe.running_var), stats, rtol=0, atol=0)
    torch.testing.assert_close(in_training, safe.eval()(row))


@pytest.mark.parametrize("config", CONFIGS, ids=["-".join(filter(None, c)) for c in CONFIGS])
def test_node_relabelling_and_batching_invariance(config: tuple[str, str, str]) -> None:
    """Eval mode: h does not depend on the node order, nor on the other graphs of the batch."""
    torch.manual_seed(0)
    graphs = _to_double(_molecules(config))
    model = _warm_up(_build(config).double(), Batch.from_data_list(graphs))
    with torch.no_grad():
        h = model(Batch.from_data_list(graphs))  # (G, D)
        generator = torch.Generator().manual_seed(1)
        relabelled = model(Batch.from_data_list([_relabelled(g, generator) for g in graphs]))
        alone = torch.cat([model(Batch.from_data_list([g])) for g in graphs])  # (G, D)
    torch.testing.assert_close(relabelled, h, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(alone, h, rtol=1e-10, atol=1e-10)


def test_categorical_embedding_sums_columns() -> None:
    embedding = CategoricalEmbedding((3, 5), dim=4)
    x = torch.tensor([[0, 4], [2, 1]])
    tables = [cast(nn.Embedding, table).weight for table in embedding.embeddings]
    expected = tables[0][x[:, 0]] + tables[1][x[:, 1]]
    torch.testing.assert_close(embedding(x), expected)
    assert embedding(x[:0]).shape == (0, 4)
    with pytest.raises(ValueError, match=r"shape \(n, 2\)"):
        embedding(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="integer"):
        embedding(torch.zeros(2, 2))
    with pytest.raises(ValueError, match="vocab"):
        CategoricalEmbedding((3, 0), dim=4)


@pytest.mark.parametrize("config", [CONFIGS[0], HU, CONFIGS[-1]])
def test_edge_weights_scale_messages(config: tuple[str, str, str]) -> None:
    """w = 1 is the plain graph; an extra edge of weight 0 changes nothing; w = 0 everywhere
    equals the graphs without edges."""
    torch.manual_seed(0)
    graphs = _to_double(_molecules(config))
    batch = Batch.from_data_list(graphs)
    model = _warm_up(_build(config).double(), batch)
    with torch.no_grad():
        h = model(batch)
        ones = batch.clone()
        ones.edge_weight = torch.ones(batch.num_edges, dtype=torch.float64)
        torch.testing.assert_close(model(ones), h)
        extra = batch.clone()  # bond atoms 0 and 2 of ethanol, with weight 0
        extra.edge_index = torch.cat([batch.edge_index, torch.tensor([[0, 2], [2, 0]])], dim=1)
        extra.edge_attr = torch.cat([batch.edge_attr, batch.edge_attr[:2]])
        extra.edge_weight = torch.cat([ones.edge_weight, torch.zeros(2, dtype=torch.float64)])
        torch.testing.assert_close(model(extra), h)
        zeros = batch.clone()
        zeros.edge_weight = torch.zeros(batch.num_edges, dtype=torch.float64)
        bare = batch.clone()
        bare.edge_index, bare.edge_attr = batch.edge_index[:, :0], batch.edge_attr[:0]
        torch.testing.assert_close(model(zeros), model(bare))


def _star(num_leaves: int, config: tuple[str, str, str], generator: torch.Generator) -> Batch:
    """One centre bonded to ``num_leaves`` atoms of random types (a bf16 sum loses bits)."""
    leaves = torch.arange(1, num_leaves + 1)
    edge_index = torch.cat(
        [torch.stack([leaves, 0 * leaves]), torch.stack([0 * leaves, leaves])], 1
    )
    columns = [torch.randint(size, (2 * num_leaves,), generator=generator) for size in BOND_VOCAB]
    x = torch.stack(
        [torch.randint(size, (num_leaves + 1,), generator=generator) for size in ATOM_VOCAB], 1
    )
    if config[0] == "tu_gin_float":
        x = torch.randn(num_leaves + 1, TU_IN_DIM, generator=generator)
    return Batch.from_data_list(
        [Data(x=x, edge_index=edge_index, edge_attr=torch.stack(columns, 1))]
    )


def _oracle_sum(conv: WeightedGINConv, x: Tensor, batch: Batch) -> Tensor:
    """Σ_j m_ji in float64 from the layer's (bf16) input: the sum with no accumulation error."""
    x_j = x.double()[batch.edge_index[0]]  # (E, D)
    if conv.edge_embedding is not None:
        x_j = torch.relu(x_j + conv.edge_embedding(batch.edge_attr).double())
    return torch.zeros(x.shape[0], x.shape[1], dtype=torch.float64).index_add_(
        0, batch.edge_index[1], x_j
    )  # (n, D)


@pytest.mark.parametrize("config", [CONFIGS[0], CONFIGS[-2], CONFIGS[-1]])
def test_bf16_autocast_sums_neighbours_in_float32(config: tuple[str, str, str]) -> None:
    """Under bf16 autocast a layer receives bf16 input; the 64-neighbour sum of the star's centre
    must still be float32 and exact to float32 precision given those bf16 inputs (a bf16 sum is
    off by ~2^-8 relative). The encoder's h then matches float32 to bf16 precision."""
    torch.manual_seed(0)
    batch = _star(64, config, torch.Generator().manual_seed(0))
    model = _warm_up(_build(config), batch)
    captured: list[tuple[WeightedGINConv, Tensor, Tensor]] = []
    hooks = []
    for conv in (m for m in model.modules() if isinstance(m, WeightedGINConv)):
        inputs: list[Tensor] = []
        hooks.append(conv.register_forward_pre_hook(lambda _, args, i=inputs: i.append(args[0])))
        hooks.append(
            conv.aggr_module.register_forward_hook(
                lambda _, __, out, c=conv, i=inputs: captured.append((c, i[-1], out))
            )
        )
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        h_bf16 = model(batch)
    for hook in hooks:
        hook.remove()
    assert len(captured) == len(hooks) // 2  # every layer ran
    assert any(x.dtype == torch.bfloat16 for _, x, _ in captured)  # the case that matters ran
    with torch.no_grad():
        for conv, x, aggregated in captured:
            assert aggregated.dtype == torch.float32
            oracle = _oracle_sum(conv, x, batch)  # (n, D)
            torch.testing.assert_close(aggregated[0].double(), oracle[0], rtol=1e-5, atol=1e-5)
        h = model(batch)
    assert h_bf16.dtype == torch.float32
    assert (h_bf16 - h).norm() <= 5e-2 * h.norm()


def test_attention_gate_softmax_runs_in_float32() -> None:
    model = _build(("gin", "last", "attention"))
    assert isinstance(model, GINEncoder) and model.attention is not None
    gates: list[Tensor] = []
    model.attention.gate_nn.register_forward_hook(lambda _, __, out: gates.append(out))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model(Batch.from_data_list(_molecules(CONFIGS[0])))
    assert gates[0].dtype == torch.float32


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: GINEncoder(ATOM_VOCAB, BOND_VOCAB, jk="first"), "jk"),  # type: ignore[arg-type]
        (lambda: GINEncoder(ATOM_VOCAB, BOND_VOCAB, pooling="max"), "pooling"),  # type: ignore[arg-type]
        (lambda: GINEncoder(ATOM_VOCAB, BOND_VOCAB, dropout=1.0), "dropout"),
        (lambda: GINEncoder(ATOM_VOCAB, BOND_VOCAB, num_layers=0), "num_layers"),
        (lambda: TUGIN(), "exactly one"),
        (lambda: TUGIN(3, atom_vocab=ATOM_VOCAB), "exactly one"),
        (lambda: TUGIN(0), "in_dim"),
        (lambda: build_encoder("gin", atom_vocab=ATOM_VOCAB), "bond_vocab"),
        (
            lambda: build_encoder("gin", atom_vocab=ATOM_VOCAB, bond_vocab=BOND_VOCAB, in_dim=1),
            "in_",
        ),
        (lambda: build_encoder("gcn", in_dim=3), "encoder"),  # type: ignore[arg-type]
    ],
)
def test_bad_settings_raise(build: Callable[[], nn.Module], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build()


def test_tu_gin_on_float_input_rejects_categorical_x() -> None:
    with pytest.raises(ValueError, match="float x"):
        TUGIN(9)(Batch.from_data_list([from_smiles("CCO")]))
