"""Specification of contragan.layers: spectral norm really bounds σ, orthogonal init (also of
spectrally normalised layers, in eval mode) with zero biases, conditional batch norm reads its
condition,
self-attention starts as the identity, the residual blocks' shapes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from contragan.layers import (
    ConditionalBatchNorm2d,
    DiscBlock,
    GenBlock,
    SelfAttention,
    orthogonal_init_,
    sn_conv2d,
    sn_embedding,
    sn_linear,
)

SN_LAYERS = {
    "conv": lambda: sn_conv2d(4, 6, 3, padding=1),
    "linear": lambda: sn_linear(12, 5),
    "embedding": lambda: sn_embedding(10, 7),
}


def _sigma(layer: nn.Module) -> float:
    """Largest singular value of the effective weight as a (out, rest) matrix."""
    weight = layer.weight
    assert isinstance(weight, Tensor)
    return float(torch.linalg.matrix_norm(weight.detach().flatten(1), ord=2))


def _original(layer: nn.Module) -> Tensor:
    return layer.get_parameter("parametrizations.weight.original")


@pytest.mark.parametrize("kind", list(SN_LAYERS))
def test_spectral_norm_bounds_the_largest_singular_value(kind: str) -> None:
    torch.manual_seed(0)
    layer = SN_LAYERS[kind]()
    with torch.no_grad():
        _original(layer).mul_(25.0)  # far from σ = 1 before normalisation
    assert float(torch.linalg.matrix_norm(_original(layer).detach().flatten(1), ord=2)) > 5
    layer.train()
    for _ in range(10):  # each training-mode access runs one power iteration
        _ = layer.weight
    assert _sigma(layer) == pytest.approx(1.0, abs=1e-3)
    assert _sigma(layer) <= 1 + 1e-3


@pytest.mark.parametrize("kind", list(SN_LAYERS))
def test_orthogonal_init_of_a_spectrally_normalised_layer(kind: str) -> None:
    torch.manual_seed(1)
    layer = SN_LAYERS[kind]()
    orthogonal_init_(layer)
    matrix = _original(layer).detach().flatten(1)  # (out, rest)
    small = min(matrix.shape)
    gram = matrix @ matrix.T if matrix.shape[0] == small else matrix.T @ matrix
    torch.testing.assert_close(gram, torch.eye(small), atol=1e-5, rtol=0)
    layer.eval()  # no power iteration: the refreshed u, v must already give σ = 1
    assert _sigma(layer) == pytest.approx(1.0, abs=1e-4)


def test_orthogonal_init_reaches_every_plain_layer_and_leaves_others() -> None:
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8), nn.Embedding(4, 8), sn_linear(8, 2))
    bn_weight = model[1].weight.detach().clone()
    bn_bias = model[1].bias
    assert isinstance(bn_bias, Tensor)
    with torch.no_grad():
        bn_bias.fill_(0.5)  # not a conv, linear or embedding: left alone
    assert orthogonal_init_(model) is model
    assert torch.equal(bn_bias.detach(), torch.full((8,), 0.5))
    for matrix in (model[0].weight.detach(), model[2].weight.detach()):
        small = min(matrix.shape)
        gram = matrix @ matrix.T if matrix.shape[0] == small else matrix.T @ matrix
        torch.testing.assert_close(gram, torch.eye(small), atol=1e-5, rtol=0)
    torch.testing.assert_close(model[1].weight.detach(), bn_weight)


def test_orthogonal_init_zeroes_the_biases_of_convs_and_linears() -> None:
    """StudioGAN's ``init_weights`` under ``init: ortho`` fills every conv and linear bias with 0
    (PyTorch's default is uniform in ±1/√fan_in); spectral norm leaves biases alone."""
    torch.manual_seed(5)
    layers: list[nn.Conv2d | nn.Linear] = [
        nn.Conv2d(3, 4, 3),
        nn.Linear(5, 6),
        sn_conv2d(3, 4, 1),
        sn_linear(5, 6),
    ]
    for layer in layers:
        bias = layer.bias
        assert isinstance(bias, Tensor) and bias.abs().min() > 0  # PyTorch's default
        orthogonal_init_(layer)
        assert torch.equal(bias.detach(), torch.zeros_like(bias)), layer
    bias_free = sn_linear(5, 6, bias=False)
    orthogonal_init_(bias_free)
    assert bias_free.bias is None


def test_conditional_batch_norm_uses_the_condition() -> None:
    torch.manual_seed(3)
    cbn, classes = ConditionalBatchNorm2d(8, 6), nn.Embedding(3, 6)
    x = torch.randn(4, 8, 5, 5)
    x[1], x[2] = x[0], x[0]  # rows 0, 1, 2 share their input
    out = cbn(x, classes(torch.tensor([0, 1, 0, 2])))
    torch.testing.assert_close(out[0], out[2])  # same input, same class: same output
    assert (out[0] - out[1]).abs().max() > 1e-3  # same input, other class: other output
    cbn.eval()
    out = cbn(x, classes(torch.tensor([2, 2, 1, 0])))
    torch.testing.assert_close(out[0], out[1])
    assert (out[1] - out[2]).abs().max() > 1e-3


def test_conditional_batch_norm_with_a_zero_condition_is_plain_batch_norm() -> None:
    torch.manual_seed(4)
    cbn = ConditionalBatchNorm2d(5, 3)
    x, cond = torch.randn(6, 5, 4, 4), torch.zeros(6, 3)  # gain 1 + 0, bias 0
    expected = F.batch_norm(x, None, None, training=True)
    torch.testing.assert_close(cbn(x, cond), expected)


def test_self_attention_starts_as_identity_and_learns_through_gamma() -> None:
    torch.manual_seed(5)
    attention = SelfAttention(16)
    x = torch.randn(2, 16, 6, 6, requires_grad=True)
    torch.testing.assert_close(attention(x), x)
    with torch.no_grad():
        attention.gamma.fill_(0.5)
    out = attention(x)
    assert out.shape == x.shape and (out - x).abs().max() > 1e-4
    out.square().sum().backward()
    for name, parameter in attention.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


def test_self_attention_needs_eight_channels() -> None:
    with pytest.raises(ValueError, match="channels >= 8"):
        SelfAttention(4)


def test_blocks_equal_biggan_order_of_operations() -> None:
    """The shortcuts convolve at the low resolution; that is exactly BigGAN's block."""
    torch.manual_seed(7)
    x, cond = torch.randn(2, 8, 4, 4), torch.randn(2, 5)
    up = GenBlock(8, 6, 5).eval()  # eval: no power iteration between the two calls
    h = F.interpolate(F.relu(up.bn1(x, cond)), scale_factor=2, mode="nearest")
    h = up.conv2(F.relu(up.bn2(up.conv1(h), cond)))
    literal = h + up.shortcut(F.interpolate(x, scale_factor=2, mode="nearest"))
    torch.testing.assert_close(up(x, cond), literal)
    down = DiscBlock(8, 6, downsample=True).eval()
    h = F.avg_pool2d(down.conv2(F.relu(down.conv1(F.relu(x)))), 2)
    assert down.shortcut is not None
    literal = h + F.avg_pool2d(down.shortcut(x), 2)
    torch.testing.assert_close(down(x), literal)


def test_block_shapes() -> None:
    torch.manual_seed(6)
    x, cond = torch.randn(3, 8, 4, 4), torch.randn(3, 5)
    assert GenBlock(8, 12, 5)(x, cond).shape == (3, 12, 8, 8)
    image = torch.randn(3, 1, 8, 8)
    assert DiscBlock(1, 8, downsample=True, first=True)(image).shape == (3, 8, 4, 4)
    assert DiscBlock(8, 16, downsample=True)(x).shape == (3, 16, 2, 2)
    plain = DiscBlock(8, 8, downsample=False)
    assert plain.shortcut is None and plain(x).shape == (3, 8, 4, 4)
    with pytest.raises(ValueError, match="first discriminator block"):
        DiscBlock(1, 8, downsample=False, first=True)
