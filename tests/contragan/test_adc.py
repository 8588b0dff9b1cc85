"""Specification of ``adc`` (ADC-GAN's second proxy per class, for fakes, on the contrastive
head): the head's table and which rows it returns, the D and G losses against the shared
losses they are built from (for 2C and D2D-CE), the direction of G's ADC term, the updater
logging both ADC terms, and the combinations that are refused."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from contragan.arch import GanArch, GanLoss
from contragan.config import Config, resume_config
from contragan.losses import LossSettings
from contragan.networks import DiscOutput, Discriminator
from contragan.steps import discriminator_loss, generator_loss
from shared.losses import conditional_contrastive_loss, data_to_data_cross_entropy_loss


def _outputs(n: int, dim: int, seed: int) -> DiscOutput:
    g = torch.Generator().manual_seed(seed)
    return DiscOutput(
        adv=torch.randn(n, generator=g, dtype=torch.float64),
        embedding=torch.randn(n, dim, generator=g, dtype=torch.float64),
        proxy=torch.randn(n, dim, generator=g, dtype=torch.float64),
        class_logits=None,
        fake_proxy=torch.randn(n, dim, generator=g, dtype=torch.float64),
    )


def _term(loss: str, settings: LossSettings, embedding: Tensor, proxy: Tensor, y: Tensor) -> Tensor:
    if loss == "contra":
        return conditional_contrastive_loss(
            embedding, proxy, y, temperature=settings.tau, positives=settings.class_positives
        )
    return data_to_data_cross_entropy_loss(
        embedding, proxy, y, temperature=settings.tau, margin_pos=settings.margin_pos
    )


@pytest.mark.parametrize("loss", ["contra", "reacgan"])
def test_the_head_holds_a_real_and_a_fake_proxy_per_class(loss: GanLoss) -> None:
    arch = replace(GanArch.digits(16, 1, 10, loss), adc=True)
    discriminator = Discriminator(arch).eval()  # eval: the normalised table stays fixed
    table = discriminator.head.proxies.weight
    assert table.shape == (20, arch.embed_dim)
    x, y = torch.randn(5, 1, 16, 16), torch.tensor([0, 3, 9, 3, 1])
    with torch.no_grad():
        out = discriminator(x, y)
        assert out.fake_proxy is not None
        torch.testing.assert_close(out.proxy, table[2 * y])
        torch.testing.assert_close(out.fake_proxy, table[2 * y + 1])
        plain = Discriminator(GanArch.digits(16, 1, 10, loss)).eval()(x, y)
    assert plain.fake_proxy is None and plain.proxy.shape == out.proxy.shape


@pytest.mark.parametrize(
    ("loss", "extra"),
    [
        ("contra", {}),
        ("contra", {"class_positives": "proxy", "tau": 0.2}),
        ("reacgan", {}),
        ("reacgan", {"tau": 0.1, "lambda_2c": 2.0}),
    ],
)
def test_d_adds_the_fakes_term_and_g_subtracts_it(loss: str, extra: dict[str, object]) -> None:
    """D: adv + λ(L(real, real proxy) + L(fake, fake proxy)); G: adv + λ(L(fake, real proxy) −
    L(fake, fake proxy)), each source contrasted within itself."""
    real, fake = _outputs(7, 4, seed=1), _outputs(6, 4, seed=2)
    y_real, y_fake = torch.tensor([0, 1, 0, 2, 1, 0, 2]), torch.tensor([2, 2, 1, 0, 1, 1])
    d = discriminator_loss(real, fake, y_real, y_fake, loss=loss, adc=True, **extra)  # type: ignore[arg-type]
    g = generator_loss(fake, y_fake, loss=loss, adc=True, **extra)  # type: ignore[arg-type]
    settings = LossSettings.resolve(loss, adc=True, **extra)  # type: ignore[arg-type]
    assert fake.fake_proxy is not None
    on_real = _term(loss, settings, real.embedding, real.proxy, y_real)
    fake_to_fake = _term(loss, settings, fake.embedding, fake.fake_proxy, y_fake)
    fake_to_real = _term(loss, settings, fake.embedding, fake.proxy, y_fake)
    lam = settings.lambda_2c
    d_adv = F.relu(1 - real.adv).mean() + F.relu(1 + fake.adv).mean()
    torch.testing.assert_close(d["loss"], d_adv + lam * (on_real + fake_to_fake))
    torch.testing.assert_close(d["d_adc"], fake_to_fake)
    torch.testing.assert_close(g["loss"], -fake.adv.mean() + lam * (fake_to_real - fake_to_fake))
    torch.testing.assert_close(g["g_adc"], -fake_to_fake)
    # without adc the fake proxies are not read
    plain = discriminator_loss(real, fake, y_real, y_fake, loss=loss, **extra)  # type: ignore[arg-type]
    torch.testing.assert_close(plain["loss"], d_adv + lam * on_real)
    assert "d_adc" not in plain


@pytest.mark.parametrize("loss", ["contra", "reacgan"])
def test_g_moves_its_fakes_away_from_their_fake_proxy(loss: str) -> None:
    fake = _outputs(16, 8, seed=3)
    y = torch.arange(16) % 4
    embedding = fake.embedding.clone().requires_grad_(True)
    g = generator_loss(fake._replace(embedding=embedding), y, loss=loss, adc=True)
    (grad,) = torch.autograd.grad(g["g_adc"], embedding)
    assert fake.fake_proxy is not None

    def cosine(e: Tensor) -> Tensor:
        return F.cosine_similarity(e, fake.fake_proxy, dim=1).mean()  # type: ignore[arg-type]

    stepped = embedding.detach() - 0.05 * grad
    assert float(cosine(stepped)) < float(cosine(embedding.detach()))


def test_adc_without_a_fake_proxy_or_with_another_loss_is_refused() -> None:
    real = _outputs(4, 3, seed=4)._replace(fake_proxy=None)
    y = torch.tensor([0, 1, 0, 1])
    with pytest.raises(ValueError, match=r"GanArch\(adc=True\)"):
        discriminator_loss(real, real, y, y, loss="contra", adc=True)
    with pytest.raises(ValueError, match="adc applies to the contrastive losses"):
        replace(GanArch.digits(16, 1, 10, "proj"), adc=True)
    with pytest.raises(ValueError, match="adc applies to losses contra and reacgan only"):
        Config(loss="ac", adc=True)


def test_a_run_without_adc_stores_no_adc_setting() -> None:
    """Run folders from before the option resume: ``adc`` is stored only when on."""
    assert "adc" not in resume_config(Config(loss="contra"))
    assert resume_config(Config(loss="reacgan", adc=True))["adc"] is True
