"""L∞ attacks: one contract for every attack, golden steps on a linear loss, robust accuracy."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

# needs the image extra (kornia): skipped without it, not a collection error
pytest.importorskip("kornia")

from imagecl import evaluate
from imagecl.attacks import fgsm_contrastive, pgd_contrastive
from imagecl.backbones import build_backbone
from imagecl.commands import eval as eval_command
from imagecl.commands import train
from imagecl.data import ImageData, images_and_labels, load_data
from shared.losses import nt_xent_loss
from shared.probes import ProbeResult, linear_probe

CPU = torch.device("cpu")
EPS = 0.03  # pixel units; large enough that every step moves, small enough for a local ascent


class Attack(Protocol):
    def __call__(
        self,
        loss_fn: Callable[[Tensor], Tensor],
        x: Tensor,
        *,
        eps: float,
        generator: torch.Generator | None = None,
    ) -> Tensor: ...


def _fgsm(
    loss_fn: Callable[[Tensor], Tensor],
    x: Tensor,
    *,
    eps: float,
    generator: torch.Generator | None = None,
) -> Tensor:
    return fgsm_contrastive(loss_fn, x, eps=eps)


def _pgd(
    loss_fn: Callable[[Tensor], Tensor],
    x: Tensor,
    *,
    eps: float,
    generator: torch.Generator | None = None,
) -> Tensor:
    return pgd_contrastive(loss_fn, x, eps=eps, steps=5, generator=generator)


def _pgd_no_start(
    loss_fn: Callable[[Tensor], Tensor],
    x: Tensor,
    *,
    eps: float,
    generator: torch.Generator | None = None,
) -> Tensor:
    return pgd_contrastive(loss_fn, x, eps=eps, steps=5, random_start=False)


ATTACKS: dict[str, Attack] = {"fgsm": _fgsm, "pgd": _pgd, "pgd_no_start": _pgd_no_start}


def _images(n: int = 8, *, seed: int = 0, dtype: torch.dtype = torch.float32) -> Tensor:
    """Random images in [0.1, 0.9] with a black and a white pixel each (the clamp must act)."""
    g = torch.Generator().manual_seed(seed)
    x = 0.1 + 0.8 * torch.rand(n, 3, 6, 6, generator=g, dtype=torch.float64)  # (N, 3, 6, 6)
    x[:, :, 0, 0] = 0.0
    x[:, :, -1, -1] = 1.0
    return x.to(dtype)


def _linear_classifier(*, seed: int = 0, dtype: torch.dtype = torch.float32) -> nn.Sequential:
    g = torch.Generator().manual_seed(seed)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 6 * 6, 4)).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64))
    return model


def _encoder(*, seed: int = 0) -> nn.Sequential:
    g = torch.Generator().manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.Tanh(), nn.Flatten(), nn.Linear(4 * 4 * 4, 8)
    )  # (N, 3, 6, 6) -> (N, 8)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=g))
    return model


def check_attack(attack: Attack, *, dtype: torch.dtype = torch.float32) -> None:
    """The contract of an L∞ attack on a fixed linear model + cross-entropy.

    The ε-ball and the pixel range hold; the loss goes up (also when called under no_grad);
    the input, the parameters' ``.grad`` (a sentinel and a None) and the model's mode are
    untouched; dtype, device and shape are kept; the output is detached; a seeded generator
    reproduces the output; ε = 0 is the identity.
    """
    x = _images(dtype=dtype)
    y = torch.arange(x.shape[0]) % 4  # (N,)
    model = _linear_classifier(dtype=dtype)
    linear = model[1]
    assert isinstance(linear, nn.Linear)
    sentinel = torch.full_like(linear.weight, 7.0)
    linear.weight.grad = sentinel.clone()
    assert linear.bias.grad is None

    def loss_fn(x_adv: Tensor) -> Tensor:
        return F.cross_entropy(model(x_adv), y)

    before = x.clone()
    for training in (True, False):
        model.train(training)
        out = attack(loss_fn, x, eps=EPS, generator=torch.Generator().manual_seed(1))
        assert model.training is training
        assert torch.equal(x, before)
        assert out.dtype == x.dtype and out.device == x.device and out.shape == x.shape
        assert not out.requires_grad
        assert float((out - x).abs().max()) <= EPS + 1e-6
        assert float(out.min()) >= 0.0 and float(out.max()) <= 1.0
        with torch.no_grad():
            assert float(loss_fn(out)) > float(loss_fn(x)) + 1e-3
        assert torch.equal(linear.weight.grad, sentinel)
        assert linear.bias.grad is None
    again = attack(loss_fn, x, eps=EPS, generator=torch.Generator().manual_seed(1))
    assert torch.equal(again, out)
    with torch.no_grad():  # an evaluation loop may call it under no_grad
        quiet = attack(loss_fn, x, eps=EPS, generator=torch.Generator().manual_seed(1))
    assert torch.equal(quiet, out)
    identity = attack(loss_fn, x, eps=0.0, generator=torch.Generator().manual_seed(1))
    assert torch.equal(identity, x) and identity is not x


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attack_contract(name: str, dtype: torch.dtype) -> None:
    check_attack(ATTACKS[name], dtype=dtype)


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attacks_raise_the_contrastive_loss_of_the_first_view(name: str) -> None:
    """CLAE: x_adv starts from x1 and ascends NT-Xent(f(x1), f(x_adv)); f's grads untouched."""
    x1 = _images(seed=3)
    encoder = _encoder()
    with torch.no_grad():
        z1 = encoder(x1)  # (N, 8)

    def loss_fn(x_adv: Tensor) -> Tensor:
        return nt_xent_loss(z1, encoder(x_adv))

    out = ATTACKS[name](loss_fn, x1, eps=EPS, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert float(loss_fn(out)) > float(loss_fn(x1)) + 1e-3
    assert all(p.grad is None for p in encoder.parameters())
    assert float((out - x1).abs().max()) <= EPS + 1e-6


def test_autocast_runs_the_loss_in_low_precision_and_keeps_the_input_dtype() -> None:
    x, y, model = _images(), torch.arange(8) % 4, _linear_classifier()
    seen: list[torch.dtype] = []

    def loss_fn(x_adv: Tensor) -> Tensor:
        logits = model(x_adv)
        seen.append(logits.dtype)
        return F.cross_entropy(logits.float(), y)

    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = pgd_contrastive(loss_fn, x, eps=EPS, steps=2, generator=torch.Generator())
    assert seen == [torch.bfloat16, torch.bfloat16]
    assert out.dtype == torch.float32 and float((out - x).abs().max()) <= EPS + 1e-6


def test_fgsm_and_pgd_on_a_linear_loss_step_to_the_corner_of_the_ball() -> None:
    """loss = <w, x>: the ascent direction is sign(w) everywhere, so both land on x + ε sign(w)."""
    x = torch.full((2, 3, 4, 4), 0.5)
    w = torch.randn(x.shape, generator=torch.Generator().manual_seed(0))

    def loss_fn(x_adv: Tensor) -> Tensor:
        return (w * x_adv).sum()

    corner = x + EPS * w.sign()  # (2, 3, 4, 4)
    assert torch.equal(fgsm_contrastive(loss_fn, x, eps=EPS), corner)
    # 4 steps of 2.5 ε / 4 (Madry et al.): past the boundary after two, projected back
    assert torch.equal(pgd_contrastive(loss_fn, x, eps=EPS, steps=4, random_start=False), corner)
    short = pgd_contrastive(loss_fn, x, eps=EPS, step_size=EPS / 10, steps=3, random_start=False)
    torch.testing.assert_close(short, x + 0.3 * EPS * w.sign())
    # near white the pixel range wins over the ball; other ranges are honoured too
    bright = pgd_contrastive(loss_fn, torch.full_like(x, 0.99), eps=EPS, random_start=False)
    assert torch.equal(bright[w > 0], torch.ones_like(bright[w > 0]))
    signed = fgsm_contrastive(loss_fn, x - 1.48, eps=EPS, clamp=(-1.0, 1.0))
    assert float(signed.min()) == -1.0 and float(signed.max()) <= -0.98 + EPS + 1e-6


def test_pgd_random_start_is_uniform_in_the_ball_from_the_cpu_generator() -> None:
    """With a zero gradient PGD stays at its start: x + U(-ε, ε) drawn by `generator` on CPU."""
    x = torch.full((4, 3, 8, 8), 0.5, dtype=torch.float64)

    def flat(x_adv: Tensor) -> Tensor:
        return (0.0 * x_adv).sum()

    out = pgd_contrastive(flat, x, eps=EPS, generator=torch.Generator().manual_seed(5))
    noise = torch.rand(x.shape, generator=torch.Generator().manual_seed(5))  # float32
    torch.testing.assert_close(out, x + ((2 * noise - 1) * EPS).double())
    assert float((out - x).abs().max()) > 0.9 * EPS and abs(float((out - x).mean())) < 0.1 * EPS


def test_pgd_is_reproducible_from_its_seed_and_deterministic_without_random_start() -> None:
    x, y, model = _images(), torch.arange(8) % 4, _linear_classifier()

    def loss_fn(x_adv: Tensor) -> Tensor:
        return F.cross_entropy(model(x_adv), y)

    def run(seed: int) -> Tensor:
        return pgd_contrastive(
            loss_fn, x, eps=EPS, steps=3, generator=torch.Generator().manual_seed(seed)
        )

    assert torch.equal(run(0), run(0))
    assert not torch.equal(run(0), run(1))
    state = torch.get_rng_state()
    first = pgd_contrastive(loss_fn, x, eps=EPS, steps=3, random_start=False)
    assert torch.equal(first, pgd_contrastive(loss_fn, x, eps=EPS, steps=3, random_start=False))
    assert torch.equal(torch.get_rng_state(), state)  # no random start: no draw at all


def _scalar_loss(x_adv: Tensor) -> Tensor:
    return x_adv.square().sum()


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: fgsm_contrastive(_scalar_loss, torch.rand(2, 3), eps=-0.1), "-0.1"),
        (lambda: pgd_contrastive(_scalar_loss, torch.rand(2, 3), eps=math.nan), "nan"),
        (
            lambda: fgsm_contrastive(_scalar_loss, torch.zeros(2, 3, dtype=torch.uint8), eps=0.1),
            "torch.uint8",
        ),
        (
            lambda: fgsm_contrastive(_scalar_loss, torch.rand(2, 3), eps=0.1, clamp=(1.0, 0.0)),
            r"\(1.0, 0.0\)",
        ),
        (lambda: pgd_contrastive(_scalar_loss, torch.rand(2, 3), eps=0.1, steps=0), "got 0"),
        (lambda: pgd_contrastive(_scalar_loss, torch.rand(2, 3), eps=0.1, steps=2.0), "2.0"),  # type: ignore[arg-type]
        (lambda: pgd_contrastive(_scalar_loss, torch.rand(2, 3), eps=0.1, step_size=0.0), "0.0"),
        (lambda: pgd_contrastive(_scalar_loss, torch.rand(2, 3), eps=0.0, step_size=-1.0), "-1.0"),
        (lambda: fgsm_contrastive(lambda x: x.square(), torch.rand(2, 3), eps=0.1), r"\(2, 3\)"),
        (
            lambda: fgsm_contrastive(lambda x: torch.ones(()), torch.rand(2, 3), eps=0.1),
            "does not depend",
        ),
    ],
)
def test_bad_settings_raise_naming_the_value(call: Callable[[], Tensor], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


# --- robust accuracy of the linear probe on a frozen encoder ----------------------------------


@pytest.fixture(scope="module")
def probed() -> tuple[nn.Module, ImageData, ProbeResult]:
    """A random small CNN on the digits and a linear probe fit on its features."""
    data = load_data("digits")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        encoder = build_backbone("small_cnn", in_channels=1)
    train_x, train_y = images_and_labels(data.train)
    test_x, test_y = images_and_labels(data.test)
    train_h = evaluate.encode(encoder, train_x, data.mean, data.std, device=CPU)
    test_h = evaluate.encode(encoder, test_x, data.mean, data.std, device=CPU)
    probe = linear_probe(train_h, train_y, test_h, test_y, weight_decay=1e-3, val_fraction=0.0)
    return encoder, data, probe


def test_robust_accuracy_is_at_most_clean_and_equals_it_at_eps_zero(
    probed: tuple[nn.Module, ImageData, ProbeResult],
) -> None:
    encoder, data, probe = probed
    assert probe.model is not None and probe.accuracy > 0.5  # the setup classifies at all
    encoder.train()
    kwargs: dict[str, Any] = {"device": CPU, "steps": 3}
    clean = evaluate.robust_accuracy(encoder, probe.model, data, attack="pgd", eps=0.0, **kwargs)
    assert clean == probe.accuracy
    fgsm = evaluate.robust_accuracy(
        encoder, probe.model, data, attack="fgsm", eps=2 / 255, **kwargs
    )
    pgd = evaluate.robust_accuracy(encoder, probe.model, data, attack="pgd", eps=2 / 255, **kwargs)
    strong = evaluate.robust_accuracy(
        encoder, probe.model, data, attack="pgd", eps=8 / 255, **kwargs
    )
    assert fgsm <= clean and pgd <= clean
    assert strong < clean  # the attack bites
    assert encoder.training  # the mode is restored
    assert all(p.grad is None for p in encoder.parameters())
    with pytest.raises(ValueError, match="'cw'"):
        evaluate.robust_accuracy(encoder, probe.model, data, attack="cw", eps=0.1, device=CPU)  # type: ignore[arg-type]


def test_eval_attack_pgd_writes_the_robust_accuracy(tmp_path: Path) -> None:
    run = tmp_path / "run"
    train.main(
        [
            "--quick",
            "--device",
            "cpu",
            "--batch-size",
            "64",
            "--epochs",
            "1",
            "--max-steps",
            "2",
            "--out",
            str(run),
        ]
    )
    out = tmp_path / "eval"
    summary = eval_command.main(
        [
            "--checkpoint",
            str(run / "checkpoints" / "last.pt"),
            "--attack",
            "pgd",
            "--attack-steps",
            "2",
            "--eps",
            "0.0314",
            "--severities",
            "1",
            "--device",
            "cpu",
            "--out",
            str(out),
        ]
    )
    robust = summary["pgd_robust_accuracy"]
    assert 0.0 <= robust <= summary["linear_probe_accuracy"]
    assert json.loads((out / "summary.json").read_text())["pgd_robust_accuracy"] == robust
    report = (out / "report.md").read_text()
    assert "pgd_robust_accuracy" in report and "## Adversarial robustness" in report
    assert json.loads((out / "config.json").read_text())["eps"] == 0.0314
