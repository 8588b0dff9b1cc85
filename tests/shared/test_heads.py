"""Projection and linear heads: shapes, gradients to every parameter, the SimCLR v1/v2 layouts."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from shared import heads
from shared.heads import LinearHead, ProjectionHead, simclr_v1_head, simclr_v2_head

IN_DIM = 12

HEADS: dict[str, tuple[Callable[[], nn.Module], int]] = {
    "v1": (lambda: simclr_v1_head(IN_DIM, out_dim=6), 6),
    "v2": (lambda: simclr_v2_head(IN_DIM, out_dim=6), 6),
    "v2_narrow": (lambda: simclr_v2_head(IN_DIM, out_dim=4, hidden_dim=5, num_layers=4), 4),
    "linear_projection": (lambda: ProjectionHead(IN_DIM, 99, 3, num_layers=1), 3),
    "bn_hidden_only": (lambda: ProjectionHead(IN_DIM, 8, 5, num_layers=2, batch_norm=True), 5),
    "linear_head": (lambda: LinearHead(IN_DIM, 10), 10),
}


@pytest.mark.parametrize("name", sorted(HEADS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_head_backward(name: str, dtype: torch.dtype) -> None:
    """timm's test_model_backward: right output shape, every parameter gets a finite gradient."""
    torch.manual_seed(0)
    factory, out_dim = HEADS[name]
    head = factory().to(dtype).train()
    h = torch.randn(8, IN_DIM, dtype=dtype)
    h_before = h.clone()
    z = head(h)
    assert z.shape == (8, out_dim) and z.dtype == dtype
    torch.testing.assert_close(h, h_before, rtol=0, atol=0)  # input not modified
    # A random linear readout: z.sum() would be blind to everything before a final batch norm.
    target = torch.randn(8, out_dim, dtype=dtype)
    (z * target).sum().backward()
    named = list(head.named_parameters())
    assert named
    for param_name, param in named:
        assert param.grad is not None, param_name
        assert torch.isfinite(param.grad).all(), param_name
        assert param.grad.abs().sum() > 0, param_name


def test_v1_layout() -> None:
    head = simclr_v1_head(IN_DIM)
    kinds = [type(m) for m in head.layers]
    assert kinds == [nn.Linear, nn.ReLU, nn.Linear]
    first, last = head.layers[0], head.layers[2]
    assert (first.in_features, first.out_features) == (IN_DIM, IN_DIM)  # hidden = input width
    assert (last.in_features, last.out_features) == (IN_DIM, 128)  # z has 128 dims
    assert first.bias is not None and last.bias is not None
    assert (
        sum(p.numel() for p in head.parameters()) == IN_DIM * IN_DIM + IN_DIM + IN_DIM * 128 + 128
    )


def test_v2_has_batch_norm_and_no_redundant_bias() -> None:
    head = simclr_v2_head(IN_DIM, out_dim=6)
    linears = [m for m in head.layers if isinstance(m, nn.Linear)]
    norms = [m for m in head.modules() if isinstance(m, nn.BatchNorm1d)]
    assert len(linears) == 3 and len(norms) == 3  # 3 layers, each followed by batch norm
    assert all(m.bias is None for m in linears)  # BN makes a linear bias redundant
    assert [m.num_features for m in norms] == [IN_DIM, IN_DIM, 6]
    # The output BN scales but does not shift (SimCLR v2 reference: center=False).
    last = head.layers[-1]
    assert [n for n, _ in last.named_parameters()] == ["weight"]
    assert not last.norm.affine


def test_v2_output_is_batch_normalised_in_train_mode() -> None:
    torch.manual_seed(0)
    head = simclr_v2_head(IN_DIM, out_dim=6).train()
    z = head(torch.randn(64, IN_DIM) * 5 + 3)
    torch.testing.assert_close(z.mean(dim=0), torch.zeros(6), rtol=0, atol=1e-5)
    torch.testing.assert_close(z.std(dim=0, unbiased=False), torch.ones(6), rtol=0, atol=1e-3)


def test_linear_head_is_affine() -> None:
    torch.manual_seed(0)
    head = LinearHead(IN_DIM, 4)
    h = torch.randn(5, IN_DIM)
    torch.testing.assert_close(head(h), h @ head.fc.weight.T + head.fc.bias)


@pytest.mark.parametrize(
    ("factory", "bad"),
    [
        (lambda: ProjectionHead(IN_DIM, 8, 4, num_layers=0), "num_layers must be >= 1, got 0"),
        (lambda: ProjectionHead(0, 8, 4), "in_dim must be >= 1, got 0"),
        (lambda: simclr_v2_head(IN_DIM, out_dim=-3), "out_dim must be >= 1, got -3"),
        (lambda: LinearHead(IN_DIM, 0), "num_classes must be >= 1, got 0"),
    ],
)
def test_heads_reject_bad_sizes(factory: Callable[[], nn.Module], bad: str) -> None:
    with pytest.raises(ValueError, match=bad):
        factory()


def test_projection_head_rejects_wrong_input_shape() -> None:
    with pytest.raises(ValueError, match=r"\(N, 12\)"):
        simclr_v1_head(IN_DIM)(torch.randn(4, IN_DIM + 1))


def test_size_check_is_named_for_what_it_checks() -> None:
    # heads check sizes >= 1; shared.losses.common.check_positive means > 0: distinct names
    assert not hasattr(heads, "_check_positive")
    heads._check_at_least_one(in_dim=1, num_layers=3)
    with pytest.raises(ValueError, match="hidden_dim must be >= 1, got 0"):
        heads._check_at_least_one(in_dim=1, hidden_dim=0)
