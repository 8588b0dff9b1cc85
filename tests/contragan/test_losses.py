"""Specification of contragan.losses: hinge and non-saturating values by hand, the 2C wiring
(the shared loss on the right DiscOutput fields, and a float64 loop of Eq. 8, with all or only
the proxy as positives), the D2D-CE wiring of reacgan (and a float64 loop of StudioGAN's
formula), the ACGAN (with and without fakes) and ProjGAN terms, the reference values unset
settings take, precision, and the argument checks."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from contragan.arch import LOSSES
from contragan.losses import (
    ADV_LOSSES,
    REFERENCE_SETTINGS,
    LossSettings,
    ac_d_loss,
    ac_g_loss,
    contra_d_loss,
    contra_g_loss,
    d_hinge,
    d_nonsaturating,
    g_hinge,
    g_nonsaturating,
    proj_d_loss,
    proj_g_loss,
    reacgan_d_loss,
    reacgan_g_loss,
)
from contragan.networks import DiscOutput
from contragan.steps import GAN_LOSSES, GanLossFns, discriminator_loss, generator_loss
from shared.losses import conditional_contrastive_loss, data_to_data_cross_entropy_loss

REAL = torch.tensor([2.0, 0.5, -1.0])
FAKE = torch.tensor([-2.0, 0.0, 1.0])


def _softplus(v: float) -> float:
    return math.log1p(math.exp(v))


def test_hinge_values_by_hand() -> None:
    # relu(1 - real) = (0, 0.5, 2); relu(1 + fake) = (0, 1, 2)
    assert float(d_hinge(REAL, FAKE)) == pytest.approx(2.5 / 3 + 1.0)
    assert float(g_hinge(FAKE)) == pytest.approx(-(-2.0 + 0.0 + 1.0) / 3)
    # confident and correct: no loss
    assert float(d_hinge(torch.tensor([1.0, 3.0]), torch.tensor([-1.0, -5.0]))) == 0.0


def test_nonsaturating_values_by_hand() -> None:
    d_expected = sum(_softplus(-r) for r in REAL.tolist()) / 3
    d_expected += sum(_softplus(f) for f in FAKE.tolist()) / 3
    assert float(d_nonsaturating(REAL, FAKE)) == pytest.approx(d_expected)
    g_expected = sum(_softplus(-f) for f in FAKE.tolist()) / 3
    assert float(g_nonsaturating(FAKE)) == pytest.approx(g_expected)
    zeros = torch.zeros(4)
    assert float(d_nonsaturating(zeros, zeros)) == pytest.approx(2 * math.log(2))
    assert float(g_nonsaturating(zeros)) == pytest.approx(math.log(2))


def test_adv_losses_table() -> None:
    assert ADV_LOSSES == {
        "hinge": (d_hinge, g_hinge),
        "nonsaturating": (d_nonsaturating, g_nonsaturating),
    }


def test_adversarial_losses_compute_in_fp32() -> None:
    half = REAL.bfloat16()
    assert d_hinge(half, half).dtype == torch.float32
    assert g_nonsaturating(half).dtype == torch.float32
    assert g_hinge(REAL.double()).dtype == torch.float64


def _outputs(n: int, dim: int, classes: int, seed: int, logits: bool = False) -> DiscOutput:
    g = torch.Generator().manual_seed(seed)
    return DiscOutput(
        adv=torch.randn(n, generator=g, dtype=torch.float64),
        embedding=torch.randn(n, dim, generator=g, dtype=torch.float64),
        proxy=torch.randn(n, dim, generator=g, dtype=torch.float64),
        class_logits=torch.randn(n, classes, generator=g, dtype=torch.float64) if logits else None,
    )


def _two_c_loop(
    embedding: Tensor, proxy: Tensor, labels: Tensor, tau: float, proxy_only: bool = False
) -> float:
    """Eq. 8 of ContraGAN (Kang & Park 2020, the 2C loss) written out with a Python loop; with
    ``proxy_only`` the numerator holds the proxy alone (the denominator is unchanged)."""
    l = F.normalize(embedding, dim=1).tolist()
    e = F.normalize(proxy, dim=1).tolist()
    y = labels.tolist()
    n = len(y)

    def sim(a: list[float], b: list[float]) -> float:
        return math.exp(sum(p * q for p, q in zip(a, b, strict=True)) / tau)

    total = 0.0
    for i in range(n):
        to_proxy = sim(l[i], e[i])
        same = [sim(l[i], l[k]) for k in range(n) if k != i and y[k] == y[i]]
        numerator = to_proxy + (0.0 if proxy_only else sum(same))
        denominator = to_proxy + sum(sim(l[i], l[k]) for k in range(n) if k != i)
        total -= math.log(numerator / denominator)
    return total / n


def _d2dce_loop(embedding: Tensor, proxy: Tensor, labels: Tensor, tau: float, m_p: float) -> float:
    """StudioGAN's ``Data2DataCrossEntropyLoss.forward`` written out with a Python loop: the
    relu'd positive, the negatives of other classes shifted by the row's largest other logit
    (before the relu, over every other sample), m_n = 1 − m_p."""
    f = F.normalize(embedding, dim=1).tolist()
    v = F.normalize(proxy, dim=1).tolist()
    y = labels.tolist()
    n = len(y)

    def cos(a: list[float], b: list[float]) -> float:
        return sum(p * q for p, q in zip(a, b, strict=True))

    total = 0.0
    for i in range(n):
        logits = {k: (cos(f[i], f[k]) + m_p - 1) / tau for k in range(n) if k != i}
        row_max = max(logits.values())
        negatives = sum(
            math.exp(max(logit, 0.0) - row_max) for k, logit in logits.items() if y[k] != y[i]
        )
        positive = max((m_p - cos(f[i], v[i])) / tau, 0.0)
        total += positive + math.log(math.exp(-positive) + negatives)
    return total / n


@pytest.mark.parametrize(("lambda_2c", "tau"), [(1.0, 1.0), (0.5, 0.3)])
def test_2c_wiring_in_the_discriminator_loss(lambda_2c: float, tau: float) -> None:
    real, fake = _outputs(6, 5, 3, seed=0), _outputs(6, 5, 3, seed=1)
    y_real, y_fake = torch.tensor([0, 1, 0, 2, 1, 0]), torch.tensor([2, 2, 1, 0, 1, 0])
    parts = discriminator_loss(
        real, fake, y_real, y_fake, loss="contra", lambda_2c=lambda_2c, tau=tau
    )
    assert set(parts) == {"loss", "d_adv", "d_2c"}
    shared = conditional_contrastive_loss(real.embedding, real.proxy, y_real, temperature=tau)
    torch.testing.assert_close(parts["d_2c"], shared)
    assert float(parts["d_2c"]) == pytest.approx(
        _two_c_loop(real.embedding, real.proxy, y_real, tau), rel=1e-12
    )
    torch.testing.assert_close(parts["d_adv"], d_hinge(real.adv, fake.adv))
    torch.testing.assert_close(parts["loss"], parts["d_adv"] + lambda_2c * parts["d_2c"])


@pytest.mark.parametrize(("lambda_2c", "tau"), [(1.0, 1.0), (2.0, 0.1)])
def test_2c_wiring_in_the_generator_loss(lambda_2c: float, tau: float) -> None:
    fake, y_fake = _outputs(5, 4, 3, seed=2), torch.tensor([1, 1, 0, 2, 0])
    parts = generator_loss(
        fake, y_fake, loss="contra", adv="nonsaturating", lambda_2c=lambda_2c, tau=tau
    )
    assert set(parts) == {"loss", "g_adv", "g_2c"}
    assert float(parts["g_2c"]) == pytest.approx(
        _two_c_loop(fake.embedding, fake.proxy, y_fake, tau), rel=1e-12
    )
    torch.testing.assert_close(parts["g_adv"], g_nonsaturating(fake.adv))
    torch.testing.assert_close(parts["loss"], parts["g_adv"] + lambda_2c * parts["g_2c"])


@pytest.mark.parametrize("loss", ["contra", "reacgan"])
@pytest.mark.parametrize("adc", [False, True])
def test_g_lambda_2c_weighs_gs_class_term_alone(loss: str, adc: bool) -> None:
    """G's total is g_adv + λ_G·(its class terms); D's loss still weighs λ; unset, λ_G = λ."""
    real, fake = _outputs(6, 4, 3, seed=30), _outputs(6, 4, 3, seed=31)
    fake = fake._replace(fake_proxy=torch.randn(6, 4, dtype=torch.float64))
    y_real, y_fake = torch.tensor([0, 1, 0, 2, 1, 2]), torch.tensor([2, 2, 1, 0, 1, 0])
    common: dict[str, Any] = {"loss": loss, "lambda_2c": 0.25, "tau": 0.2, "adc": adc}
    same = generator_loss(fake, y_fake, **common)
    for g_weight in (0.0, 0.1, 2.0):
        g = generator_loss(fake, y_fake, g_lambda_2c=g_weight, **common)
        class_parts = [v for k, v in g.items() if k not in ("loss", "g_adv")]
        assert len(class_parts) == (2 if adc else 1)
        torch.testing.assert_close(g["loss"], g["g_adv"] + g_weight * sum(class_parts))
        for key in g:  # the parts themselves do not depend on the weight
            if key != "loss":
                torch.testing.assert_close(g[key], same[key])
    class_parts = [v for k, v in same.items() if k not in ("loss", "g_adv")]
    torch.testing.assert_close(same["loss"], same["g_adv"] + 0.25 * sum(class_parts))
    d = discriminator_loss(real, fake, y_real, y_fake, **common)
    assert float(d["loss"] - d["d_adv"]) == pytest.approx(
        0.25 * float(sum(v for k, v in d.items() if k not in ("loss", "d_adv"))), rel=1e-12
    )
    # at λ_G = 0 no gradient reaches G's embedding through the class term
    embedding = fake.embedding.clone().requires_grad_(True)
    zero = generator_loss(fake._replace(embedding=embedding), y_fake, g_lambda_2c=0.0, **common)
    zero["loss"].backward()
    assert embedding.grad is not None and not embedding.grad.any()


@pytest.mark.parametrize("value", [-0.1, math.nan, math.inf])
def test_a_bad_g_lambda_2c_is_refused(value: float) -> None:
    out, y = _outputs(2, 3, 2, seed=10), torch.tensor([0, 1])
    with pytest.raises(ValueError, match="g_lambda_2c must be a finite number >= 0"):
        generator_loss(out, y, loss="contra", g_lambda_2c=value)


def test_discriminator_2c_reads_real_images_only() -> None:
    real, y = _outputs(4, 3, 2, seed=3), torch.tensor([0, 1, 1, 0])
    fake_a, fake_b = _outputs(4, 3, 2, seed=4), _outputs(4, 3, 2, seed=5)
    fake_b = fake_b._replace(adv=fake_a.adv)
    a = discriminator_loss(real, fake_a, y, y, loss="contra")
    b = discriminator_loss(real, fake_b, y, y, loss="contra")
    torch.testing.assert_close(a["loss"], b["loss"])


@pytest.mark.parametrize("tau", [1.0, 0.1])
def test_proxy_positives_keep_the_proxy_alone_in_the_numerator(tau: float) -> None:
    real, fake = _outputs(7, 4, 3, seed=20), _outputs(6, 4, 3, seed=21)
    y_real, y_fake = torch.tensor([0, 1, 0, 2, 1, 0, 2]), torch.tensor([2, 2, 1, 0, 1, 1])
    d = discriminator_loss(
        real, fake, y_real, y_fake, loss="contra", tau=tau, class_positives="proxy"
    )
    g = generator_loss(fake, y_fake, loss="contra", tau=tau, class_positives="proxy")
    expected_d = _two_c_loop(real.embedding, real.proxy, y_real, tau, proxy_only=True)
    expected_g = _two_c_loop(fake.embedding, fake.proxy, y_fake, tau, proxy_only=True)
    assert float(d["d_2c"]) == pytest.approx(expected_d, rel=1e-12)
    assert float(g["g_2c"]) == pytest.approx(expected_g, rel=1e-12)
    # with same-class samples in the batch the two numerators differ
    faithful = discriminator_loss(real, fake, y_real, y_fake, loss="contra", tau=tau)
    assert float(faithful["d_2c"]) < float(d["d_2c"]) - 1e-6


@pytest.mark.parametrize(("lambda_2c", "tau", "margin_pos"), [(None, None, None), (2.0, 0.1, 0.9)])
def test_reacgan_losses_are_adversarial_plus_lambda_d2dce(
    lambda_2c: float | None, tau: float | None, margin_pos: float | None
) -> None:
    """D: hinge + λ·D2D-CE of the real embeddings and proxies; G: hinge + λ·D2D-CE of its
    fakes; unset values are ReACGAN's CIFAR-10 config (λ 0.5, τ 0.5, m_p 0.98)."""
    real, fake = _outputs(8, 5, 3, seed=22), _outputs(6, 5, 3, seed=23)
    y_real, y_fake = torch.tensor([0, 1, 0, 2, 1, 0, 2, 2]), torch.tensor([2, 2, 1, 0, 1, 0])
    settings = LossSettings.resolve("reacgan", lambda_2c=lambda_2c, tau=tau, margin_pos=margin_pos)
    d = discriminator_loss(
        real,
        fake,
        y_real,
        y_fake,
        loss="reacgan",
        lambda_2c=lambda_2c,
        tau=tau,
        margin_pos=margin_pos,
    )
    g = generator_loss(
        fake, y_fake, loss="reacgan", lambda_2c=lambda_2c, tau=tau, margin_pos=margin_pos
    )
    assert set(d) == {"loss", "d_adv", "d_d2dce"} and set(g) == {"loss", "g_adv", "g_d2dce"}
    lam = 0.5 if lambda_2c is None else lambda_2c
    t, m = (0.5, 0.98) if tau is None else (tau, margin_pos)
    assert m is not None
    for out, y, parts, key in ((real, y_real, d, "d_d2dce"), (fake, y_fake, g, "g_d2dce")):
        direct = data_to_data_cross_entropy_loss(
            out.embedding, out.proxy, y, temperature=t, margin_pos=m
        )
        torch.testing.assert_close(parts[key], direct)
        assert float(parts[key]) == pytest.approx(
            _d2dce_loop(out.embedding, out.proxy, y, t, m), rel=1e-12
        )
    torch.testing.assert_close(d["loss"], d_hinge(real.adv, fake.adv) + lam * d["d_d2dce"])
    torch.testing.assert_close(g["loss"], g_hinge(fake.adv) + lam * g["g_d2dce"])
    # the table's rows are the same functions
    torch.testing.assert_close(
        reacgan_d_loss(real, fake, y_real, y_fake, settings)["loss"], d["loss"]
    )
    torch.testing.assert_close(reacgan_g_loss(fake, y_fake, settings)["loss"], g["loss"])


def test_reacgan_discriminator_term_reads_real_images_only() -> None:
    real, y = _outputs(5, 3, 2, seed=24), torch.tensor([0, 1, 1, 0, 1])
    fake_a, fake_b = _outputs(5, 3, 2, seed=25), _outputs(5, 3, 2, seed=26)
    fake_b = fake_b._replace(adv=fake_a.adv)
    a = discriminator_loss(real, fake_a, y, y, loss="reacgan")
    b = discriminator_loss(real, fake_b, y, y, loss="reacgan")
    torch.testing.assert_close(a["loss"], b["loss"])


def test_unset_settings_take_each_methods_reference_values() -> None:
    assert REFERENCE_SETTINGS == {
        "contra": {"lambda_2c": 1.0, "tau": 1.0},
        "reacgan": {"lambda_2c": 0.5, "tau": 0.5, "margin_pos": 0.98},
    }
    contra, reacgan = LossSettings.resolve("contra"), LossSettings.resolve("reacgan")
    assert (contra.lambda_2c, contra.tau) == (1.0, 1.0)
    assert (reacgan.lambda_2c, reacgan.tau, reacgan.margin_pos) == (0.5, 0.5, 0.98)
    given = LossSettings.resolve("reacgan", lambda_2c=0.0, tau=2.0, margin_pos=0.5)
    assert (given.lambda_2c, given.tau, given.margin_pos) == (0.0, 2.0, 0.5)
    assert LossSettings.resolve("proj") == LossSettings()


def test_acgan_terms() -> None:
    real, fake = _outputs(4, 3, 5, seed=6, logits=True), _outputs(4, 3, 5, seed=7, logits=True)
    y_real, y_fake = torch.tensor([0, 4, 2, 2]), torch.tensor([1, 3, 3, 0])
    assert real.class_logits is not None and fake.class_logits is not None
    ce_real = F.cross_entropy(real.class_logits, y_real)
    ce_fake = F.cross_entropy(fake.class_logits, y_fake)
    d = discriminator_loss(real, fake, y_real, y_fake, loss="ac", ac_weight=0.25)
    assert set(d) == {"loss", "d_adv", "d_ac"}
    torch.testing.assert_close(d["d_ac"], ce_real + ce_fake)
    torch.testing.assert_close(d["loss"], d_hinge(real.adv, fake.adv) + 0.25 * (ce_real + ce_fake))
    g = generator_loss(fake, y_fake, loss="ac")
    assert set(g) == {"loss", "g_adv", "g_ac"}
    torch.testing.assert_close(g["loss"], g_hinge(fake.adv) + ce_fake)
    # real images only (today's StudioGAN): the fakes' class logits do not matter to D
    real_only = discriminator_loss(
        real, fake, y_real, y_fake, loss="ac", ac_weight=0.25, ac_fakes=False
    )
    torch.testing.assert_close(real_only["d_ac"], ce_real)
    torch.testing.assert_close(real_only["loss"], d_hinge(real.adv, fake.adv) + 0.25 * ce_real)
    other = fake._replace(class_logits=torch.zeros_like(fake.class_logits))
    again = discriminator_loss(real, other, y_real, y_fake, loss="ac", ac_fakes=False)
    torch.testing.assert_close(again["d_ac"], ce_real)


def test_projection_loss_is_adversarial_only() -> None:
    real, fake, y = _outputs(3, 2, 2, seed=8), _outputs(3, 2, 2, seed=9), torch.tensor([0, 1, 0])
    d = discriminator_loss(real, fake, y, y, loss="proj", adv="nonsaturating")
    assert set(d) == {"loss", "d_adv"}
    torch.testing.assert_close(d["loss"], d_nonsaturating(real.adv, fake.adv))
    g = generator_loss(fake, y, loss="proj")
    assert set(g) == {"loss", "g_adv"}
    torch.testing.assert_close(g["loss"], g_hinge(fake.adv))


BAD_SETTINGS: list[tuple[dict[str, Any], str]] = [
    ({"loss": "wgan"}, "loss must be one of"),
    ({"loss": "contra", "adv": "wasserstein"}, "adv must be one of"),
    ({"loss": "contra", "lambda_2c": -0.1}, "lambda_2c must be a finite number >= 0"),
    ({"loss": "contra", "lambda_2c": math.nan}, "lambda_2c must be a finite number >= 0"),
    ({"loss": "ac", "ac_weight": -1.0}, "ac_weight must be a finite number >= 0"),
    ({"loss": "contra", "tau": 0.0}, "tau must be a finite number > 0"),
    ({"loss": "contra", "tau": math.inf}, "tau must be a finite number > 0"),
    ({"loss": "contra", "class_positives": "some"}, "class_positives must be one of"),
    ({"loss": "reacgan", "margin_pos": 1.5}, r"margin_pos must lie in \[0, 1\]"),
    ({"loss": "reacgan", "margin_pos": math.nan}, r"margin_pos must lie in \[0, 1\]"),
]


@pytest.mark.parametrize(("settings", "message"), BAD_SETTINGS)
def test_bad_settings_raise(settings: dict[str, Any], message: str) -> None:
    out, y = _outputs(2, 3, 2, seed=10, logits=True), torch.tensor([0, 1])
    with pytest.raises(ValueError, match=message):
        discriminator_loss(out, out, y, y, **settings)
    with pytest.raises(ValueError, match=message):
        generator_loss(out, y, **settings)


def test_acgan_without_class_logits_raises() -> None:
    out, y = _outputs(2, 3, 2, seed=11), torch.tensor([0, 1])
    with pytest.raises(ValueError, match="needs class_logits"):
        discriminator_loss(out, out, y, y, loss="ac")
    with pytest.raises(ValueError, match="needs class_logits"):
        generator_loss(out, y, loss="ac")


def test_every_method_has_one_row_of_d_and_g_losses() -> None:
    """The step picks D's and G's loss by name from one table, with a row for every method the
    networks can be built for."""
    assert GAN_LOSSES == {
        "contra": GanLossFns(contra_d_loss, contra_g_loss),
        "reacgan": GanLossFns(reacgan_d_loss, reacgan_g_loss),
        "proj": GanLossFns(proj_d_loss, proj_g_loss),
        "ac": GanLossFns(ac_d_loss, ac_g_loss),
    }
    assert tuple(GAN_LOSSES) == LOSSES


def test_the_by_name_losses_equal_the_table_rows() -> None:
    real, fake = _outputs(4, 3, 5, seed=12, logits=True), _outputs(4, 3, 5, seed=13, logits=True)
    y_real, y_fake = torch.tensor([0, 4, 2, 2]), torch.tensor([1, 3, 3, 0])
    settings = LossSettings(adv="nonsaturating", lambda_2c=0.5, tau=0.3, ac_weight=2.0)
    for loss, fns in GAN_LOSSES.items():
        by_name = discriminator_loss(
            real,
            fake,
            y_real,
            y_fake,
            loss=loss,
            adv="nonsaturating",
            lambda_2c=0.5,
            tau=0.3,
            ac_weight=2.0,
        )
        row = fns.discriminator(real, fake, y_real, y_fake, settings)
        assert list(by_name) == list(row)
        for key in row:
            torch.testing.assert_close(by_name[key], row[key])
        g_row = fns.generator(fake, y_fake, settings)
        g_by_name = generator_loss(
            fake, y_fake, loss=loss, adv="nonsaturating", lambda_2c=0.5, tau=0.3, ac_weight=2.0
        )
        assert list(g_by_name) == list(g_row) and next(iter(g_row)) == "loss"
