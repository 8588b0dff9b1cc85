"""Specification of contragan.diffaug: one contract (input untouched, shape/dtype kept, seeded,
per-sample randomness, gradients flow) for every policy, then what each op does, observed on
its output, and the policy-name checks."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from contragan.diffaug import (
    POLICIES,
    brightness,
    contrast,
    cutout,
    diff_augment,
    saturation,
    translation,
)

POLICY_STRINGS = ["color", "translation", "cutout", "color,translation,cutout", "cutout,color"]


def _images(n: int, channels: int, size: int = 16, dtype: torch.dtype = torch.float32) -> Tensor:
    g = torch.Generator().manual_seed(n * 100 + channels)
    return (torch.rand(n, channels, size, size, generator=g, dtype=dtype) * 2 - 1) + 0.01


def check_augment(
    augment: Callable[[Tensor, torch.Generator | None], Tensor], channels: int
) -> None:
    """The contract every augmentation of the family keeps."""
    for dtype in (torch.float32, torch.float64):
        x = _images(6, channels, dtype=dtype)
        before = x.clone()
        out = augment(x, torch.Generator().manual_seed(0))
        torch.testing.assert_close(x, before, rtol=0, atol=0)  # input untouched
        assert out.shape == x.shape and out.dtype == dtype and out.device == x.device
        again = augment(x, torch.Generator().manual_seed(0))
        torch.testing.assert_close(out, again, rtol=0, atol=0)  # same seed, same output
        other = augment(x, torch.Generator().manual_seed(1))
        assert not torch.equal(out, other)
    # per-sample randomness: identical images in one batch come out different
    same = _images(1, channels).repeat(8, 1, 1, 1)
    out = augment(same, torch.Generator().manual_seed(2))
    assert len({tuple(row.flatten().tolist()) for row in out}) > 1
    # differentiable in the pixels (so G learns through it)
    x = _images(4, channels).requires_grad_()
    augment(x, torch.Generator().manual_seed(3)).square().sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("policy", POLICY_STRINGS)
def test_diff_augment_contract(policy: str, channels: int) -> None:
    check_augment(lambda x, g: diff_augment(x, policy, generator=g), channels)


def test_empty_policy_is_the_identity() -> None:
    x = _images(2, 3)
    assert diff_augment(x, "") is x


def test_bad_policy_names_raise() -> None:
    with pytest.raises(ValueError, match=r"'colour'; valid: color, translation, cutout"):
        diff_augment(_images(2, 1), "colour,cutout")
    with pytest.raises(ValueError, match=r"unknown DiffAugment policy ''"):
        diff_augment(_images(2, 1), "color,,cutout")
    with pytest.raises(ValueError, match="floating"):
        diff_augment(torch.zeros(2, 1, 8, 8, dtype=torch.uint8))
    with pytest.raises(ValueError, match="floating"):
        diff_augment(torch.zeros(1, 8, 8))


def test_policies_table() -> None:
    assert list(POLICIES) == ["color", "translation", "cutout"]
    assert POLICIES["color"] == (brightness, saturation, contrast)


def test_brightness_adds_one_offset_per_image() -> None:
    x = _images(16, 3)
    delta = brightness(x, torch.Generator().manual_seed(4)) - x  # (N, C, H, W)
    offsets = delta.flatten(1)
    torch.testing.assert_close(offsets, offsets[:, :1].expand_as(offsets))
    assert offsets.abs().max() <= 0.5


def test_saturation_keeps_the_channel_mean_and_is_the_identity_on_grayscale() -> None:
    x = _images(8, 3)
    out = saturation(x, torch.Generator().manual_seed(5))
    torch.testing.assert_close(out.mean(1), x.mean(1))
    gray = _images(8, 1)
    torch.testing.assert_close(saturation(gray, torch.Generator().manual_seed(5)), gray)


def test_contrast_keeps_the_image_mean() -> None:
    x = _images(8, 3)
    out = contrast(x, torch.Generator().manual_seed(6))
    torch.testing.assert_close(out.mean(dim=(1, 2, 3)), x.mean(dim=(1, 2, 3)))
    scale = (out - out.mean(dim=(1, 2, 3), keepdim=True)) / (
        x - x.mean(dim=(1, 2, 3), keepdim=True)
    )
    assert scale.min() >= 0.5 - 1e-4 and scale.max() <= 1.5 + 1e-4


def _shifted(image: Tensor, dy: int, dx: int) -> Tensor:
    """``image`` moved by (dy, dx) whole pixels, zeros where nothing moved in (a slow oracle)."""
    _, H, W = image.shape
    out = torch.zeros_like(image)
    for i, j in itertools.product(range(H), range(W)):
        if 0 <= i - dy < H and 0 <= j - dx < W:
            out[:, i, j] = image[:, i - dy, j - dx]
    return out


def test_translation_is_a_zero_filled_whole_pixel_shift() -> None:
    x = _images(12, 2)
    out = translation(x, generator=torch.Generator().manual_seed(7))
    seen = set()
    for image, moved in zip(x, out, strict=True):
        matches = [
            (dy, dx)
            for dy, dx in itertools.product(range(-2, 3), repeat=2)  # 16 px: up to round(16/8)
            if torch.equal(_shifted(image, dy, dx), moved)
        ]
        assert len(matches) == 1
        seen.add(matches[0])
    assert len(seen) > 1
    torch.testing.assert_close(translation(x, ratio=0.0), x)


def test_cutout_zeroes_one_clipped_square_of_half_the_side() -> None:
    x = _images(16, 3)  # no pixel is exactly 0
    out = cutout(x, generator=torch.Generator().manual_seed(8))
    for image, cut in zip(x, out, strict=True):
        hole = (cut == 0).all(0)  # (H, W)
        assert torch.equal(cut[:, ~hole], image[:, ~hole])  # the rest untouched
        rows, cols = hole.any(1).nonzero().squeeze(1), hole.any(0).nonzero().squeeze(1)
        assert hole.sum() == len(rows) * len(cols) > 0  # a rectangle
        for kept, size in ((rows, 16), (cols, 16)):
            side = int(kept[-1] - kept[0]) + 1
            assert side == len(kept) and side <= size // 2
            if side < size // 2:  # clipped: it touches the border
                assert kept[0] == 0 or kept[-1] == size - 1
    torch.testing.assert_close(cutout(x, ratio=0.0), x)
