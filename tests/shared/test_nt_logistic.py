"""Executable specification of NT-Logistic (SimCLR, Chen et al. 2020, Table 2): a float64 loop
oracle over anchors and their negatives, analytic values, invariances, gradients, empty batches
and bad input."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from shared.losses import NTLogisticLoss, nt_logistic_loss

F64 = torch.float64


def _log_sigmoid(x: float) -> float:
    """log σ(x), written out, stable for either sign of x."""
    return -math.log1p(math.exp(-x)) if x >= 0 else x - math.log1p(math.exp(x))


def _oracle(
    z1: Tensor, z2: Tensor, temperature: float, normalize: bool, negative_weight: str
) -> list[list[float]]:
    """ℓ of every anchor (n, v), one pair at a time: the positive is the other view of sample n,
    the negatives every view of every other sample."""
    N = z1.shape[0]
    views = [z1.tolist(), z2.tolist()]

    def vector(n: int, v: int) -> list[float]:
        x = views[v][n]
        if not normalize:
            return x
        norm = math.sqrt(sum(a * a for a in x))
        return [a / norm for a in x]

    def sim(a: list[float], b: list[float]) -> float:
        return sum(x * y for x, y in zip(a, b, strict=True)) / temperature

    losses = [[0.0, 0.0] for _ in range(N)]
    for n in range(N):
        for v in range(2):
            anchor = vector(n, v)
            loss = -_log_sigmoid(sim(anchor, vector(n, 1 - v)))
            negatives = [
                -_log_sigmoid(-sim(anchor, vector(m, u)))
                for m in range(N)
                if m != n
                for u in range(2)
            ]
            weight = 1.0 / len(negatives) if negative_weight == "mean" and negatives else 1.0
            losses[n][v] = loss + weight * sum(negatives)
    return losses


def _pair(N: int, D: int, seed: int) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(N, D, generator=g, dtype=F64), torch.randn(N, D, generator=g, dtype=F64)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("N", [1, 2, 5])
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("negative_weight", ["mean", "sum"])
def test_nt_logistic_matches_loop_oracle(
    seed: int, N: int, normalize: bool, negative_weight: str
) -> None:
    z1, z2 = _pair(N, 4, seed)
    temperature = (0.1, 0.5, 1.3)[seed]
    expected = torch.tensor(_oracle(z1, z2, temperature, normalize, negative_weight), dtype=F64)
    kwargs = {"temperature": temperature, "normalize": normalize}
    per_anchor = nt_logistic_loss(
        z1, z2, **kwargs, negative_weight=negative_weight, reduction="none"
    )
    torch.testing.assert_close(per_anchor, expected, rtol=1e-10, atol=1e-12)
    mean = nt_logistic_loss(z1, z2, **kwargs, negative_weight=negative_weight)
    total = nt_logistic_loss(z1, z2, **kwargs, negative_weight=negative_weight, reduction="sum")
    torch.testing.assert_close(mean, expected.mean(), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(total, expected.sum(), rtol=1e-10, atol=1e-12)


def test_identical_embeddings_give_the_closed_form() -> None:
    """All views equal: every cosine is 1, so ℓ = softplus(−1/τ) + w·(2N−2)·softplus(1/τ)."""
    N, tau = 3, 0.5
    z = torch.ones(N, 4, dtype=F64)
    pos, neg = math.log1p(math.exp(-1 / tau)), math.log1p(math.exp(1 / tau))
    got_mean = nt_logistic_loss(z, z, temperature=tau)
    got_sum = nt_logistic_loss(z, z, temperature=tau, negative_weight="sum")
    assert got_mean.item() == pytest.approx(pos + neg, rel=1e-12)
    assert got_sum.item() == pytest.approx(pos + (2 * N - 2) * neg, rel=1e-12)


def test_one_sample_has_no_negatives() -> None:
    """N = 1: the loss is the positive term alone, −log σ(s/τ), with either weighting."""
    z1, z2 = _pair(1, 3, 0)
    s = F.cosine_similarity(z1, z2).item()
    for weight in ("mean", "sum"):
        got = nt_logistic_loss(z1, z2, temperature=0.2, negative_weight=weight)
        assert got.item() == pytest.approx(-_log_sigmoid(s / 0.2), rel=1e-12)


def test_invariances_view_swap_rescaling_permutation_and_inputs_unchanged() -> None:
    z1, z2 = _pair(6, 5, 3)
    before = (z1.clone(), z2.clone())
    loss = nt_logistic_loss(z1, z2, temperature=0.3)
    torch.testing.assert_close(nt_logistic_loss(z2, z1, temperature=0.3), loss)
    torch.testing.assert_close(nt_logistic_loss(3.0 * z1, 0.5 * z2, temperature=0.3), loss)
    perm = torch.randperm(6, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(nt_logistic_loss(z1[perm], z2[perm], temperature=0.3), loss)
    assert torch.equal(z1, before[0]) and torch.equal(z2, before[1])
    # without normalisation, rescaling changes the logits
    raw = nt_logistic_loss(z1, z2, temperature=0.3, normalize=False)
    assert not torch.allclose(nt_logistic_loss(3 * z1, z2, temperature=0.3, normalize=False), raw)


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("negative_weight", ["mean", "sum"])
def test_gradcheck(normalize: bool, negative_weight: str) -> None:
    z1, z2 = _pair(4, 3, 5)
    z1.requires_grad_(True)
    z2.requires_grad_(True)

    def fn(a: Tensor, b: Tensor) -> Tensor:
        return nt_logistic_loss(
            a, b, temperature=0.7, normalize=normalize, negative_weight=negative_weight
        )

    assert torch.autograd.gradcheck(fn, (z1, z2), eps=1e-6, atol=1e-8)


def test_gradient_pulls_positives_together_and_pushes_negatives_apart() -> None:
    """A step down the gradient raises the positive cosine and lowers the negative ones."""
    z1, z2 = _pair(4, 8, 7)
    z1.requires_grad_(True)
    loss = nt_logistic_loss(z1, z2, temperature=0.5)
    (grad,) = torch.autograd.grad(loss, z1)
    moved = z1.detach() - 0.05 * grad
    cos = F.normalize(moved, dim=1) @ F.normalize(z2, dim=1).T  # (N, N)
    cos0 = F.normalize(z1.detach(), dim=1) @ F.normalize(z2, dim=1).T
    assert bool((cos.diagonal() > cos0.diagonal()).all())
    off = ~torch.eye(4, dtype=torch.bool)
    assert cos[off].sum() < cos0[off].sum()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_empty_batch_gives_zero_loss_and_zero_gradient(reduction: str) -> None:
    """The rule of shared.losses.core: no rows, a zero loss that still runs backward."""
    torch.manual_seed(0)
    layer = nn.Linear(4, 2 * 5).double()
    x = layer(torch.empty(0, 4, dtype=F64)).view(0, 2, 5)  # (0, V, D)
    loss = nt_logistic_loss(x[:, 0], x[:, 1], reduction=reduction)
    if reduction == "none":
        assert loss.shape == (0, 2)
    else:
        assert loss.shape == () and loss.item() == 0.0
    assert loss.grad_fn is not None
    loss.sum().backward()
    for param in layer.parameters():
        assert param.grad is not None and torch.equal(param.grad, torch.zeros_like(param.grad))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_inputs_compute_in_float32(dtype: torch.dtype) -> None:
    z1, z2 = _pair(8, 16, 9)
    got = nt_logistic_loss(z1.to(dtype), z2.to(dtype), temperature=0.1)
    assert got.dtype == torch.float32 and torch.isfinite(got)
    ref = nt_logistic_loss(z1.to(dtype).double(), z2.to(dtype).double(), temperature=0.1)
    assert got.item() == pytest.approx(ref.item(), rel=1e-5)


def test_module_delegates_to_the_function() -> None:
    z1, z2 = _pair(5, 3, 11)
    module = NTLogisticLoss(
        temperature=0.3, normalize=False, negative_weight="sum", reduction="none"
    )
    expected = nt_logistic_loss(
        z1, z2, temperature=0.3, normalize=False, negative_weight="sum", reduction="none"
    )
    assert torch.equal(module(z1, z2), expected)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda z: nt_logistic_loss(z, z, temperature=0.0), "temperature must be a finite"),
        (lambda z: nt_logistic_loss(z, z[:2]), "must have the same shape"),
        (lambda z: nt_logistic_loss(z, z, negative_weight="max"), "negative_weight must be"),
        (lambda z: nt_logistic_loss(z, z, reduction="avg"), "reduction must be one of"),
        (lambda z: nt_logistic_loss(z[0], z[0]), "z1 must have 2 dims"),
        (lambda z: NTLogisticLoss(negative_weight="max"), "negative_weight must be"),
    ],
)
def test_bad_input_raises_value_error_naming_the_problem(call: object, message: str) -> None:
    z = torch.randn(3, 4)
    with pytest.raises(ValueError, match=message):
        call(z)
