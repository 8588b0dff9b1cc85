"""The training loop: exact resume, check_finite, accumulation, precision, best.pt and DDP."""

from __future__ import annotations

import csv
import os
import random
import socket
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from shared.checkpoint import load_checkpoint
from shared.losses import MemoryQueue
from shared.runs import RunDir
from shared.runtime import (
    DistEnv,
    cleanup_distributed,
    init_distributed,
    make_loader,
    seed_everything,
    unwrap,
    wrap_ddp,
)
from shared.train import FitResult, LoopConfig, check_finite, fit
from tests.processes import exit_without_teardown

CPU = torch.device("cpu")
Batch = tuple[Tensor, Tensor]


def _data(n: int = 20, d_in: int = 4, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d_in, generator=g)
    y = x @ torch.randn(d_in, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def _mse_step(model: nn.Module, batch: Batch) -> dict[str, Tensor]:
    x, y = batch
    return {"loss": nn.functional.mse_loss(model(x), y)}


def _noisy_step(model: nn.Module, batch: Batch) -> dict[str, Tensor | float]:
    """Dropout in the model plus draws from every global RNG: resume must restore them all."""
    out = _mse_step(model, batch)
    noise = torch.rand(()).item() + random.random() + float(np.random.rand())  # noqa: NPY002
    return {**out, "noise": noise}


def _evaluate(model: nn.Module) -> dict[str, float]:
    x, y = _data(8, seed=1).tensors
    with torch.no_grad():
        val = nn.functional.mse_loss(model(x), y).item()
    return {"val_loss": val, "val_draw": torch.rand(()).item()}


def _setup(
    kind: str = "make_loader", batch_size: int = 4
) -> tuple[nn.Module, torch.optim.Optimizer, Any, DataLoader[Any]]:
    """Everything a fresh process builds; the resumed run builds it again like a new process."""
    seed_everything(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.25), nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    if kind == "make_loader":
        loader = make_loader(_data(), batch_size, shuffle=True, drop_last=False, seed=0)
    else:  # a plain shuffling DataLoader draws its order from the global torch RNG
        loader = DataLoader(_data(), batch_size=batch_size, shuffle=True)
    return model, optimizer, scheduler, loader


def _fit(
    run_dir: RunDir,
    cfg: LoopConfig,
    *,
    resume: bool = False,
    kind: str = "make_loader",
    train_step: Callable[[nn.Module, Any], Mapping[str, Tensor | float]] = _noisy_step,
    evaluate: Callable[[nn.Module], Mapping[str, float]] | None = _evaluate,
) -> tuple[nn.Module, FitResult]:
    model, optimizer, scheduler, loader = _setup(kind)
    result = fit(
        model,
        optimizer,
        loader,
        train_step,
        loop_cfg=cfg,
        run_dir=run_dir,
        device=CPU,
        scheduler=scheduler,
        evaluate=evaluate,
        resume=resume,
    )
    return model, result


def _assert_same_weights(a: nn.Module, b: nn.Module) -> None:
    for (name, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(p, q), name


@pytest.mark.parametrize(
    ("kind", "accum", "checkpoint_every", "crash_at"),
    [("make_loader", 1, 4, 11), ("torch_shuffle", 1, 4, 11), ("make_loader", 2, 3, 5)],
)
def test_resume_after_a_crash_equals_an_uninterrupted_run(
    tmp_path: Path, kind: str, accum: int, checkpoint_every: int, crash_at: int
) -> None:
    """5 batches per epoch, 3 epochs; the crash comes after a mid-epoch checkpoint."""
    cfg = LoopConfig(
        epochs=3,
        grad_accum_steps=accum,
        log_every=1,
        eval_every=2,
        checkpoint_every=checkpoint_every,
        clip_grad_norm=1.0,
        best_metric="val_loss",
        progress=False,
    )
    whole = RunDir.create("t", "whole", root=tmp_path)
    reference, expected = _fit(whole, cfg, kind=kind)

    calls = iter(range(1, 10**6))

    def crashing_step(model: nn.Module, batch: Batch) -> dict[str, Tensor | float]:
        if next(calls) == (crash_at - 1) * accum + 1:  # first micro-batch of step crash_at
            raise RuntimeError("preempted")
        return _noisy_step(model, batch)

    parts = RunDir.create("t", "parts", root=tmp_path)
    with pytest.raises(RuntimeError, match="preempted"):
        _fit(parts, cfg, kind=kind, train_step=crashing_step)
    last_step = (crash_at - 1) // checkpoint_every * checkpoint_every
    assert load_checkpoint(parts.last_checkpoint)["step"] == last_step
    resumed, result = _fit(
        RunDir.create("t", "parts", root=tmp_path, resume=True), cfg, resume=True, kind=kind
    )

    _assert_same_weights(reference, resumed)
    assert result == expected
    assert parts.metrics_path.read_bytes() == whole.metrics_path.read_bytes()
    best_a, best_b = load_checkpoint(whole.best_checkpoint), load_checkpoint(parts.best_checkpoint)
    assert best_a["step"] == best_b["step"] == expected.best_step
    for key in best_a["model"]:
        assert torch.equal(best_a["model"][key], best_b["model"][key])


def test_resume_extends_a_finished_run_at_an_epoch_boundary(tmp_path: Path) -> None:
    """Stop after exactly one epoch (5 steps) via max_steps, then continue to 12 steps."""
    whole, parts = RunDir.create("t", "a", root=tmp_path), RunDir.create("t", "b", root=tmp_path)
    long = LoopConfig(max_steps=12, log_every=1, progress=False)
    reference, expected = _fit(whole, long, evaluate=None)
    _, short = _fit(parts, LoopConfig(max_steps=5, log_every=1, progress=False), evaluate=None)
    assert (short.step, short.epoch) == (5, 1)
    resumed, result = _fit(parts, long, resume=True, evaluate=None)
    _assert_same_weights(reference, resumed)
    assert result == expected and result.epoch == 2
    assert parts.metrics_path.read_bytes() == whole.metrics_path.read_bytes()


def test_resume_refuses_a_different_batch_layout(tmp_path: Path) -> None:
    run = RunDir.create("t", "a", root=tmp_path)
    _fit(run, LoopConfig(max_steps=2, progress=False), evaluate=None)
    with pytest.raises(ValueError, match=r"steps_per_epoch, batches_per_step\) = \(5, 1\)"):
        _fit(run, LoopConfig(max_steps=4, grad_accum_steps=2, progress=False), resume=True)
    with pytest.raises(FileNotFoundError, match=r"last\.pt"):
        _fit(RunDir.create("t", "b", root=tmp_path), LoopConfig(max_steps=2), resume=True)


def _metrics(run: RunDir) -> list[dict[str, str]]:
    with run.metrics_path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_nan_loss_stops_with_a_clear_message_and_keeps_last_checkpoint(tmp_path: Path) -> None:
    run = RunDir.create("t", "nan", root=tmp_path)
    calls = iter(range(1, 10**6))
    snapshot: list[bytes] = []

    def diverging_step(model: nn.Module, batch: Batch) -> dict[str, Tensor]:
        out = _mse_step(model, batch)
        if next(calls) == 6:
            snapshot.append(run.last_checkpoint.read_bytes())  # written at step 4
            return {"loss": out["loss"] * float("nan")}
        return out

    cfg = LoopConfig(max_steps=10, checkpoint_every=2, log_every=1, progress=False)
    with pytest.raises(FloatingPointError, match="loss is nan at step 6"):
        _fit(run, cfg, train_step=diverging_step, evaluate=None)
    assert run.last_checkpoint.read_bytes() == snapshot[0]
    ckpt = load_checkpoint(run.last_checkpoint)
    assert ckpt["step"] == 4
    assert all(torch.isfinite(t).all() for t in ckpt["model"].values())
    assert [row["step"] for row in _metrics(run)] == ["1", "2", "3", "4", "5"]


def _nan_gradient_step(model: nn.Module, batch: Batch) -> dict[str, Tensor]:
    """A finite loss whose gradient is NaN: d/dw sqrt(0 * w) = 0 * inf."""
    out = _mse_step(model, batch)
    weight = next(unwrap(model).parameters())  # the first layer's weight
    return {"loss": out["loss"] + torch.sqrt(weight.sum() * 0.0)}


@pytest.mark.parametrize(
    ("clip", "message"),
    [(1.0, "grad_norm is nan at step 1"), (None, r"parameter 0\.weight is .* at step 1")],
)
def test_nan_gradients_never_reach_a_checkpoint(
    tmp_path: Path, clip: float | None, message: str
) -> None:
    run = RunDir.create("t", "g", root=tmp_path)
    cfg = LoopConfig(max_steps=3, checkpoint_every=1, clip_grad_norm=clip, progress=False)
    with pytest.raises(FloatingPointError, match=message):
        _fit(run, cfg, train_step=_nan_gradient_step, evaluate=None)
    assert not run.last_checkpoint.exists()


def test_check_finite() -> None:
    check_finite(torch.tensor([1.0, 2.0]), "loss", 3)
    check_finite(0.5, "lr", 3)
    with pytest.raises(FloatingPointError, match="loss is inf at step 3"):
        check_finite(torch.tensor(float("inf")), "loss", 3)
    with pytest.raises(FloatingPointError, match="z is a tensor with non-finite entries at step 9"):
        check_finite(torch.tensor([1.0, float("nan")]), "z", 9)
    with pytest.raises(FloatingPointError, match="lr is nan"):
        check_finite(float("nan"), "lr", 1)


def _nan_at(step: int, then: Callable[[], None] | None = None) -> Callable[..., dict[str, Tensor]]:
    """``_mse_step`` whose loss is NaN from call ``step`` on; ``then()`` runs on later calls."""
    calls = iter(range(1, 10**6))

    def diverging_step(model: nn.Module, batch: Batch) -> dict[str, Tensor]:
        out, call = _mse_step(model, batch), next(calls)
        if then is not None and call > step:
            then()
        return {"loss": out["loss"] * float("nan")} if call >= step else out

    return diverging_step


def test_a_nan_between_logging_steps_is_named_at_the_next_one(tmp_path: Path) -> None:
    """The flag is read on logging and checkpoint steps only, but names the step it went bad."""
    run = RunDir.create("t", "nan", root=tmp_path)
    cfg = LoopConfig(max_steps=10, log_every=5, checkpoint_every=2, progress=False)
    with pytest.raises(FloatingPointError, match="loss is nan at step 3; training stopped"):
        _fit(run, cfg, train_step=_nan_at(3), evaluate=None)
    ckpt = load_checkpoint(run.last_checkpoint)
    assert ckpt["step"] == 2  # the step-4 checkpoint read the flag first and was not written
    assert all(torch.isfinite(t).all() for t in ckpt["model"].values())
    assert _metrics(run) == []  # step 5's row never came


def test_an_error_after_an_unread_nan_names_the_nan(tmp_path: Path) -> None:
    """A step that fails because of an earlier NaN reports the NaN, not its symptom."""

    def fail() -> None:
        raise ValueError("features contain NaN")

    run = RunDir.create("t", "nan", root=tmp_path)
    cfg = LoopConfig(max_steps=10, log_every=5, progress=False)
    with pytest.raises(FloatingPointError, match="loss is nan at step 2") as raised:
        _fit(run, cfg, train_step=_nan_at(2, then=fail), evaluate=None)
    assert isinstance(raised.value.__context__, ValueError)


def test_a_steady_step_of_the_loop_reads_nothing_on_the_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between logging steps neither the loss check nor clipping waits for the device."""
    from tests.test_pipeline_syncs import _counted

    cfg = LoopConfig(max_steps=4, log_every=4, clip_grad_norm=1.0, progress=False)
    run = RunDir.create("t", "syncs", root=tmp_path)
    counts = _counted(monkeypatch, lambda: _fit(run, cfg, train_step=_mse_step, evaluate=None))
    assert counts == {}


def _linear_after_one_step(tmp_path: Path, name: str, batch_size: int, accum: int) -> Tensor:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = make_loader(_data(8), batch_size, shuffle=False, drop_last=False, seed=0)
    cfg = LoopConfig(max_steps=1, grad_accum_steps=accum, log_every=1, progress=False)
    run = RunDir.create("t", name, root=tmp_path)
    result = fit(model, optimizer, loader, _mse_step, loop_cfg=cfg, run_dir=run, device=CPU)
    return torch.cat([model.weight.flatten(), model.bias, torch.tensor([result.metrics["loss"]])])


def test_two_micro_batches_of_four_equal_one_batch_of_eight(tmp_path: Path) -> None:
    accumulated = _linear_after_one_step(tmp_path, "acc", batch_size=4, accum=2)
    whole = _linear_after_one_step(tmp_path, "whole", batch_size=8, accum=1)
    torch.manual_seed(0)
    untouched = nn.Linear(4, 1).weight.flatten()
    assert not torch.allclose(whole[:4], untouched)  # the step did move the weights
    torch.testing.assert_close(accumulated, whole)


@pytest.mark.parametrize(("amp", "dtype"), [("auto", torch.float32), ("bf16", torch.bfloat16)])
def test_precision_is_decided_by_the_loop(tmp_path: Path, amp: str, dtype: torch.dtype) -> None:
    seen: list[tuple[torch.dtype, torch.dtype]] = []

    def step(model: nn.Module, batch: Batch) -> dict[str, Tensor]:
        x, y = batch
        out = model(x)
        seen.append((out.dtype, x.dtype))
        return {"loss": nn.functional.mse_loss(out.float(), y)}

    model = nn.Linear(4, 1)
    loader = make_loader(_data(8), 4, shuffle=False, drop_last=False, seed=0)
    cfg = LoopConfig(max_steps=2, amp=amp, progress=False)  # type: ignore[arg-type]
    run = RunDir.create("t", amp, root=tmp_path)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    fit(model, optimizer, loader, step, loop_cfg=cfg, run_dir=run, device=CPU)
    assert seen == [(dtype, torch.float32)] * 2
    assert model.weight.dtype == torch.float32


def test_logging_evaluation_best_and_progress(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scores: Iterator[float] = iter([3.0, 1.0, 2.0, 5.0])

    def evaluate(model: nn.Module) -> dict[str, float]:
        assert not model.training
        return {"val_score": next(scores)}

    run = RunDir.create("t", "log", root=tmp_path)
    cfg = LoopConfig(
        max_steps=7,
        log_every=3,
        eval_every=2,
        best_metric="val_score",
        best_mode="min",
        tensorboard=True,
    )
    model, result = _fit(run, cfg, train_step=_mse_step, evaluate=evaluate)
    assert model.training
    rows = _metrics(run)
    assert [row["step"] for row in rows] == ["2", "3", "4", "6", "7"]
    assert rows[0]["loss"] == "" and rows[0]["val_score"] == "3.0"
    assert rows[1]["val_score"] == "" and float(rows[1]["loss"]) > 0
    assert rows[3]["epoch"] == "1" and rows[3]["lr"] == str(0.05 * 0.5)
    assert rows[4]["val_score"] == "5.0"  # the last step is always evaluated and logged
    assert (result.best, result.best_step) == (1.0, 4)
    assert load_checkpoint(run.best_checkpoint)["step"] == 4
    assert load_checkpoint(run.last_checkpoint)["step"] == 7
    assert any(run.tensorboard_dir.iterdir())
    err = capsys.readouterr().err
    assert "7/7" in err and "step/s" in err


def test_fit_validates_its_inputs(tmp_path: Path) -> None:
    run = RunDir.create("t", "v", root=tmp_path)
    with pytest.raises(ValueError, match="needs an evaluate"):
        _fit(run, LoopConfig(max_steps=1, best_metric="val"), evaluate=None)
    with pytest.raises(ValueError, match="'val' is not among"):
        _fit(run, LoopConfig(max_steps=1, best_metric="val", progress=False))
    with pytest.raises(ValueError, match="fewer than grad_accum_steps=9"):
        _fit(run, LoopConfig(max_steps=1, grad_accum_steps=9))
    with pytest.raises(ValueError, match="tensor 'loss'"):
        _fit(run, LoopConfig(max_steps=1, progress=False), train_step=lambda m, b: {"x": 1.0})
    with pytest.raises(ValueError, match="clash"):
        _fit(run, LoopConfig(max_steps=1, progress=False), evaluate=lambda m: {"loss": 1.0})
    with pytest.raises(ValueError, match="epochs or max_steps"):
        LoopConfig()
    with pytest.raises(ValueError, match="log_every"):
        LoopConfig(max_steps=1, log_every=0)
    model, optimizer, _, loader = _setup()
    env = DistEnv(rank=0, local_rank=0, world_size=2, is_distributed=True)
    with pytest.raises(ValueError, match="wrap_ddp"):
        fit(
            model,
            optimizer,
            loader,
            _mse_step,
            loop_cfg=LoopConfig(max_steps=1),
            run_dir=run,
            device=CPU,
            dist_env=env,
        )


# Distributed: 2 gloo processes, each with half of every batch, equal one process.

WORLD = 2


def _linear_fit(run_dir: RunDir, batch_size: int, dist_env: DistEnv | None) -> nn.Module:
    torch.manual_seed(0)
    model: nn.Module = nn.Linear(4, 1)
    if dist_env is not None:
        model = wrap_ddp(model, dist_env)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    loader = make_loader(
        _data(16), batch_size, shuffle=True, drop_last=False, seed=0, dist=dist_env
    )
    cfg = LoopConfig(epochs=2, grad_accum_steps=2, log_every=1, progress=False)
    fit(
        model,
        optimizer,
        loader,
        _mse_step,
        loop_cfg=cfg,
        run_dir=run_dir,
        device=CPU,
        dist_env=dist_env,
    )
    return unwrap(model)


def _join(rank: int, port: int) -> DistEnv:
    """Join a 2-process gloo group the way torchrun would describe it."""
    torch.set_num_threads(1)
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(WORLD),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    return init_distributed(CPU)


def _ddp_worker(rank: int, port: int, folder: str) -> None:
    env = _join(rank, port)
    try:
        assert env == DistEnv(rank, rank, WORLD, True)
        model = _linear_fit(RunDir(Path(folder) / "ddp"), batch_size=2, dist_env=env)
        torch.save(model.state_dict(), Path(folder) / f"rank{rank}.pt")
    finally:
        cleanup_distributed()
    exit_without_teardown()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_ddp_two_ranks_equal_one_process(tmp_path: Path) -> None:
    RunDir.create("t", "ddp", root=tmp_path)
    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [
        ctx.Process(target=_ddp_worker, args=(r, port, str(tmp_path / "t"))) for r in range(WORLD)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    assert [proc.exitcode for proc in procs] == [0] * WORLD

    single = _linear_fit(RunDir.create("t", "single", root=tmp_path), batch_size=4, dist_env=None)
    ranks = [torch.load(tmp_path / "t" / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]
    ddp_run = RunDir(tmp_path / "t" / "ddp")
    written = load_checkpoint(ddp_run.last_checkpoint)["model"]
    for name, value in single.state_dict().items():
        torch.testing.assert_close(ranks[0][name], value)
        assert torch.equal(ranks[1][name], ranks[0][name]) and torch.equal(
            written[name], ranks[0][name]
        )
    assert len(_metrics(ddp_run)) == 4  # 2 epochs of 2 steps, written by rank 0 only


# A NaN on one rank: every rank raises the same error at the same step.


def _ddp_nan_worker(rank: int, port: int, folder: str) -> None:
    env = _join(rank, port)
    stopped = False
    try:
        torch.manual_seed(0)
        model = wrap_ddp(nn.Linear(4, 1), env)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
        loader = make_loader(_data(16), 2, shuffle=True, seed=0, dist=env)
        step = _nan_at(2) if rank == 1 else _mse_step  # only rank 1 sees a NaN
        cfg = LoopConfig(max_steps=4, log_every=3, progress=False)
        run = RunDir(Path(folder) / "nan")
        try:
            fit(model, optimizer, loader, step, loop_cfg=cfg, run_dir=run, device=CPU, dist_env=env)
        except FloatingPointError as error:
            (Path(folder) / f"error{rank}.txt").write_text(str(error))
            stopped = True
    finally:
        cleanup_distributed()
    if stopped:
        exit_without_teardown()


def test_ddp_a_nan_on_one_rank_stops_every_rank_with_the_same_error(tmp_path: Path) -> None:
    RunDir.create("t", "nan", root=tmp_path)
    ctx = mp.get_context("spawn")
    port = _free_port()
    folder = tmp_path / "t"
    procs = [ctx.Process(target=_ddp_nan_worker, args=(r, port, str(folder))) for r in range(WORLD)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    assert [proc.exitcode for proc in procs] == [0] * WORLD
    errors = [(folder / f"error{r}.txt").read_text() for r in range(WORLD)]
    assert errors[0] == errors[1]
    assert errors[0].startswith("loss is nan at step 2 on rank 1; training stopped")


# A write on rank 0 that fails (a full disk): every rank stops with rank 0's one-line error.


def _fail_on_rank0(what: str) -> None:
    """Make rank 0's second write of ``what`` raise ENOSPC, as atomic_write would."""
    import errno

    import shared.resume
    import shared.runs

    calls: list[object] = []

    def failing(original: Callable[..., Any], name: str) -> Callable[..., Any]:
        def write(*args: Any, **kwargs: Any) -> Any:
            calls.append(args)
            if len(calls) == 2:
                raise OSError(errno.ENOSPC, f"cannot write {name}: No space left on device")
            return original(*args, **kwargs)

        return write

    if what == "last.pt":
        original = shared.resume.save_checkpoint  # type: ignore[attr-defined]
        shared.resume.save_checkpoint = failing(original, "last.pt")
    elif what == "metrics.csv":
        log = shared.runs.MetricsLogger.log
        shared.runs.MetricsLogger.log = failing(log, "metrics.csv")


def _ddp_write_failure_worker(rank: int, port: int, folder: str, what: str) -> None:
    env = _join(rank, port)
    stopped = False
    try:
        if rank == 0:
            _fail_on_rank0(what)
        torch.manual_seed(0)
        model = wrap_ddp(nn.Linear(4, 1), env)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
        loader = make_loader(_data(16), 2, shuffle=True, seed=0, dist=env)
        grids: list[int] = []

        def evaluate(module: nn.Module) -> dict[str, float]:  # rank 0 alone: a sample grid
            grids.append(1)
            if what == "grid" and len(grids) == 2:
                raise OSError(28, "cannot write grid.png: No space left on device")
            return {"score": 1.0}

        cfg = LoopConfig(max_steps=4, log_every=1, eval_every=1, checkpoint_every=1)
        run = RunDir(Path(folder) / what)
        try:
            fit(
                model,
                optimizer,
                loader,
                _mse_step,
                loop_cfg=replace(cfg, progress=False),
                run_dir=run,
                device=CPU,
                dist_env=env,
                evaluate=evaluate,
                evaluate_on_all_ranks=False,
            )
        except OSError as error:
            (Path(folder) / f"{what}-error{rank}.txt").write_text(str(error))
            stopped = True
    finally:
        cleanup_distributed()
    if stopped:
        exit_without_teardown()


@pytest.mark.parametrize("what", ["last.pt", "metrics.csv", "grid"])
def test_ddp_a_failed_write_on_rank_0_stops_every_rank_with_its_error(
    what: str, tmp_path: Path
) -> None:
    """Without the agreement rank 1 goes on to the next collective and fails there with gloo's
    "Connection closed by peer" traceback (NCCL would wait until its timeout)."""
    RunDir.create("t", what.replace(".", "-"), root=tmp_path)
    (tmp_path / "t" / what).mkdir(exist_ok=True)
    RunDir(tmp_path / "t" / what).checkpoints.mkdir(exist_ok=True)
    ctx = mp.get_context("spawn")
    port = _free_port()
    folder = tmp_path / "t"
    procs = [
        ctx.Process(target=_ddp_write_failure_worker, args=(r, port, str(folder), what))
        for r in range(WORLD)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    assert [proc.exitcode for proc in procs] == [0] * WORLD
    errors = [(folder / f"{what}-error{r}.txt").read_text() for r in range(WORLD)]
    assert errors[0] == errors[1], errors
    assert "No space left on device" in errors[0] and what.split(".")[0] in errors[0]
    if what == "last.pt":  # the first checkpoint (step 1) is still there and loads
        assert load_checkpoint(RunDir(folder / what).last_checkpoint)["step"] == 1


# The MemoryQueue under DDP: all-gathered by enqueue, never broadcast from rank 0.


class _QueueNet(nn.Module):
    """A linear layer, a buffer (which DDP broadcasts) and a MemoryQueue (which it must not)."""

    marker: Tensor

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)
        self.register_buffer("marker", torch.zeros(3))
        self.queue = MemoryQueue(8, 3, normalize=False)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.linear(x)  # (B, 3)
        return out


def _ddp_queue_worker(rank: int, port: int, folder: str) -> None:
    env = _join(rank, port)
    try:
        torch.manual_seed(0)
        inner = _QueueNet()
        model = wrap_ddp(inner, env)
        with torch.no_grad():  # rank-local values written behind DDP's back
            inner.marker.fill_(rank + 1.0)
            inner.queue.keys.fill_(10.0 * (rank + 1))
        model(torch.randn(2, 4)).sum().backward()  # DDP broadcasts rank 0's buffers here
        after_forward = {"marker": inner.marker.clone(), "keys": inner.queue.keys.clone()}
        inner.queue.load_state_dict(_QueueNet().queue.state_dict())  # empty again
        inner.queue.enqueue(torch.full((2, 3), rank + 1.0))  # each rank its own keys
        out = {**after_forward, "queue": inner.queue.negatives()}
        torch.save(out, Path(folder) / f"queue{rank}.pt")
    finally:
        cleanup_distributed()
    exit_without_teardown()


def test_ddp_leaves_the_memory_queue_out_of_the_buffer_broadcast(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_ddp_queue_worker, args=(r, port, str(tmp_path))) for r in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    assert [proc.exitcode for proc in procs] == [0] * WORLD
    out = [torch.load(tmp_path / f"queue{r}.pt", weights_only=True) for r in range(WORLD)]
    assert torch.equal(out[1]["marker"], torch.full((3,), 1.0))  # other buffers: rank 0's
    assert torch.equal(out[1]["keys"], torch.full((8, 3), 20.0))  # the queue: never sent
    expected = torch.tensor([[1.0] * 3] * 2 + [[2.0] * 3] * 2)  # (4, 3) rank 0's keys first
    assert torch.equal(out[0]["queue"], expected) and torch.equal(out[1]["queue"], expected)


# Resume under DDP: every rank continues its own random stream.


def _per_rank_noise_step(model: nn.Module, batch: Batch) -> dict[str, Tensor]:
    """Input noise and dropout drawn from this rank's global RNG, as augmentations would."""
    x, y = batch
    x = x + 0.3 * torch.randn_like(x)
    return {"loss": nn.functional.mse_loss(model(x), y)}


def _ddp_noisy_fit(
    run_dir: RunDir,
    dist_env: DistEnv,
    *,
    resume: bool = False,
    crash_at: int | None = None,
    batch_size: int = 2,
) -> nn.Module:
    seed_everything(0)  # the same initial weights on every rank
    model = wrap_ddp(
        nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.25), nn.Linear(8, 1)), dist_env
    )
    seed_everything(0, rank=dist_env.rank)  # per-rank randomness from here on
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    loader = make_loader(_data(16), batch_size, shuffle=True, seed=0, dist=dist_env)
    calls = iter(range(1, 10**6))

    def step(model: nn.Module, batch: Batch) -> dict[str, Tensor]:
        if next(calls) == crash_at:
            raise RuntimeError("preempted")
        return _per_rank_noise_step(model, batch)

    cfg = LoopConfig(epochs=3, log_every=1, checkpoint_every=3, progress=False)
    fit(
        model,
        optimizer,
        loader,
        step,
        loop_cfg=cfg,
        run_dir=run_dir,
        device=CPU,
        resume=resume,
        dist_env=dist_env,
        config={"lr": 0.05},
    )
    return unwrap(model)


def _ddp_resume_worker(rank: int, port: int, folder: str) -> None:
    env = _join(rank, port)
    root = Path(folder)
    try:
        whole = _ddp_noisy_fit(RunDir(root / "whole"), env)
        with pytest.raises(RuntimeError, match="preempted"):
            _ddp_noisy_fit(RunDir(root / "parts"), env, crash_at=8)  # after step 6's checkpoint
        resumed = _ddp_noisy_fit(RunDir(root / "parts"), env, resume=True)
        torch.save(whole.state_dict(), root / f"whole{rank}.pt")
        torch.save(resumed.state_dict(), root / f"resumed{rank}.pt")
        seed_everything(0, rank=rank)
        torch.save(torch.randn(3), root / f"stream{rank}.pt")
    finally:
        cleanup_distributed()
    exit_without_teardown()


def test_ddp_resume_continues_every_ranks_own_stream(tmp_path: Path) -> None:
    """Two ranks with per-rank noise, killed after a mid-epoch checkpoint and resumed, end with
    the weights and metrics of the uninterrupted 2-rank run, bit for bit."""
    for name in ("whole", "parts"):
        RunDir.create("t", name, root=tmp_path)
    ctx = mp.get_context("spawn")
    port = _free_port()
    folder = str(tmp_path / "t")
    procs = [ctx.Process(target=_ddp_resume_worker, args=(r, port, folder)) for r in range(WORLD)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=180)
    assert [proc.exitcode for proc in procs] == [0] * WORLD

    def load(name: str) -> Any:
        return torch.load(tmp_path / "t" / name, weights_only=True)

    assert not torch.equal(load("stream0.pt"), load("stream1.pt"))  # the ranks' noise differs
    whole, resumed = load("whole0.pt"), load("resumed0.pt")
    for name, value in whole.items():
        assert torch.equal(resumed[name], value), name
        assert torch.equal(load("resumed1.pt")[name], value), name
    whole_run, parts_run = RunDir(tmp_path / "t" / "whole"), RunDir(tmp_path / "t" / "parts")
    assert parts_run.metrics_path.read_bytes() == whole_run.metrics_path.read_bytes()
    ckpt = load_checkpoint(parts_run.last_checkpoint)
    assert ckpt["world_size"] == WORLD and len(ckpt["rng_per_rank"]) == WORLD
    assert not torch.equal(
        ckpt["rng_per_rank"][0]["rng"]["torch"], ckpt["rng_per_rank"][1]["rng"]["torch"]
    )

    # one process cannot continue two ranks' streams (same global batches: 4 per step)
    with pytest.raises(ValueError, match="written by 2 processes, this run has 1"):
        _ddp_noisy_fit(parts_run, SINGLE, resume=True, batch_size=4)


SINGLE = DistEnv(rank=0, local_rank=0, world_size=1, is_distributed=False)


# Changed config on resume.


def test_resume_refuses_a_changed_config_and_names_the_keys(tmp_path: Path) -> None:
    run = RunDir.create("t", "cfg", root=tmp_path)
    base = {"lr": 0.05, "loss": "nt_xent", "temperature": 0.5, "data": {"root": Path("x")}}
    cfg = LoopConfig(max_steps=4, checkpoint_every=2, log_every=1, progress=False)

    def run_fit(loop_cfg: LoopConfig, config: dict[str, Any], resume: bool) -> FitResult:
        model, optimizer, scheduler, loader = _setup()
        return fit(
            model,
            optimizer,
            loader,
            _mse_step,
            loop_cfg=loop_cfg,
            run_dir=run,
            device=CPU,
            scheduler=scheduler,
            resume=resume,
            config=config,
        )

    run_fit(cfg, base, resume=False)
    assert load_checkpoint(run.last_checkpoint)["config"]["pipeline"]["data"] == {"root": "x"}
    changed = {**base, "lr": 0.1, "temperature": 0.2}
    with pytest.raises(ValueError, match=r"pipeline\.lr: 0\.05 -> 0\.1; pipeline\.temperature"):
        run_fit(replace(cfg, max_steps=6), changed, resume=True)
    with pytest.raises(ValueError, match=r"pipeline\.data\.root: 'x' -> 'y'"):
        run_fit(replace(cfg, max_steps=6), {**base, "data": {"root": "y"}}, resume=True)
    with pytest.raises(ValueError, match=r"loop\.clip_grad_norm: None -> 1\.0"):
        run_fit(replace(cfg, max_steps=6, clip_grad_norm=1.0), base, resume=True)
    with pytest.raises(ValueError, match=r"pipeline\.extra: '<absent>' -> 1"):
        run_fit(replace(cfg, max_steps=6), {**base, "extra": 1}, resume=True)
    with pytest.raises(ValueError, match="at step 4, past this run's last step 3"):
        run_fit(replace(cfg, max_steps=3), base, resume=True)
    # what may change to continue a run: the length, logging, evaluation and checkpoint intervals
    longer = replace(cfg, max_steps=6, log_every=2, checkpoint_every=3, eval_every=5)
    result = run_fit(longer, {**base, "epochs": 9, "out": "elsewhere"}, resume=True)
    assert result.step == 6
