"""Specification of contragan.models: every parameter of G and D learns from the losses (each
of contra/reacgan/proj/ac, both plans), DiscOutput's shapes, what depends on the class and what
must not, images in [-1, 1] at the data's size and channels, the reference recipe, orthogonal
init with zero biases and what they do to D's embeddings at step 0, bad arguments."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from contragan.arch import CONTRASTIVE_LOSSES, LOSSES, GanArch, GanLoss
from contragan.layers import SelfAttention
from contragan.models import build_gan
from contragan.networks import Discriminator, Generator
from contragan.steps import discriminator_loss, generator_loss


def tiny_resnet32(loss: GanLoss = "contra") -> GanArch:
    """The reference plan (32 px, 4 D blocks, hierarchical z, attention) at 1/12 of its width."""
    arch = GanArch.resnet32(loss=loss)
    width = 2 * 4  # D's trunk width with d_channels = 4
    return replace(
        arch,
        z_dim=8,
        g_channels=4,
        d_channels=4,
        shared_dim=8,
        embed_dim=16 if loss in CONTRASTIVE_LOSSES else width,
    )


def small_digits(loss: GanLoss = "contra") -> GanArch:
    return GanArch.digits(16, 1, 10, loss)


ARCHS: dict[str, Callable[[GanLoss], GanArch]] = {
    "digits16": small_digits,
    "resnet32-tiny": tiny_resnet32,
}


def _open_attention(*models: nn.Module) -> None:
    """γ = 0 at init stops gradients into the attention convolutions; open it for the test."""
    for model in models:
        for module in model.modules():
            if isinstance(module, SelfAttention):
                with torch.no_grad():
                    module.gamma.fill_(0.5)


def _batch(arch: GanArch, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, arch.z_dim, generator=g)
    y = torch.arange(n) % arch.num_classes
    real = torch.rand(n, arch.channels, arch.image_size, arch.image_size, generator=g) * 2 - 1
    return z, y, real


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("arch_name", list(ARCHS))
def test_every_parameter_gets_a_gradient(arch_name: str, loss: GanLoss) -> None:
    torch.manual_seed(0)
    arch = ARCHS[arch_name](loss)
    generator, discriminator = build_gan(arch)
    _open_attention(generator, discriminator)
    z, y, real = _batch(arch, 6, seed=1)
    fake = generator(z, y)
    out_real, out_fake = discriminator(real, y), discriminator(fake.detach(), y)
    d_parts = discriminator_loss(out_real, out_fake, y, y, loss=loss)
    d_parts["loss"].backward()
    # with every logit inside the hinge's margin the logit's bias gets −1 + 1 = 0: exact
    inside = bool((out_real.adv < 1).all() and (out_fake.adv > -1).all())
    for name, parameter in discriminator.named_parameters():
        grad = parameter.grad
        assert grad is not None and torch.isfinite(grad).all(), f"D {name}"
        if name == "linear.bias" and inside:
            assert float(grad.abs().sum()) == 0.0, f"D {name}: {grad}"
            continue
        assert grad.abs().sum() > 0, f"D {name} has a zero gradient"
    discriminator.zero_grad()
    generator_loss(discriminator(fake, y), y, loss=loss)["loss"].backward()
    for name, parameter in generator.named_parameters():
        grad = parameter.grad
        assert grad is not None and torch.isfinite(grad).all(), f"G {name}"
        assert grad.abs().sum() > 0, f"G {name} has a zero gradient"


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("arch_name", list(ARCHS))
def test_disc_output_shapes(arch_name: str, loss: GanLoss) -> None:
    arch = ARCHS[arch_name](loss)
    _, discriminator = build_gan(arch)
    _, y, real = _batch(arch, 5, seed=2)
    out = discriminator(real, y)
    assert out.adv.shape == (5,)
    assert out.embedding.shape == out.proxy.shape == (5, arch.embed_dim)
    if loss == "ac":
        assert out.class_logits is not None and out.class_logits.shape == (5, arch.num_classes)
        # the proxy is the classifier row of the conditioning class
        logit_of_y = out.class_logits.gather(1, y[:, None]).squeeze(1)
        torch.testing.assert_close(logit_of_y, (out.embedding * out.proxy).sum(1))
    else:
        assert out.class_logits is None


def test_projection_logit_depends_on_the_class_and_contra_logit_does_not() -> None:
    torch.manual_seed(3)
    _, y, real = _batch(small_digits(), 4, seed=3)
    other = (y + 1) % 10
    adv = {}
    for loss in LOSSES:
        discriminator = build_gan(small_digits(loss))[1].eval()  # eval: no power iteration
        first, second = discriminator(real, y), discriminator(real, other)
        adv[loss] = (first.adv, second.adv)
        assert (first.proxy - second.proxy).abs().amax(1).min() > 0  # the proxy follows y
    assert (adv["proj"][0] - adv["proj"][1]).abs().min() > 1e-6
    torch.testing.assert_close(adv["contra"][0], adv["contra"][1], rtol=0, atol=0)
    torch.testing.assert_close(adv["ac"][0], adv["ac"][1], rtol=0, atol=0)


@pytest.mark.parametrize("loss", LOSSES)
def test_bf16_autocast_runs_and_losses_stay_fp32(loss: GanLoss) -> None:
    """The training loop decides precision (bf16 on GPU); nothing in G, D or the losses
    breaks under it. CPU autocast stands in for the GPU here."""
    arch = small_digits(loss)
    generator, discriminator = build_gan(arch)
    z, y, real = _batch(arch, 4, seed=8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fake = generator(z, y)
        d = discriminator_loss(discriminator(real, y), discriminator(fake, y), y, y, loss=loss)
        g = generator_loss(discriminator(fake, y), y, loss=loss)
    for parts in (d, g):
        for name, value in parts.items():
            assert value.dtype == torch.float32 and torch.isfinite(value), name


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("image_size", [8, 12, 16, 24, 28, 32])
def test_digits_images_match_the_data(image_size: int, channels: int) -> None:
    arch = GanArch.digits(image_size, channels, 4, "contra")
    generator, discriminator = build_gan(arch)
    z, y, _ = _batch(arch, 3, seed=4)
    images = generator(z, y)
    assert images.shape == (3, channels, image_size, image_size)
    assert images.abs().max() <= 1
    assert discriminator(images, y).adv.shape == (3,)


def test_resnet32_images_match_the_data() -> None:
    arch = tiny_resnet32()
    generator = Generator(arch)
    z, y, _ = _batch(arch, 3, seed=5)
    images = generator(z, y)
    assert images.shape == (3, 3, 32, 32) and images.abs().max() <= 1


@pytest.mark.parametrize("hierarchical_z", [True, False])
def test_generator_is_conditioned_on_the_class_and_on_every_z_chunk(hierarchical_z: bool) -> None:
    torch.manual_seed(6)
    arch = replace(small_digits(), hierarchical_z=hierarchical_z)
    generator = build_gan(arch)[0].eval()
    z = torch.randn(1, arch.z_dim).repeat(3, 1)
    images = generator(z, torch.tensor([2, 5, 2]))
    torch.testing.assert_close(images[0], images[2])
    assert (images[0] - images[1]).abs().max() > 1e-4
    for start in range(0, arch.z_dim, arch.z_chunks[-1]):  # a change in any chunk shows
        moved = z[:1].clone()
        moved[0, start] += 3.0
        assert (generator(moved, torch.tensor([2])) - images[:1]).abs().max() > 1e-5


def test_resnet32_is_the_reference_recipe() -> None:
    arch = GanArch.resnet32()
    assert (arch.z_dim, arch.shared_dim, arch.embed_dim) == (80, 128, 512)
    assert arch.z_chunks == (20, 20, 20, 20)
    assert arch.g_widths == (384, 384, 384, 384) and arch.bottom_size == 4
    assert arch.d_plan == ((3, 192, True), (192, 192, True), (192, 192, False), (192, 192, False))
    assert arch.attention and arch.hierarchical_z and arch.feature_dim == 192
    assert GanArch.resnet32(loss="proj").embed_dim == 192
    discriminator = Discriminator(arch)
    assert discriminator.attention_index == 0  # after the first block, at 16×16
    assert Generator(arch).attention_index == 1  # after the second block, at 16×16


@pytest.mark.parametrize("loss", LOSSES)
def test_constructor_widths_keep_the_embedding_width_consistent(loss: GanLoss) -> None:
    arch = GanArch.resnet32(loss=loss, g_channels=8, d_channels=12)
    assert arch.g_widths == (32,) * 4 and arch.feature_dim == 24
    assert arch.embed_dim == (512 if loss in CONTRASTIVE_LOSSES else 24)
    digits = GanArch.digits(16, 1, 10, loss, g_channels=16, d_channels=48)
    assert digits.g_widths == (32, 16, 8)
    assert digits.d_plan == ((1, 24, True), (24, 48, True), (48, 96, False))
    assert digits.embed_dim == (128 if loss in CONTRASTIVE_LOSSES else 96)


def test_build_gan_initialises_orthogonally() -> None:
    generator, discriminator = build_gan(small_digits())
    for layer in (generator.linear, discriminator.linear, generator.blocks[0].conv1):
        matrix = layer.get_parameter("parametrizations.weight.original").detach().flatten(1)
        small = min(matrix.shape)
        gram = matrix @ matrix.T if matrix.shape[0] == small else matrix.T @ matrix
        torch.testing.assert_close(gram, torch.eye(small), atol=1e-5, rtol=0)


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("arch_name", list(ARCHS))
def test_build_gan_zeroes_every_bias(arch_name: str, loss: GanLoss) -> None:
    generator, discriminator = build_gan(ARCHS[arch_name](loss))
    biases = [
        (name, p)
        for model in (generator, discriminator)
        for name, p in model.named_parameters()
        if name.endswith("bias")
    ]
    assert len(biases) > 10  # the convs', the linears' and G's last batch norm
    for name, bias in biases:
        assert torch.equal(bias.detach(), torch.zeros_like(bias)), name


def _mean_cosine(rows: Tensor) -> float:
    """Mean cosine over the pairs of distinct rows."""
    unit = F.normalize(rows, dim=1)
    n = rows.shape[0]
    return float(((unit @ unit.T).sum() - n) / (n * (n - 1)))


def _fake_embeddings(generator: Generator, discriminator: Discriminator) -> tuple[Tensor, Tensor]:
    """D's embeddings and h of 64 fakes at step 0 (G in training mode, as in the G step)."""
    captured: list[Tensor] = []
    hook = discriminator.head.register_forward_hook(lambda m, i, o: captured.append(i[0]))
    rng = torch.Generator().manual_seed(100)
    z = torch.randn(64, generator.z_dim, generator=rng)
    y = torch.arange(64) % generator.num_classes
    with torch.no_grad():
        embedding = discriminator.eval()(generator(z, y), y).embedding  # (64, D)
    hook.remove()
    return embedding, captured[0]


@pytest.mark.parametrize("loss", ["contra", "reacgan"])
def test_zero_biases_keep_step_0_embeddings_apart(loss: GanLoss) -> None:
    """With zero biases the contrastive head is an isometry at step 0 (an orthogonal W with
    orthonormal columns, σ = 1, b = 0), so fakes' embeddings are as far apart as their h; with
    PyTorch's default biases in every conv and linear of G and D the same weights give fakes
    whose embeddings nearly coincide. Measured over seeds 0-4 at 16 and 32 px: 0.86-0.97 as
    built, 0.98-0.996 with default biases; here (seed 0, 16 px) 0.938 and 0.988."""
    torch.manual_seed(0)
    generator, discriminator = build_gan(small_digits(loss))
    embedding, h = _fake_embeddings(generator, discriminator)
    cosines = F.normalize(embedding, dim=1) @ F.normalize(embedding, dim=1).T
    torch.testing.assert_close(cosines, F.normalize(h, dim=1) @ F.normalize(h, dim=1).T)
    built = _mean_cosine(embedding)
    rng = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for module in [*generator.modules(), *discriminator.modules()]:
            if isinstance(module, (nn.Conv2d, nn.Linear)) and module.bias is not None:
                bound = 1 / math.sqrt(module.weight[0].numel())  # PyTorch's: ±1/√fan_in
                module.bias.copy_((torch.rand(module.bias.shape, generator=rng) * 2 - 1) * bound)
    with_default_biases = _mean_cosine(_fake_embeddings(generator, discriminator)[0])
    assert built < 0.965 and with_default_biases > built + 0.03, (built, with_default_biases)


BAD_ARCHS: list[tuple[Callable[[], GanArch], str]] = [
    (lambda: GanArch.digits(18, 1, 10, "contra"), "'digits' takes image_size"),
    (lambda: GanArch.digits(6, 1, 10, "contra"), "'digits' takes image_size"),
    (lambda: GanArch.digits(256, 1, 10, "contra"), "'digits' takes image_size"),
    (lambda: GanArch.resnet32(image_size=64), "takes image_size 32 only"),
    (lambda: GanArch.digits(32, 0, 10, "contra"), "channels must be an integer >= 1"),
    (lambda: GanArch.digits(32, 1, 0, "contra"), "num_classes must be an integer >= 1"),
    (lambda: GanArch.digits(32, 1, 10, "wgan"), "loss must be one of"),  # type: ignore[arg-type]
    (lambda: replace(GanArch.digits(), name="dcgan"), "arch name must be one of"),
    (lambda: replace(GanArch.digits(), z_dim=3), "z_dim must be >= 4"),
    (lambda: replace(GanArch.digits(loss="proj"), embed_dim=128), "embed_dim must equal"),
    (lambda: replace(GanArch.resnet32(), d_channels=2), "self-attention needs >= 8 channels"),
    (lambda: replace(GanArch.digits(), shared_dim=0), "shared_dim must be an integer >= 1"),
]


@pytest.mark.parametrize(("make", "message"), BAD_ARCHS)
def test_bad_arch_arguments_raise(make: Callable[[], GanArch], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_bad_input_shapes_raise() -> None:
    arch = small_digits()
    generator, discriminator = build_gan(arch)
    z, y, real = _batch(arch, 2, seed=7)
    with pytest.raises(ValueError, match="z of shape"):
        generator(z[:, :-1], y)
    with pytest.raises(ValueError, match="y of shape"):
        generator(z, y[:1])
    with pytest.raises(ValueError, match=r"x of shape \(N, 1, 16, 16\)"):
        discriminator(real[:, :, :8, :8], y)
