"""LARS against a hand-written float64 loop; parameter groups; the warm-up + cosine schedule."""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
from torch import Tensor, nn

from shared.optim import LARS, WarmupCosineLR, lars_param_groups, warmup_cosine_schedule


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(5, 7), nn.BatchNorm1d(7), nn.ReLU(), nn.Linear(7, 3, bias=False)
    ).double()


def _random_grads(model: nn.Module, generator: torch.Generator) -> None:
    for param in model.parameters():
        param.grad = torch.randn(param.shape, generator=generator, dtype=param.dtype)


def _oracle_step(
    weights: list[Tensor],
    grads: list[Tensor],
    buffers: list[Tensor | None],
    adapt: list[bool],
    decay: list[float],
    *,
    lr: float,
    momentum: float,
    trust_coefficient: float,
    nesterov: bool,
) -> None:
    """You et al. 2017, Algorithm 1, one tensor at a time, written out with Python floats."""
    for i, (w, g) in enumerate(zip(weights, grads, strict=True)):
        wd = decay[i]
        w_norm = math.sqrt(sum(v * v for v in w.flatten().tolist()))
        g_norm = math.sqrt(sum(v * v for v in g.flatten().tolist()))
        trust = 1.0
        if adapt[i] and w_norm > 0 and g_norm + wd * w_norm > 0:
            trust = trust_coefficient * w_norm / (g_norm + wd * w_norm)
        d = trust * (g + wd * w)
        previous = buffers[i]
        v = d.clone() if previous is None else momentum * previous + d
        buffers[i] = v
        step = d + momentum * v if nesterov else v
        weights[i] = w - lr * step


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize(("seed", "weight_decay"), [(0, 1e-6), (1, 0.0), (2, 0.3)])
def test_lars_matches_oracle_loop(seed: int, weight_decay: float, nesterov: bool) -> None:
    model = _model()
    groups = lars_param_groups(model, weight_decay)
    lr, momentum, trust_coefficient = 0.7, 0.9, 0.02  # large eta so the adaptation is visible
    optimizer = LARS(
        groups, lr=lr, momentum=momentum, trust_coefficient=trust_coefficient, nesterov=nesterov
    )
    params = [p for g in groups for p in g["params"]]
    adapt = [g["lars_adapt"] for g in groups for _ in g["params"]]
    decay = [g["weight_decay"] for g in groups for _ in g["params"]]
    weights = [p.detach().clone() for p in params]
    buffers: list[Tensor | None] = [None] * len(params)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(4):
        _random_grads(model, generator)
        before = [p.detach().clone() for p in params]
        grads = [p.grad.clone() for p in params if p.grad is not None]
        optimizer.step()
        expected_before = [w.clone() for w in weights]
        _oracle_step(
            weights,
            grads,
            buffers,
            adapt,
            decay,
            lr=lr,
            momentum=momentum,
            trust_coefficient=trust_coefficient,
            nesterov=nesterov,
        )
        for p, b, w, wb in zip(params, before, weights, expected_before, strict=True):
            # Compare the updates, not the weights: they are far smaller than the weights.
            torch.testing.assert_close(p.detach() - b, w - wb, rtol=1e-9, atol=1e-14)


def test_param_groups_exclude_bn_and_biases() -> None:
    model = _model()
    groups = lars_param_groups(model, 1e-6)
    adapted, excluded = groups
    assert adapted == {"params": adapted["params"], "weight_decay": 1e-6, "lars_adapt": True}
    assert excluded["weight_decay"] == 0.0 and excluded["lars_adapt"] is False
    assert {id(p) for p in adapted["params"]} == {id(model[0].weight), id(model[3].weight)}
    assert {id(p) for p in excluded["params"]} == {
        id(model[0].bias),
        id(model[1].weight),
        id(model[1].bias),
    }


def test_param_groups_skip_frozen_and_empty() -> None:
    model = nn.Sequential(nn.Linear(3, 2, bias=False), nn.Linear(2, 2, bias=False))
    model[1].weight.requires_grad_(False)
    groups = lars_param_groups(model, 0.1)
    assert len(groups) == 1 and groups[0]["params"] == [model[0].weight]


def test_excluded_params_get_trust_one_and_no_decay() -> None:
    """BN/bias tensors move exactly as torch.optim.SGD with momentum and no weight decay."""
    model = _model()
    reference = copy.deepcopy(model)
    lars = LARS(lars_param_groups(model, 0.5), lr=0.3)
    excluded = [p for p in model.parameters() if p.ndim <= 1]
    excluded_ref = [p for p in reference.parameters() if p.ndim <= 1]
    sgd = torch.optim.SGD(excluded_ref, lr=0.3, momentum=0.9, weight_decay=0.0)
    generator = torch.Generator().manual_seed(0)
    for step in range(3):
        _random_grads(model, generator)
        for p, q in zip(model.parameters(), reference.parameters(), strict=True):
            q.grad = p.grad.clone() if p.grad is not None else None
        before = [p.detach().clone() for p in excluded]
        lars.step()
        sgd.step()
        for p, q in zip(excluded, excluded_ref, strict=True):
            torch.testing.assert_close(p, q, rtol=0, atol=1e-15)
        if step == 0:  # first step: buffer = update = trust * g with trust 1 and no decay
            for p, b in zip(excluded, before, strict=True):
                assert p.grad is not None
                torch.testing.assert_close(p.detach() - b, -0.3 * p.grad, rtol=0, atol=1e-15)
    # The matrices, by contrast, are adapted: their first-step update is not -lr * g.
    assert not torch.allclose(model[3].weight, reference[3].weight)


def test_zero_weight_gets_trust_one() -> None:
    weight = nn.Parameter(torch.zeros(3, 4, dtype=torch.float64))
    weight.grad = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    LARS([weight], lr=0.1, weight_decay=0.01).step()
    torch.testing.assert_close(weight.detach(), -0.1 * weight.grad)


def test_first_update_is_bounded_by_trust_coefficient() -> None:
    """||trust * (g + wd w)|| <= eta ||w|| by the triangle inequality (You et al. 2017)."""
    generator = torch.Generator().manual_seed(3)
    for scale in (1e-4, 1.0, 1e4):
        weight = nn.Parameter(torch.randn(6, 5, generator=generator, dtype=torch.float64))
        weight.grad = scale * torch.randn(6, 5, generator=generator, dtype=torch.float64)
        before = weight.detach().clone()
        LARS([weight], lr=1.0, weight_decay=0.1, trust_coefficient=1e-3).step()
        assert (weight.detach() - before).norm() <= 1e-3 * before.norm() * (1 + 1e-12)


def test_lars_is_dtype_agnostic_and_skips_missing_grads() -> None:
    a = nn.Parameter(torch.ones(2, 2, dtype=torch.float32))
    b = nn.Parameter(torch.ones(2, dtype=torch.float32))
    a.grad = torch.ones(2, 2)
    LARS([a, b], lr=0.1).step()
    assert a.dtype == torch.float32 and torch.equal(b.detach(), torch.ones(2))
    assert not torch.equal(a.detach(), torch.ones(2, 2))


def _stepped(total: int, steps: int, lr: float = 0.2) -> tuple[LARS, WarmupCosineLR]:
    optimizer = LARS([nn.Parameter(torch.zeros(1))], lr=lr)
    scheduler = warmup_cosine_schedule(optimizer, warmup_steps=3, total_steps=total)
    for _ in range(steps):
        optimizer.step()
        scheduler.step()
    return optimizer, scheduler


def test_resume_with_a_longer_horizon_continues_on_the_new_cosine() -> None:
    """A finished 10-step run extended to 20: LambdaLR alone would keep T = 10 and lr = 0."""
    old_optimizer, old = _stepped(total=10, steps=10)
    assert old.get_last_lr()[0] == 0.0
    optimizer, scheduler = _stepped(total=20, steps=0)
    optimizer.load_state_dict(old_optimizer.state_dict())
    with pytest.warns(
        UserWarning, match=r"schedule changed on resume at step 10.*'total_steps': 10"
    ):
        scheduler.load_state_dict(old.state_dict())
    assert scheduler.lr_lambdas[0].total_steps == 20  # type: ignore[attr-defined]
    for step in range(10, 21):
        lr = optimizer.param_groups[0]["lr"]  # the lr the step at `step` trains with
        assert lr == pytest.approx(_closed_form(step, 0.2, 3, 20, 0.0), rel=1e-12, abs=1e-15)
        assert scheduler.get_last_lr() == [lr]
        optimizer.step()
        scheduler.step()
    assert 0.0 < _closed_form(10, 0.2, 3, 20, 0.0) < 0.2


def test_resume_with_the_same_horizon_is_silent_and_exact() -> None:
    old_optimizer, old = _stepped(total=10, steps=4)
    optimizer, scheduler = _stepped(total=10, steps=0)
    optimizer.load_state_dict(old_optimizer.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scheduler.load_state_dict(old.state_dict())
    assert optimizer.param_groups[0]["lr"] == old_optimizer.param_groups[0]["lr"]
    assert scheduler.state_dict() == old.state_dict()


@pytest.mark.parametrize(
    ("kwargs", "bad"),
    [
        ({"lr": -1.0}, "-1.0"),
        ({"lr": 0.1, "momentum": 1.0}, "1.0"),
        ({"lr": 0.1, "weight_decay": -0.5}, "-0.5"),
        ({"lr": 0.1, "trust_coefficient": 0.0}, "0.0"),
        ({"lr": 0.1, "momentum": 0.0, "nesterov": True}, "momentum=0.0"),
    ],
)
def test_lars_rejects_bad_hyperparameters(kwargs: dict[str, float], bad: str) -> None:
    with pytest.raises(ValueError, match=bad):
        LARS([nn.Parameter(torch.ones(2))], **kwargs)  # type: ignore[arg-type]


def _closed_form(step: int, base: float, warmup: int, total: int, ratio: float) -> float:
    if step < warmup:
        return base * step / warmup
    progress = min(step, total) - warmup
    return base * (
        ratio + (1 - ratio) * 0.5 * (1 + math.cos(math.pi * progress / (total - warmup)))
    )


def _scheduled_lrs(
    base_lrs: tuple[float, ...], warmup: int, total: int, ratio: float, steps: int
) -> list[list[float]]:
    params = [nn.Parameter(torch.zeros(1)) for _ in base_lrs]
    optimizer = LARS(
        [{"params": [p], "lr": lr} for p, lr in zip(params, base_lrs, strict=True)], lr=1.0
    )
    scheduler = warmup_cosine_schedule(
        optimizer, warmup_steps=warmup, total_steps=total, final_lr_ratio=ratio
    )
    lrs = []
    for _ in range(steps):
        lrs.append([g["lr"] for g in optimizer.param_groups])
        optimizer.step()
        scheduler.step()
    return lrs


def test_schedule_matches_closed_form() -> None:
    warmup, total, ratio, bases = 10, 110, 0.1, (0.4, 0.1)
    lrs = _scheduled_lrs(bases, warmup, total, ratio, total + 10)
    for i, base in enumerate(bases):
        assert lrs[0][i] == 0.0  # warm-up starts at 0 (SimCLR)
        assert lrs[5][i] == pytest.approx(base / 2, rel=1e-12)
        assert lrs[warmup][i] == pytest.approx(base, rel=1e-12)  # end of warm-up: the peak
        assert lrs[60][i] == pytest.approx(base * (1 + ratio) / 2, rel=1e-12)  # middle of cosine
        assert lrs[total][i] == pytest.approx(base * ratio, rel=1e-12)
        assert lrs[total + 9][i] == pytest.approx(base * ratio, rel=1e-12)  # stays at the floor
        for step, row in enumerate(lrs):
            assert row[i] == pytest.approx(
                _closed_form(step, base, warmup, total, ratio), rel=1e-12, abs=1e-15
            )


def test_schedule_without_warmup_starts_at_base_and_ends_at_zero() -> None:
    lrs = _scheduled_lrs((0.5,), 0, 20, 0.0, 21)
    assert lrs[0][0] == 0.5 and lrs[10][0] == pytest.approx(0.25) and lrs[20][0] == 0.0


def test_schedule_resumes_from_state_dict() -> None:
    param = nn.Parameter(torch.zeros(1))
    optimizer = LARS([param], lr=0.2)
    scheduler = warmup_cosine_schedule(optimizer, warmup_steps=3, total_steps=10)
    for _ in range(5):
        optimizer.step()
        scheduler.step()
    fresh_optimizer = LARS([nn.Parameter(torch.zeros(1))], lr=0.2)
    fresh = warmup_cosine_schedule(fresh_optimizer, warmup_steps=3, total_steps=10)
    fresh_optimizer.load_state_dict(optimizer.state_dict())
    fresh.load_state_dict(scheduler.state_dict())
    optimizer.step()
    scheduler.step()
    fresh_optimizer.step()
    fresh.step()
    assert fresh.get_last_lr() == scheduler.get_last_lr()
    assert scheduler.get_last_lr()[0] == pytest.approx(_closed_form(6, 0.2, 3, 10, 0.0))


@pytest.mark.parametrize(
    ("kwargs", "bad"),
    [
        ({"warmup_steps": -1, "total_steps": 10}, "-1"),
        ({"warmup_steps": 10, "total_steps": 10}, "total_steps=10"),
        ({"warmup_steps": 1, "total_steps": 10, "final_lr_ratio": 1.5}, "1.5"),
    ],
)
def test_schedule_rejects_bad_arguments(kwargs: dict[str, float], bad: str) -> None:
    optimizer = LARS([nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(ValueError, match=bad):
        warmup_cosine_schedule(optimizer, **kwargs)  # type: ignore[arg-type]
