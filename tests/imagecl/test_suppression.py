"""Feature-suppression wrappers: RandBits' bits are fixed per image, identical in every view and
untouched by augmentation; DigitOverlay pastes the chosen digit into the chosen cell."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

# needs the image extra (kornia): skipped without it, not a collection error
pytest.importorskip("kornia")

from imagecl.augment import SimCLRViews, ViewConfig
from imagecl.data import TensorImageDataset, load_data
from imagecl.suppression import DigitOverlay, RandBits, split_seed, wrap_image_data


def _rgb_dataset(n: int = 6, size: int = 12, seed: int = 0) -> TensorImageDataset:
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, 3, size, size), generator=g, dtype=torch.uint8)
    return TensorImageDataset(images, torch.arange(n) % 3)


def test_randbits_appends_constant_seeded_bit_channels_and_keeps_the_image() -> None:
    base = _rgb_dataset()
    wrapped = RandBits(base, n_bits=5, seed=3)
    assert len(wrapped) == len(base) and wrapped.n_bits == 5
    for i in range(len(base)):
        image, label = wrapped[i]
        assert image.shape == (8, 12, 12) and image.dtype == torch.uint8
        assert label == base[i][1]
        assert torch.equal(image[:3], base[i][0])
        for b in range(5):
            plane = image[3 + b]
            assert torch.equal(plane, torch.full_like(plane, 255 * int(wrapped.bits[i, b])))
        assert torch.equal(image, wrapped[i][0])  # fixed per image, not redrawn per call
    again = RandBits(base, n_bits=5, seed=3)
    assert torch.equal(again.bits, wrapped.bits)
    assert not torch.equal(RandBits(base, n_bits=5, seed=4).bits, wrapped.bits)


def test_randbits_repeats_grayscale_to_rgb_and_zero_bits_adds_nothing_else() -> None:
    gray = TensorImageDataset(
        torch.arange(2 * 16, dtype=torch.uint8).view(2, 1, 4, 4), torch.tensor([0, 1])
    )
    image, _ = RandBits(gray, n_bits=0)[1]
    assert image.shape == (3, 4, 4)
    assert all(torch.equal(image[c], gray[1][0][0]) for c in range(3))
    assert RandBits(gray, n_bits=2)[0][0].shape == (5, 4, 4)


@pytest.mark.parametrize("preset", ["simclr_imagenet", "simclr_cifar"])
def test_bits_are_identical_in_both_views_and_untouched_by_augmentation(preset: str) -> None:
    """Every op of the strongest recipe (crop, flip, jitter, grayscale, blur) runs on the RGB
    channels; the bit channels come out as the same constant in every view."""
    base = _rgb_dataset(n=8, size=16)
    wrapped = RandBits(base, n_bits=4, seed=1)
    images = torch.stack([wrapped[i][0] for i in range(len(wrapped))])  # (8, 7, 16, 16)
    before = images.clone()
    mean = (0.5, 0.5, 0.5, 0.4, 0.5, 0.6, 0.5)
    std = (0.25, 0.25, 0.25, 0.5, 0.5, 0.5, 0.5)
    views = SimCLRViews(16, mean, std, preset, views=2)
    x = views(images, generator=torch.Generator().manual_seed(0))  # (8, 2, 7, 16, 16)
    assert torch.equal(images, before)  # input untouched
    bits = wrapped.bits.float()  # (8, 4)
    expected = (bits - torch.tensor(mean[3:])) / torch.tensor(std[3:])  # (8, 4)
    for v in range(2):
        got = x[:, v, 3:]  # (8, 4, 16, 16)
        torch.testing.assert_close(
            got, expected[:, :, None, None].expand_as(got), atol=1e-5, rtol=0
        )
    torch.testing.assert_close(x[:, 0, 3:], x[:, 1, 3:], atol=1e-5, rtol=0)
    assert not torch.allclose(x[:, 0, :3], x[:, 1, :3])  # the image channels were augmented


def test_bits_survive_the_colour_ops_alone() -> None:
    """Jitter, grayscale and blur at probability 1 with no crop: bits exactly unchanged."""
    wrapped = RandBits(_rgb_dataset(n=4, size=16), n_bits=3, seed=2)
    images = torch.stack([wrapped[i][0] for i in range(4)])  # (4, 6, 16, 16)
    config = ViewConfig(
        crop_scale=(1.0, 1.0),
        crop_ratio=(1.0, 1.0),
        flip_p=0.0,
        jitter_p=1.0,
        gray_p=1.0,
        blur_p=1.0,
    )
    views = SimCLRViews(16, (0.0,) * 6, (1.0,) * 6, config, views=2)
    x = views(images, generator=torch.Generator().manual_seed(1))  # (4, 2, 6, 16, 16)
    target = images[:, None, 3:].float().div(255).expand(-1, 2, -1, -1, -1)
    torch.testing.assert_close(x[:, :, 3:], target, atol=1e-6, rtol=0)


def _digit(value: int, size: int) -> Tensor:
    return torch.full((1, size, size), value, dtype=torch.uint8)


def test_digit_overlay_pastes_the_drawn_digit_into_the_drawn_cell() -> None:
    """Black 9×9 images, constant digits of distinct brightness: the lit pixels are exactly the
    chosen cell and their value names the digit, whose label is the second target."""
    base = TensorImageDataset(torch.zeros(60, 3, 9, 9, dtype=torch.uint8), torch.arange(60) % 5)
    values = (40, 80, 120, 160)
    digits = TensorImageDataset(
        torch.stack([_digit(v, 6) for v in values]), torch.tensor([7, 1, 4, 2])
    )
    overlay = DigitOverlay(base, digits, grid=3, seed=5)
    assert overlay.side == 3 and overlay.offset == 0
    seen_cells = set()
    for i in range(len(overlay)):
        image, label, digit_label = overlay[i]
        assert label == base[i][1]
        j = int(overlay.digit_index[i])
        assert digit_label == int(digits[j][1]) == overlay.digit_label(i)
        position = int(overlay.positions[i])
        row, column = divmod(position, 3)
        assert overlay.cell(i) == (3 * row, 3 * column)
        lit = (image > 0).any(dim=0)  # (9, 9)
        expected = torch.zeros(9, 9, dtype=torch.bool)
        expected[3 * row : 3 * row + 3, 3 * column : 3 * column + 3] = True
        assert torch.equal(lit, expected)
        assert torch.equal(image[:, lit], torch.full((3, 9), values[j], dtype=torch.uint8))
        seen_cells.add(position)
    assert seen_cells == set(range(9))  # 60 draws reach every cell
    assert torch.equal(base.images, torch.zeros_like(base.images))  # the base is untouched


def test_digit_overlay_combines_by_pixelwise_max_and_centres_the_grid() -> None:
    image = torch.full((1, 1, 10, 10), 100, dtype=torch.uint8)
    base = TensorImageDataset(image, torch.tensor([0]))
    digit = torch.zeros(1, 1, 3, 3, dtype=torch.uint8)
    digit[0, 0, 1, 1] = 250
    overlay = DigitOverlay(base, TensorImageDataset(digit, torch.tensor([8])), grid=3, seed=0)
    assert overlay.offset == 0 and overlay.side == 3  # 10 // 3 = 3, (10 - 9) // 2 = 0
    out, _, digit_label = overlay[0]
    top, left = overlay.cell(0)
    assert digit_label == 8
    assert int(out[0, top + 1, left + 1]) == 250  # the stroke is brighter: it wins
    assert int(out.min()) == 100  # the dark part of the digit never darkens the image
    assert int((out != 100).sum()) == 1


def test_wrap_image_data_keeps_splits_labels_and_second_target() -> None:
    data = load_data("digits-m", seed=0)
    bits = wrap_image_data(data, lambda split, s: RandBits(split, 5, seed=split_seed(0, s)))
    assert bits.data.channels == 8 and bits.train_extra is None
    assert bits.data.pretrain is bits.data.train
    assert torch.equal(bits.data.train.labels, data.train.labels)
    assert len(bits.data.mean) == 8 and all(s > 0 for s in bits.data.std)
    assert bits.data.mean[:3] == pytest.approx(data.mean, abs=1e-9)
    digits = TensorImageDataset(*[t[:50] for t in (data.train.images[:, :1], data.train.labels)])
    over = wrap_image_data(data, lambda split, s: DigitOverlay(split, digits, seed=s))
    assert over.data.channels == 3
    assert over.train_extra is not None and over.test_extra is not None
    assert over.train_extra.shape == data.train.labels.shape
    assert over.test_extra.shape == data.test.labels.shape


def test_bad_arguments_raise() -> None:
    base = _rgb_dataset()
    with pytest.raises(ValueError, match="n_bits must be an int >= 0"):
        RandBits(base, n_bits=-1)
    with pytest.raises(ValueError, match="grid must be an int >= 1"):
        DigitOverlay(base, base, grid=0)
    with pytest.raises(ValueError, match="cannot wrap an empty data set"):
        RandBits(
            TensorImageDataset(
                torch.zeros(0, 3, 4, 4, dtype=torch.uint8), torch.zeros(0, dtype=torch.long)
            ),
            2,
        )
