"""CIFAR-10-C corruptions: the contract of every corruption, damage growing with severity, seeded
randomness, closed forms on constant images, scipy/scikit-image oracles, and the errors."""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.ndimage import gaussian_filter
from skimage import color
from torch import Tensor

from imagecl.corruptions import CORRUPTIONS, SEVERITY_PARAMS, _pixelate, corrupt

SEVERITIES = (1, 2, 3, 4, 5)
RANDOM = ("gaussian_noise", "shot_noise")
DETERMINISTIC = tuple(name for name in CORRUPTIONS if name not in RANDOM)


def natural_images(n: int = 8, channels: int = 3, size: int = 32, seed: int = 0) -> Tensor:
    """Smooth colour gradients and a wave plus pixel noise: edges, texture and flat parts.

    Shape:
        - Output: (n, channels, size, size), uint8
    """
    generator = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(torch.linspace(0, 1, size), torch.linspace(0, 1, size), indexing="ij")
    base = torch.stack([0.2 + 0.6 * xx, 0.2 + 0.6 * yy, 0.5 + 0.3 * torch.sin(6 * xx + 3 * yy)])
    noise = 0.05 * torch.randn(n, 3, size, size, generator=generator)
    images = (base + noise).clamp(0, 1)[:, :channels]  # (n, channels, size, size)
    return (images * 255).round().to(torch.uint8)


def constant_images(value: tuple[int, ...], n: int = 2, size: int = 6) -> Tensor:
    """Shape: (n, len(value), size, size), uint8, every pixel equal to ``value``."""
    pixel = torch.tensor(value, dtype=torch.uint8)[None, :, None, None]
    return pixel.expand(n, len(value), size, size).clone()


def check_corruption(
    images: Tensor, name: str, severity: int, generator: torch.Generator | None = None
) -> Tensor:
    """The contract of every corruption: a new uint8 tensor of the same shape and device; the
    input untouched; the global RNG untouched when a generator is given."""
    before = images.clone()
    global_state = torch.get_rng_state()
    out = corrupt(images, name, severity, generator=generator)
    assert out.shape == images.shape and out.dtype == torch.uint8
    assert out.device == images.device
    assert out.data_ptr() != images.data_ptr() or images.numel() == 0
    torch.testing.assert_close(images, before, rtol=0, atol=0)
    if generator is not None:
        assert torch.equal(torch.get_rng_state(), global_state), "global RNG was used"
    return out


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("severity", SEVERITIES)
@pytest.mark.parametrize("name", CORRUPTIONS)
def test_contract(name: str, severity: int, channels: int) -> None:
    images = natural_images(n=3, channels=channels, size=12)[..., :10]  # (3, C, 12, 10)
    out = check_corruption(images, name, severity, torch.Generator().manual_seed(0))
    assert not torch.equal(out, images), f"{name} at severity {severity} changed nothing"


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_empty_batch(name: str) -> None:
    images = torch.zeros(0, 3, 8, 8, dtype=torch.uint8)
    assert check_corruption(images, name, 3, torch.Generator().manual_seed(0)).shape == (0, 3, 8, 8)


@pytest.mark.parametrize(("channels", "size"), [(3, 32), (1, 32), (3, 8)])
@pytest.mark.parametrize("name", CORRUPTIONS)
def test_damage_grows_with_severity(name: str, channels: int, size: int) -> None:
    """Mean absolute difference to the clean images is non-decreasing in severity.

    Guaranteed by construction for noise, blur, contrast and brightness. JPEG's damage is not
    monotone in quality on every image (quantisation tables are rounded); on these images it
    holds, and is nearly flat on RGB (chroma subsampling costs the same at every quality).
    Pixelate ties where int(size·c) does (8 px: 0.95 and 0.9 both give 7, 0.85 and 0.75 both 6).
    """
    images = natural_images(channels=channels, size=size)
    damage = []
    for severity in SEVERITIES:
        out = corrupt(images, name, severity, generator=torch.Generator().manual_seed(0))
        damage.append((out.float() - images.float()).abs().mean().item())
    assert damage[0] > 0
    assert all(b >= a for a, b in itertools.pairwise(damage)), damage
    assert damage[-1] > damage[0], damage


@pytest.mark.parametrize("name", RANDOM)
def test_seeded_reproducibility(name: str) -> None:
    images = natural_images(n=4)
    first = corrupt(images, name, 3, generator=torch.Generator().manual_seed(7))
    again = corrupt(images, name, 3, generator=torch.Generator().manual_seed(7))
    other = corrupt(images, name, 3, generator=torch.Generator().manual_seed(8))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    generator = torch.Generator().manual_seed(7)
    assert torch.equal(corrupt(images, name, 3, generator=generator), first)
    assert not torch.equal(corrupt(images, name, 3, generator=generator), first)  # stream moves on
    # without a generator the global one is used, so torch.manual_seed fixes the result
    torch.manual_seed(3)
    unseeded = corrupt(images, name, 3)
    torch.manual_seed(3)
    assert torch.equal(corrupt(images, name, 3), unseeded)


@pytest.mark.parametrize("name", RANDOM)
def test_noise_is_per_pixel_and_per_image(name: str) -> None:
    """Identical images in a batch get different noise."""
    images = constant_images((128, 128, 128), n=2, size=16)
    out = corrupt(images, name, 5, generator=torch.Generator().manual_seed(0))
    assert not torch.equal(out[0], out[1])


@pytest.mark.parametrize("name", DETERMINISTIC)
def test_deterministic_corruptions(name: str) -> None:
    """No randomness: the generator is not consumed and batched equals one image at a time."""
    images = natural_images(n=3, size=16)
    generator = torch.Generator().manual_seed(0)
    state = generator.get_state()
    out = check_corruption(images, name, 4, generator)
    assert torch.equal(generator.get_state(), state)
    assert torch.equal(corrupt(images, name, 4), out)
    single = torch.cat([corrupt(images[i : i + 1], name, 4) for i in range(3)])
    assert torch.equal(single, out)


def test_noise_magnitudes() -> None:
    """Gaussian noise has std c; shot noise is Poisson(c·x)/c: mean x, variance x/c."""
    images = constant_images((128,), n=64, size=32)
    x = 128 / 255
    generator = torch.Generator().manual_seed(0)
    for severity in SEVERITIES:
        out = corrupt(images, "gaussian_noise", severity, generator=generator).float() / 255
        std = SEVERITY_PARAMS["gaussian_noise"][severity - 1]
        assert abs(out.mean().item() - x) < 0.005
        assert abs(out.std().item() / std - 1) < 0.05  # x ± 3c stays inside [0, 1]
        out = corrupt(images, "shot_noise", severity, generator=generator).float() / 255
        photons = SEVERITY_PARAMS["shot_noise"][severity - 1]
        assert abs(out.mean().item() - x) < 0.005
        assert abs(out.var().item() / (x / photons) - 1) < 0.1


@pytest.mark.parametrize("severity", SEVERITIES)
def test_constant_images(severity: int) -> None:
    """Closed forms: contrast, blur and pixelate keep a constant image; brightness raises the
    HSV value, so grey g -> clip(g + c), black -> grey c, and a colour scales by v'/v."""
    for value in [(0,), (77,), (255,), (0, 0, 0), (200, 90, 40)]:
        images = constant_images(value)
        for name in ("contrast", "gaussian_blur", "pixelate"):
            assert torch.equal(corrupt(images, name, severity), images), (name, value)
    delta = SEVERITY_PARAMS["brightness"][severity - 1]
    grey = corrupt(constant_images((77,)), "brightness", severity)
    assert torch.equal(grey, torch.full_like(grey, round(min(77 / 255 + delta, 1) * 255)))
    black = corrupt(constant_images((0, 0, 0)), "brightness", severity)
    assert torch.equal(black, torch.full_like(black, round(delta * 255)))
    colour = corrupt(constant_images((200, 90, 40)), "brightness", severity)
    scale = min(200 / 255 + delta, 1) / (200 / 255)
    expected = [round(v * scale) for v in (200, 90, 40)]  # none at a .5 boundary
    assert colour[0, :, 0, 0].tolist() == expected


@pytest.mark.parametrize("severity", SEVERITIES)
def test_contrast_two_levels(severity: int) -> None:
    """Half the pixels at a, half at b: mean m = (a + b)/2 per channel, a -> m + (a − m)·c."""
    images = torch.zeros(1, 2, 4, 4, dtype=torch.uint8)
    images[:, 0, :2], images[:, 0, 2:] = 40, 200  # channel 0: mean 120
    images[:, 1, :, 2:] = 120  # channel 1: mean 60, so the means are per channel
    factor = SEVERITY_PARAMS["contrast"][severity - 1]
    out = corrupt(images, "contrast", severity)
    expected_low = torch.tensor([120 - 80 * factor, 60 - 60 * factor]).round()  # no .5 ties
    expected_high = torch.tensor([120 + 80 * factor, 60 + 60 * factor]).round()
    assert out[0, :, 0, 0].tolist() == expected_low.tolist()
    assert out[0, :, 3, 3].tolist() == expected_high.tolist()


def test_jpeg_of_a_flat_image() -> None:
    """A flat 8×8-aligned image has only DC coefficients: it stays flat, off by at most the DC
    quantisation error (step/16 ≤ 1.25 levels at quality 40) plus YCbCr rounding."""
    for value, tolerance in [((77,), 2), ((0,), 2), ((200, 100, 50), 4), ((10, 240, 128), 4)]:
        images = constant_images(value, size=16)
        for severity in SEVERITIES:
            out = corrupt(images, "jpeg", severity)
            assert torch.equal(out, out[:, :, :1, :1].expand_as(out)), (value, severity)
            assert (out.int() - images.int()).abs().max() <= tolerance, (value, severity)


@pytest.mark.parametrize("severity", SEVERITIES)
def test_blur_matches_scipy(severity: int) -> None:
    """Oracle: scipy.ndimage.gaussian_filter (what skimage.filters.gaussian calls) in float64,
    edges replicated (mode="nearest"), kernel cut at 4 std, channels not mixed."""
    images = natural_images(n=2, size=16)[..., :11]  # non-square: rows and columns apart
    sigma = SEVERITY_PARAMS["gaussian_blur"][severity - 1]
    x = images.double().numpy() / 255
    expected = gaussian_filter(x, sigma=(0, 0, sigma, sigma), mode="nearest", truncate=4.0)
    expected_u8 = torch.from_numpy(np.round(expected * 255))
    out = corrupt(images, "gaussian_blur", severity)
    assert (out.double() - expected_u8).abs().max() <= 1  # fp32 vs fp64 at a .5 boundary


@pytest.mark.parametrize("severity", SEVERITIES)
def test_brightness_matches_skimage(severity: int) -> None:
    """Oracle: the reference's rgb2hsv, value + c clipped, hsv2rgb (scikit-image, float64)."""
    images = natural_images(n=2, size=8)
    images[0, :, 0, 0] = 0  # a black pixel: hue and saturation undefined, becomes grey
    delta = SEVERITY_PARAMS["brightness"][severity - 1]
    expected = []
    for image in images.permute(0, 2, 3, 1).double().numpy() / 255:  # (H, W, 3)
        hsv = color.rgb2hsv(image)
        hsv[..., 2] = np.clip(hsv[..., 2] + delta, 0, 1)
        expected.append(np.round(np.clip(color.hsv2rgb(hsv), 0, 1) * 255))
    expected_u8 = torch.from_numpy(np.stack(expected)).permute(0, 3, 1, 2)
    out = corrupt(images, "brightness", severity)
    assert (out.double() - expected_u8).abs().max() <= 1


def test_pixelate_box_filter() -> None:
    """At factor 1/2 the box filter is 2×2 average pooling and nearest upsampling repeats."""
    x = torch.rand(2, 3, 8, 6, generator=torch.Generator().manual_seed(0))
    pooled = F.avg_pool2d(x, 2)  # (2, 3, 4, 3)
    expected = pooled.repeat_interleave(2, dim=2).repeat_interleave(2, dim=3)  # (2, 3, 8, 6)
    torch.testing.assert_close(_pixelate(x, 0.5), expected)


def test_pixelate_resolution() -> None:
    """int(32·c) cells per side, as the reference: 30, 28, 27, 24, 20 distinct columns."""
    row = torch.arange(32, dtype=torch.uint8)[None, None, None, :] * 8  # a ramp along W
    images = row.expand(1, 1, 4, 32).clone()
    cells = [len(set(corrupt(images, "pixelate", s)[0, 0, 0].tolist())) for s in SEVERITIES]
    assert cells == [30, 28, 27, 24, 20]


def test_bad_arguments() -> None:
    images = natural_images(n=1, size=8)
    with pytest.raises(ValueError, match=r"'fog'.*gaussian_noise, shot_noise"):
        corrupt(images, "fog", 1)
    for severity in (0, 6, -1, 2.0, True):
        with pytest.raises(ValueError, match=rf"severity must be an int in 1\.\.5, got {severity}"):
            corrupt(images, "contrast", severity)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"uint8 tensor \(N, C, H, W\), got torch.float32"):
        corrupt(images.float(), "contrast", 1)
    with pytest.raises(ValueError, match=r"got torch.uint8 \(3, 8, 8\)"):
        corrupt(images[0], "contrast", 1)
    five = torch.zeros(1, 5, 8, 8, dtype=torch.uint8)
    for name in ("brightness", "jpeg"):
        with pytest.raises(ValueError, match=f"{name} needs 1 or 3 channels, got C=5"):
            corrupt(five, name, 1)
    check_corruption(five, "gaussian_blur", 1)  # channel-wise corruptions take any C


# GPU check, in the manner of tests/shared/test_cuda.py: CONTRASTKIT_TEST_DEVICE=cpu runs the body
# on the CPU.
DEVICE = torch.device(os.environ.get("CONTRASTKIT_TEST_DEVICE", "cuda"))


@pytest.mark.cuda
@pytest.mark.skipif(
    DEVICE.type == "cuda" and not torch.cuda.is_available(),
    reason="CUDA is not available: run on a GPU, or set CONTRASTKIT_TEST_DEVICE=cpu",
)
@pytest.mark.parametrize("name", CORRUPTIONS)
def test_device_equals_cpu(name: str) -> None:
    """On the device, with the same seed, the result is the CPU's (draws are made on the CPU),
    up to one level of float rounding."""
    images = natural_images(n=4, size=16)
    on_cpu = corrupt(images, name, 3, generator=torch.Generator().manual_seed(0))
    on_device = check_corruption(images.to(DEVICE), name, 3, torch.Generator().manual_seed(0))
    assert (on_device.cpu().int() - on_cpu.int()).abs().max() <= 1
