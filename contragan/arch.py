"""The architecture of the class-conditional generator and discriminator: :class:`GanArch`.

Two plans, both BigGAN-style ResNets (Brock et al. 2019): ``"resnet32"`` as StudioGAN
configures them for CIFAR-10 (Kang & Park 2020), and ``"digits"``, a small version for CPU
runs. Image size, channels and classes come from the data; the networks themselves are in
:mod:`contragan.networks`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["ARCHS", "CONTRASTIVE_LOSSES", "LOSSES", "GanArch", "GanLoss"]

GanLoss = Literal["contra", "reacgan", "proj", "ac"]
ARCHS = ("digits", "resnet32")
LOSSES = ("contra", "reacgan", "proj", "ac")
# the methods whose class term contrasts D's embedding with a class proxy (the same head)
CONTRASTIVE_LOSSES = ("contra", "reacgan")

_SIZES = (
    "image_size",
    "channels",
    "num_classes",
    "z_dim",
    "g_channels",
    "d_channels",
    "shared_dim",
    "embed_dim",
)
_MIN_WIDTH = 8  # digits widths never go below 8: SelfAttention needs C/8 >= 1 query channel


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

    ``embed_dim`` is the width of :class:`DiscOutput`'s embedding and proxy: the projection dim
    of the contrastive head for ``"contra"`` and ``"reacgan"`` (512 in the reference, both
    methods); for ``"proj"`` and ``"ac"`` those are h and its class vector, so ``embed_dim``
    must equal the trunk width ``feature_dim`` (the constructors set it).

    ``adc`` (contra and reacgan only) gives the contrastive head two proxies per class, one
    for real images and one for fakes: the auxiliary discriminative classifier of ADC-GAN
    (Hou et al. 2022) on the 2C/D2D-CE head, StudioGAN's ``aux_cls_type: ADC``.

    ``proj_adv`` (contra and reacgan only) makes their unconditional adversarial logit
    ProjGAN's conditional one, ``w·h + ⟨v(y), h⟩`` with its own class table ``v`` (not the
    proxies): D then judges each image against its class's real images, besides the class
    term. Neither ContraGAN nor ReACGAN has it (their logit is unconditional).
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
    adc: bool = False
    proj_adv: bool = False

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
        if self.loss not in CONTRASTIVE_LOSSES and self.embed_dim != self.feature_dim:
            raise ValueError(
                f"for loss={self.loss!r} the embedding and proxy are h and its class vector, so "
                f"embed_dim must equal the trunk width {self.feature_dim}, got {self.embed_dim}"
            )
        if self.adc and self.loss not in CONTRASTIVE_LOSSES:
            raise ValueError(
                f"adc applies to the contrastive losses {CONTRASTIVE_LOSSES}, got {self.loss!r}"
            )
        if self.proj_adv and self.loss not in CONTRASTIVE_LOSSES:
            raise ValueError(
                f"proj_adv applies to the contrastive losses {CONTRASTIVE_LOSSES}, got "
                f"{self.loss!r} (proj's logit is conditional already)"
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
        """The small CPU configuration: z 64, base widths 32, shared embedding 32, embedding 128.

        Other widths keep ``embed_dim`` consistent (the trunk width for proj/ac)."""
        return cls._with_heads(
            name="digits",
            image_size=image_size,
            channels=channels,
            num_classes=num_classes,
            z_dim=64,
            g_channels=g_channels,
            d_channels=d_channels,
            shared_dim=32,
            contra_dim=128,
            loss=loss,
        )

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
        """StudioGAN's CIFAR-10 ContraGAN/ReACGAN: z 80 in 4 chunks, shared 128, widths 96,
        embedding 512.

        Other widths keep ``embed_dim`` consistent (the trunk width for proj/ac)."""
        return cls._with_heads(
            name="resnet32",
            image_size=image_size,
            channels=channels,
            num_classes=num_classes,
            z_dim=80,
            g_channels=g_channels,
            d_channels=d_channels,
            shared_dim=128,
            contra_dim=512,
            loss=loss,
        )

    @classmethod
    def _with_heads(
        cls,
        *,
        name: str,
        image_size: int,
        channels: int,
        num_classes: int,
        z_dim: int,
        g_channels: int,
        d_channels: int,
        shared_dim: int,
        contra_dim: int,
        loss: GanLoss,
    ) -> GanArch:
        _check_image_size(name, image_size)  # before planning the trunk width
        width = _d_plan(name, image_size, channels, d_channels)[-1][1]
        return cls(
            name=name,
            image_size=image_size,
            channels=channels,
            num_classes=num_classes,
            z_dim=z_dim,
            g_channels=g_channels,
            d_channels=d_channels,
            shared_dim=shared_dim,
            embed_dim=contra_dim if loss in CONTRASTIVE_LOSSES else width,
            attention=True,
            hierarchical_z=True,
            loss=loss,
        )

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
        for 32 px); 8 for digits (a 16×16 attention map is costly on a CPU)."""
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
