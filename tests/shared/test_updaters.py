"""The loop around any updater: a two-optimizer GAN-shaped updater resumes bit for bit, the
single-optimizer updater is what ``fit`` runs, evaluation runs once on rank 0 under DDP."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from torch import Tensor, nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils.data import TensorDataset

from shared.checkpoint import load_checkpoint
from shared.runs import RunDir
from shared.runtime import (
    DistEnv,
    cleanup_distributed,
    make_loader,
    seed_everything,
    unwrap,
    wrap_ddp,
)
from shared.train import (
    FitResult,
    LoopConfig,
    OptimizerUpdater,
    StepContext,
    Updater,
    fit,
    fit_updater,
)
from shared.updaters import FiniteGuard
from tests.processes import exit_without_teardown
from tests.shared.test_train import WORLD, _free_port, _join
from tests.sync_counts import count_syncs

CPU = torch.device("cpu")


def _real(n: int = 24) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 2, generator=g) * 0.5 + 2.0)


class ToyGanUpdater(Updater):
    """A 1-D GAN's step: ``n_dis`` discriminator steps (one real batch each, fresh noise from
    the global RNG), one generator step, an EMA of the generator from ``ema_start``."""

    def __init__(self, g: nn.Module, d: nn.Module, *, n_dis: int = 2, ema_start: int = 3) -> None:
        self.g, self.d = g, d
        self.g_opt = torch.optim.Adam(g.parameters(), lr=0.01, betas=(0.5, 0.999))
        self.d_opt = torch.optim.Adam(d.parameters(), lr=0.01, betas=(0.5, 0.999))
        self.d_sched = torch.optim.lr_scheduler.StepLR(self.d_opt, step_size=2, gamma=0.5)
        average = get_ema_multi_avg_fn(0.9)  # type: ignore[no-untyped-call]
        self.ema = AveragedModel(unwrap(g), multi_avg_fn=average)
        self.batches_per_step, self.ema_start = n_dis, ema_start
        self.d_calls = 0

    def step(self, batches: Iterator[Any], ctx: StepContext) -> dict[str, Tensor | float]:
        d_total = torch.zeros(())
        for (real,) in batches:
            real = ctx.to_device(real)
            with ctx.autocast():
                with torch.no_grad():
                    fake = self.g(torch.randn(real.shape[0], 2))
                out_real, out_fake = self.d(torch.cat([real, fake])).chunk(2)  # one DDP forward
                d_loss = (1 - out_real).relu().mean() + (1 + out_fake).relu().mean()
            self.d_opt.zero_grad(set_to_none=True)  # drop what the last G step left on D
            ctx.backward(d_loss, "d_loss")
            self.d_opt.step()
            d_total += d_loss.detach() / self.batches_per_step
            self.d_calls += 1
        self.d_sched.step()
        with ctx.autocast():
            g_loss = -self.d(self.g(torch.randn(8, 2))).mean()
        ctx.backward(g_loss, "g_loss")
        self.g_opt.step()
        self.g_opt.zero_grad(set_to_none=True)
        if ctx.step >= self.ema_start:
            self.ema.update_parameters(unwrap(self.g))
        else:
            self.ema.module.load_state_dict(unwrap(self.g).state_dict())
        return {"lr": self.g_opt.param_groups[0]["lr"], "d_loss": d_total, "g_loss": g_loss}

    def modules(self) -> Mapping[str, nn.Module]:
        return {"generator": self.g, "discriminator": self.d, "generator_ema": self.ema}

    def evaluated(self) -> nn.Module:
        return self.ema.module

    def state_dict(self) -> dict[str, Any]:
        return {
            "generator": unwrap(self.g).state_dict(),
            "discriminator": unwrap(self.d).state_dict(),
            "generator_ema": self.ema.state_dict(),
            "g_optimizer": self.g_opt.state_dict(),
            "d_optimizer": self.d_opt.state_dict(),
            "d_scheduler": self.d_sched.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        unwrap(self.g).load_state_dict(state["generator"])
        unwrap(self.d).load_state_dict(state["discriminator"])
        self.ema.load_state_dict(state["generator_ema"])
        self.g_opt.load_state_dict(state["g_optimizer"])
        self.d_opt.load_state_dict(state["d_optimizer"])
        self.d_sched.load_state_dict(state["d_scheduler"])


def _nets() -> tuple[nn.Module, nn.Module]:
    g = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Dropout(0.2), nn.Linear(8, 2))
    d = nn.Sequential(nn.Linear(2, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1), nn.Flatten(0))
    return g, d


def _evaluate(ema: nn.Module) -> dict[str, float]:
    with torch.no_grad():
        mean = ema(torch.randn(16, 2)).mean().item()
    return {"sample_mean": mean}


def _gan_fit(
    run_dir: RunDir,
    *,
    resume: bool = False,
    crash_at: int | None = None,
    dist_env: DistEnv | None = None,
    evaluate: Any = _evaluate,
    batch_size: int = 4,
) -> tuple[ToyGanUpdater, FitResult]:
    seed_everything(0)
    g, d = _nets()
    if dist_env is not None:
        g, d = wrap_ddp(g, dist_env), wrap_ddp(d, dist_env)
        seed_everything(0, rank=dist_env.rank)
    updater = ToyGanUpdater(g, d)
    if crash_at is not None:
        original = updater.step

        def crashing(batches: Iterator[Any], ctx: StepContext) -> dict[str, Tensor | float]:
            if ctx.step == crash_at:
                raise RuntimeError("preempted")
            return original(batches, ctx)

        updater.step = crashing  # type: ignore[method-assign]
    loader = make_loader(_real(), batch_size, shuffle=True, seed=0, dist=dist_env)
    cfg = LoopConfig(epochs=3, log_every=1, eval_every=2, checkpoint_every=2, progress=False)
    result = fit_updater(
        updater,
        loader,
        loop_cfg=cfg,
        run_dir=run_dir,
        device=CPU,
        evaluate=evaluate,
        evaluate_on_all_ranks=False,
        resume=resume,
        dist_env=dist_env,
        config={"n_dis": 2},
    )
    return updater, result


def _same_state(a: Mapping[str, Any], b: Mapping[str, Any], where: str = "") -> None:
    assert a.keys() == b.keys(), where
    for key, value in a.items():
        if isinstance(value, Mapping):
            _same_state(value, b[key], f"{where}.{key}")
        elif isinstance(value, Tensor):
            assert torch.equal(value, b[key]), f"{where}.{key}"
        else:
            assert value == b[key], f"{where}.{key}"


def test_gan_updater_resume_equals_an_uninterrupted_run(tmp_path: Path) -> None:
    """Killed mid-epoch after a checkpoint and resumed, a two-optimizer run with n_dis = 2, a
    scheduler and an EMA ends with every weight, optimizer state and metrics.csv byte of the
    uninterrupted run."""
    whole, whole_result = _gan_fit(RunDir.create("t", "whole", root=tmp_path))
    parts_dir = RunDir.create("t", "parts", root=tmp_path)
    with pytest.raises(RuntimeError, match="preempted"):
        _gan_fit(parts_dir, crash_at=6)  # 3 steps per epoch: step 4's checkpoint is mid-epoch
    resumed, resumed_result = _gan_fit(parts_dir, resume=True)
    assert resumed_result == whole_result
    assert whole_result.step == 9 and whole.d_calls == 18
    _same_state(resumed.state_dict(), whole.state_dict())
    assert (
        parts_dir.metrics_path.read_bytes()
        == (tmp_path / "t" / "whole" / "metrics.csv").read_bytes()
    )
    header = parts_dir.metrics_path.read_text().splitlines()[0].split(",")
    assert header[:5] == ["step", "epoch", "lr", "d_loss", "g_loss"] and "sample_mean" in header
    ckpt = load_checkpoint(parts_dir.last_checkpoint)
    assert ckpt["batches_per_step"] == 2 and ckpt["steps_per_epoch"] == 3
    assert {"generator", "discriminator", "generator_ema", "g_optimizer"} <= ckpt.keys()


def test_the_ema_is_evaluated_with_every_module_in_eval_mode(tmp_path: Path) -> None:
    seen: list[tuple[bool, ...]] = []
    updater: ToyGanUpdater | None = None

    def evaluate(module: nn.Module) -> dict[str, float]:
        assert updater is not None and module is updater.ema.module
        seen.append(tuple(m.training for m in updater.modules().values()))
        return {"sample_mean": 0.0}

    class Spy(ToyGanUpdater):
        def __init__(self, g: nn.Module, d: nn.Module) -> None:
            nonlocal updater
            super().__init__(g, d)
            updater = self

    seed_everything(0)
    g, d = _nets()
    spy = Spy(g, d)
    fit_updater(
        spy,
        make_loader(_real(), 4, shuffle=True, seed=0),
        loop_cfg=LoopConfig(max_steps=4, eval_every=2, progress=False),
        run_dir=RunDir.create("t", "eval", root=tmp_path),
        device=CPU,
        evaluate=evaluate,
    )
    assert seen == [(False, False, False)] * 2
    assert all(m.training for m in spy.modules().values())  # back in train mode afterwards


def test_fit_is_fit_updater_with_the_optimizer_updater(tmp_path: Path) -> None:
    def run(use_updater: bool) -> nn.Module:
        seed_everything(0)
        model = nn.Sequential(nn.Linear(2, 4), nn.Tanh(), nn.Linear(4, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = make_loader(_real(), 4, shuffle=True, seed=0)

        def step(model: nn.Module, batch: tuple[Tensor]) -> dict[str, Tensor]:
            return {"loss": model(batch[0]).pow(2).mean()}

        folder = RunDir.create("t", f"u{use_updater}", root=tmp_path)
        cfg = LoopConfig(epochs=2, progress=False)
        if use_updater:
            fit_updater(
                OptimizerUpdater(model, optimizer, step, grad_accum_steps=2),
                loader,
                loop_cfg=cfg,
                run_dir=folder,
                device=CPU,
            )
        else:
            accumulating = LoopConfig(epochs=2, grad_accum_steps=2, progress=False)
            fit(model, optimizer, loader, step, loop_cfg=accumulating, run_dir=folder, device=CPU)
        return model

    for p, q in zip(run(True).parameters(), run(False).parameters(), strict=True):
        assert torch.equal(p, q)


def test_fit_updater_refuses_the_loops_own_accumulation_and_clashing_keys(
    tmp_path: Path,
) -> None:
    g, d = _nets()
    loader = make_loader(_real(), 4, shuffle=True, seed=0)
    run = RunDir.create("t", "bad", root=tmp_path)
    with pytest.raises(ValueError, match="grad_accum_steps and clip_grad_norm are the updater"):
        fit_updater(
            ToyGanUpdater(g, d),
            loader,
            loop_cfg=LoopConfig(max_steps=1, grad_accum_steps=2),
            run_dir=run,
            device=CPU,
        )

    class Clashing(ToyGanUpdater):
        def state_dict(self) -> dict[str, Any]:
            return {**super().state_dict(), "step": 0}

    with pytest.raises(ValueError, match=r"checkpoint keys \['step'\]"):
        fit_updater(
            Clashing(g, d),
            loader,
            loop_cfg=LoopConfig(max_steps=1, progress=False),
            run_dir=run,
            device=CPU,
        )
    with pytest.raises(ValueError, match="fewer than the 20 one step consumes"):
        big = ToyGanUpdater(g, d, n_dis=20)
        fit_updater(big, loader, loop_cfg=LoopConfig(max_steps=1), run_dir=run, device=CPU)


def test_a_nan_in_any_loss_names_it(tmp_path: Path) -> None:
    g, d = _nets()
    with torch.no_grad():
        next(unwrap(g).parameters()).fill_(float("nan"))  # the first layer's weight
    with pytest.raises(FloatingPointError, match="d_loss is nan at step 1"):
        fit_updater(
            ToyGanUpdater(g, d),
            make_loader(_real(), 4, shuffle=True, seed=0),
            loop_cfg=LoopConfig(max_steps=1, progress=False),
            run_dir=RunDir.create("t", "nan", root=tmp_path),
            device=CPU,
        )


def test_a_step_run_by_hand_checks_at_once() -> None:
    ctx = StepContext(7, CPU, None)  # no guard: outside the loop
    with pytest.raises(FloatingPointError, match="g_loss is nan at step 7"):
        ctx.check(torch.tensor(float("nan")), "g_loss")


def test_the_guard_records_on_the_device_and_names_the_first_bad_value() -> None:
    guard = FiniteGuard(CPU)
    values = [
        (1, "d_loss", torch.tensor(0.5)),
        (2, "z", torch.tensor([1.0, float("inf")])),  # the first bad one: a tensor
        (3, "g_loss", torch.tensor(float("nan"))),
    ]
    with count_syncs() as syncs:
        for step, name, value in values[:1]:
            StepContext(step, CPU, None, guard=guard).check(value, name)
    assert syncs == {}
    guard.raise_if_bad()  # all finite so far
    with count_syncs() as syncs:
        for step, name, value in values[1:]:
            StepContext(step, CPU, None, guard=guard).check(value, name)
    assert syncs == {}
    with pytest.raises(FloatingPointError, match="z is a tensor with non-finite entries at step 2"):
        guard.raise_if_bad()

    later = FiniteGuard(CPU)
    later.observe(torch.tensor(float("-inf"), dtype=torch.bfloat16), "loss", 4)
    later.observe(torch.tensor(float("nan")), "loss", 5)
    with pytest.raises(FloatingPointError, match="loss is -inf at step 4"):
        later.raise_if_bad(collective=False)
    with pytest.raises(ValueError, match="steps are counted from 1"):
        later.observe(torch.tensor(1.0), "loss", 0)


# Distributed: G and D wrapped in DDP on 2 gloo ranks; evaluation runs on rank 0 alone.


def _ddp_gan_worker(rank: int, port: int, folder: str) -> None:
    env = _join(rank, port)
    calls: list[int] = []

    def evaluate(ema: nn.Module) -> dict[str, float]:
        calls.append(1)
        return _evaluate(ema)

    try:
        root = Path(folder)
        # each rank: 12 rows in batches of 2, 3 steps of n_dis = 2 per epoch, 9 steps
        whole, _ = _gan_fit(RunDir(root / "whole"), dist_env=env, evaluate=evaluate, batch_size=2)
        with pytest.raises(RuntimeError, match="preempted"):
            _gan_fit(RunDir(root / "parts"), dist_env=env, crash_at=6, batch_size=2)
        resumed, _ = _gan_fit(RunDir(root / "parts"), dist_env=env, resume=True, batch_size=2)
        torch.save(
            {
                "whole": copy.deepcopy(whole.state_dict()),
                "resumed": resumed.state_dict(),
                "eval_calls": len(calls),
            },
            root / f"rank{rank}.pt",
        )
    finally:
        cleanup_distributed()
    exit_without_teardown()


def test_ddp_gan_resumes_and_evaluates_on_rank_zero_only(tmp_path: Path) -> None:
    for name in ("whole", "parts"):
        RunDir.create("t", name, root=tmp_path)
    ctx = mp.get_context("spawn")
    port = _free_port()
    folder = str(tmp_path / "t")
    procs = [ctx.Process(target=_ddp_gan_worker, args=(r, port, folder)) for r in range(WORLD)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=180)
    assert [proc.exitcode for proc in procs] == [0] * WORLD
    out = [torch.load(tmp_path / "t" / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    assert out[0]["eval_calls"] == 5 and out[1]["eval_calls"] == 0  # steps 2, 4, 6, 8, 9
    for rank in range(WORLD):
        _same_state(out[rank]["resumed"], out[rank]["whole"], f"rank{rank}")
    _same_state(out[1]["whole"]["generator"], out[0]["whole"]["generator"])  # DDP kept G equal
    parts, whole = (
        RunDir(tmp_path / "t" / n).metrics_path.read_bytes() for n in ("parts", "whole")
    )
    assert parts == whole
