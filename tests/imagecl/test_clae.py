"""CLAE: the adversarial batch-norm branch and the adversarial view of a training step."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

from imagecl import train
from imagecl.backbones import build_backbone
from imagecl.clae import adversarial_view
from imagecl.data import load_data
from imagecl.dual_bn import DualBatchNorm2d, adversarial_rows, convert_dual_bn
from imagecl.evaluate import evaluate_encoder
from imagecl.models import ImageModel
from shared.config import parse_config
from shared.runtime import unwrap

CPU = torch.device("cpu")


def test_adversarial_rows_use_their_own_batch_norm() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    reference = copy.deepcopy(net[1])
    convert_dual_bn(net)
    layer = net[1]
    assert isinstance(layer, DualBatchNorm2d) and layer.adversarial.momentum == 0.01
    clean, adv = torch.randn(6, 3, 8, 8), 5 + 3 * torch.randn(2, 3, 8, 8)
    with adversarial_rows(net, 2):
        out = net(torch.cat([clean, adv]))
    assert layer.adv_rows == 0  # restored on exit
    # the clean statistics saw the clean rows only, exactly as a plain BN on them would
    expected = reference(net[0](clean))
    torch.testing.assert_close(out[:6], expected)
    torch.testing.assert_close(layer.clean.running_mean, reference.running_mean)
    assert not torch.allclose(layer.adversarial.running_mean, reference.running_mean)
    torch.testing.assert_close(net(clean), reference(net[0](clean)))  # no rows: clean branch


def _cfg(argv: list[str]) -> train.Config:
    quick = {"quick": train.QUICK}
    return parse_config(train.Config, ["--quick", "--batch-size", "16", *argv], presets=quick)


@pytest.mark.parametrize("steps", [1, 3])
def test_adversarial_view_stays_in_the_eps_ball_and_leaves_parameter_grads_alone(
    steps: int,
) -> None:
    data = load_data("digits-m", seed=0)
    cfg = _cfg(["--method", "clae", "--adv-steps", str(steps)])
    built = train.build(cfg, device=CPU, data=data)
    model = unwrap(built.model)
    assert isinstance(model, ImageModel)
    assert any(isinstance(m, DualBatchNorm2d) for m in model.modules())
    images, labels = next(iter(built.loader))
    x = built.views(images, generator=torch.Generator().manual_seed(0))
    sentinel = next(model.parameters())
    sentinel.grad = torch.full_like(sentinel, 7.0)
    x_adv = adversarial_view(model, x[:, 0], labels, cfg=cfg, mean=built.views.mean,
                             std=built.views.std)  # fmt: skip
    m, s = built.views.mean.view(1, -1, 1, 1), built.views.std.view(1, -1, 1, 1)
    pixels, adv_pixels = (x[:, 0] * s + m).clamp(0, 1), x_adv * s + m
    assert (adv_pixels - pixels).abs().max() <= cfg.adv_eps + 1e-5
    assert adv_pixels.min() >= -1e-5 and adv_pixels.max() <= 1 + 1e-5
    assert (adv_pixels - pixels).abs().max() > 0.5 * cfg.adv_eps  # it did move
    assert torch.equal(sentinel.grad, torch.full_like(sentinel, 7.0))
    assert all(p.grad is None for p in list(model.parameters())[1:])


def test_clae_and_adversarial_supcon_train(tmp_path: Path) -> None:
    for method, extra in (("clae", []), ("supcon", ["--adversarial", "--adv-steps", "2"])):
        out = tmp_path / method
        summary = train.main(
            ["--quick", "--device", "cpu", "--batch-size", "64", "--max-steps", "2",
             "--method", method, "--out", str(out), *extra]
        )  # fmt: skip
        assert summary["steps"] == 2
        assert "adversarial_loss" in (out / "metrics.csv").read_text().splitlines()[0]
    with pytest.raises(ValueError, match="adv_eps >= 0"):
        _cfg(["--method", "clae", "--adv-eps", "-0.1"])
    with pytest.raises(ValueError, match="adversarial applies to methods simclr and supcon"):
        _cfg(["--method", "ce", "--adversarial"])


@pytest.mark.slow
def test_clae_on_digits_m_beats_the_random_init_encoder(tmp_path: Path) -> None:
    """Learning: the quick preset with CLAE probes clearly above its random init."""
    summary = train.main(
        ["--quick", "--method", "clae", "--device", "cpu", "--out", str(tmp_path / "run")]
    )
    data = load_data("digits-m", seed=0)
    torch.manual_seed(0)
    baseline = evaluate_encoder(build_backbone("small_cnn", in_channels=3), data, device=CPU,
                                knn_k=())  # fmt: skip
    margin = summary["linear_probe_accuracy"] - baseline["linear_probe_accuracy"]
    assert margin > 0.05, (summary["linear_probe_accuracy"], baseline["linear_probe_accuracy"])
