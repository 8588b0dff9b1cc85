"""Specification of ``proj_adv`` (ProjGAN's class projection in the adversarial logit of the
contrastive losses): the logit is the plain one plus ``⟨v(y), h⟩`` from a table of its own,
so it reads the label; the class term's embedding and proxies are untouched; the option is
refused for the losses whose logit is already conditional (proj) or that have no proxies (ac);
a run without it stores nothing new, so older run folders resume."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from contragan.arch import GanArch, GanLoss
from contragan.config import Config, resume_config
from contragan.models import build_gan
from contragan.networks import Discriminator


def _pooled(discriminator: Discriminator, x: Tensor) -> Tensor:
    """h, D's pooled feature, recomputed from the trunk the way ``forward`` does."""
    h = x
    for i, block in enumerate(discriminator.blocks):
        h = block(h)
        if discriminator.attention is not None and i == discriminator.attention_index:
            h = discriminator.attention(h)
    return F.relu(h).sum(dim=(2, 3))


@pytest.mark.parametrize("loss", ["contra", "reacgan"])
def test_the_logit_gains_the_class_projection_and_the_class_term_is_unchanged(
    loss: GanLoss,
) -> None:
    torch.manual_seed(0)
    arch = replace(GanArch.digits(16, 1, 10, loss), proj_adv=True)
    discriminator = Discriminator(arch).eval()  # eval: the normalised tables stay fixed
    table = discriminator.head.class_adv
    assert table is not None and table.weight.shape == (10, arch.feature_dim)
    x, y = torch.randn(5, 1, 16, 16), torch.tensor([0, 3, 9, 3, 1])
    with torch.no_grad():
        out = discriminator(x, y)
        h = _pooled(discriminator, x)
        plain_adv = discriminator.linear(h).squeeze(1)
        torch.testing.assert_close(out.adv, plain_adv + (table.weight[y] * h).sum(dim=1))
        torch.testing.assert_close(out.embedding, discriminator.head.projection(h))
        torch.testing.assert_close(out.proxy, discriminator.head.proxies.weight[y])
        # the label moves the logit: the same images under other labels score otherwise
        other = discriminator(x, (y + 1) % 10)
    assert not torch.allclose(out.adv, other.adv)
    torch.testing.assert_close(out.embedding, other.embedding)


@pytest.mark.parametrize("loss", ["contra", "reacgan"])
def test_without_the_option_the_logit_ignores_the_label(loss: GanLoss) -> None:
    torch.manual_seed(1)
    discriminator = Discriminator(GanArch.digits(16, 1, 10, loss)).eval()
    assert discriminator.head.class_adv is None
    x, y = torch.randn(4, 1, 16, 16), torch.tensor([0, 1, 2, 3])
    with torch.no_grad():
        torch.testing.assert_close(discriminator(x, y).adv, discriminator(x, 9 - y).adv)


def test_the_table_is_spectrally_normalised_and_orthogonally_initialised() -> None:
    arch = replace(GanArch.digits(16, 1, 10, "contra"), proj_adv=True)
    torch.manual_seed(0)
    _, discriminator = build_gan(arch)
    table = discriminator.head.get_submodule("class_adv")
    names = {name for name, _ in table.named_parameters()}
    assert names == {"parametrizations.weight.original"}  # spectral norm's parametrisation
    weight = table.get_parameter("parametrizations.weight.original").detach()
    # orthogonal rows (10 rows of width >= 10): W Wᵀ is diagonal
    gram = weight @ weight.T
    torch.testing.assert_close(gram, torch.diag(torch.diagonal(gram)), atol=1e-5, rtol=0)


def test_the_option_is_refused_where_the_logit_is_conditional_or_there_are_no_proxies() -> None:
    losses: tuple[GanLoss, ...] = ("proj", "ac")
    for loss in losses:
        with pytest.raises(ValueError, match="proj_adv applies to the contrastive losses"):
            replace(GanArch.digits(16, 1, 10, loss), proj_adv=True)
        with pytest.raises(ValueError, match="proj_adv applies to losses contra and reacgan"):
            Config(loss=loss, proj_adv=True)


def test_a_run_without_the_option_stores_no_setting() -> None:
    assert "proj_adv" not in resume_config(Config(loss="contra"))
    assert resume_config(Config(loss="contra", proj_adv=True))["proj_adv"] is True
