"""The class-conditional generator and discriminator of ContraGAN and its baselines.

BigGAN-style ResNets (Brock et al. 2019) as StudioGAN configures them for CIFAR-10 (Kang & Park
2020): the generator maps z and a class to an image through up-sampling residual blocks with
conditional batch norm (a shared class embedding, plus a chunk of z per block under
hierarchical z); the discriminator's trunk of down-sampling residual blocks ends in ReLU and a
global *sum* pool, giving h, read by an unconditional linear logit and by one of three
class-conditioning heads, one per ``loss``:

- ``"contra"`` (ContraGAN): a projection head ``l = W h`` and a class embedding ``e(y)``, the
  embedding and proxy of the 2C loss (Kang & Park 2020, Eq. 8); the adversarial logit stays
  unconditional.
- ``"proj"`` (ProjGAN, Miyato & Koyama 2018, Eq. 3): the adversarial logit gains ``⟨e(y), h⟩``.
- ``"ac"`` (ACGAN, Odena et al. 2017): class logits ``W h`` for an auxiliary cross-entropy.

Spectral norm on every weight of both networks (except the generator's shared embedding and
its batch norms, as in BigGAN) and orthogonal initialisation (:func:`build_gan`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from contragan.layers import (
    DiscBlock,
    GenBlock,
    SelfAttention,
    orthogonal_init_,
    sn_conv2d,
    sn_embedding,
    sn_linear,
)

__all__ = [
    "ARCHS",
    "LOSSES",
    "DiscOutput",
    "Discriminator",
    "GanArch",
    "GanLoss",
    "Generator",
    "build_gan",
]

GanLoss = Literal["contra", "proj", "ac"]
ARCHS = ("digits", "resnet32")
LOSSES = ("contra", "proj", "ac")

_SIZES = (
    "image_size", "channels", "num_classes", "z_dim", "g_channels", "d_channels", "shared_dim",
    "embed_dim",
)  # fmt: skip
_MIN_WIDTH = 8  # digits widths never go below 8: SelfAttention needs C/8 >= 1 query channel


class DiscOutput(NamedTuple):
    """What the discriminator returns.

    ``embedding`` and ``proxy`` are the pair whose agreement conditions the discriminator on
    the class: for ``"contra"`` the projection-head output ``l`` (before L2 normalisation) and
    the class embedding ``e(y)`` of the 2C loss; for ``"proj"`` h and the projection embedding
    ``e(y)`` (the adversarial logit holds their dot product); for ``"ac"`` h and the classifier
    row ``w_y`` (``class_logits[i, y_i] = ⟨w_{y_i}, h_i⟩``). Their width D is always
    ``arch.embed_dim``, which :class:`GanArch` sets to the trunk width for proj/ac.

    Shape:
        adv: ``(N,)``; embedding: ``(N, D)``; proxy: ``(N, D)``; class_logits: ``(N, C)`` for
        ``"ac"``, else None.
    """

    adv: Tensor
    embedding: Tensor
    proxy: Tensor
    class_logits: Tensor | None


def _resolution_plan(image_size: int) -> tuple[int, int]:
    """``(bottom, ups)`` with ``image_size = bottom · 2^ups``: halve while even and >= 8."""
    bottom, ups = image_size, 0
    while bottom % 2 == 0 and bottom // 2 >= 4:
        bottom, ups = bottom // 2, ups + 1
    return bottom, ups


@dataclass(frozen=True)
class GanArch:
    """Architecture of G and D; image size, channels and classes come from the data.

    Two plans. ``"resnet32"`` is StudioGAN's BigGAN for CIFAR-10 and only takes 32×32: G is
    a 4×4 map of width 4·g_channels and three up-blocks at that width; D has four blocks of
    width 2·d_channels, the first two down-sampling (32 → 16 → 8). ``"digits"`` is a small
    version for CPU runs and takes ``image_size = b·2^u`` with ``b`` in 4..7, ``u >= 1`` and
    ``image_size <= 128`` (8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64, ...): G starts
    at b×b with width 2·g_channels and its ``u`` up-blocks have widths g, g/2, g/4, ... (at
    least 8), so the cost per block stays flat; D mirrors it with ``u`` down-blocks to b×b of
    widths ..., d/2, d (at least 8) and one more block of width 2·d.

    Self-attention (``attention``) follows G's first block that reaches ``attention_side`` or
    more and D's first block at ``attention_side`` or less: 16×16 for resnet32 (the
    reference's place), 8×8 for digits (cheaper on a CPU). With ``hierarchical_z`` z is cut
    into ``u + 1`` chunks (sizes differ by at most one): the first feeds G's input linear,
    block i's conditional batch norm gets ``[shared(y), chunk_{i+1}]``; without it z goes
    whole into the linear and the batch norms get ``shared(y)`` alone.

    ``embed_dim`` is the width of :class:`DiscOutput`'s embedding and proxy: the 2C projection
    dim for ``"contra"`` (512 in the reference); for ``"proj"`` and ``"ac"`` those are h and
    its class vector, so ``embed_dim`` must equal the trunk width ``feature_dim`` (the
    constructors set it).
    """

    name: str
    image_size: int
    channels: int
    num_classes: int
    z_dim: int
    g_channels: int
    d_channels: int
    shared_dim: int
    embed_dim: int
    attention: bool
    hierarchical_z: bool
    loss: GanLoss

    def __post_init__(self) -> None:
        if self.name not in ARCHS:
            raise ValueError(f"arch name must be one of {ARCHS}, got {self.name!r}")
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {self.loss!r}")
        for field in _SIZES:
            _check_at_least(getattr(self, field), field, 1)
        _check_image_size(self.name, self.image_size)
        if self.hierarchical_z and self.z_dim < self.num_ups + 1:
            raise ValueError(
                f"hierarchical_z cuts z into {self.num_ups + 1} chunks for image_size "
                f"{self.image_size}, so z_dim must be >= {self.num_ups + 1}, got {self.z_dim}"
            )
        if (
            self.attention
            and self.name == "resnet32"
            and min(4 * self.g_channels, 2 * self.d_channels) < 8
        ):
            raise ValueError(
                "self-attention needs >= 8 channels: g_channels >= 2 and d_channels >= 4, got "
                f"{self.g_channels} and {self.d_channels}"
            )
        if self.loss != "contra" and self.embed_dim != self.feature_dim:
            raise ValueError(
                f"for loss={self.loss!r} the embedding and proxy are h and its class vector, so "
                f"embed_dim must equal the trunk width {self.feature_dim}, got {self.embed_dim}"
            )

    @classmethod
    def digits(
        cls,
        image_size: int = 32,
        channels: int = 1,
        num_classes: int = 10,
        loss: GanLoss = "contra",
        *,
        g_channels: int = 32,
        d_channels: int = 32,
    ) -> GanArch:
        """The small CPU configuration: z 64, base widths 32, shared embedding 32, 2C dim 128.

        Other widths keep ``embed_dim`` consistent (the trunk width for proj/ac)."""
        return cls._with_heads(
            name="digits", image_size=image_size, channels=channels, num_classes=num_classes,
            z_dim=64, g_channels=g_channels, d_channels=d_channels, shared_dim=32,
            contra_dim=128, loss=loss,
        )  # fmt: skip

    @classmethod
    def resnet32(
        cls,
        image_size: int = 32,
        channels: int = 3,
        num_classes: int = 10,
        loss: GanLoss = "contra",
        *,
        g_channels: int = 96,
        d_channels: int = 96,
    ) -> GanArch:
        """StudioGAN's CIFAR-10 ContraGAN: z 80 in 4 chunks, shared 128, widths 96, 2C dim 512.

        Other widths keep ``embed_dim`` consistent (the trunk width for proj/ac)."""
        return cls._with_heads(
            name="resnet32", image_size=image_size, channels=channels, num_classes=num_classes,
            z_dim=80, g_channels=g_channels, d_channels=d_channels, shared_dim=128,
            contra_dim=512, loss=loss,
        )  # fmt: skip

    @classmethod
    def _with_heads(
        cls, *, name: str, image_size: int, channels: int, num_classes: int, z_dim: int,
        g_channels: int, d_channels: int, shared_dim: int, contra_dim: int, loss: GanLoss,
    ) -> GanArch:  # fmt: skip
        _check_image_size(name, image_size)  # before planning the trunk width
        width = _d_plan(name, image_size, channels, d_channels)[-1][1]
        return cls(
            name=name, image_size=image_size, channels=channels, num_classes=num_classes,
            z_dim=z_dim, g_channels=g_channels, d_channels=d_channels, shared_dim=shared_dim,
            embed_dim=contra_dim if loss == "contra" else width, attention=True,
            hierarchical_z=True, loss=loss,
        )  # fmt: skip

    @property
    def bottom_size(self) -> int:
        """Side of G's first feature map."""
        return _resolution_plan(self.image_size)[0]

    @property
    def num_ups(self) -> int:
        """Number of G's up-sampling blocks."""
        return _resolution_plan(self.image_size)[1]

    @property
    def g_widths(self) -> tuple[int, ...]:
        """G's input width, then each block's output width: ``num_ups + 1`` entries."""
        if self.name == "resnet32":
            return (4 * self.g_channels,) * (self.num_ups + 1)
        blocks = [max(self.g_channels >> i, _MIN_WIDTH) for i in range(self.num_ups)]
        return (2 * self.g_channels, *blocks)

    @property
    def attention_side(self) -> int:
        """Feature-map side where self-attention goes: 16 in the reference (StudioGAN's place
        for 32 px); 8 for digits, where the 16×16 attention map was a large share of the CPU
        step."""
        return 16 if self.name == "resnet32" else 8

    @property
    def d_plan(self) -> tuple[tuple[int, int, bool], ...]:
        """D's blocks as ``(in_channels, out_channels, downsample)``."""
        return _d_plan(self.name, self.image_size, self.channels, self.d_channels)

    @property
    def feature_dim(self) -> int:
        """Width of h, the pooled discriminator feature."""
        return self.d_plan[-1][1]

    @property
    def z_chunks(self) -> tuple[int, ...]:
        """Sizes of z's chunks: ``num_ups + 1`` with hierarchical z, else ``(z_dim,)``."""
        if not self.hierarchical_z:
            return (self.z_dim,)
        parts = self.num_ups + 1
        return tuple(self.z_dim // parts + (i < self.z_dim % parts) for i in range(parts))


def _check_at_least(value: int, name: str, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


def _check_image_size(name: str, image_size: int) -> None:
    if name == "resnet32" and image_size != 32:
        raise ValueError(
            f"arch 'resnet32' (StudioGAN's CIFAR-10 recipe) takes image_size 32 only, got "
            f"{image_size}; use arch 'digits' for other sizes"
        )
    bottom, ups = _resolution_plan(image_size)
    if name == "digits" and not (ups >= 1 and bottom <= 7 and image_size <= 128):
        raise ValueError(
            "arch 'digits' takes image_size = b·2^u with b in 4..7, u >= 1 and at most 128 "
            f"(8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64, ...), got {image_size}"
        )


def _d_plan(
    name: str, image_size: int, channels: int, d_channels: int
) -> tuple[tuple[int, int, bool], ...]:
    if name == "resnet32":
        width = 2 * d_channels
        return (
            (channels, width, True),
            (width, width, True),
            (width, width, False),
            (width, width, False),
        )
    ups = _resolution_plan(image_size)[1]
    widths = [channels] + [max(d_channels >> (ups - 1 - j), _MIN_WIDTH) for j in range(ups)]
    down = tuple((widths[j], widths[j + 1], True) for j in range(ups))
    return (*down, (widths[-1], 2 * d_channels, False))


class Generator(nn.Module):
    """``G(z, y)``: a class-conditional BigGAN-style ResNet generator, images in [-1, 1].

    Input linear (z or its first chunk) → ``(width, b, b)``; up-blocks with conditional batch
    norm; self-attention after the first block at >= ``attention_side``; BN, ReLU, 3×3 conv,
    tanh.

    Shape:
        - z: ``(N, z_dim)``; y: ``(N,)`` long class indices
        - output: ``(N, channels, image_size, image_size)``
    """

    def __init__(self, arch: GanArch) -> None:
        super().__init__()
        self.arch = arch
        self.z_dim, self.num_classes = arch.z_dim, arch.num_classes
        widths, chunks, bottom = arch.g_widths, arch.z_chunks, arch.bottom_size
        # BigGAN's shared embedding is a plain table (no spectral norm)
        self.shared = nn.Embedding(arch.num_classes, arch.shared_dim)
        self.linear = sn_linear(chunks[0], widths[0] * bottom * bottom)
        if arch.hierarchical_z:
            cond_dims = [arch.shared_dim + chunk for chunk in chunks[1:]]
        else:
            cond_dims = [arch.shared_dim] * arch.num_ups
        self.blocks = nn.ModuleList(
            GenBlock(widths[i], widths[i + 1], cond_dims[i]) for i in range(arch.num_ups)
        )
        sides = [bottom * 2 ** (i + 1) for i in range(arch.num_ups)]
        self.attention_index = next(
            (i for i, side in enumerate(sides) if side >= arch.attention_side), len(sides) - 1
        )
        self.attention = SelfAttention(widths[self.attention_index + 1]) if arch.attention else None
        self.bn = nn.BatchNorm2d(widths[-1])
        self.conv_out = sn_conv2d(widths[-1], arch.channels, 3, padding=1)

    def forward(self, z: Tensor, y: Tensor) -> Tensor:
        N = z.shape[0]
        if z.shape != (N, self.z_dim) or y.shape != (N,):
            raise ValueError(
                f"Generator expects z of shape (N, {self.z_dim}) and y of shape (N,), got "
                f"{tuple(z.shape)} and {tuple(y.shape)}"
            )
        chunks = torch.split(z, list(self.arch.z_chunks), dim=1)
        shared = self.shared(y)  # (N, shared_dim)
        if self.arch.hierarchical_z:
            conds = [torch.cat([shared, chunk], dim=1) for chunk in chunks[1:]]  # (N, S + c_i)
        else:
            conds = [shared] * len(self.blocks)
        side, width = self.arch.bottom_size, self.arch.g_widths[0]
        h = self.linear(chunks[0]).view(N, width, side, side)  # (N, width, b, b)
        for i, block in enumerate(self.blocks):
            h = block(h, conds[i])  # (N, width_i, b·2^(i+1), b·2^(i+1))
            if self.attention is not None and i == self.attention_index:
                h = self.attention(h)
        images: Tensor = torch.tanh(self.conv_out(F.relu(self.bn(h))))  # (N, channels, S, S)
        return images


class _ContrastiveHead(nn.Module):
    """ContraGAN's 2C head: ``l = W h`` and the class embedding ``e(y)``, both spectrally
    normalised (StudioGAN); the adversarial logit is left unconditional."""

    def __init__(self, feature_dim: int, num_classes: int, embed_dim: int) -> None:
        super().__init__()
        self.projection = sn_linear(feature_dim, embed_dim)
        self.proxies = sn_embedding(num_classes, embed_dim)

    def forward(self, h: Tensor, y: Tensor, adv: Tensor) -> DiscOutput:
        return DiscOutput(adv, self.projection(h), self.proxies(y), None)  # (N, D) twice


class _ProjectionHead(nn.Module):
    """ProjGAN's class term: ``adv + ⟨e(y), h⟩`` (Miyato & Koyama 2018, Eq. 3)."""

    def __init__(self, feature_dim: int, num_classes: int) -> None:
        super().__init__()
        self.embedding = sn_embedding(num_classes, feature_dim)

    def forward(self, h: Tensor, y: Tensor, adv: Tensor) -> DiscOutput:
        e = self.embedding(y)  # (N, F)
        return DiscOutput(adv + (e * h).sum(dim=1), h, e, None)


class _ClassifierHead(nn.Module):
    """ACGAN's auxiliary classifier ``W h``, bias-free as in StudioGAN, so the proxy ``w_y``
    and h give the logit of the conditioning class: ``class_logits[i, y_i] = ⟨w_{y_i}, h_i⟩``."""

    def __init__(self, feature_dim: int, num_classes: int) -> None:
        super().__init__()
        self.classifier = sn_linear(feature_dim, num_classes, bias=False)

    def forward(self, h: Tensor, y: Tensor, adv: Tensor) -> DiscOutput:
        # one access of the spectrally normalised weight: in training mode each access runs a
        # power iteration
        weight = self.classifier.weight  # (C, F)
        return DiscOutput(adv, h, weight[y], h @ weight.T)  # logits (N, C)


class Discriminator(nn.Module):
    """``D(x, y)``: BigGAN-style ResNet trunk, ReLU, global sum pool, then the heads.

    Shape:
        - x: ``(N, channels, image_size, image_size)``; y: ``(N,)`` long class indices
        - output: :class:`DiscOutput` with ``D = embed_dim``
    """

    def __init__(self, arch: GanArch) -> None:
        super().__init__()
        self.arch = arch
        plan = arch.d_plan
        self.blocks = nn.ModuleList(
            DiscBlock(c_in, c_out, downsample=down, first=i == 0)
            for i, (c_in, c_out, down) in enumerate(plan)
        )
        side, sides = arch.image_size, []
        for _, _, down in plan:
            side = side // 2 if down else side
            sides.append(side)
        self.attention_index = next(
            (i for i, s in enumerate(sides) if s <= arch.attention_side), len(sides) - 1
        )
        self.attention = SelfAttention(plan[self.attention_index][1]) if arch.attention else None
        width = arch.feature_dim
        self.linear = sn_linear(width, 1)
        self.head: nn.Module
        if arch.loss == "contra":
            self.head = _ContrastiveHead(width, arch.num_classes, arch.embed_dim)
        elif arch.loss == "proj":
            self.head = _ProjectionHead(width, arch.num_classes)
        else:
            self.head = _ClassifierHead(width, arch.num_classes)

    def forward(self, x: Tensor, y: Tensor) -> DiscOutput:
        arch = self.arch
        expected = (arch.channels, arch.image_size, arch.image_size)
        if x.ndim != 4 or tuple(x.shape[1:]) != expected or y.shape != (x.shape[0],):
            raise ValueError(
                f"Discriminator expects x of shape (N, {', '.join(map(str, expected))}) and y "
                f"of shape (N,), got {tuple(x.shape)} and {tuple(y.shape)}"
            )
        h = x
        for i, block in enumerate(self.blocks):
            h = block(h)  # (N, width_i, side_i, side_i)
            if self.attention is not None and i == self.attention_index:
                h = self.attention(h)
        h = F.relu(h).sum(dim=(2, 3))  # (N, F): global sum pool
        adv = self.linear(h).squeeze(1)  # (N,)
        out: DiscOutput = self.head(h, y, adv)
        return out


def build_gan(arch: GanArch) -> tuple[Generator, Discriminator]:
    """G and D for ``arch``, orthogonally initialised (BigGAN, StudioGAN's ``init: ortho``)."""
    generator, discriminator = Generator(arch), Discriminator(arch)
    orthogonal_init_(generator)
    orthogonal_init_(discriminator)
    return generator, discriminator
