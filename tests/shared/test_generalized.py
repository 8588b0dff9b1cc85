"""Executable specification of the generalized contrastive loss (Chen, Luo & Li 2021) and of the
alignment / uniformity metrics (Wang & Isola 2020): loop oracles transcribing the TF2 notebook
``colabs/intriguing_properties/generalized_contrastive_loss.ipynb``, analytic values,
invariances, gradients, a small learning check and bad input. Everything is float64."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from shared.checkpoint import load_checkpoint, save_checkpoint
from shared.losses import (
    GeneralizedContrastiveLoss,
    alignment,
    generalized_contrastive_loss,
    random_orthogonal,
    sample_prior,
    sliced_wasserstein_distance,
    uniformity,
)

F64 = torch.float64
SEEDS = (0, 1, 2)
SWD_PRIORS = ("uniform_hypersphere", "normal", "uniform_hypercube")
ALL_PRIORS = (*SWD_PRIORS, "decoupled_nt_xent")
# our prior name -> the notebook's (dist, hidden_norm) configuration (its docstring)
NOTEBOOK_CONFIG = {
    "decoupled_nt_xent": ("logsumexp", True),
    "normal": ("normal", False),
    "uniform_hypersphere": ("normal", True),
    "uniform_hypercube": ("uniform", False),
}
# (lam, temperature, scale) per seed, so the oracle sees more than the defaults
HYPER = {0: (1.0, 1.0, 1.0), 1: (0.5, 0.2, 2.0), 2: (3.0, 0.7, 0.1)}

Rows = list[list[float]]


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Every tensor here is tiny; the QR of each random projection spends its time in thread
    hand-offs (tens of times slower with 2 threads on a busy 2-core machine), so run on one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ---------------------------------------------------------------- loop oracles (notebook)


def _lse(values: list[float]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def _l2_normalize(rows: Rows) -> Rows:
    """tf.math.l2_normalize(x, -1), row by row."""
    return [[v / math.sqrt(sum(u * u for u in row)) for v in row] for row in rows]


def _matmul(a: Rows, b: Rows) -> Rows:
    return [
        [sum(a[i][k] * b[k][j] for k in range(len(b))) for j in range(len(b[0]))]
        for i in range(len(a))
    ]


def swd_oracle(states: Rows, states_prior: Rows, rand_w: Rows) -> float:
    """get_swd_loss after the prior is drawn: project both, sort each projection over the batch
    (one column at a time), mean of the squared differences of the sorted values."""
    proj, proj_prior = _matmul(states, rand_w), _matmul(states_prior, rand_w)
    n, p = len(proj), len(rand_w[0])
    total = 0.0
    for c in range(p):
        xs = sorted(proj[i][c] for i in range(n))
        ps = sorted(proj_prior[i][c] for i in range(n))
        total += sum((pv - xv) ** 2 for pv, xv in zip(ps, xs, strict=True))
    return total / (n * p)


def notebook_loss(
    hidden1: Tensor,
    hidden2: Tensor,
    *,
    dist: str,
    hidden_norm: bool,
    lambda_weight: float,
    temperature: float,
    loss_scaling: float,
    prior_draw: Tensor | None = None,
    rand_w: Tensor | None = None,
) -> float:
    """generalized_contrastive_loss of the notebook, literally, with python loops. ``prior_draw``
    is the raw N(0,1) or U(−1,1) sample of the SWD prior (hidden_norm is applied here, as in
    get_swd_loss) and ``rand_w`` the orthogonal matrix."""
    h1, h2 = hidden1.tolist(), hidden2.tolist()
    n, d = len(h1), len(h1[0])
    if hidden_norm:
        h1, h2 = _l2_normalize(h1), _l2_normalize(h2)
    loss_align = (
        sum(
            (a - b) ** 2 for r1, r2 in zip(h1, h2, strict=True) for a, b in zip(r1, r2, strict=True)
        )
        / (n * d)
        / 2
    )
    hiddens = h1 + h2
    if dist == "logsumexp":
        bias = math.log(d)
        per_row = [
            _lse([sum(a * b for a, b in zip(hi, hk, strict=True)) / temperature for hk in hiddens])
            - bias
            for hi in hiddens
        ]
        loss_dist_match = sum(per_row) / len(per_row)
    else:
        assert prior_draw is not None and rand_w is not None
        states_prior = prior_draw.tolist()
        if hidden_norm:
            states_prior = _l2_normalize(states_prior)
        loss_dist_match = swd_oracle(hiddens, states_prior, rand_w.tolist())
    return float(loss_scaling * (loss_align + lambda_weight * loss_dist_match))


def _redraw(prior: str, n_rows: int, d: int, seed: int) -> tuple[Tensor, Tensor]:
    """The prior draw and W our loss makes from ``seed``, in its order: prior samples, then W.
    The hypersphere prior is drawn as plain normal samples: the oracle normalises them itself."""
    g = torch.Generator().manual_seed(seed)
    raw_prior = "normal" if prior == "uniform_hypersphere" else prior
    draw = sample_prior(raw_prior, (n_rows, d), generator=g, dtype=F64)  # type: ignore[arg-type]
    w = random_orthogonal(d, generator=g, dtype=F64)
    return draw, w


def _views(seed: int, N: int, D: int) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(1000 + seed)
    h1 = torch.randn(N, D, generator=g, dtype=F64) * 1.5 + 0.2
    h2 = h1 + 0.7 * torch.randn(N, D, generator=g, dtype=F64)
    return h1, h2


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("N", "D"), [(1, 3), (2, 1), (3, 2), (5, 4), (8, 6)])
@pytest.mark.parametrize("prior", ALL_PRIORS)
def test_loss_matches_notebook_oracle(seed: int, N: int, D: int, prior: str) -> None:
    h1, h2 = _views(seed, N, D)
    lam, tau, scale = HYPER[seed]
    got = generalized_contrastive_loss(
        h1,
        h2,
        prior=prior,
        lam=lam,
        temperature=tau,
        scale=scale,  # type: ignore[arg-type]
        generator=_gen(seed),
    )
    assert got.dtype == F64 and got.shape == ()
    dist, hidden_norm = NOTEBOOK_CONFIG[prior]
    draw, w = _redraw(prior, 2 * N, D, seed) if prior in SWD_PRIORS else (None, None)
    want = notebook_loss(
        h1,
        h2,
        dist=dist,
        hidden_norm=hidden_norm,
        lambda_weight=lam,
        temperature=tau,
        loss_scaling=scale,
        prior_draw=draw,
        rand_w=w,
    )
    assert got.item() == pytest.approx(want, abs=1e-10, rel=0)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("N", "D"), [(1, 2), (4, 1), (6, 3)])
@pytest.mark.parametrize("projections", [None, 1, "2D+1"])
def test_sliced_wasserstein_matches_loop_oracle(
    seed: int, N: int, D: int, projections: int | str | None
) -> None:
    g = _gen(500 + seed)
    x = torch.randn(N, D, generator=g, dtype=F64) * 2
    prior = torch.rand(N, D, generator=g, dtype=F64) * 3 - 1
    P = 2 * D + 1 if projections == "2D+1" else projections
    assert P is None or isinstance(P, int)
    got = sliced_wasserstein_distance(x, prior, num_projections=P, generator=_gen(seed))
    # W: ceil(P/D) orthogonal D×D blocks drawn one after the other, first P columns
    g_w = _gen(seed)
    n_blocks = 1 if P is None else math.ceil(P / D)
    blocks = [random_orthogonal(D, generator=g_w, dtype=F64) for _ in range(n_blocks)]
    w = torch.cat(blocks, dim=1)[:, : (D if P is None else P)]
    assert got.item() == pytest.approx(
        swd_oracle(x.tolist(), prior.tolist(), w.tolist()), abs=1e-10, rel=0
    )


# ---------------------------------------------------------------- analytic


@pytest.mark.parametrize("projections", [None, 1, 2, 7])
def test_swd_of_a_set_with_itself_is_zero(projections: int | None) -> None:
    x = torch.randn(9, 3, generator=_gen(0), dtype=F64)
    for seed in SEEDS:
        d = sliced_wasserstein_distance(
            x, x.clone(), num_projections=projections, generator=_gen(seed)
        )
        assert d.item() == 0.0
    # a batch permutation of the prior samples changes nothing either: sorting forgets the order
    perm = torch.randperm(9, generator=_gen(3))
    assert sliced_wasserstein_distance(x, x[perm], generator=_gen(1)).item() == pytest.approx(
        0.0, abs=1e-14
    )


@pytest.mark.parametrize("prior", ALL_PRIORS)
def test_alignment_vanishes_for_identical_views(prior: str) -> None:
    h, _ = _views(0, 5, 4)
    loss = generalized_contrastive_loss(h, h.clone(), prior=prior, lam=0.0, generator=_gen(0))  # type: ignore[arg-type]
    assert loss.item() == 0.0


@pytest.mark.parametrize(("N", "D", "tau"), [(1, 1, 1.0), (1, 4, 0.5), (3, 2, 0.1), (6, 5, 2.0)])
def test_decoupled_with_identical_rows_is_closed_form(N: int, D: int, tau: float) -> None:
    row = torch.randn(1, D, generator=_gen(N), dtype=F64)
    h1 = row.expand(N, D) * 3.0  # the norm does not matter: rows are normalised
    h2 = row.expand(N, D).clone()
    loss = generalized_contrastive_loss(h1, h2, prior="decoupled_nt_xent", temperature=tau)
    # align = 0; every logit is 1/τ, so each of the 2N rows gives 1/τ + log(2N) − log D
    want = 1 / tau + math.log(2 * N) - math.log(D)
    assert loss.item() == pytest.approx(want, abs=1e-12, rel=0)


@pytest.mark.parametrize("dim", [1, 2, 5, 16])
def test_random_orthogonal_is_orthogonal_and_reproducible(dim: int) -> None:
    w = random_orthogonal(dim, generator=_gen(7), dtype=F64)
    assert w.shape == (dim, dim) and w.dtype == F64
    eye = torch.eye(dim, dtype=F64)
    torch.testing.assert_close(w @ w.T, eye, atol=1e-12, rtol=0)
    torch.testing.assert_close(w.T @ w, eye, atol=1e-12, rtol=0)
    assert torch.equal(w, random_orthogonal(dim, generator=_gen(7), dtype=F64))
    if dim > 1:
        assert not torch.allclose(w, random_orthogonal(dim, generator=_gen(8), dtype=F64))
    # Keras' convention: W is the Q of the Gaussian draw with R's diagonal made positive
    gauss = torch.randn(dim, dim, generator=_gen(7), dtype=F64)
    r = w.T @ gauss
    torch.testing.assert_close(torch.tril(r, diagonal=-1), torch.zeros_like(r), atol=1e-12, rtol=0)
    assert bool((torch.diagonal(r) > 0).all())
    # the dtype argument only casts the result
    w32 = random_orthogonal(dim, generator=_gen(7))
    assert w32.dtype == torch.float32
    torch.testing.assert_close(w32, w.float())


def test_prior_samples_have_the_stated_support() -> None:
    shape = (4000, 3)
    sphere = sample_prior("uniform_hypersphere", shape, generator=_gen(0), dtype=F64)
    assert tuple(sphere.shape) == shape and sphere.dtype == F64
    torch.testing.assert_close(sphere.norm(dim=1), torch.ones(shape[0], dtype=F64))
    # hypersphere = the normal draw of the same seed, row-normalised (the notebook's recipe)
    normal = sample_prior("normal", shape, generator=_gen(0), dtype=F64)
    torch.testing.assert_close(sphere, F.normalize(normal, dim=1), atol=1e-15, rtol=0)
    assert abs(normal.mean().item()) < 0.05 and abs(normal.std().item() - 1) < 0.05
    cube = sample_prior("uniform_hypercube", shape, generator=_gen(0), dtype=F64)
    assert cube.min().item() >= -1 and cube.max().item() <= 1
    assert cube.min().item() < -0.99 and cube.max().item() > 0.99  # U(−1, 1), not U(0, 1)
    assert abs(cube.mean().item()) < 0.05 and abs(cube.var().item() - 1 / 3) < 0.02
    assert torch.equal(cube, sample_prior("uniform_hypercube", shape, generator=_gen(0), dtype=F64))


def test_more_projections_than_dims_uses_p_columns() -> None:
    x = torch.randn(10, 3, generator=_gen(0), dtype=F64)
    prior = torch.randn(10, 3, generator=_gen(1), dtype=F64)
    d3 = sliced_wasserstein_distance(x, prior, generator=_gen(2))
    d7 = sliced_wasserstein_distance(x, prior, num_projections=7, generator=_gen(2))
    assert torch.isfinite(d7) and d7.item() != pytest.approx(d3.item(), abs=1e-6)
    # the first D projections are the default ones; the remaining 4 are columns of new blocks
    g = _gen(2)
    w = torch.cat([random_orthogonal(3, generator=g, dtype=F64) for _ in range(3)], dim=1)
    per_column = (
        (torch.sort(prior @ w, dim=0).values - torch.sort(x @ w, dim=0).values).pow(2).mean(dim=0)
    )
    assert d3.item() == pytest.approx(per_column[:3].mean().item(), abs=1e-12)
    assert d7.item() == pytest.approx(per_column[:7].mean().item(), abs=1e-12)
    assert d7.item() != pytest.approx(per_column[:6].mean().item(), abs=1e-6)


# ---------------------------------------------------------------- invariances / properties


@pytest.mark.parametrize("prior", ALL_PRIORS)
def test_swapping_views_and_permuting_the_batch(prior: str) -> None:
    h1, h2 = _views(1, 6, 4)
    kw = {"prior": prior, "temperature": 0.3, "lam": 0.8}
    base = generalized_contrastive_loss(h1, h2, generator=_gen(4), **kw)  # type: ignore[arg-type]
    swapped = generalized_contrastive_loss(h2, h1, generator=_gen(4), **kw)  # type: ignore[arg-type]
    perm = torch.randperm(6, generator=_gen(9))
    permuted = generalized_contrastive_loss(h1[perm], h2[perm], generator=_gen(4), **kw)  # type: ignore[arg-type]
    assert swapped.item() == pytest.approx(base.item(), abs=1e-12, rel=0)
    assert permuted.item() == pytest.approx(base.item(), abs=1e-12, rel=0)


@pytest.mark.parametrize("prior", ALL_PRIORS)
def test_scale_lambda_and_alignment_only(prior: str) -> None:
    h1, h2 = _views(2, 5, 3)

    def loss(**kw: float) -> float:
        return generalized_contrastive_loss(
            h1,
            h2,
            prior=prior,
            temperature=0.4,
            generator=_gen(11),
            **kw,  # type: ignore[arg-type]
        ).item()

    assert loss(scale=3.5) == pytest.approx(3.5 * loss(scale=1.0), abs=1e-12, rel=0)
    # lam = 0 leaves the notebook's alignment term only (normalised iff the variant normalises)
    normalise = NOTEBOOK_CONFIG[prior][1]
    a, b = (F.normalize(h1, dim=1), F.normalize(h2, dim=1)) if normalise else (h1, h2)
    align = (a - b).pow(2).mean().item() / 2
    assert loss(lam=0.0) == pytest.approx(align, abs=1e-12, rel=0)
    assert loss(lam=0.0, scale=2.0) == pytest.approx(2 * align, abs=1e-12, rel=0)
    # and λ enters linearly
    dist = loss(lam=1.0) - align
    assert dist > 0
    assert loss(lam=2.5) == pytest.approx(align + 2.5 * dist, abs=1e-12, rel=0)


@pytest.mark.parametrize("prior", SWD_PRIORS)
def test_seeded_generator_fixes_the_swd_loss(prior: str) -> None:
    h1, h2 = _views(0, 7, 4)

    def loss(seed: int, **kw: float) -> float:
        return generalized_contrastive_loss(h1, h2, prior=prior, generator=_gen(seed), **kw).item()  # type: ignore[arg-type]

    assert loss(5) == loss(5)
    assert loss(5) != pytest.approx(loss(6), abs=1e-9)
    assert loss(5, temperature=0.1) == loss(5)  # τ only acts on the decoupled variant
    # the module form with a seed walks the same stream as one seeded generator
    module = GeneralizedContrastiveLoss(prior=prior, lam=0.6, scale=1.3, seed=21)  # type: ignore[arg-type]
    g = _gen(21)
    for _ in range(2):
        want = generalized_contrastive_loss(h1, h2, prior=prior, lam=0.6, scale=1.3, generator=g)  # type: ignore[arg-type]
        assert module(h1, h2).item() == want.item()


@pytest.mark.parametrize("prior", SWD_PRIORS)
def test_seeded_module_draws_a_reproducible_stream_on_the_inputs_device(prior: str) -> None:
    h1, h2 = _views(3, 6, 4)

    def losses(seed: int) -> list[float]:
        module = GeneralizedContrastiveLoss(prior=prior, seed=seed)  # type: ignore[arg-type]
        values = [module(h1, h2).item() for _ in range(3)]
        # one generator for the inputs' device, made there and kept between calls
        generator = module.generator_for(h1.device)
        assert generator is not None and generator.device == h1.device
        assert module.generator_for(h1.device) is generator
        return values

    first = losses(5)
    torch.manual_seed(123)  # the global stream plays no part
    assert losses(5) == first
    assert len(set(first)) == 3  # successive calls draw fresh numbers
    assert all(a != pytest.approx(b, abs=1e-9) for a, b in zip(first, losses(6), strict=True))
    assert GeneralizedContrastiveLoss(prior=prior).generator_for(h1.device) is None  # type: ignore[arg-type]


def test_seeded_module_stream_survives_a_checkpoint(tmp_path: Path) -> None:
    """The generators are extra state: a resumed module continues the same stream."""
    h1, h2 = _views(3, 6, 4)
    model = nn.Sequential(nn.Linear(4, 4), GeneralizedContrastiveLoss(seed=3))
    loss = model[1]
    before = [loss(h1, h2).item() for _ in range(2)]
    save_checkpoint(tmp_path / "last.pt", {"model": model.state_dict()})
    expected = [loss(h1, h2).item() for _ in range(2)]
    restored = nn.Sequential(nn.Linear(4, 4), GeneralizedContrastiveLoss(seed=3))
    restored.load_state_dict(load_checkpoint(tmp_path / "last.pt")["model"])
    assert [restored[1](h1, h2).item() for _ in range(2)] == expected
    assert expected != before
    fresh = GeneralizedContrastiveLoss(seed=3)
    assert fresh.state_dict()["_extra_state"] == {}  # nothing drawn yet: the seed's start
    fresh.load_state_dict(fresh.state_dict())
    assert fresh(h1, h2).item() == before[0]


def test_generator_on_another_device_raises_naming_both() -> None:
    h = torch.randn(4, 3, dtype=F64)
    # a stand-in for a CUDA generator, so that this runs on a CPU-only machine too
    elsewhere: Any = SimpleNamespace(device=torch.device("cuda", 0))
    message = "generator is on device cuda:0 but h1 is on device cpu"
    with pytest.raises(ValueError, match=message):
        generalized_contrastive_loss(h, h, generator=elsewhere)
    with pytest.raises(ValueError, match="generator is on device cuda:0 but x is on device cpu"):
        sliced_wasserstein_distance(h, h, generator=elsewhere)


def test_decoupled_loss_ignores_the_generator() -> None:
    h1, h2 = _views(0, 4, 3)
    kw = {"prior": "decoupled_nt_xent", "temperature": 0.2}
    a = generalized_contrastive_loss(h1, h2, generator=_gen(0), **kw)  # type: ignore[arg-type]
    b = generalized_contrastive_loss(h1, h2, generator=_gen(1), **kw)  # type: ignore[arg-type]
    assert a.item() == b.item()


@pytest.mark.parametrize("prior", ALL_PRIORS)
def test_inputs_are_not_modified(prior: str) -> None:
    h1, h2 = _views(0, 5, 3)
    h1.requires_grad_(True)
    before1, before2 = h1.detach().clone(), h2.clone()
    loss = generalized_contrastive_loss(h1, h2, prior=prior, generator=_gen(0))  # type: ignore[arg-type]
    torch.autograd.grad(loss, h1)
    assert torch.equal(h1.detach(), before1) and torch.equal(h2, before2)
    x, p = torch.randn(6, 2, dtype=F64), torch.randn(6, 2, dtype=F64)
    x0, p0 = x.clone(), p.clone()
    sliced_wasserstein_distance(x, p, num_projections=5, generator=_gen(0))
    assert torch.equal(x, x0) and torch.equal(p, p0)


# ---------------------------------------------------------------- gradients


@pytest.mark.parametrize("projections", [None, 5])
def test_gradcheck_sliced_wasserstein(projections: int | None) -> None:
    g = _gen(3)
    x = torch.randn(6, 3, generator=g, dtype=F64).requires_grad_(True)
    prior = torch.randn(6, 3, generator=g, dtype=F64).requires_grad_(True)

    def swd(a: Tensor, b: Tensor) -> Tensor:  # the same W on every call
        return sliced_wasserstein_distance(a, b, num_projections=projections, generator=_gen(0))

    assert torch.autograd.gradcheck(swd, (x, prior), eps=1e-6, atol=1e-8)


@pytest.mark.parametrize("prior", ALL_PRIORS)
def test_gradcheck_generalized_loss(prior: str) -> None:
    h1, h2 = _views(4, 4, 3)
    h1.requires_grad_(True)
    h2.requires_grad_(True)

    def loss(a: Tensor, b: Tensor) -> Tensor:
        return generalized_contrastive_loss(
            a,
            b,
            prior=prior,
            lam=0.7,
            temperature=0.5,
            scale=1.5,
            generator=_gen(2),  # type: ignore[arg-type]
        )

    assert torch.autograd.gradcheck(loss, (h1, h2), eps=1e-6, atol=1e-8)


@pytest.mark.parametrize("prior", ALL_PRIORS)
def test_gradients_are_finite(prior: str) -> None:
    random_views = _views(0, 8, 5)
    row = torch.randn(1, 5, dtype=F64, generator=_gen(1))
    collapsed = (row.expand(8, 5).clone(), row.expand(8, 5).clone())  # ties everywhere in sort
    for h1, h2 in (random_views, collapsed):
        h1, h2 = h1.clone().requires_grad_(True), h2.clone().requires_grad_(True)
        loss = generalized_contrastive_loss(h1, h2, prior=prior, generator=_gen(0))  # type: ignore[arg-type]
        g1, g2 = torch.autograd.grad(loss, (h1, h2))
        assert bool(torch.isfinite(g1).all() and torch.isfinite(g2).all())
        assert g1.abs().sum().item() + g2.abs().sum().item() > 0 or prior == "decoupled_nt_xent"


# ---------------------------------------------------------------- learning / claim check


def test_hypersphere_swd_term_spreads_collapsed_points() -> None:
    """Minimising only the uniform-hypersphere distribution term (h1 = h2, so alignment is 0)
    by plain gradient descent moves free 2-D points from a collapsed start towards a uniform
    spread on the circle (torch.optim is avoided: its first use imports the compiler stack)."""
    g = _gen(0)
    z = torch.tensor([[1.0, 0.0]], dtype=F64) + 1e-3 * torch.randn(32, 2, generator=g, dtype=F64)
    z.requires_grad_(True)

    def dist_term() -> Tensor:
        return generalized_contrastive_loss(z, z, prior="uniform_hypersphere", generator=g)

    start_uniformity, start_loss = uniformity(z.detach()).item(), dist_term().item()
    for _ in range(200):
        (grad,) = torch.autograd.grad(dist_term(), z)
        with torch.no_grad():
            z -= 5.0 * grad
    end_uniformity, end_loss = uniformity(z.detach()).item(), dist_term().item()
    # collapsed: log E exp(0) = 0; uniform on the circle: log(e^{−4} I₀(4)) ≈ −1.57 (≈ −1.70
    # for 32 evenly spaced points, distinct pairs only)
    assert start_uniformity > -1e-4
    assert end_uniformity < -1.2, (start_uniformity, end_uniformity)
    assert end_loss < 0.2 * start_loss, (start_loss, end_loss)


# ---------------------------------------------------------------- metrics


def alignment_oracle(z1: Tensor, z2: Tensor, alpha: float) -> float:
    a, b = _l2_normalize(z1.tolist()), _l2_normalize(z2.tolist())
    dists = [
        math.sqrt(sum((u - v) ** 2 for u, v in zip(ra, rb, strict=True)))
        for ra, rb in zip(a, b, strict=True)
    ]
    return float(sum(d**alpha for d in dists) / len(dists))


def uniformity_oracle(z: Tensor, t: float) -> float:
    x = _l2_normalize(z.tolist())
    n = len(x)
    terms = [
        math.exp(-t * sum((u - v) ** 2 for u, v in zip(x[i], x[j], strict=True)))
        for i in range(n)
        for j in range(i + 1, n)
    ]
    return math.log(sum(terms) / len(terms))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("N", "D"), [(1, 3), (2, 2), (7, 5)])
@pytest.mark.parametrize("alpha", [2.0, 1.0, 0.5, 3.0])
def test_alignment_matches_oracle(seed: int, N: int, D: int, alpha: float) -> None:
    z1, z2 = _views(seed, N, D)
    got = alignment(z1, z2, alpha=alpha)
    assert got.dtype == F64
    assert got.item() == pytest.approx(alignment_oracle(z1, z2, alpha), abs=1e-12, rel=0)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("N", "D"), [(2, 1), (3, 2), (9, 4)])
@pytest.mark.parametrize("t", [2.0, 0.5, 5.0])
def test_uniformity_matches_oracle(seed: int, N: int, D: int, t: float) -> None:
    z, _ = _views(seed, N, D)
    got = uniformity(z, t=t)
    assert got.dtype == F64
    assert got.item() == pytest.approx(uniformity_oracle(z, t), abs=1e-12, rel=0)


def test_metrics_closed_forms() -> None:
    z = torch.randn(5, 3, generator=_gen(0), dtype=F64)
    assert alignment(z, 4.0 * z).item() == pytest.approx(0.0, abs=1e-14)  # scale-free
    antipodal = torch.tensor([[0.0, 2.0], [0.0, -0.5]], dtype=F64)
    assert alignment(antipodal[:1], antipodal[1:]).item() == pytest.approx(4.0, abs=1e-14)
    # ‖x − y‖² = 4 for antipodal points: log exp(−t·4)
    assert uniformity(antipodal, t=2.0).item() == pytest.approx(-8.0, abs=1e-12)
    collapsed = torch.randn(1, 4, generator=_gen(1), dtype=F64).expand(6, 4) * 2
    assert uniformity(collapsed).item() == pytest.approx(0.0, abs=1e-12)


def test_metrics_bad_input() -> None:
    z = torch.randn(4, 3, dtype=F64)
    with pytest.raises(ValueError, match="z1 must have 2 dims"):
        alignment(z[0], z[0])
    with pytest.raises(ValueError, match="z1 and z2 must have the same shape"):
        alignment(z, z[:3])
    bad = z.clone()
    bad[1, 2] = float("nan")
    # values are not read (a host wait): NaN in, NaN out, and the loop checks the loss
    assert torch.isnan(alignment(z, bad))
    for alpha in (0.0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="alpha must be a finite number > 0"):
            alignment(z, z, alpha=alpha)
    with pytest.raises(ValueError, match="z must have 2 dims"):
        uniformity(z.unsqueeze(0))
    assert torch.isnan(uniformity(bad))
    with pytest.raises(ValueError, match="at least 2 rows"):
        uniformity(z[:1])
    for t in (0.0, -2.0, float("nan")):
        with pytest.raises(ValueError, match="t must be a finite number > 0"):
            uniformity(z, t=t)


# ---------------------------------------------------------------- bad input


def test_loss_bad_input_raises_value_error_naming_the_problem() -> None:
    h = torch.randn(4, 3, dtype=F64)
    with pytest.raises(ValueError, match="h1 must have 2 dims"):
        generalized_contrastive_loss(h[0], h[0])
    with pytest.raises(ValueError, match="h2 must have 2 dims"):
        generalized_contrastive_loss(h, h.unsqueeze(0))
    with pytest.raises(ValueError, match="h1 and h2 must have the same shape"):
        generalized_contrastive_loss(h, h[:3])
    with pytest.raises(ValueError, match="h1 and h2 must have the same shape"):
        generalized_contrastive_loss(h, torch.randn(4, 2, dtype=F64))
    nan = h.clone()
    nan[0, 0] = float("nan")
    # values are not read (a host wait): NaN in, NaN out, and the loop checks the loss
    assert torch.isnan(generalized_contrastive_loss(nan, h))
    inf = h.clone()
    inf[2, 1] = float("inf")
    assert not torch.isfinite(generalized_contrastive_loss(h, inf))
    with pytest.raises(ValueError, match="h1 must be a floating tensor"):
        generalized_contrastive_loss(torch.ones(4, 3, dtype=torch.long), h)
    with pytest.raises(ValueError, match="prior must be one of"):
        generalized_contrastive_loss(h, h, prior="laplace")  # type: ignore[arg-type]
    for tau in (0.0, -0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
            generalized_contrastive_loss(h, h, prior="decoupled_nt_xent", temperature=tau)
    for lam in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="lam must be a finite number >= 0"):
            generalized_contrastive_loss(h, h, lam=lam)
    with pytest.raises(ValueError, match="prior must be one of"):
        GeneralizedContrastiveLoss(prior="laplace")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
        GeneralizedContrastiveLoss(temperature=0.0)
    with pytest.raises(ValueError, match="lam must be a finite number >= 0"):
        GeneralizedContrastiveLoss(lam=-1.0)(h, h)


def test_swd_and_prior_bad_input() -> None:
    x = torch.randn(5, 3, dtype=F64)
    with pytest.raises(ValueError, match="x and prior_samples must have the same shape"):
        sliced_wasserstein_distance(x, x[:4])
    with pytest.raises(ValueError, match="prior_samples must have 2 dims"):
        sliced_wasserstein_distance(x, x[0])
    nan = x.clone()
    nan[0, 0] = float("nan")
    # values are not read (a host wait): NaN in, NaN out, and the loop checks the loss
    assert torch.isnan(sliced_wasserstein_distance(nan, x))
    for p in (0, -2):
        with pytest.raises(ValueError, match="num_projections must be >= 1"):
            sliced_wasserstein_distance(x, x, num_projections=p)
    for prior in ("decoupled_nt_xent", "gaussian"):  # decoupled is not a sampling prior
        with pytest.raises(ValueError, match="prior must be one of"):
            sample_prior(prior, (3, 2))  # type: ignore[arg-type]
