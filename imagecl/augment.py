"""SimCLR views of a whole uint8 image batch on its device, and the per-image twin for loaders.

Chen et al. 2020 (SimCLR), Appendix A: random resized crop (area U(0.08, 1), aspect ratio
U(3/4, 4/3), bicubic) and horizontal flip; colour jitter with strength s — brightness, contrast
and saturation 0.8s, hue 0.2s — applied with p = 0.8; grayscale with p = 0.2; Gaussian blur with
p = 0.5, kernel 10% of the image side, σ ~ U(0.1, 2.0). The CIFAR recipe (SupCon, Khosla et al.
2020) uses s = 0.5, a minimum crop area of 0.2 and no blur.

:class:`SimCLRViews` is the training path: one call turns a uint8 batch ``(N, C, H, W)`` into
``V`` views per image, every view with its own random parameters, on whatever device the batch
lives; the ``N·V`` views go through every op as one batch, in fp32 whatever autocast the caller
runs, with every random parameter drawn on that device (torchvision's samplers, batched). The
photometric ops live in :mod:`imagecl.colour` (:func:`color_jitter`, importable from here, is
torchvision's jitter, checked against it image by image). :func:`torchvision_views` is the same
recipe per image with ``torchvision.transforms.v2``, for DataLoader workers; :func:`to_float` is
the evaluation path (no augmentation).

Channels: ``C = 3`` is RGB. ``C = 1`` (grayscale) skips the colour ops (jitter, grayscale) by
itself and keeps the blur. ``C > 3`` means RGB followed by extra channels (e.g. RandBit's constant
bit channels, Chen et al. 2021): those extra channels get the geometric ops only — the very same
crop and flip as the RGB channels of that view — and never the colour ops or the blur, so a
constant channel stays constant and identical in every view. ``C = 2`` is refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torchvision.transforms.v2 as T
from PIL import Image
from torch import Tensor, nn

from imagecl.colour import GRAY_WEIGHTS as GRAY_WEIGHTS  # re-exported (kept importable from here)
from imagecl.colour import (
    ColorJitterParams,
    RandomGaussianBlur,
    RandomGrayscale,
    random_color_jitter,
)
from imagecl.colour import color_jitter as color_jitter  # re-exported (kept importable from here)
from imagecl.crops import HorizontalFlip, ResizedCropBoxes, resized_crop

BLUR_SIGMA = (0.1, 2.0)  # SimCLR Appendix A: σ ~ U(0.1, 2.0)
MAX_JITTER_STRENGTH = 2.5  # hue magnitude 0.2s must stay ≤ 0.5 (half a turn)


@dataclass(frozen=True)
class ViewConfig:
    """Parameters of one SimCLR view; defaults are SimCLR's ImageNet recipe (Appendix A).

    The jitter draws brightness, contrast and saturation factors from ``[1 - 0.8s, 1 + 0.8s]``
    (lower end floored at 0, as torchvision does) and a hue shift from ``[-0.2s, 0.2s]`` turns.
    ``color=False`` drops jitter and grayscale (for grayscale data); the blur stays.
    """

    crop_scale: tuple[float, float] = (0.08, 1.0)  # random resized crop area range (SimCLR)
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip_p: float = 0.5
    jitter_strength: float = 1.0  # s: brightness/contrast/saturation 0.8s, hue 0.2s (SimCLR)
    jitter_p: float = 0.8
    gray_p: float = 0.2
    blur_p: float = 0.5  # Gaussian blur, kernel ~10% of the image size, sigma U(0.1, 2.0)
    color: bool = True  # False: no jitter/grayscale (grayscale images)

    def __post_init__(self) -> None:
        _check_range("crop_scale", self.crop_scale, upper=1.0)
        _check_range("crop_ratio", self.crop_ratio, upper=math.inf)
        for name in ("flip_p", "jitter_p", "gray_p", "blur_p"):
            _check_probability(name, getattr(self, name))
        s = self.jitter_strength
        if not _is_real(s) or not 0.0 <= s <= MAX_JITTER_STRENGTH:
            raise ValueError(
                f"ViewConfig.jitter_strength must be in [0, {MAX_JITTER_STRENGTH}] "
                f"(hue 0.2s ≤ 0.5), got {s!r}"
            )
        if not isinstance(self.color, bool):
            raise ValueError(f"ViewConfig.color must be a bool, got {self.color!r}")


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_probability(name: str, p: object) -> None:
    if not _is_real(p) or not 0.0 <= p <= 1.0:  # type: ignore[operator]
        raise ValueError(f"ViewConfig.{name} must be a probability in [0, 1], got {p!r}")


def _check_range(name: str, pair: object, *, upper: float) -> None:
    ok = isinstance(pair, tuple) and len(pair) == 2 and all(_is_real(v) for v in pair)
    if not ok or not 0.0 < pair[0] <= pair[1] <= upper:  # type: ignore[index]
        raise ValueError(
            f"ViewConfig.{name} must be a tuple (low, high) with 0 < low <= high <= {upper}, "
            f"got {pair!r}"
        )


PRESETS: dict[str, ViewConfig] = {
    # SimCLR ImageNet (Chen et al. 2020, Appendix A)
    "simclr_imagenet": ViewConfig(),
    # SimCLR/SupCon CIFAR: s = 0.5, crop area from 0.2 (SupCon's recipe), no blur
    "simclr_cifar": ViewConfig(crop_scale=(0.2, 1.0), jitter_strength=0.5, blur_p=0.0),
    # small grayscale images (digits): crop and flip only
    "small_gray": ViewConfig(crop_scale=(0.2, 1.0), blur_p=0.0, color=False),
}


def view_config(preset_or_config: str | ViewConfig) -> ViewConfig:
    """Resolve a preset name (a key of :data:`PRESETS`) or pass a :class:`ViewConfig` through."""
    if isinstance(preset_or_config, ViewConfig):
        return preset_or_config
    if isinstance(preset_or_config, str) and preset_or_config in PRESETS:
        return PRESETS[preset_or_config]
    raise ValueError(
        f"unknown view preset {preset_or_config!r}; presets: {', '.join(sorted(PRESETS))} "
        "(or pass a ViewConfig)"
    )


def blur_kernel_size(size: int) -> int:
    """Odd Gaussian-blur kernel of about 10% of the image side, at least 3.

    SimCLR's code takes ``size // 10`` and makes it odd as ``2 · (size // 20) + 1`` (23 at 224);
    below 40 px that would be a kernel of 1 (no blur at all), so 3 is the floor.
    """
    return max(3, 2 * (size // 20) + 1)


def _channel_stats(values: Sequence[float], name: str) -> Tensor:
    stats = torch.as_tensor(values, dtype=torch.float32).flatten()
    if stats.numel() == 0 or not bool(torch.isfinite(stats).all()):
        raise ValueError(f"{name} must be a non-empty sequence of finite numbers, got {values!r}")
    if name == "std" and bool((stats <= 0).any()):
        raise ValueError(f"std must be positive, got {values!r}")
    return stats


def _check_images(images: Tensor, channels: int) -> None:
    if not isinstance(images, Tensor) or images.dtype != torch.uint8 or images.ndim != 4:
        what = f"{images.dtype} {tuple(images.shape)}" if isinstance(images, Tensor) else images
        raise ValueError(f"images must be a uint8 tensor (N, C, H, W), got {what}")
    c = images.shape[1]
    if c == 2:
        raise ValueError("images must have 1 (gray), 3 (RGB) or more than 3 channels, got C = 2")
    if c != channels:
        raise ValueError(f"images have C = {c} channels but mean/std have {channels} values")


def _normalise(x: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """In place: ``(x - mean) / std`` per channel of a float ``(B, C, H, W)`` batch in [0, 1]."""
    mean = mean.to(x.device)[:, None, None]  # (C, 1, 1)
    std = std.to(x.device)[:, None, None]  # (C, 1, 1)
    return x.sub_(mean).div_(std)


def to_float(images: Tensor, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    """The evaluation path: pixels to [0, 1], normalised with ``mean``/``std``; no augmentation.

    Shape:
        images: uint8 ``(N, C, H, W)``, any device (not modified)
        returns: float32 ``(N, C, H, W)`` on the same device
    """
    mean_t, std_t = _channel_stats(mean, "mean"), _channel_stats(std, "std")
    _check_images(images, mean_t.numel())
    return _normalise(images.float().div_(255), mean_t, std_t)


class SimCLRViews(nn.Module):
    """``V`` SimCLR views of every image of a uint8 batch, with per-view random parameters.

    Order (SimCLR): random resized crop to ``size × size`` (bicubic, then clamped to [0, 1]) →
    horizontal flip → colour jitter → grayscale → Gaussian blur → normalise with ``mean``/``std``.
    The ``N·V`` views go through the ops as one batch; view ``j`` of image ``i`` gets its own
    crop, flip, jitter factors, grayscale and blur draws. See the module docstring for the
    channel rules (``C = 1``: no colour ops; ``C > 3``: extra channels geometric only).

    On the device, in fp32: every parameter is drawn on the images' device and every op runs
    there, in float32 with autocast disabled (under a bf16 autocast the crop's ``affine_grid``
    and the blur would run in bf16, and the views would depend on the loop's precision). Move
    the module once with ``.to(device)``: ``mean``/``std`` are buffers, the only tensors it
    keeps, so a call then copies nothing from the host and reads nothing back (a module left on
    another device still works, copying its two buffers on every call). The one host-side draw
    is the order of the four jitter adjustments, a permutation of 4 on the CPU stream (it decides
    which kernels run).

    The samplers are ours, not kornia.augmentation's: kornia builds its ranges as host tensors
    on every call (``torch.tensor(0.0, device=...)``), gates rows with boolean indexing and its
    blur reads σ on the host, all of which stall a GPU. They follow torchvision's recipes:
    :class:`ResizedCropBoxes` (its RandomResizedCrop sampler), :class:`ColorJitterParams`,
    :class:`HorizontalFlip`, :class:`RandomGrayscale`, :class:`RandomGaussianBlur`. The crop
    (:func:`imagecl.crops.resized_crop`) and the colour jitter (:func:`color_jitter`) are batched
    tensor ops.

    Randomness: without ``generator`` the parameters come from torch's global streams (the
    images' device, and the CPU for the jitter order), so ``shared.runtime.seed_everything(seed,
    rank=r)`` gives every rank its own views. With a ``generator`` (on any device), one seed is
    drawn from it and the pipeline runs inside ``torch.random.fork_rng`` with the CPU stream and
    the images' device stream seeded from it: the output is a function of the generator's state
    and the global streams are left untouched. A seed gives the same views on every device of a
    kind; CUDA's and the CPU's random streams differ.

    Differences from torchvision's per-image recipe: the order of the four jitter adjustments is
    drawn once per call rather than per image, the factors are per view; the crop is resampled
    without antialiasing (it matters only when a crop is much larger than ``size``).

    ``forward`` always augments (also in ``eval()`` mode); use :func:`to_float` for evaluation.
    """

    mean: Tensor
    std: Tensor

    def __init__(
        self,
        size: int,
        mean: Sequence[float],
        std: Sequence[float],
        config: str | ViewConfig = "simclr_cifar",
        views: int = 2,
    ) -> None:
        super().__init__()
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be a positive int, got {size!r}")
        if isinstance(views, bool) or not isinstance(views, int) or views < 1:
            raise ValueError(f"views must be a positive int, got {views!r}")
        self.size, self.views, self.config = size, views, view_config(config)
        mean_t, std_t = _channel_stats(mean, "mean"), _channel_stats(std, "std")
        if mean_t.numel() != std_t.numel():
            raise ValueError(f"mean and std differ in length: {list(mean)} vs {list(std)}")
        self.register_buffer("mean", mean_t, persistent=False)  # (C,)
        self.register_buffer("std", std_t, persistent=False)  # (C,)
        cfg, s = self.config, self.config.jitter_strength
        # an op whose probability is 0 is not built: it neither runs nor draws
        self.crop = ResizedCropBoxes(cfg.crop_scale, cfg.crop_ratio)
        self.flip = HorizontalFlip(cfg.flip_p) if cfg.flip_p > 0 else None
        colour = cfg.color and cfg.jitter_p > 0 and s > 0
        self.jitter = (
            ColorJitterParams(0.8 * s, 0.8 * s, 0.8 * s, 0.2 * s, cfg.jitter_p) if colour else None
        )
        self.gray = RandomGrayscale(cfg.gray_p) if cfg.color and cfg.gray_p > 0 else None
        k = blur_kernel_size(size)
        self.blur = RandomGaussianBlur(k, BLUR_SIGMA, cfg.blur_p) if cfg.blur_p > 0 else None

    def forward(self, images: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Views of every image: view ``j`` of image ``i`` is ``out[i, j]``.

        Shape:
            images: uint8 ``(N, C, H, W)`` on any device, ``C`` = len(mean); not modified
            returns: float32 ``(N, V, C, size, size)`` on the same device, normalised
        """
        _check_images(images, self.mean.numel())
        with torch.autocast(images.device.type, enabled=False):  # fp32 whatever the loop's amp
            if generator is None:
                return self.draw_views(images)
            seed = int(torch.randint(2**62, (), generator=generator, device=generator.device))
            cuda = images.device.type == "cuda"
            with torch.random.fork_rng(devices=[images.device] if cuda else []):
                # not torch.manual_seed: it would also reseed CUDA devices fork_rng doesn't restore
                torch.default_generator.manual_seed(seed)
                if cuda:
                    torch.cuda.default_generators[images.device.index].manual_seed(seed)
                return self.draw_views(images)

    def draw_views(self, images: Tensor) -> Tensor:
        """The views of ``images`` from torch's global random streams, in the caller's precision.

        :meth:`forward` runs it with autocast disabled (and inside a forked RNG when given a
        generator); a subclass that builds its views differently overrides this method.

        Shape:
            as :meth:`forward`
        """
        n, c, h, w = images.shape
        v, size = self.views, self.size
        x = images.float().div_(255)[:, None].expand(n, v, c, h, w).reshape(n * v, c, h, w)
        x = resized_crop(x, self.crop, size).clamp_(0.0, 1.0)  # (N·V, C, size, size)
        if self.flip is not None:
            x = self.flip(x)
        image_channels = 1 if c == 1 else 3
        y = x[:, :image_channels]  # (N·V, 1 or 3, size, size): the photometric ops' share
        if c >= 3 and self.jitter is not None:
            y = random_color_jitter(y, self.jitter)
        if c >= 3 and self.gray is not None:
            y = self.gray(y)
        if self.blur is not None:
            y = self.blur(y)
        if c > image_channels:  # extra channels: geometric ops only
            y = torch.cat([y, x[:, image_channels:]], dim=1)  # (N·V, C, size, size)
        x = _normalise(y, self.mean, self.std)  # in place: our own buffer, never the input
        return x.reshape(n, v, c, size, size)  # (N, V, C, size, size)

    def extra_repr(self) -> str:
        return f"size={self.size}, views={self.views}, config={self.config}"


class _TorchvisionViews:
    """Per-image SimCLR views with torchvision.transforms.v2 (picklable, for loader workers)."""

    def __init__(
        self,
        size: int,
        mean: Sequence[float],
        std: Sequence[float],
        config: str | ViewConfig,
        views: int,
    ) -> None:
        if isinstance(views, bool) or not isinstance(views, int) or views < 1:
            raise ValueError(f"views must be a positive int, got {views!r}")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be a positive int, got {size!r}")
        cfg = view_config(config)
        self.views = views
        self.mean = _channel_stats(mean, "mean").tolist()
        self.std = _channel_stats(std, "std").tolist()
        if len(self.mean) != len(self.std):
            raise ValueError(f"mean and std differ in length: {list(mean)} vs {list(std)}")
        self.geometric = T.Compose(
            [
                T.RandomResizedCrop(
                    size,
                    cfg.crop_scale,
                    cfg.crop_ratio,
                    T.InterpolationMode.BICUBIC,
                    antialias=True,
                ),
                T.RandomHorizontalFlip(cfg.flip_p),
            ]
        )
        colour: list[nn.Module] = []
        if cfg.color and cfg.jitter_p > 0 and cfg.jitter_strength > 0:
            s = cfg.jitter_strength
            jitter = T.ColorJitter(0.8 * s, 0.8 * s, 0.8 * s, 0.2 * s)
            colour.append(T.RandomApply([jitter], p=cfg.jitter_p))
        if cfg.color and cfg.gray_p > 0:
            colour.append(T.RandomGrayscale(cfg.gray_p))
        blur: list[nn.Module] = []
        if cfg.blur_p > 0:
            k = blur_kernel_size(size)
            blur.append(T.RandomApply([T.GaussianBlur(k, BLUR_SIGMA)], p=cfg.blur_p))
        self.rgb = T.Compose([*colour, *blur]) if colour or blur else T.Identity()
        self.gray = T.Compose(blur) if blur else T.Identity()
        self.to_float = T.Compose(
            [T.ToImage(), T.ToDtype(torch.float32, scale=True), T.Normalize(self.mean, self.std)]
        )

    def __call__(self, image: Tensor | Image.Image) -> Tensor:
        if isinstance(image, Image.Image):
            if image.mode not in ("L", "RGB"):
                raise ValueError(f"PIL images must be mode 'L' or 'RGB', got {image.mode!r}")
            c = 1 if image.mode == "L" else 3
        elif isinstance(image, Tensor) and image.ndim == 3:
            _check_images(image[None], len(self.mean))
            c = image.shape[0]
        else:
            raise ValueError(f"expected a uint8 (C, H, W) tensor or a PIL image, got {image!r:.80}")
        if c != len(self.mean):
            raise ValueError(f"image has C = {c} channels but mean/std have {len(self.mean)}")
        out = []
        for _ in range(self.views):
            x = self.geometric(image)
            if c == 1:
                x = self.gray(x)
            elif c == 3:
                x = self.rgb(x)
            else:  # extra channels: geometric ops only
                x = torch.cat([self.rgb(x[:3]), x[3:]])
            out.append(self.to_float(x))  # (C, size, size)
        return torch.stack(out)  # (V, C, size, size)


def torchvision_views(
    size: int,
    mean: Sequence[float],
    std: Sequence[float],
    config: str | ViewConfig = "simclr_cifar",
    views: int = 2,
) -> Callable[[Tensor | Image.Image], Tensor]:
    """The per-image twin of :class:`SimCLRViews` (torchvision.transforms.v2), for loader workers.

    Same recipe and channel rules; the ops run on the input's own type (PIL or uint8 tensor) and
    the pixels become normalised float32 at the end, as torchvision's recipes do. Randomness comes
    from torch's global RNG (each DataLoader worker seeds its own). The jitter order is drawn per
    image here and the crop is antialiased.

    Shape:
        input: one uint8 ``(C, H, W)`` tensor or a PIL image (mode ``L`` or ``RGB``)
        returns: float32 ``(V, C, size, size)``
    """
    return _TorchvisionViews(size, mean, std, config, views)
