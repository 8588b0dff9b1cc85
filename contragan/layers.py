"""Building blocks of the BigGAN-style generator and discriminator (Brock et al. 2019).

- Spectrally normalised convolution, linear and embedding layers (Miyato et al. 2018): the
  weight is divided by its largest singular value, estimated by one power iteration per
  training-mode forward (``torch.nn.utils.parametrizations.spectral_norm``).
- Conditional batch norm (de Vries et al. 2017; BigGAN's shared embedding and hierarchical z):
  batch norm without affine parameters, then a per-sample gain ``1 + W_γ c`` and bias ``W_β c``
  from a conditioning vector ``c``.
- The SAGAN self-attention block (Zhang et al. 2019) as BigGAN writes it: C/8 query and key
  channels, C/2 value channels, keys and values max-pooled 2×2, learnable ``γ`` starting at 0.
- The generator's up-sampling residual block and the discriminator's down-sampling blocks.
- Orthogonal initialisation (Saxe et al. 2014) with zero biases, which BigGAN and StudioGAN use
  for G and D.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import spectral_norm

__all__ = [
    "ConditionalBatchNorm2d",
    "DiscBlock",
    "GenBlock",
    "SelfAttention",
    "orthogonal_init_",
    "sn_conv2d",
    "sn_embedding",
    "sn_linear",
]


def sn_conv2d(
    in_channels: int,
    out_channels: int,
    kernel_size: int,
    stride: int = 1,
    padding: int = 0,
    bias: bool = True,
) -> nn.Conv2d:
    """A spectrally normalised ``nn.Conv2d``; σ is that of the ``(out, in·k·k)`` weight matrix."""
    conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding, bias=bias)
    spectral_norm(conv)  # registers the parametrization in place
    return conv


def sn_linear(in_features: int, out_features: int, bias: bool = True) -> nn.Linear:
    """A spectrally normalised ``nn.Linear``."""
    linear = nn.Linear(in_features, out_features, bias=bias)
    spectral_norm(linear)
    return linear


def sn_embedding(num_embeddings: int, embedding_dim: int) -> nn.Embedding:
    """A spectrally normalised ``nn.Embedding`` (σ of the whole ``(num, dim)`` table), as
    StudioGAN's discriminators use for the projection and 2C class embeddings."""
    embedding = nn.Embedding(num_embeddings, embedding_dim)
    spectral_norm(embedding)
    return embedding


_ORTHOGONAL_TYPES = (nn.Conv2d, nn.Linear, nn.Embedding)


def orthogonal_init_(module: nn.Module) -> nn.Module:
    """Orthogonal weights and zero biases for every conv, linear and embedding in ``module``.

    In place. The biases are zeroed as StudioGAN's ``init_weights`` does under ``init: ortho``;
    PyTorch's default biases (uniform in ±1/√fan_in) kept in every conv and linear of G and D
    make D's embeddings of G's first fakes nearly coincide (mean pairwise cosine 0.98-0.996
    against 0.86-0.97 with zero biases, digits networks, seeds 0-4). An embedding has no bias.
    A spectrally normalised layer gets its *original* weight re-initialised and then 15 power
    iterations, as at registration, so its σ estimate matches the new weight even in eval mode
    (``nn.init.orthogonal_(m.weight)`` on such a layer would only overwrite a computed tensor
    and leave the parameter untouched).

    Returns ``module`` for chaining.
    """
    targets = [m for m in module.modules() if isinstance(m, _ORTHOGONAL_TYPES)]
    with torch.no_grad():
        for layer in targets:
            bias = getattr(layer, "bias", None)
            if isinstance(bias, Tensor):
                bias.zero_()
            if not parametrize.is_parametrized(layer, "weight"):
                nn.init.orthogonal_(layer.weight)
                continue
            nn.init.orthogonal_(layer.get_parameter("parametrizations.weight.original"))
            training = layer.training
            layer.train()
            for _ in range(15):
                # in training mode every access runs one power iteration, refreshing u and v
                _ = layer.weight
            layer.train(training)
    return module


class ConditionalBatchNorm2d(nn.Module):
    """Batch norm whose gain and bias are linear functions of a conditioning vector.

    BigGAN (Brock et al. 2019, Sec. 3 and App. B): ``out = BN(x) · (1 + W_γ c) + W_β c``, with
    BN without affine parameters and ``c`` the shared class embedding, concatenated with a chunk
    of z under hierarchical z. The two projections are spectrally normalised and bias-free, as
    in StudioGAN's BigGAN for CIFAR-10; the ``1 +`` makes a zero projection the plain BN.

    Shape:
        - x: ``(N, num_features, H, W)``; cond: ``(N, cond_dim)``
        - output: ``(N, num_features, H, W)``
    """

    def __init__(self, num_features: int, cond_dim: int) -> None:
        super().__init__()
        if num_features < 1 or cond_dim < 1:
            raise ValueError(
                f"num_features and cond_dim must be >= 1, got {num_features} and {cond_dim}"
            )
        self.bn = nn.BatchNorm2d(num_features, affine=False)
        self.gain = sn_linear(cond_dim, num_features, bias=False)
        self.bias = sn_linear(cond_dim, num_features, bias=False)

    def forward(self, x: Tensor, cond: Tensor) -> Tensor:
        N, C = x.shape[:2]
        gain = 1 + self.gain(cond).view(N, C, 1, 1)  # (N, C, 1, 1)
        bias = self.bias(cond).view(N, C, 1, 1)  # (N, C, 1, 1)
        out: Tensor = self.bn(x) * gain + bias  # (N, C, H, W)
        return out


class SelfAttention(nn.Module):
    """SAGAN self-attention, ``x + γ · o(attention(x))``, with ``γ`` a learnable scalar at 0.

    Zhang et al. 2019, Sec. 4, in BigGAN's form: 1×1 spectrally normalised bias-free
    convolutions to C/8 query (θ) and key (φ) channels and C/2 value (g) channels; keys and
    values are max-pooled 2×2 (4× fewer positions); a softmax over the keys of each query; a
    1×1 convolution back to C channels. ``γ = 0`` at the start, so the block begins as the
    identity and its convolutions only receive gradients once ``γ`` has moved.

    Shape:
        - x: ``(N, channels, H, W)`` with ``H, W >= 2``
        - output: same as x
    """

    def __init__(self, channels: int) -> None:
        super().__init__()
        if channels < 8:
            raise ValueError(
                f"SelfAttention needs channels >= 8 (C/8 query channels), got {channels}"
            )
        self.theta = sn_conv2d(channels, channels // 8, 1, bias=False)
        self.phi = sn_conv2d(channels, channels // 8, 1, bias=False)
        self.g = sn_conv2d(channels, channels // 2, 1, bias=False)
        self.o = sn_conv2d(channels // 2, channels, 1, bias=False)
        self.gamma = nn.Parameter(torch.zeros(()))

    def forward(self, x: Tensor) -> Tensor:
        N, C, H, W = x.shape
        query = self.theta(x).flatten(2)  # (N, C/8, HW)
        key = F.max_pool2d(self.phi(x), 2).flatten(2)  # (N, C/8, HW/4)
        value = F.max_pool2d(self.g(x), 2).flatten(2)  # (N, C/2, HW/4)
        attention = torch.softmax(query.transpose(1, 2) @ key, dim=-1)  # (N, HW, HW/4)
        attended = (value @ attention.transpose(1, 2)).view(N, C // 2, H, W)  # (N, C/2, H, W)
        out: Tensor = x + self.gamma * self.o(attended)  # (N, C, H, W)
        return out


class GenBlock(nn.Module):
    """BigGAN's generator block: CBN, ReLU, 2× nearest up-sampling, 3×3 conv, CBN, ReLU, 3×3
    conv, plus a shortcut of up-sampling and a 1×1 conv.

    The shortcut runs the 1×1 conv before up-sampling: a pointwise conv commutes exactly with
    nearest up-sampling, and at the low resolution it costs a quarter.

    Shape:
        - x: ``(N, in_channels, H, W)``; cond: ``(N, cond_dim)``
        - output: ``(N, out_channels, 2H, 2W)``
    """

    def __init__(self, in_channels: int, out_channels: int, cond_dim: int) -> None:
        super().__init__()
        self.bn1 = ConditionalBatchNorm2d(in_channels, cond_dim)
        self.conv1 = sn_conv2d(in_channels, out_channels, 3, padding=1)
        self.bn2 = ConditionalBatchNorm2d(out_channels, cond_dim)
        self.conv2 = sn_conv2d(out_channels, out_channels, 3, padding=1)
        self.shortcut = sn_conv2d(in_channels, out_channels, 1)

    def forward(self, x: Tensor, cond: Tensor) -> Tensor:
        h = F.interpolate(F.relu(self.bn1(x, cond)), scale_factor=2, mode="nearest")
        h = self.conv2(F.relu(self.bn2(self.conv1(h), cond)))  # (N, out, 2H, 2W)
        skip = F.interpolate(self.shortcut(x), scale_factor=2, mode="nearest")  # (N, out, 2H, 2W)
        out: Tensor = h + skip
        return out


class DiscBlock(nn.Module):
    """BigGAN's discriminator block, optionally halving the resolution by 2×2 average pooling.

    ``first=True`` is the block that sees the image ("optimised block", Miyato et al. 2018):
    conv, ReLU, conv, pool, with a pool-then-1×1-conv shortcut, and no ReLU in front (the input
    is the image). Otherwise the block is pre-activated (ReLU, conv, ReLU, conv, pool) with a
    1×1-conv-then-pool shortcut when the width or resolution changes, the identity otherwise.
    Both shortcuts pool first: average pooling and a 1×1 conv commute exactly (both linear, one
    over space, one over channels), and the conv then runs on a quarter of the pixels.

    Shape:
        - x: ``(N, in_channels, H, W)``
        - output: ``(N, out_channels, H/2, W/2)`` when ``downsample``, else
          ``(N, out_channels, H, W)``
    """

    def __init__(
        self, in_channels: int, out_channels: int, *, downsample: bool, first: bool = False
    ) -> None:
        super().__init__()
        if first and not downsample:
            raise ValueError("the first discriminator block always down-samples")
        self.first, self.downsample = first, downsample
        self.conv1 = sn_conv2d(in_channels, out_channels, 3, padding=1)
        self.conv2 = sn_conv2d(out_channels, out_channels, 3, padding=1)
        learnable = first or downsample or in_channels != out_channels
        self.shortcut = sn_conv2d(in_channels, out_channels, 1) if learnable else None

    def _pool(self, x: Tensor) -> Tensor:
        return F.avg_pool2d(x, 2) if self.downsample else x

    def forward(self, x: Tensor) -> Tensor:
        h = x if self.first else F.relu(x)
        h = self._pool(self.conv2(F.relu(self.conv1(h))))  # (N, out, H', W')
        skip = x if self.shortcut is None else self.shortcut(self._pool(x))  # (N, out, H', W')
        out: Tensor = h + skip
        return out
