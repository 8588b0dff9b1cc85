"""Specification of imagecl.augment: the SimCLR views of a uint8 batch and their per-image twin.

One contract helper (as torchvision's ``check_transform``) runs for every preset and for 1, 3 and
5 channels; then golden cases (the identity config is :func:`to_float`, ``flip_p = 1`` is a
flip), parameter ranges and probabilities measured on observable images, the channel rules, and
the torchvision path. Warnings are errors (pytest config).
"""

from __future__ import annotations

import colorsys
import itertools
import math
import os
import pickle
from dataclasses import replace

import pytest
import torch
import torchvision.transforms.v2.functional as TF
from PIL import Image
from torch import Tensor

# needs the image extra (kornia): skipped without it, not a collection error
pytest.importorskip("kornia")

from imagecl.augment import (
    PRESETS,
    SimCLRViews,
    ViewConfig,
    blur_kernel_size,
    color_jitter,
    to_float,
    torchvision_views,
    view_config,
)
from shared.runtime import seed_everything

IDENTITY = ViewConfig(
    crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), flip_p=0.0, jitter_p=0.0, gray_p=0.0, blur_p=0.0
)
CPU = torch.device("cpu")
ATOL = 1e-4  # the identity warp of the bicubic crop is exact up to float rounding (~1e-5 here)


def _stats(channels: int) -> tuple[list[float], list[float]]:
    mean = [0.3, 0.4, 0.5, 0.5, 0.5][:channels] if channels != 1 else [0.45]
    std = [0.2, 0.25, 0.3, 0.5, 0.5][:channels] if channels != 1 else [0.22]
    return mean, std


def _images(n: int, channels: int, side: int, seed: int = 0) -> Tensor:
    """Random-texture uint8 images ``(n, C, side, side)``: every crop and flip shows."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, channels, side, side), generator=g, dtype=torch.uint8)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _unnormalise(out: Tensor, mean: list[float], std: list[float]) -> Tensor:
    """Normalised views ``(..., C, H, W)`` back to [0, 1] pixels."""
    m = torch.tensor(mean, device=out.device)[:, None, None]
    s = torch.tensor(std, device=out.device)[:, None, None]
    return out * s + m


def check_views(config: str | ViewConfig, channels: int, device: torch.device = CPU) -> None:
    """The contract of every view transform: input untouched, dtype/device/shape, values in
    range, per-sample randomness, seeded reproducibility with the global RNG untouched, the
    global-RNG path, constant images stay constant, picklable."""
    n, views, side, size = 4, 3, 20, 16
    mean, std = _stats(channels)
    aug = SimCLRViews(size, mean, std, config, views=views)
    images = _images(n, channels, side).to(device)
    before = images.clone()

    out = aug(images, generator=_gen(0))
    assert torch.equal(images, before), "the input was modified"
    assert out.dtype == torch.float32 and out.device == images.device
    assert out.shape == (n, views, channels, size, size)
    pixels = _unnormalise(out, mean, std)
    assert bool(((pixels > -1e-5) & (pixels < 1 + 1e-5)).all()), "views leave [0, 1] pixels"

    # per-sample randomness: n copies of one image get n different views, and views differ
    same = images[:1].expand(n, -1, -1, -1)
    out = aug(same, generator=_gen(1))
    assert torch.equal(images, before)
    for i in range(n):
        for j in range(views):
            for k, m in [(i, j + 1), (i + 1, j)]:
                if k < n and m < views:
                    assert not torch.allclose(out[i, j], out[k, m]), f"views {i, j} = {k, m}"

    # seeded: same seed, same views; another seed, other views; global streams untouched
    state = torch.get_rng_state()
    cuda_state = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    first = aug(images, generator=_gen(2))
    assert torch.equal(first, aug(images, generator=_gen(2)))
    assert not torch.allclose(first, aug(images, generator=_gen(3)))
    assert torch.equal(state, torch.get_rng_state()), "a generator run touched the global RNG"
    if cuda_state is not None:
        assert torch.equal(cuda_state, torch.cuda.get_rng_state(device))

    # without a generator: the global stream of the images' device (torch.manual_seed and
    # seed_everything's per-rank seeds seed every device's)
    def stream() -> Tensor:
        return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()

    torch.manual_seed(4)
    seeded = stream()
    a = aug(images)
    assert not torch.equal(stream(), seeded), "no generator: the device's global stream is unused"
    torch.manual_seed(4)
    assert torch.equal(a, aug(images)), "torch.manual_seed(4) must reproduce the views"

    # a constant image gives constant views (no padding leaks in at the borders of a crop)
    flat = torch.full_like(images, 128)
    pixels = aug(flat, generator=_gen(6)).flatten(3)  # (n, V, C, size·size)
    assert float((pixels.amax(-1) - pixels.amin(-1)).max()) < 1e-4, "a constant image changed"

    clone = pickle.loads(pickle.dumps(aug))
    assert torch.equal(clone(images, generator=_gen(5)), aug(images, generator=_gen(5)))


@pytest.mark.parametrize("channels", [1, 3, 5])
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_contract(preset: str, channels: int) -> None:
    check_views(preset, channels)


def test_per_rank_seeding_gives_per_rank_views() -> None:
    """Without a generator the views follow torch's global RNG, which seed_everything seeds per
    rank: ranks differ, and a rank repeats itself."""
    aug, images = SimCLRViews(12, [0.5] * 3, [0.5] * 3), _images(4, 3, 16)
    seed_everything(7, rank=0)
    rank0 = aug(images)
    seed_everything(7, rank=1)
    rank1 = aug(images)
    assert not torch.allclose(rank0, rank1)
    seed_everything(7, rank=1)
    assert torch.equal(rank1, aug(images))


def test_contract_full_recipe_with_views_one() -> None:
    aug = SimCLRViews(8, [0.5] * 3, [0.5] * 3, "simclr_imagenet", views=1)
    assert aug(_images(2, 3, 12)).shape == (2, 1, 3, 8, 8)
    assert aug(_images(0, 3, 12)).shape == (0, 1, 3, 8, 8)


# --- golden cases --------------------------------------------------------------------------


@pytest.mark.parametrize("channels", [1, 3, 5])
def test_identity_config_is_to_float(channels: int) -> None:
    mean, std = _stats(channels)
    images = _images(3, channels, 12)
    expected = to_float(images, mean, std)  # (3, C, 12, 12)
    out = SimCLRViews(12, mean, std, IDENTITY)(images, generator=_gen(0))
    torch.testing.assert_close(out, expected[:, None].expand_as(out), rtol=0, atol=ATOL)
    torch.testing.assert_close(
        torchvision_views(12, mean, std, IDENTITY)(images[0]), expected[:1].expand(2, -1, -1, -1)
    )


def test_to_float_values() -> None:
    images = torch.tensor([0, 51, 255], dtype=torch.uint8).view(1, 1, 1, 3)
    out = to_float(images, [0.2], [0.5])
    torch.testing.assert_close(out, torch.tensor([[[[-0.4, 0.0, 1.6]]]]))
    assert out.dtype == torch.float32


@pytest.mark.parametrize("channels", [1, 3, 5])
def test_flip_only_is_the_mirror_image(channels: int) -> None:
    mean, std = _stats(channels)
    flip = replace(IDENTITY, flip_p=1.0)
    images = _images(3, channels, 12)
    expected = to_float(images, mean, std).flip(-1)  # (3, C, 12, 12)
    out = SimCLRViews(12, mean, std, flip)(images, generator=_gen(0))
    torch.testing.assert_close(out, expected[:, None].expand_as(out), rtol=0, atol=ATOL)
    torch.testing.assert_close(
        torchvision_views(12, mean, std, flip)(images[0]), expected[:1].expand(2, -1, -1, -1)
    )


def test_grayscale_p1_gives_equal_channels_and_leaves_extra_channels() -> None:
    gray = replace(IDENTITY, gray_p=1.0)
    mean, std = [0.5] * 5, [0.5] * 5
    images = _images(4, 5, 12)
    pixels = _unnormalise(SimCLRViews(12, mean, std, gray)(images, generator=_gen(0)), mean, std)
    torch.testing.assert_close(pixels[:, :, 1], pixels[:, :, 0], rtol=0, atol=1e-6)
    torch.testing.assert_close(pixels[:, :, 2], pixels[:, :, 0], rtol=0, atol=1e-6)
    extra = to_float(images, mean, std)[:, 3:]  # (4, 2, 12, 12): untouched by the grayscale
    out = SimCLRViews(12, mean, std, gray)(images, generator=_gen(0))
    torch.testing.assert_close(
        out[:, :, 3:], extra[:, None].expand(-1, 2, -1, -1, -1), rtol=0, atol=ATOL
    )


# --- parameter ranges and probabilities, on observable images -----------------------------


@pytest.mark.parametrize("strength", [0.25, 0.5, 1.0])
def test_jitter_brightness_factor_within_range(strength: float) -> None:
    """On a constant gray image contrast, saturation and hue are identities, so the output is
    the pixel value times the brightness factor, drawn from [1 - 0.8s, 1 + 0.8s]."""
    value = 100 / 255
    config = replace(IDENTITY, jitter_p=1.0, jitter_strength=strength)
    images = torch.full((500, 3, 4, 4), 100, dtype=torch.uint8)
    out = SimCLRViews(4, [0.0] * 3, [1.0] * 3, config)(images, generator=_gen(0))
    factor = (out / value).flatten(2)  # (500, 2, 48): one factor per view
    assert bool((factor.amax(-1) - factor.amin(-1) < 1e-5).all()), "a view is not constant"
    factor = factor[..., 0]
    low, high = 1 - 0.8 * strength, 1 + 0.8 * strength
    assert low - 1e-5 <= float(factor.min()) and float(factor.max()) <= high + 1e-5
    # and the draws fill the range (1000 uniform draws: the ends within 2% of the width)
    assert float(factor.min()) < low + 0.02 * (high - low)
    assert float(factor.max()) > high - 0.02 * (high - low)


@pytest.mark.parametrize("strength", [0.25, 0.5])
def test_jitter_hue_shift_within_range(strength: float) -> None:
    """A dull red, r > g = b, far enough from 0 and 1 that no step clamps (s ≤ 0.5): brightness,
    contrast and saturation keep its hue, so the hue of a view is the shift, drawn from
    [-0.2s, 0.2s] turns."""
    config = replace(IDENTITY, jitter_p=1.0, jitter_strength=strength)
    images = torch.tensor([115, 77, 77], dtype=torch.uint8)[None, :, None, None]
    images = images.expand(500, 3, 2, 2)
    out = SimCLRViews(2, [0.0] * 3, [1.0] * 3, config)(images, generator=_gen(0))
    assert float(out.min()) > 0 and float(out.max()) < 1, "a step clamped"
    rgb = out[:, :, :, 0, 0].reshape(-1, 3).tolist()  # (1000, 3): one colour per view
    hue = torch.tensor([colorsys.rgb_to_hsv(*c)[0] for c in rgb])
    hue = (hue + 0.5) % 1.0 - 0.5  # turns in [-0.5, 0.5)
    assert float(hue.abs().max()) <= 0.2 * strength + 1e-5
    assert float(hue.min()) < -0.19 * strength and float(hue.max()) > 0.19 * strength


def _tv_jitter(image: Tensor, factors: Tensor, order: tuple[int, ...]) -> Tensor:
    """The oracle: torchvision's functional adjustments on one image, in ``order``."""
    steps = (TF.adjust_brightness, TF.adjust_contrast, TF.adjust_saturation, TF.adjust_hue)
    for step in order:
        image = steps[step](image, float(factors[step]))
    return image


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("n", [1, 9])
def test_color_jitter_equals_torchvision_per_image(seed: int, n: int) -> None:
    """Batched colour_jitter equals torchvision's adjust_* image by image, for all 24 orders,
    with gray pixels and ties between channels (torchvision computes hue in float32)."""
    g = _gen(seed)
    images = torch.rand(n, 3, 5, 7, generator=g)
    images[0, :, 0, 0] = 0.5  # gray pixel
    images[0, :, 0, 1] = torch.tensor([0.7, 0.7, 0.2])  # r = g = max
    images[0, :, 0, 2] = torch.tensor([0.1, 0.6, 0.6])  # g = b = max
    low = torch.tensor([0.2, 0.2, 0.2, -0.5])
    factors = low + torch.rand(n, 4, generator=g) * torch.tensor([1.6, 1.6, 1.6, 1.0])  # (n, 4)
    for order in itertools.permutations(range(4)):
        expected = torch.stack([_tv_jitter(images[i], factors[i], order) for i in range(n)])
        torch.testing.assert_close(
            color_jitter(images, factors, order), expected, rtol=0, atol=1e-5
        )
    with pytest.raises(ValueError, match=r"steps are 0\.\.3"):
        color_jitter(images, factors, (4,))


def _fraction(mask: Tensor, p: float) -> None:
    n = mask.numel()
    tolerance = 5 * math.sqrt(p * (1 - p) / n) + 1e-9  # five binomial standard deviations
    assert abs(mask.float().mean().item() - p) <= tolerance, (mask.float().mean().item(), p)


@pytest.mark.parametrize("p", [0.0, 0.3, 0.8, 1.0])
def test_probabilities_per_view(p: float) -> None:
    """Each op fires in a fraction p of the views (flip, jitter, grayscale), per view."""
    images = _images(1, 3, 6).expand(1000, -1, -1, -1)
    mean, std = [0.0] * 3, [1.0] * 3
    plain = to_float(images[:1], mean, std)[0]  # (3, 6, 6)

    flip = replace(IDENTITY, flip_p=p)
    out = SimCLRViews(6, mean, std, flip)(images, generator=_gen(0))  # (1000, 2, 3, 6, 6)
    flipped = (out - plain.flip(-1)).abs().flatten(2).amax(-1) < 1e-4
    _fraction(flipped, p)

    jitter = replace(IDENTITY, jitter_p=p)
    out = SimCLRViews(6, mean, std, jitter)(images, generator=_gen(1))
    _fraction((out - plain).abs().flatten(2).amax(-1) > 1e-3, p)

    gray = replace(IDENTITY, gray_p=p)
    out = SimCLRViews(6, mean, std, gray)(images, generator=_gen(2))
    _fraction((out[:, :, 0] - out[:, :, 1]).abs().flatten(2).amax(-1) < 1e-6, p)


def test_crop_area_and_ratio_within_config() -> None:
    """A ramp image reveals every crop box: the corner pixels of a view are the box's corner
    pixel centres (bicubic reproduces a linear ramp at pixel centres)."""
    side, scale, ratio = 60, (0.3, 0.6), (0.5, 2.0)
    ramp = torch.arange(side, dtype=torch.uint8) * 4  # 0 .. 236
    image = torch.stack([ramp.expand(side, side), ramp[:, None].expand(side, side)])  # x, y
    images = torch.cat([image, torch.zeros(1, side, side, dtype=torch.uint8)])[None]
    config = ViewConfig(scale, ratio, flip_p=0.0, jitter_p=0.0, gray_p=0.0, blur_p=0.0)
    aug = SimCLRViews(16, [0.0] * 3, [1.0 / 255] * 3, config, views=400)
    out = aug(images, generator=_gen(0))[0]  # (400, 3, 16, 16) in pixel units
    width = (out[:, 0, 0, -1] - out[:, 0, 0, 0]) / 4 + 1  # (400,)
    height = (out[:, 1, -1, 0] - out[:, 1, 0, 0]) / 4 + 1
    area = width * height / side**2
    # torchvision's sampler rounds the sides to pixels: allow a pixel on each side
    slack = (width + height + 1) / side**2
    assert bool((area >= scale[0] - slack - 1e-4).all() & (area <= scale[1] + slack + 1e-4).all())
    aspect = width / height
    assert bool((aspect >= ratio[0] * (1 - 2 / height) - 1e-4).all())
    assert bool((aspect <= ratio[1] * (1 + 2 / height) + 1e-4).all())
    assert float(area.max() - area.min()) > 0.5 * (scale[1] - scale[0]), "crop areas too alike"


# --- channel rules --------------------------------------------------------------------------


def test_extra_channels_get_the_same_crop_and_flip() -> None:
    """Channels 3, 4 copy channels 0, 1: without colour ops their views stay copies."""
    images = _images(6, 3, 20)
    images = torch.cat([images, images[:, :2]], dim=1)  # (6, 5, 20, 20)
    mean, std = [0.5] * 5, [0.25] * 5
    geometric = ViewConfig(crop_scale=(0.2, 1.0), blur_p=0.0, color=False)
    out = SimCLRViews(12, mean, std, geometric)(images, generator=_gen(0))
    torch.testing.assert_close(out[:, :, 3:], out[:, :, :2], rtol=0, atol=1e-5)


def test_extra_channels_skip_colour_ops_and_blur() -> None:
    """Same seed, with and without the photometric ops: the extra channels do not change (the
    photometric draws come after the geometric ones), the RGB channels do."""
    images = _images(6, 5, 20)
    mean, std = [0.5] * 5, [0.25] * 5
    full = ViewConfig(crop_scale=(0.2, 1.0), jitter_p=1.0, gray_p=0.5, blur_p=1.0)
    geometric = ViewConfig(crop_scale=(0.2, 1.0), blur_p=0.0, color=False)
    a = SimCLRViews(12, mean, std, full)(images, generator=_gen(0))
    b = SimCLRViews(12, mean, std, geometric)(images, generator=_gen(0))
    torch.testing.assert_close(a[:, :, 3:], b[:, :, 3:], rtol=0, atol=0)
    assert not torch.allclose(a[:, :, :3], b[:, :, :3])


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_constant_extra_channels_stay_constant_in_every_view(preset: str) -> None:
    """RandBit (Chen et al. 2021): bits as constant extra channels, identical in both views."""
    images = _images(8, 3, 20)
    bits = torch.randint(0, 2, (8, 4), generator=_gen(1), dtype=torch.uint8) * 255
    images = torch.cat([images, bits[:, :, None, None].expand(-1, -1, 20, 20)], dim=1)
    mean, std = [0.5] * 7, [0.5] * 7
    out = SimCLRViews(16, mean, std, preset)(images, generator=_gen(0))  # (8, 2, 7, 16, 16)
    expected = (bits.float() / 255 - 0.5) / 0.5  # (8, 4)
    torch.testing.assert_close(
        out[:, :, 3:], expected[:, None, :, None, None].expand(-1, 2, -1, 16, 16), atol=1e-5, rtol=0
    )


def test_one_channel_skips_colour_ops() -> None:
    colour = replace(IDENTITY, jitter_p=1.0, gray_p=1.0)
    images = _images(3, 1, 8)
    out = SimCLRViews(8, [0.5], [0.5], colour)(images, generator=_gen(0))
    torch.testing.assert_close(out, to_float(images, [0.5], [0.5])[:, None].expand_as(out))


def test_blur_applies_to_gray_images() -> None:
    blur = replace(IDENTITY, blur_p=1.0)
    images = _images(3, 1, 8)
    out = SimCLRViews(8, [0.5], [0.5], blur)(images, generator=_gen(0))
    assert not torch.allclose(out, to_float(images, [0.5], [0.5])[:, None].expand_as(out))


# --- configuration and validation --------------------------------------------------------


def test_presets() -> None:
    cifar = PRESETS["simclr_cifar"]
    assert cifar == ViewConfig(crop_scale=(0.2, 1.0), jitter_strength=0.5, blur_p=0.0)
    assert PRESETS["simclr_imagenet"] == ViewConfig()
    gray = PRESETS["small_gray"]
    assert not gray.color and gray.blur_p == 0.0 and gray.crop_scale == (0.2, 1.0)
    assert view_config("simclr_cifar") is cifar and view_config(gray) is gray
    with pytest.raises(ValueError, match="simclr_cifar, simclr_imagenet, small_gray"):
        view_config("simclr_cifar10")


def test_blur_kernel_is_ten_percent_and_odd() -> None:
    assert [blur_kernel_size(s) for s in (8, 32, 96, 224)] == [3, 3, 9, 23]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("crop_scale", (0.0, 1.0)),
        ("crop_scale", (0.5, 0.2)),
        ("crop_scale", (0.2, 1.5)),
        ("crop_scale", [0.2, 1.0]),
        ("crop_ratio", (0.0, 1.0)),
        ("crop_ratio", (2.0, 1.0)),
        ("crop_ratio", (1.0, math.inf)),
        ("flip_p", -0.1),
        ("flip_p", 1.5),
        ("jitter_p", math.nan),
        ("gray_p", "0.2"),
        ("blur_p", True),
        ("jitter_strength", -0.5),
        ("jitter_strength", 3.0),
        ("color", 1),
    ],
)
def test_view_config_rejects_bad_values(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"ViewConfig.{field}"):
        ViewConfig(**{field: value})  # type: ignore[arg-type]


def test_bad_inputs_raise() -> None:
    aug = SimCLRViews(8, [0.5] * 3, [0.5] * 3)
    with pytest.raises(ValueError, match="uint8"):
        aug(_images(2, 3, 8).float())
    with pytest.raises(ValueError, match="uint8"):
        aug(_images(2, 3, 8)[0])
    with pytest.raises(ValueError, match="C = 2"):
        SimCLRViews(8, [0.5] * 2, [0.5] * 2)(_images(2, 2, 8))
    with pytest.raises(ValueError, match="mean/std have 3"):
        aug(_images(2, 1, 8))
    with pytest.raises(ValueError, match="std must be positive"):
        SimCLRViews(8, [0.5], [0.0])
    with pytest.raises(ValueError, match="differ in length"):
        SimCLRViews(8, [0.5] * 3, [0.5])
    with pytest.raises(ValueError, match="views"):
        SimCLRViews(8, [0.5], [0.5], views=0)
    with pytest.raises(ValueError, match="size"):
        SimCLRViews(0, [0.5], [0.5])
    with pytest.raises(ValueError, match="presets"):
        SimCLRViews(8, [0.5], [0.5], "cifar")
    with pytest.raises(ValueError, match="mean/std have 3"):
        torchvision_views(8, [0.5] * 3, [0.5] * 3)(_images(1, 1, 8)[0])


# --- the torchvision per-image path --------------------------------------------------------


@pytest.mark.parametrize("channels", [1, 3, 5])
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_torchvision_views_contract(preset: str, channels: int) -> None:
    mean, std = _stats(channels)
    transform = pickle.loads(pickle.dumps(torchvision_views(16, mean, std, preset, views=3)))
    image = _images(1, channels, 20)[0]
    before = image.clone()
    torch.manual_seed(0)
    out = transform(image)
    assert torch.equal(image, before)
    assert out.shape == (3, channels, 16, 16) and out.dtype == torch.float32
    assert not torch.allclose(out[0], out[1])
    inputs: list[Tensor | Image.Image] = [image]
    if channels in (1, 3):
        pil = Image.fromarray(image.permute(1, 2, 0).squeeze(-1).numpy())
        inputs.append(pil)
        out = transform(pil)
        assert out.shape == (3, channels, 16, 16) and out.dtype == torch.float32
    pixels = _unnormalise(out, mean, std)
    assert bool(((pixels > -1e-5) & (pixels < 1 + 1e-5)).all())
    flat = transform(torch.full_like(image, 128)).flatten(2)  # (3, C, 16·16)
    assert float((flat.amax(-1) - flat.amin(-1)).max()) < 1e-4, "a constant image changed"
    if channels == 5:  # extra channels: geometric ops only, so a copy of a channel stays one
        image = torch.cat([image[:3], image[:2]])
        same = replace(PRESETS[preset], color=False, blur_p=0.0)
        out = torchvision_views(16, [0.5] * 5, [0.5] * 5, same)(image)
        torch.testing.assert_close(out[:, 3:], out[:, :2])


def test_torchvision_views_identity_on_pil() -> None:
    images = _images(1, 3, 12)
    pil = Image.fromarray(images[0].permute(1, 2, 0).numpy())
    out = torchvision_views(12, [0.5] * 3, [0.5] * 3, IDENTITY)(pil)
    torch.testing.assert_close(out, to_float(images, [0.5] * 3, [0.5] * 3).expand(2, -1, -1, -1))


# --- on a GPU -------------------------------------------------------------------------------

DEVICE = torch.device(os.environ.get("CONTRASTKIT_TEST_DEVICE", "cuda"))


@pytest.mark.cuda
@pytest.mark.skipif(
    DEVICE.type == "cuda" and not torch.cuda.is_available(),
    reason="CUDA is not available (CONTRASTKIT_TEST_DEVICE=cpu runs the body on the CPU)",
)
@pytest.mark.parametrize("channels", [1, 3, 5])
def test_on_device(channels: int) -> None:
    """The contract on the device, and a module moved there draws and runs there: its buffers
    live there and a seed repeats itself (CUDA's random stream, not the CPU's)."""
    check_views("simclr_imagenet", channels, DEVICE)
    mean, std = _stats(channels)
    aug = SimCLRViews(16, mean, std, "simclr_imagenet").to(DEVICE)
    images = _images(8, channels, 24).to(DEVICE)
    assert aug.mean.device == aug.std.device == images.device
    on_device = aug(images, generator=_gen(0))
    assert on_device.device == images.device
    torch.testing.assert_close(aug(images, generator=_gen(0)), on_device, rtol=0, atol=0)
