"""InfoMin toy views: pairs share exactly the chosen factors; the digit sits in its cell on a
crop of its texture; everything is seeded."""

from __future__ import annotations

import itertools

import pytest
import torch

from imagecl.infomin import (
    FACTORS,
    ToyConfig,
    make_images,
    make_pairs,
    render,
    sample_factors,
    texture_bank,
)

SUBSETS = [s for r in (1, 2, 3) for s in itertools.combinations(FACTORS, r)]


@pytest.mark.parametrize("shared", SUBSETS, ids=lambda s: "+".join(s))
def test_pairs_share_exactly_the_chosen_factors(shared: tuple[str, ...]) -> None:
    pairs = make_pairs(64, shared, seed=0)
    assert pairs.images.shape == (64, 2, 1, 32, 32) and pairs.images.dtype == torch.uint8
    assert pairs.factors.shape == (64, 2, 3) and pairs.shared == shared
    for column, name in enumerate(FACTORS):
        same = pairs.factors[:, 0, column] == pairs.factors[:, 1, column]
        assert bool(same.all()) if name in shared else not bool(same.any()), name
    for column, size in enumerate(ToyConfig().sizes):
        values = pairs.factors[..., column]
        assert int(values.min()) >= 0 and int(values.max()) < size


def test_the_digit_lies_in_its_cell_over_a_dimmed_background() -> None:
    config = ToyConfig()
    images, factors = make_images(200, seed=1, config=config)
    side = config.image_size // config.grid
    for image, (_, position, _) in zip(images, factors.tolist(), strict=True):
        bright = image[0] > config.texture_max  # only digit strokes exceed the dimmed texture
        top, left = (position // config.grid) * side, (position % config.grid) * side
        cell = torch.zeros_like(bright)
        cell[top : top + side, left : left + side] = True
        assert bool(bright.any()) and not bool((bright & ~cell).any())


def test_the_background_is_a_crop_of_the_chosen_texture() -> None:
    """The pixels outside the digit's cell match a crop of the chosen texture, of no other."""
    config = ToyConfig(image_size=16, grid=2, texture_scale=8)  # 64 px textures: few crops
    textures = texture_bank(config.texture_scale, config.texture_max)  # (3, 64, 64)
    images, factors = make_images(12, seed=2, config=config)
    crops = textures.unfold(1, 16, 1).unfold(2, 16, 1)  # (3, 49, 49, 16, 16)
    for image, (_, position, background) in zip(images, factors.tolist(), strict=True):
        outside = torch.ones(16, 16, dtype=torch.bool)
        top, left = (position // 2) * 8, (position % 2) * 8
        outside[top : top + 8, left : left + 8] = False
        match = (crops[..., outside] == image[0][outside]).all(dim=-1)  # (3, 49, 49)
        assert bool(match[background].any())
        others = [k for k in range(3) if k != background]
        assert not bool(match[others].any())


def test_generation_is_seeded_and_leaves_the_global_generator_alone() -> None:
    state = torch.random.get_rng_state()
    a, b = make_pairs(8, ("digit",), seed=3), make_pairs(8, ("digit",), seed=3)
    assert torch.equal(a.images, b.images) and torch.equal(a.factors, b.factors)
    assert not torch.equal(make_pairs(8, ("digit",), seed=4).images, a.images)
    assert torch.equal(torch.random.get_rng_state(), state)


def test_render_gives_fresh_nuisances_for_equal_factors() -> None:
    config = ToyConfig()
    generator = torch.Generator().manual_seed(0)
    factors = sample_factors(1, config, generator).expand(6, 3)
    images = render(factors, config, generator)
    assert len({bytes(image.numpy()) for image in images}) == 6


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="shared must name distinct factors"):
        make_pairs(4, ("colour",), seed=0)
    with pytest.raises(ValueError, match="shared must name distinct factors"):
        make_pairs(4, ("digit", "digit"), seed=0)
    with pytest.raises(ValueError, match="factor 'position' has one value only"):
        make_pairs(4, ("digit",), seed=0, config=ToyConfig(grid=1))
    with pytest.raises(ValueError, match="need grid >= 1"):
        make_images(2, seed=0, config=ToyConfig(image_size=3, grid=2))
