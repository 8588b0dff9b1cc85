"""CUDA specification: the losses, the gradient-correct gather and the training loop on a GPU.

Every test here carries the ``cuda`` marker (``pytest -m cuda`` selects exactly this file) and
is skipped, with the reason shown by ``-rs``, where it cannot run; the CI run (no GPU) collects
them and reports them skipped.

* losses: every loss of :mod:`shared.losses` (``info_nce_loss`` included) in fp32 and under
  bf16 autocast, dense and blockwise;
  values and input gradients against the float64 CPU computation of the same loss;
* ``GeneralizedContrastiveLoss(seed=...)``: the seed fixes the draws on the device;
* ``gather_with_grad`` with 2 nccl processes (needs 2 GPUs): gathered rows, gradients, and the
  ``gather=True`` losses equal one process holding the whole batch;
* :func:`shared.train.fit` with bf16 autocast: a crash and a resume end with the weights of an
  uninterrupted run.

``CONTRASTKIT_TEST_DEVICE`` picks the device the bodies run on: ``cuda`` (the default, also
``cuda:1`` etc.) or ``cpu``. With ``CONTRASTKIT_TEST_DEVICE=cpu`` the same tests run on the CPU
(bf16 autocast with ``device_type="cpu"``, the 2-process test with gloo instead of nccl), which
checks the test bodies themselves on a machine without a GPU::

    CONTRASTKIT_TEST_DEVICE=cpu python -m pytest -q -p no:xdist -m cuda tests  # bodies on CPU
    python -m pytest -q -p no:xdist -m cuda -rs tests                          # on a GPU
"""

from __future__ import annotations

import io
import os
import socket
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Literal, NamedTuple

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import TensorDataset

from shared.checkpoint import load_checkpoint
from shared.distributed import all_reduce_mean, gather_with_grad
from shared.losses import (
    GeneralizedContrastiveLoss,
    conditional_contrastive_loss,
    data_to_data_cross_entropy_loss,
    generalized_contrastive_loss,
    graphcl_loss,
    info_nce_loss,
    masked_logsumexp,
    npairs_loss,
    nt_xent_loss,
    random_orthogonal,
    sample_prior,
    supcon_loss,
    triplet_loss,
)
from shared.runs import RunDir
from shared.runtime import make_loader, seed_everything
from shared.train import LoopConfig, fit
from tests.processes import exit_without_teardown

DEVICE_VARIABLE = "CONTRASTKIT_TEST_DEVICE"
DEVICE = torch.device(os.environ.get(DEVICE_VARIABLE, "cuda"))
if DEVICE.type not in ("cuda", "cpu"):
    raise ValueError(f"{DEVICE_VARIABLE} must name a cuda or cpu device, got {DEVICE}")
ON_CUDA = DEVICE.type == "cuda"

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        ON_CUDA and not torch.cuda.is_available(),
        reason=f"CUDA is not available: run on a GPU, or set {DEVICE_VARIABLE}=cpu to run the "
        "same test bodies on the CPU",
    ),
]

N, D_IN, D = 12, 8, 8  # samples, input width, width of one view
BLOCK = 7  # forces the blockwise path with a partial last block (N·V = 24 anchor rows)
# class 3 has one sample: SupCon anchors whose only positive is their other view, 2C anchors
# without a same-class embedding
LABELS = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 3])
SWD_PRIORS = ("uniform_hypersphere", "normal", "uniform_hypercube")
Precision = Literal["fp32", "bf16"]

# fp32: the inputs are the same fp32 numbers on both sides; only fp32 rounding in the matmul and
# the loss maths separates the two (a few 1e-7 relative), so 1e-5 is tight.
FP32_RTOL = 1e-5
# bf16, end to end: autocast rounds x and W to bf16 (relative 2^-9 each) before the matmul and
# rounds its output again, so the features the loss sees are off by ~3·2^-9 ≈ 6e-3 relative;
# τ ≤ 0.5 multiplies those errors in the logits, and the backward matmul runs in bf16 too. The
# loss maths itself runs in fp32 (checked separately to 1e-5 on the bf16 features), so the
# looser tolerance only covers the rounding of the inputs. Measured: at most 1.3e-2 (the
# labelled SupCon L_in), so 5e-2 leaves a margin for a GPU's different summation order.
BF16_END_TO_END_RTOL = 5e-2
# bf16 features: their gradient is stored in bf16, one rounding of the fp32 gradient (2^-9),
# two where a loss uses a feature twice.
BF16_GRAD_RTOL = 2**-7


@pytest.fixture
def device() -> torch.device:
    return DEVICE


def _autocast(device: torch.device, precision: Precision) -> AbstractContextManager[Any]:
    """The autocast of a training step: bf16 on ``device``, or none for fp32."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


def _assert_close(actual: Tensor, expected: Tensor, rtol: float, what: str) -> None:
    """Relative closeness, with the absolute slack scaled to the largest expected entry (a
    gradient entry near zero is compared at the precision of its tensor, not its own)."""
    expected = expected.detach().double()
    torch.testing.assert_close(
        actual.detach().cpu().double(),
        expected,
        rtol=rtol,
        atol=rtol * float(expected.abs().max()),
        msg=lambda message: f"{what}: {message}",
    )


# ---------------------------------------------------------------- the losses

LossFn = Callable[[Tensor, Tensor, int | None], Tensor]  # (features, labels, block_size)


class Case(NamedTuple):
    """A loss on features ``(N, 3D)`` holding three views; ``blockwise``: takes block_size."""

    loss: LossFn
    blockwise: bool = True


def _views(z: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Three ``(N, D)`` views of the features ``(N, 3D)``."""
    return z[:, :D], z[:, D : 2 * D], z[:, 2 * D :]


def _supcon(variant: str, mode: str, labelled: bool) -> Case:
    def loss(z: Tensor, labels: Tensor, block_size: int | None) -> Tensor:
        features = z[:, : 2 * D].reshape(N, 2, D)  # (N, 2, D)
        return supcon_loss(
            features,
            labels if labelled else None,
            temperature=0.1,
            variant=variant,
            contrast_mode=mode,
            block_size=block_size,  # type: ignore[arg-type]
        )

    return Case(loss)


def _lse_loss(z: Tensor, labels: Tensor, block_size: int | None, temperature: float) -> Tensor:
    """Both sums of the core, anchors of view 1 against view 2; -inf positive sums left out."""
    v1, v2, _ = _views(z)
    own = torch.arange(N, device=z.device)
    lse = masked_logsumexp(
        v1,
        v2,
        temperature=temperature,
        self_index=own,
        anchor_labels=labels,
        contrast_labels=labels,
        block_size=block_size,
    )
    assert lse.positive is not None
    positive = torch.where(torch.isfinite(lse.positive), lse.positive, 0.0)  # (N,)
    return lse.all.mean() - positive.mean()


CASES: dict[str, Case] = {
    "nt_xent": Case(lambda z, y, b: nt_xent_loss(*_views(z)[:2], temperature=0.5, block_size=b)),
    **{
        f"supcon_{variant}_{mode}_{'labelled' if labelled else 'unlabelled'}": _supcon(
            variant, mode, labelled
        )
        for variant in ("out", "in")
        for mode in ("all", "one")
        for labelled in (True, False)
    },
    "graphcl": Case(lambda z, y, b: graphcl_loss(*_views(z)[:2], temperature=0.2, block_size=b)),
    "npairs": Case(lambda z, y, b: npairs_loss(*_views(z)[:2], temperature=0.5, block_size=b)),
    "npairs_unnormalized": Case(
        lambda z, y, b: npairs_loss(*_views(z)[:2], normalize=False, block_size=b)
    ),
    "triplet": Case(lambda z, y, b: triplet_loss(*_views(z), margin=0.2), blockwise=False),
    "triplet_unnormalized": Case(
        lambda z, y, b: triplet_loss(*_views(z), margin=0.2, normalize=False), blockwise=False
    ),
    "conditional": Case(
        lambda z, y, b: conditional_contrastive_loss(
            *_views(z)[:2], y, temperature=0.5, block_size=b
        )
    ),
    "conditional_proxy": Case(
        lambda z, y, b: conditional_contrastive_loss(
            *_views(z)[:2], y, temperature=0.1, positives="proxy", block_size=b
        )
    ),
    **{
        f"d2d_ce_{form}": Case(
            lambda z, y, b, form=form: data_to_data_cross_entropy_loss(
                *_views(z)[:2], y, form=form, block_size=b
            )
        )
        for form in ("studiogan", "paper")
    },
    "generalized_decoupled_nt_xent": Case(
        lambda z, y, b: generalized_contrastive_loss(
            *_views(z)[:2], prior="decoupled_nt_xent", lam=0.7, temperature=0.5
        ),
        blockwise=False,
    ),
    # one tensor as anchors and contrasts: the core's symmetric backward
    "masked_logsumexp_symmetric": Case(
        lambda z, y, b: masked_logsumexp(
            z[:, :D],
            z[:, :D],
            temperature=0.5,
            self_index="diagonal",
            block_size=b,
        ).all.mean()
    ),
    # rows of norm ~3-4 at τ = 0.5: the constant-shift exponentials (shift ≈ 7 in fp32)
    "masked_logsumexp_labelled": Case(lambda z, y, b: _lse_loss(z, y, b, temperature=0.5)),
    # the same at τ = 0.2: the logit bound (~120) is too large, the max-shifted fallback runs
    "masked_logsumexp_max_shifted": Case(lambda z, y, b: _lse_loss(z, y, b, temperature=0.2)),
    "info_nce": Case(lambda z, y, b: info_nce_loss(*_views(z)[:2], temperature=0.1, block_size=b)),
    # K = N negatives shared by every query (a MoCo queue)
    "info_nce_shared_negatives": Case(
        lambda z, y, b: info_nce_loss(*_views(z), temperature=0.1, block_size=b)
    ),
    "info_nce_per_query_negatives": Case(
        lambda z, y, b: info_nce_loss(
            *_views(z)[:2],
            torch.stack([z[:, 2 * D :], z[:, 2 * D :].roll(1, 0)], dim=1),
            temperature=0.1,
        ),  # negatives (N, 2, D)
        blockwise=False,
    ),
}
# Known defects, strict: the test turns red once the loss is fixed, so the entry gets removed.
BF16_BUGS: dict[str, str] = {}


def _loss_params(known_bugs: dict[str, str]) -> list[Any]:
    return [
        pytest.param(
            name,
            block_size,
            id=f"{name}-{'dense' if block_size is None else 'blocks'}",
            marks=[pytest.mark.xfail(strict=True, reason=known_bugs[name])]
            if name in known_bugs
            else [],
        )
        for name, case in CASES.items()
        for block_size in ((None, BLOCK) if case.blockwise else (None,))
    ]


def _inputs(seed: int = 0) -> tuple[Tensor, Tensor]:
    """fp32 inputs ``x (N, D_IN)`` and weight ``W (D_IN, 3D)``: features x @ W are ~N(0, 1)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, D_IN, generator=g, dtype=torch.float64)
    w = torch.randn(D_IN, 3 * D, generator=g, dtype=torch.float64) / D_IN**0.5
    return x.float(), w.float()


class Run(NamedTuple):
    loss: Tensor
    features: Tensor
    features_grad: Tensor
    x_grad: Tensor
    w_grad: Tensor


def _run(
    case: Case, block_size: int | None, device: torch.device, precision: Precision | None
) -> Run:
    """One training step's forward and backward: the features come from a matmul under the
    step's autocast; ``precision=None`` is the float64 CPU reference on the same fp32 inputs."""
    x, w = _inputs()
    if precision is None:
        device, x, w = torch.device("cpu"), x.double(), w.double()
    x, w = x.to(device).requires_grad_(), w.to(device).requires_grad_()
    with _autocast(device, precision or "fp32"):
        z = x @ w  # (N, 3D)
        z.retain_grad()
        loss = case.loss(z, LABELS.to(device), block_size)
    torch.autograd.backward(loss)
    assert z.grad is not None and x.grad is not None and w.grad is not None
    return Run(loss, z, z.grad, x.grad, w.grad)


@pytest.mark.parametrize(("name", "block_size"), _loss_params({}))
def test_fp32_loss_and_input_gradients_match_float64_cpu(
    device: torch.device, name: str, block_size: int | None
) -> None:
    got = _run(CASES[name], block_size, device, "fp32")
    want = _run(CASES[name], block_size, device, None)
    assert got.loss.dtype == torch.float32 and got.loss.device.type == device.type
    assert got.x_grad.device.type == device.type
    _assert_close(got.loss, want.loss, FP32_RTOL, "loss")
    _assert_close(got.features_grad, want.features_grad, FP32_RTOL, "features grad")
    _assert_close(got.x_grad, want.x_grad, FP32_RTOL, "x grad")
    _assert_close(got.w_grad, want.w_grad, FP32_RTOL, "W grad")


@pytest.mark.parametrize(("name", "block_size"), _loss_params(BF16_BUGS))
def test_bf16_autocast_loss_is_fp32_and_matches_float64_cpu(
    device: torch.device, name: str, block_size: int | None
) -> None:
    case = CASES[name]
    got = _run(case, block_size, device, "bf16")
    assert got.features.dtype == torch.bfloat16  # a real bf16 step, not an fp32 one
    assert got.loss.dtype == torch.float32
    assert torch.isfinite(got.x_grad).all() and torch.isfinite(got.w_grad).all()

    # the loss maths runs in fp32: on the very bf16 features it matches float64 to 1e-5
    z64 = got.features.detach().cpu().double().requires_grad_()
    exact = case.loss(z64, LABELS, block_size)
    torch.autograd.backward(exact)
    assert z64.grad is not None
    _assert_close(got.loss, exact, FP32_RTOL, "loss on the bf16 features")
    _assert_close(got.features_grad, z64.grad, BF16_GRAD_RTOL, "features grad")

    # end to end, against float64 on the unrounded inputs (see BF16_END_TO_END_RTOL)
    want = _run(case, block_size, device, None)
    _assert_close(got.loss, want.loss, BF16_END_TO_END_RTOL, "loss")
    _assert_close(got.x_grad, want.x_grad, BF16_END_TO_END_RTOL, "x grad")
    _assert_close(got.w_grad, want.w_grad, BF16_END_TO_END_RTOL, "W grad")


# ---------------------------------------------------------------- sliced-Wasserstein priors


def _swd_oracle(z: Tensor, prior: str, lam: float, samples: Tensor, projection: Tensor) -> Tensor:
    """The generalized loss with given prior samples ``(2N, D)`` and projection ``(D, D)``."""
    h1, h2 = z[:, :D], z[:, D : 2 * D]  # (N, D) each
    if prior == "uniform_hypersphere":
        h1, h2 = F.normalize(h1, dim=1), F.normalize(h2, dim=1)
    H = torch.cat([h1, h2])  # (2N, D)
    sorted_h = torch.sort(H @ projection, dim=0).values  # (2N, D)
    sorted_p = torch.sort(samples @ projection, dim=0).values  # (2N, D)
    return (h1 - h2).pow(2).mean() / 2 + lam * (sorted_p - sorted_h).pow(2).mean()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("prior", SWD_PRIORS)
def test_swd_priors_on_device_are_seeded_and_match_float64_with_the_same_draws(
    device: torch.device, prior: str, precision: Precision
) -> None:
    def swd_case(seed: int) -> Case:
        generator = torch.Generator(device=device).manual_seed(seed)
        return Case(
            lambda z, y, b: generalized_contrastive_loss(
                z[:, :D],
                z[:, D : 2 * D],
                prior=prior,
                lam=0.7,
                generator=generator,  # type: ignore[arg-type]
            ),
            blockwise=False,
        )

    got = _run(swd_case(3), None, device, precision)
    again = _run(swd_case(3), None, device, precision)
    other = _run(swd_case(4), None, device, precision)
    assert got.loss.dtype == torch.float32 and torch.isfinite(got.loss)
    assert torch.isfinite(got.x_grad).all() and torch.isfinite(got.w_grad).all()
    assert torch.equal(got.loss, again.loss) and torch.equal(got.x_grad, again.x_grad)
    assert not torch.equal(got.loss, other.loss)

    # The same draws as inside the loss (prior samples first, then the projection, from the
    # device generator), then the loss maths in float64 on the CPU.
    generator = torch.Generator(device=device).manual_seed(3)
    samples = sample_prior(prior, (2 * N, D), generator=generator, device=device)  # type: ignore[arg-type]
    projection = random_orthogonal(D, generator=generator, device=device)  # (D, D), fp32
    x, w = (t.double().requires_grad_() for t in _inputs())
    want = _swd_oracle(x @ w, prior, 0.7, samples.cpu().double(), projection.cpu().double())
    torch.autograd.backward(want)
    assert x.grad is not None and w.grad is not None
    rtol = FP32_RTOL if precision == "fp32" else BF16_END_TO_END_RTOL
    _assert_close(got.loss, want, rtol, "loss")
    _assert_close(got.x_grad, x.grad, rtol, "x grad")
    _assert_close(got.w_grad, w.grad, rtol, "W grad")


@pytest.mark.parametrize("prior", SWD_PRIORS)
def test_seeded_generalized_module_is_reproducible_on_device(
    device: torch.device, prior: str
) -> None:
    x, w = _inputs()
    z = (x @ w).to(device)  # (N, 3D)
    h1, h2 = z[:, :D], z[:, D : 2 * D]
    a, b, c = (GeneralizedContrastiveLoss(prior=prior, seed=s) for s in (0, 0, 1))  # type: ignore[arg-type]
    # calls interleaved: a module drawing from a shared (global) RNG could not match its twin
    pairs = [(a(h1, h2), b(h1, h2)) for _ in range(3)]
    assert all(torch.equal(first, second) for first, second in pairs)
    assert not torch.equal(pairs[0][0], pairs[1][0])  # fresh projections on every call
    assert not torch.equal(pairs[0][0], c(h1, h2))


# ---------------------------------------------------------------- gather with nccl

WORLD = 2
GATHER_LOSSES: dict[str, Callable[[Tensor, Tensor, bool], Tensor]] = {
    "nt_xent": lambda z, y, gather: nt_xent_loss(z[:, 0], z[:, 1], gather=gather),
    "supcon_out": lambda z, y, gather: supcon_loss(z, y, gather=gather),
    "supcon_in": lambda z, y, gather: supcon_loss(z, y, variant="in", gather=gather),
    "supcon_unlabelled": lambda z, y, gather: supcon_loss(z, None, gather=gather),
    "supcon_one_blocks": lambda z, y, gather: supcon_loss(
        z, y, contrast_mode="one", gather=gather, block_size=4
    ),
    "conditional": lambda z, y, gather: conditional_contrastive_loss(
        z[:, 0], z[:, 1], y, gather=gather
    ),
    "conditional_proxy": lambda z, y, gather: conditional_contrastive_loss(
        z[:, 0], z[:, 1], y, positives="proxy", gather=gather
    ),
    "d2d_ce": lambda z, y, gather: data_to_data_cross_entropy_loss(
        z[:, 0], z[:, 1], y, gather=gather
    ),
    "info_nce": lambda z, y, gather: info_nce_loss(z[:, 0], z[:, 1], gather=gather),
}


def _gather_features() -> Tensor:
    """fp32 features ``(N, 2, D)``: two views per sample."""
    g = torch.Generator().manual_seed(1)
    return torch.randn(N, 2, D, generator=g, dtype=torch.float64).float()


def _gather_worker(rank: int, port: int, device_name: str, queue: Any) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device(device_name)
    if device.type == "cuda":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)  # nccl: one GPU per process
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=WORLD
    )
    try:
        # uneven batches (2 and 3 rows): the gather pads and cuts
        local = torch.full((2 + rank, 3), float(rank), device=device, requires_grad=True)
        gathered = gather_with_grad(local)  # (5, 3)
        weights = torch.arange(gathered.numel(), device=device).view_as(gathered).float()
        torch.autograd.backward((gathered * weights).sum())
        assert local.grad is not None
        uneven = (gathered.detach().cpu(), local.grad.cpu(), weights.cpu())

        rows = slice(rank * N // WORLD, (rank + 1) * N // WORLD)
        results = {}
        for name, loss_fn in GATHER_LOSSES.items():
            z = _gather_features()[rows].to(device).requires_grad_()
            loss = loss_fn(z, LABELS[rows].to(device), True)
            torch.autograd.backward(loss)
            assert z.grad is not None
            results[name] = (all_reduce_mean(loss).cpu(), z.grad.cpu())
        buffer = io.BytesIO()  # plain bytes: shared-memory tensors would die with this process
        torch.save((rank, uneven, results), buffer)
        queue.put(buffer.getvalue())
    finally:
        dist.destroy_process_group()
    exit_without_teardown(queue)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.mark.skipif(
    ON_CUDA and torch.cuda.device_count() < 2,
    reason=f"nccl gather needs 2 GPUs, found {torch.cuda.device_count()}",
)
def test_nccl_gather_and_gather_losses_equal_one_process(device: torch.device) -> None:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_gather_worker, args=(r, port, str(device), queue)) for r in range(WORLD)
    ]
    for proc in procs:
        proc.start()
    per_rank = {}
    for _ in procs:
        rank, *rest = torch.load(io.BytesIO(queue.get(timeout=120)), weights_only=True)
        per_rank[rank] = rest
    for proc in procs:
        proc.join(timeout=60)
    assert [proc.exitcode for proc in procs] == [0] * WORLD

    for rank, ((gathered, grad, weights), results) in per_rank.items():
        offset, n_local = (0, 2) if rank == 0 else (2, 3)
        assert torch.equal(gathered[:, 0], torch.tensor([0.0, 0.0, 1.0, 1.0, 1.0]))
        # both ranks' sums used this rank's rows
        assert torch.equal(grad, WORLD * weights[offset : offset + n_local])
        rows = slice(rank * N // WORLD, (rank + 1) * N // WORLD)
        for name, (loss, z_grad) in results.items():
            z = _gather_features().double().requires_grad_()
            full = GATHER_LOSSES[name](z, LABELS, False)
            torch.autograd.backward(full)
            assert z.grad is not None
            _assert_close(loss, full, FP32_RTOL, f"{name} loss, rank {rank}")
            # every rank's loss reaches these rows: WORLD × their share of the whole-batch loss
            _assert_close(z_grad, WORLD * z.grad[rows], FP32_RTOL, f"{name} grad, rank {rank}")


# ---------------------------------------------------------------- fit: crash and resume


def _fit(
    run_dir: RunDir,
    device: torch.device,
    train_step: Callable[[nn.Module, Any], dict[str, Tensor]],
    *,
    resume: bool = False,
) -> nn.Module:
    """A fresh process's run: seeded MLP on ``device``, AdamW, make_loader, bf16 autocast."""
    seed_everything(0)
    model = nn.Sequential(nn.Linear(D_IN, 16), nn.ReLU(), nn.Linear(16, D)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(24, D_IN, generator=torch.Generator().manual_seed(2)))
    loader = make_loader(data, 6, shuffle=True, drop_last=True, seed=0)
    cfg = LoopConfig(
        epochs=3,  # 4 steps per epoch
        log_every=1,
        checkpoint_every=3,
        clip_grad_norm=1.0,
        # "auto" is bf16 on a GPU with bf16; on the CPU it means fp32, so ask for bf16 there
        amp="auto" if device.type == "cuda" else "bf16",
        progress=False,
    )
    fit(
        model,
        optimizer,
        loader,
        train_step,
        loop_cfg=cfg,
        run_dir=run_dir,
        device=device,
        resume=resume,
    )
    return model


def _nt_xent_step(model: nn.Module, batch: list[Tensor]) -> dict[str, Tensor]:
    """Two noisy views drawn from the device's RNG, so resume must restore the CUDA RNG too."""
    (x,) = batch
    z1 = model(x + 0.1 * torch.randn_like(x))  # (B, D)
    z2 = model(x + 0.1 * torch.randn_like(x))  # (B, D)
    assert z1.dtype == torch.bfloat16, "fit did not run the step under bf16 autocast"
    return {"loss": nt_xent_loss(z1, z2, temperature=0.5)}


def test_fit_with_bf16_resumes_after_a_crash_to_the_uninterrupted_weights(
    device: torch.device, tmp_path: Path
) -> None:
    """12 steps, checkpoints every 3, a crash at step 8 (mid-epoch), resume from step 6.

    Compared bit for bit: cuBLAS GEMMs on one stream, PyTorch's reductions and the foreach
    optimizer kernels are deterministic, and the loss (unlabelled NT-Xent) uses no atomics
    (no index_add); only the labelled SupCon path would.
    """
    whole = RunDir.create("t", "whole", root=tmp_path)
    reference = _fit(whole, device, _nt_xent_step)

    calls = iter(range(1, 10**6))

    def crashing_step(model: nn.Module, batch: list[Tensor]) -> dict[str, Tensor]:
        if next(calls) == 8:
            raise RuntimeError("preempted")
        return _nt_xent_step(model, batch)

    parts = RunDir.create("t", "parts", root=tmp_path)
    with pytest.raises(RuntimeError, match="preempted"):
        _fit(parts, device, crashing_step)
    assert load_checkpoint(parts.last_checkpoint)["step"] == 6
    resumed = _fit(
        RunDir.create("t", "parts", root=tmp_path, resume=True), device, _nt_xent_step, resume=True
    )

    for (name, p), (_, q) in zip(
        reference.state_dict().items(), resumed.state_dict().items(), strict=True
    ):
        assert p.device.type == device.type
        assert torch.equal(p, q), name
    assert parts.metrics_path.read_bytes() == whole.metrics_path.read_bytes()
