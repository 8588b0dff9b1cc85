"""CLAE: the adversarial batch-norm branch and the adversarial view of a training step."""

from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path

import pytest
import torch
from torch import nn

# needs the image extra (kornia): skipped without it, not a collection error
pytest.importorskip("kornia")

from imagecl import clae, config, models
from imagecl.augment import SimCLRViews
from imagecl.backbones import build_backbone
from imagecl.clae import adversarial_view
from imagecl.commands import eval as eval_command
from imagecl.commands import train
from imagecl.data import images_and_labels, load_data
from imagecl.dual_bn import DualBatchNorm2d, adversarial_rows, convert_dual_bn
from imagecl.evaluate import encode, evaluate_encoder
from imagecl.networks import ImageModel
from imagecl.steps import adversary_of, train_step
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


def _cfg(argv: list[str]) -> config.Config:
    quick = {"quick": config.QUICK}
    return parse_config(config.Config, ["--quick", "--batch-size", "16", *argv], presets=quick)


@pytest.mark.parametrize("steps", [1, 3])
def test_adversarial_view_stays_in_the_eps_ball_and_leaves_parameter_grads_alone(
    steps: int,
) -> None:
    data = load_data("digits-m", seed=0)
    cfg = _cfg(["--method", "clae", "--adv-steps", str(steps)])
    built = models.build(cfg, device=CPU, data=data)
    model = unwrap(built.model)
    assert isinstance(model, ImageModel)
    assert any(isinstance(m, DualBatchNorm2d) for m in model.modules())
    images, labels = next(iter(built.loader))
    x = built.views(images, generator=torch.Generator().manual_seed(0))
    sentinel = next(model.parameters())
    sentinel.grad = torch.full_like(sentinel, 7.0)
    x_adv = adversarial_view(
        model,
        x[:, 0],
        labels,
        adversary=adversary_of(cfg),
        mean=built.views.mean,
        std=built.views.std,
    )
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
            [
                "--quick",
                "--device",
                "cpu",
                "--batch-size",
                "64",
                "--max-steps",
                "2",
                "--log-every",
                "1",
                "--method",
                method,
                "--out",
                str(out),
                *extra,
            ]
        )
        assert summary["steps"] == 2
        assert "adversarial_loss" in (out / "metrics.csv").read_text().splitlines()[0]
        # the run's own robustness check: its plot, its section, its number
        # (PGD ascends the probe's loss from the clean images: it cannot make them easier)
        assert summary["pgd_robust_accuracy"] <= summary["linear_probe_accuracy"]
        assert (out / "plots" / "robust_accuracy.png").stat().st_size > 0
        assert (out / "plots" / "training.png").stat().st_size > 0
        report = (out / "report.md").read_text()
        assert "![robust_accuracy](plots/robust_accuracy.png)" in report
        assert "## Adversarial robustness" in report and "Adversarial views (CLAE)" in report
    with pytest.raises(ValueError, match="adv_eps >= 0"):
        _cfg(["--method", "clae", "--adv-eps", "-0.1"])
    with pytest.raises(ValueError, match="adversarial applies to methods simclr and supcon"):
        _cfg(["--method", "ce", "--adversarial"])
    evaluated = tmp_path / "eval"
    numbers = eval_command.main(
        [
            "--checkpoint",
            str(tmp_path / "clae" / "checkpoints" / "last.pt"),
            "--attack",
            "fgsm",
            "--eps",
            "0.0314",
            "--no-corruptions",
            "--labels-per-class",
            "1",
            "--knn-k",
            "20",
            "--device",
            "cpu",
            "--out",
            str(evaluated),
        ]
    )
    assert 0.0 <= numbers["fgsm_robust_accuracy"] <= numbers["linear_probe_accuracy"]
    assert (evaluated / "plots" / "robust_accuracy.png").stat().st_size > 0
    assert "![robust_accuracy](plots/robust_accuracy.png)" in (evaluated / "report.md").read_text()
    assert json.loads((evaluated / "summary.json").read_text())["method"] == "clae"


class FixedViews:
    """The views of a training step, fixed: ``views(images)`` always returns ``x``."""

    def __init__(self, views: SimCLRViews, x: torch.Tensor) -> None:
        self.mean, self.std, self.x = views.mean, views.std, x

    def __call__(
        self, images: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        return self.x


def _clean_copy(module: nn.Module) -> nn.Module:
    """A copy with every DualBatchNorm2d replaced by its clean branch."""
    module = copy.deepcopy(module)
    for name, child in list(module.named_children()):
        if isinstance(child, DualBatchNorm2d):
            setattr(module, name, child.clean)
        else:
            setattr(module, name, _clean_copy(child))
    return module


def test_zero_weight_adversarial_term_leaves_the_supcon_step_unchanged() -> None:
    """SupCon + adversarial views with α = 0 is SupCon: the same loss and the same gradient on
    every shared parameter (the adversarial rows share the forward but not the clean rows' batch
    norm), zero gradient on the adversarial batch norm. With α = 1 the gradient changes."""
    data = load_data("digits-m", seed=0)
    steps = {}
    for name, flags in (
        ("plain", ["--method", "supcon"]),
        ("alpha0", ["--method", "supcon", "--adversarial", "--adv-alpha", "0"]),
        ("alpha1", ["--method", "supcon", "--adversarial"]),
    ):
        cfg = _cfg(flags)
        built = models.build(cfg, device=CPU, data=data)
        model = unwrap(built.model)
        images, labels = next(iter(built.loader))
        if "x" not in steps:  # one draw of the views for all three (the same loader order)
            steps["x"] = built.views(images, generator=torch.Generator().manual_seed(0))
            steps["batch"] = (images, labels)
        views = FixedViews(built.views, steps["x"])
        out = train_step(model, steps["batch"], cfg=cfg, views=views, gather=False)  # type: ignore[arg-type]
        out["loss"].backward()
        grads = {
            n.replace(".clean.", "."): p.grad
            for n, p in model.named_parameters()
            if ".adversarial." not in n
        }
        adversarial = [p.grad for n, p in model.named_parameters() if ".adversarial." in n]
        steps[name] = (out, grads, adversarial)
    plain, alpha0, alpha1 = steps["plain"], steps["alpha0"], steps["alpha1"]
    torch.testing.assert_close(alpha0[0]["contrastive_loss"], plain[0]["contrastive_loss"])
    torch.testing.assert_close(alpha0[0]["loss"], plain[0]["loss"])
    assert plain[1].keys() == alpha0[1].keys()
    for name, grad in plain[1].items():
        torch.testing.assert_close(alpha0[1][name], grad, msg=name)
    assert alpha0[2] and all(g is None or not g.any() for g in alpha0[2])
    assert any(g is not None and g.abs().sum() > 0 for g in alpha1[2])
    backbone_grads = [k for k in plain[1] if k.startswith("backbone.")]
    assert any(not torch.allclose(alpha1[1][k], plain[1][k]) for k in backbone_grads)


def test_evaluation_reads_the_clean_batch_norm_branch() -> None:
    """After CLAE steps the two branches' running statistics differ; the frozen encoder that
    evaluation (probe, kNN, attacks) sees in eval mode is the clean one."""
    data = load_data("digits-m", seed=0)
    cfg = _cfg(["--method", "clae"])
    built = models.build(cfg, device=CPU, data=data)
    model = unwrap(built.model)
    assert isinstance(model, ImageModel)
    for _, batch in zip(range(2), built.loader, strict=False):
        train_step(model, batch, cfg=cfg, views=built.views, gather=False)["loss"].backward()
    layers = [m for m in model.modules() if isinstance(m, DualBatchNorm2d)]
    assert not torch.allclose(layers[0].clean.running_mean, layers[0].adversarial.running_mean)
    images = images_and_labels(data.test)[0][:32]  # (32, C, H, W) uint8
    h = encode(model.backbone, images, data.mean, data.std, device=CPU)
    expected = encode(_clean_copy(model.backbone), images, data.mean, data.std, device=CPU)
    torch.testing.assert_close(h, expected, rtol=0, atol=0)
    assert model.backbone.training  # encode restores the mode


@pytest.mark.slow
def test_clae_on_digits_m_beats_the_random_init_encoder(tmp_path: Path) -> None:
    """Learning: the quick preset with CLAE probes clearly above its random init."""
    summary = train.main(
        ["--quick", "--method", "clae", "--device", "cpu", "--out", str(tmp_path / "run")]
    )
    data = load_data("digits-m", seed=0)
    torch.manual_seed(0)
    baseline = evaluate_encoder(
        build_backbone("small_cnn", in_channels=3), data, device=CPU, knn_k=()
    )
    margin = summary["linear_probe_accuracy"] - baseline["linear_probe_accuracy"]
    assert margin > 0.05, (summary["linear_probe_accuracy"], baseline["linear_probe_accuracy"])


def _buffers(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every buffer (running means, variances, batch counts), copied."""
    return {name: b.detach().clone() for name, b in module.named_buffers()}


@pytest.mark.parametrize("flags", [[], ["--no-adv-bn"], ["--adv-steps", "3"]])
def test_the_attack_leaves_every_batch_norm_running_statistic_alone(
    flags: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attack's forwards (anchor f(x1) and each FGSM/PGD step) normalise with batch
    statistics in train mode, as the reference's do, but update no running statistic of
    either branch; the adversarial view is the one the unfrozen forwards would give."""
    data = load_data("digits-m", seed=0)
    cfg = _cfg(["--method", "clae", "--head", "mlp3", *flags])  # mlp3: BatchNorm1d in the head
    built = models.build(cfg, device=CPU, data=data)
    model = unwrap(built.model)
    assert model.training
    images, labels = next(iter(built.loader))
    x1 = built.views(images, generator=torch.Generator().manual_seed(0))[:, 0]
    before = _buffers(model)
    assert any(name.endswith("num_batches_tracked") for name in before)
    mean, std = built.views.mean, built.views.std
    torch.manual_seed(1)  # PGD's random start
    x_adv = adversarial_view(model, x1, labels, adversary=adversary_of(cfg), mean=mean, std=std)
    after = _buffers(model)
    assert after.keys() == before.keys()
    for name, value in before.items():
        assert torch.equal(after[name], value), name
    layers = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    assert layers and all(m.track_running_stats for m in layers)  # restored on exit
    # without the freeze the same forwards would move the statistics, and give the same x_adv
    unfrozen = copy.deepcopy(model)
    monkeypatch.setattr(clae, "frozen_bn_statistics", lambda module: contextlib.nullcontext())
    torch.manual_seed(1)
    x_unfrozen = adversarial_view(
        unfrozen, x1, labels, adversary=adversary_of(cfg), mean=mean, std=std
    )
    torch.testing.assert_close(x_adv, x_unfrozen, rtol=0, atol=0)
    moved = _buffers(unfrozen)
    assert any(not torch.equal(moved[name], value) for name, value in before.items())


def test_frozen_bn_statistics_keeps_train_mode_normalisation_and_restores_the_flags() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.BatchNorm2d(3), nn.BatchNorm1d(12, track_running_stats=False))
    x = 4 + 2 * torch.randn(5, 3, 2, 2)
    bn = net[0]
    assert isinstance(bn, nn.BatchNorm2d)
    with clae.frozen_bn_statistics(net):
        frozen = bn(x)
    reference = nn.BatchNorm2d(3)
    torch.testing.assert_close(frozen, reference(x))  # batch statistics, as in train mode
    running = bn.running_mean
    assert running is not None and not running.any() and bn.num_batches_tracked == 0
    assert bn.track_running_stats and not net[1].track_running_stats
    bn(x)  # outside, the statistics move again
    torch.testing.assert_close(bn.running_mean, reference.running_mean)
