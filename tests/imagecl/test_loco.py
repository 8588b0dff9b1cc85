"""LoCo and GIM: which stage learns from which loss, the end-to-end case, both backward paths."""

from __future__ import annotations

import copy
import functools
import io
import json
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

# needs the image extra (kornia): skipped without it, not a collection error
pytest.importorskip("kornia")

from imagecl import models
from imagecl.augment import SimCLRViews
from imagecl.backbones import Backbone, ResNetBackbone, build_backbone
from imagecl.commands import train
from imagecl.config import QUICK, Config
from imagecl.data import load_data
from imagecl.evaluate import evaluate_encoder
from imagecl.loco import LocalUpdater, local_backward_step, loco_loss, loco_train_step
from imagecl.loco_model import LoCoModel, LoCoOutput, split_stages, unstack_views
from imagecl.networks import ImageModel, build_head
from imagecl.report import readout_table
from shared.config import parse_config
from shared.losses import nt_xent_loss
from shared.runtime import unwrap
from shared.updaters import OptimizerUpdater, StepContext, Updater
from tests.processes import exit_without_teardown

BACKBONES = ("small_cnn", "resnet18")
STAGE_DIMS = {"small_cnn": (8, 16, 32, 32), "resnet18": (64, 128, 256, 512)}  # small_cnn width 8
MODES: dict[str, dict[str, Any]] = {
    "end_to_end": {"end_to_end": True},
    "gim": {"overlap": 0},
    "loco": {"overlap": 1},
}
TAU = 0.5


def make_model(name: str, seed: int = 0, **kwargs: Any) -> LoCoModel:
    torch.manual_seed(seed)
    return LoCoModel(build_backbone(name, width=8), **kwargs).train()


def two_views(n: int = 2, size: int = 16, seed: int = 0) -> Tensor:
    """(N, 2, 3, S, S): an image and a noisy copy of it, so that the positives differ."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, size, size, generator=g)
    noisy = x + 0.1 * torch.randn(n, 3, size, size, generator=g)
    return torch.stack([x, noisy], dim=1)  # (N, 2, 3, S, S)


def fixed_views(x: Tensor) -> Callable[[Tensor], Tensor]:
    """A ``views`` callable that ignores the images and returns ``x`` (as the step expects)."""
    return lambda images: x


def unit_losses(model: LoCoModel, x: Tensor) -> list[Tensor]:
    out1, out2 = unstack_views(model(x.flatten(0, 1)), 2)
    return loco_loss(out1, out2, temperature=TAU)[1]


def stage_of_parameters(model: LoCoModel) -> dict[int, int]:
    """id(parameter) -> its stage."""
    return {id(p): k for k, stage in enumerate(model.stages) for p in stage.parameters()}


# --- stages ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("stages", [1, 2, 3, 4])
@pytest.mark.parametrize("name", BACKBONES)
def test_split_stages_partition_the_backbone(name: str, stages: int) -> None:
    """The stages are the backbone's own modules, each parameter in exactly one of them, and
    running them in order then pooling is the backbone."""
    torch.manual_seed(0)
    backbone = build_backbone(name, width=8).eval()
    parts = split_stages(backbone, stages)
    assert len(parts) == stages
    owned = [id(p) for part in parts for p in part.parameters()]
    assert sorted(owned) == sorted(id(p) for p in backbone.parameters())  # shared, no copies
    x = torch.randn(2, 3, 16, 16)
    h = x
    with torch.no_grad():
        for part in parts:
            h = part(h)
        torch.testing.assert_close(h.mean(dim=(2, 3)), backbone(x))


def test_split_stages_merge_earlier_groups_first() -> None:
    """ResNet with 3 stages: [stem..layer2, layer3, layer4]."""
    backbone = build_backbone("resnet18")
    assert isinstance(backbone, ResNetBackbone)
    r = backbone.resnet
    first, second, third = split_stages(backbone, 3)
    assert isinstance(first, nn.Sequential) and first[-1] is r.layer2
    assert second is r.layer3 and third is r.layer4


# --- gradient routing -----------------------------------------------------------------------------


def expected_stages(mode: str, unit: int, stages: int) -> set[int]:
    if mode == "end_to_end":
        return set(range(stages))
    if mode == "gim":
        return {unit}
    return {unit, unit + 1} & set(range(stages))  # loco: its stage and the shared one above


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("name", BACKBONES)
def test_each_stage_learns_from_exactly_its_losses(name: str, mode: str) -> None:
    """Back-propagate each unit's loss alone; hooks on every parameter record where gradient
    arrives. GIM: loss k reaches stage k only. LoCo: stage k and k+1 (the shared stage), and
    nothing crosses further down. End to end: the one loss reaches every stage."""
    model = make_model(name, **MODES[mode])
    K = len(model.stages)
    stage_of = stage_of_parameters(model)
    head_of = {id(p): u for u, head in enumerate(model.heads) for p in head.parameters()}
    reached_stages: set[int] = set()
    reached_heads: set[int] = set()

    def record(param: Tensor) -> None:
        assert param.grad is not None and torch.isfinite(param.grad).all()
        if id(param) in stage_of:
            reached_stages.add(stage_of[id(param)])
        if id(param) in head_of:
            reached_heads.add(head_of[id(param)])

    handles = [
        p.register_post_accumulate_grad_hook(record)  # type: ignore[no-untyped-call]
        for p in model.parameters()
    ]
    x = two_views()
    for unit in range(len(model.units)):
        reached_stages.clear()
        reached_heads.clear()
        model.zero_grad(set_to_none=True)
        torch.autograd.backward(unit_losses(model, x)[unit])
        assert reached_stages == expected_stages(mode, unit, K), f"unit {unit}"
        assert reached_heads == {unit}
        for k, stage in enumerate(model.stages):  # the gradient that arrives is not zero
            if k in reached_stages:
                grads = [p.grad for p in stage.parameters() if p.grad is not None]
                assert any(g.abs().sum() > 0 for g in grads)
    for handle in handles:
        handle.remove()


@pytest.mark.parametrize("name", BACKBONES)
def test_loco_shared_stage_sums_both_losses(name: str) -> None:
    """LoCo's stage k+1 gets the sum of the gradients of losses k and k+1; stage k's gradient
    is the same whether or not loss k+1 is added (nothing crosses the detached input)."""
    model = make_model(name, overlap=1)
    x = two_views()

    def grads(units: list[int]) -> list[Tensor]:
        model.zero_grad(set_to_none=True)
        losses = unit_losses(model, x)
        torch.autograd.backward(torch.stack([losses[u] for u in units]).sum())
        return [
            torch.cat([p.grad.flatten() for p in s.parameters() if p.grad is not None])
            if any(p.grad is not None for p in s.parameters())
            else torch.zeros(0)
            for s in model.stages
        ]

    g0, g1, g01 = grads([0]), grads([1]), grads([0, 1])
    torch.testing.assert_close(g01[1], g0[1] + g1[1])
    torch.testing.assert_close(g01[0], g0[0])
    assert g1[0].numel() == 0  # loss 1 never reaches stage 0


# --- the end-to-end special case ------------------------------------------------------------------


@pytest.mark.parametrize("name", BACKBONES)
def test_one_stage_gim_equals_end_to_end_simclr(name: str) -> None:
    """overlap 0 with stages=1 is end_to_end=True on the same weights, and both are SimCLR of
    imagecl's ImageModel (backbone + 2-layer MLP head + NT-Xent): same loss, same gradients."""
    gim = make_model(name, stages=1, overlap=0)
    e2e = make_model(name, seed=1, end_to_end=True)
    e2e.load_state_dict(gim.state_dict())
    backbone = copy.deepcopy(gim.backbone)
    assert isinstance(backbone, Backbone)
    simclr = ImageModel(backbone, head=build_head("mlp", gim.feature_dim)).train()
    assert simclr.head is not None
    simclr.head.load_state_dict(gim.heads[0].state_dict())
    x = two_views().flatten(0, 1)  # (2N, 3, S, S)
    z = simclr(x).z
    assert z is not None
    z = z.view(-1, 2, z.shape[-1])  # (N, 2, D)
    reference = nt_xent_loss(z[:, 0], z[:, 1], temperature=TAU)
    torch.autograd.backward(reference)
    for model in (gim, e2e):
        (loss,) = unit_losses(model, x.view(-1, 2, *x.shape[1:]))
        torch.autograd.backward(loss)
        torch.testing.assert_close(loss, reference)
        backbone_grads = {n: p.grad for n, p in model.backbone.named_parameters()}
        for n, p in simclr.backbone.named_parameters():
            torch.testing.assert_close(backbone_grads[n], p.grad, msg=n)
        assert simclr.head is not None
        for p, q in zip(model.heads[0].parameters(), simclr.head.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad)


# --- shapes, gradients, decoders, weights ---------------------------------------------------------


@pytest.mark.parametrize("stages", [1, 2, 4])
@pytest.mark.parametrize("name", BACKBONES)
def test_readout_shapes(name: str, stages: int) -> None:
    """readout(x, k) is (N, C_k), equals the forward's features[k]; the last stage's is h."""
    model = make_model(name, stages=stages).eval()
    ends = {1: (3,), 2: (1, 3), 4: (0, 1, 2, 3)}[stages]  # last base stage of each group
    assert model.stage_dims == tuple(STAGE_DIMS[name][e] for e in ends)
    x = torch.randn(3, 3, 16, 16)
    x_before = x.clone()
    with torch.no_grad():
        out = model(x)
        assert len(out.features) == stages and len(out.projections) == stages
        for k in range(stages):
            feature = model.readout(x, k)
            assert feature.shape == (3, model.stage_dims[k])
            torch.testing.assert_close(feature, out.features[k])
        torch.testing.assert_close(out.features[-1], model.backbone(x))
    torch.testing.assert_close(x, x_before, rtol=0, atol=0)


CONFIGS: dict[str, dict[str, Any]] = {
    **MODES,
    "loco_decoder2": {"overlap": 1, "decoder_depth": 2},
    "gim_decoder1_stages3": {"overlap": 0, "decoder_depth": 1, "stages": 3},
    "end_to_end_decoder1": {"end_to_end": True, "decoder_depth": 1},
}


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("name", BACKBONES)
def test_every_parameter_gets_a_finite_gradient(name: str, config: str) -> None:
    """timm's backward test: projections (B, head_dim), every parameter (decoders included) a
    finite, non-zero gradient, nothing NaN."""
    model = make_model(name, head_dim=16, **CONFIGS[config])
    x = two_views()  # 2 images 3×16×16, two views each
    out = model(x.flatten(0, 1))
    assert all(z.shape == (4, 16) for z in out.projections)
    assert len(out.projections) == len(model.units) == len(model.decoders) == len(model.heads)
    loss, per_unit = loco_loss(*unstack_views(out, 2), temperature=TAU)
    assert torch.isfinite(loss) and len(per_unit) == len(model.units)
    torch.autograd.backward(loss)
    for param_name, param in model.named_parameters():
        assert param.grad is not None, f"{param_name} got no gradient"
        assert torch.isfinite(param.grad).all(), f"{param_name} has a non-finite gradient"
        assert param.grad.abs().sum() > 0, f"{param_name} has a zero gradient"
    if CONFIGS[config].get("decoder_depth"):
        assert all(len(list(d.parameters())) > 0 for d in model.decoders)


def test_unit_weights_scale_the_losses() -> None:
    """loss = Σ w_k L_k, per-unit losses unweighted, and head k's gradient scales by w_k."""
    weights = (1.0, 2.0, 0.5, 0.0)
    plain = make_model("small_cnn", overlap=1)
    weighted = make_model("small_cnn", overlap=1, unit_weights=weights)
    weighted.load_state_dict(plain.state_dict())
    x = two_views()
    results = []
    for model in (plain, weighted):
        out1, out2 = unstack_views(model(x.flatten(0, 1)), 2)
        loss, per_unit = loco_loss(out1, out2, temperature=TAU, weights=model.unit_weights)
        torch.autograd.backward(loss)
        results.append((loss, per_unit))
    (plain_loss, plain_units), (weighted_loss, weighted_units) = results
    torch.testing.assert_close(plain_loss, torch.stack(plain_units).sum())
    torch.testing.assert_close(weighted_units, plain_units)
    expected = sum(w * unit for w, unit in zip(weights, plain_units, strict=True))
    torch.testing.assert_close(weighted_loss, expected)
    for w, head_p, head_w in zip(weights, plain.heads, weighted.heads, strict=True):
        for p, q in zip(head_p.parameters(), head_w.parameters(), strict=True):
            assert p.grad is not None and q.grad is not None
            torch.testing.assert_close(q.grad, w * p.grad)


def test_unstack_views_takes_interleaved_rows() -> None:
    """Rows n·2 + v of a stacked forward belong to view v of sample n."""
    z = torch.arange(12.0).view(6, 2)  # 3 samples × 2 views, D = 2
    first, second = unstack_views(LoCoOutput([z], [z]), 2)
    torch.testing.assert_close(first.projections[0], z[0::2])
    torch.testing.assert_close(second.features[0], z[1::2])


# --- the two backward paths -----------------------------------------------------------------------


def batch_norms(model: nn.Module) -> list[nn.BatchNorm2d]:
    return [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]


@pytest.mark.parametrize("name", BACKBONES)
def test_batch_norm_statistics_updated_once_per_forward(name: str) -> None:
    """LoCo runs each shared stage twice, but its batch norms count (and average) the batch once;
    the running statistics equal those of end-to-end training on the same weights."""
    loco = make_model(name, overlap=1, decoder_depth=1)
    e2e = make_model(name, end_to_end=True)
    e2e.backbone.load_state_dict(loco.backbone.state_dict())
    x = two_views().flatten(0, 1)
    with torch.no_grad():
        loco(x)
        e2e(x)
    assert all(bn.num_batches_tracked == 1 for bn in batch_norms(loco))
    for a, b in zip(batch_norms(loco.backbone), batch_norms(e2e.backbone), strict=True):
        torch.testing.assert_close(a.running_mean, b.running_mean)
        torch.testing.assert_close(a.running_var, b.running_var)


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("name", BACKBONES)
def test_local_backward_equals_single_backward(name: str, config: str) -> None:
    """Per-unit backward (b) gives the losses, gradients and running statistics of the single
    backward of the total loss (a) on the same weights and views."""
    kwargs = {**CONFIGS[config], "unit_weights": None}
    single = make_model(name, **kwargs)
    if not CONFIGS[config].get("end_to_end"):
        kwargs["unit_weights"] = [0.5 + u for u in range(len(single.units))]
        single = make_model(name, **kwargs)
    local = copy.deepcopy(single)
    views = fixed_views(two_views())
    batch = (torch.zeros(2, 3, 16, 16, dtype=torch.uint8), torch.zeros(2, dtype=torch.long))
    out = loco_train_step(single, batch, views=views, temperature=TAU, gather=False)
    torch.autograd.backward(out["loss"])
    metrics = local_backward_step(local, batch, views=views, temperature=TAU)
    assert set(metrics) == set(out)
    for key in out:
        torch.testing.assert_close(metrics[key], out[key].detach(), msg=key)
    assert not metrics["loss"].requires_grad
    grads = dict(local.named_parameters())
    for param_name, param in single.named_parameters():
        torch.testing.assert_close(grads[param_name].grad, param.grad, msg=param_name)
    for a, b in zip(batch_norms(single), batch_norms(local), strict=True):
        torch.testing.assert_close(a.running_mean, b.running_mean)


def test_train_step_smoke_with_simclr_views() -> None:
    """loco_train_step on a tiny uint8 batch with the CIFAR views: the loss and one metric per
    unit, all finite; the images untouched; the loss back-propagates to every parameter."""
    torch.manual_seed(0)
    mean, std = (0.49, 0.48, 0.45), (0.25, 0.24, 0.26)
    views = SimCLRViews(32, mean, std, "simclr_cifar")
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8, generator=g)
    labels = torch.zeros(4, dtype=torch.long)
    before = images.clone()
    model = make_model("small_cnn", overlap=1)
    out = loco_train_step(model, (images, labels), views=views, temperature=TAU, gather=False)
    assert set(out) == {"loss", "unit0_loss", "unit1_loss", "unit2_loss", "unit3_loss"}
    assert all(torch.isfinite(v) and v.ndim == 0 for v in out.values())
    torch.autograd.backward(out["loss"])
    assert all(p.grad is not None for p in model.parameters())
    torch.testing.assert_close(images, before, rtol=0, atol=0)
    metrics = local_backward_step(model, (images, labels), views=views, temperature=TAU)
    assert set(metrics) == set(out) and torch.isfinite(metrics["loss"])


CPU = torch.device("cpu")
# the quick preset shrunk for LoCo on digits (1 channel): a width-4 small CNN, whose pooled random
# features are weak enough for learning to show within 12 epochs of batch 64 (252 steps)
TINY_LOCO = [
    "--quick",
    "--method",
    "loco",
    "--data",
    "digits",
    "--width",
    "4",
    "--batch-size",
    "64",
    "--lr",
    "5e-3",
    "--device",
    "cpu",
]


# --- the per-unit updater of `imagecl train`, DDP, --compile --------------------------------------


def _one_step(updater: Updater, batch: tuple[Tensor, Tensor]) -> dict[str, Any]:
    """One step of ``updater`` on ``batch`` (by hand: no loop, fp32 on the CPU)."""
    return updater.step(iter([batch]), StepContext(step=1, device=CPU, dtype=None))


def _updaters(model: LoCoModel, gather: bool) -> dict[str, OptimizerUpdater]:
    """The per-unit updater and the single-backward one (fit's), on copies of ``model``."""
    views = fixed_views_of
    local, single = copy.deepcopy(model), copy.deepcopy(model)
    return {
        "local": LocalUpdater(
            local,
            torch.optim.SGD(local.parameters(), lr=0.1),
            views=views,
            temperature=TAU,
            gather=gather,
        ),
        "single": OptimizerUpdater(
            single,
            torch.optim.SGD(single.parameters(), lr=0.1),
            functools.partial(loco_train_step, views=views, temperature=TAU, gather=gather),
        ),
    }


def fixed_views_of(images: Tensor) -> Tensor:
    return images  # the "images" of these batches are already (N, 2, C, S, S) views


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_local_updater_step_equals_the_single_backward_step(config: str) -> None:
    """One step of the per-unit updater (what `imagecl train --method loco` runs) leaves the
    weights, running statistics and metrics of fit's single-backward step."""
    model = make_model("small_cnn", **CONFIGS[config])
    batch = (two_views(4), torch.zeros(4, dtype=torch.long))
    updaters = _updaters(model, gather=False)
    metrics = {name: _one_step(u, batch) for name, u in updaters.items()}
    assert set(metrics["local"]) == set(metrics["single"])
    for key, value in metrics["single"].items():
        torch.testing.assert_close(torch.as_tensor(metrics["local"][key]), torch.as_tensor(value))
    local, single = (unwrap(u.modules()["model"]) for u in updaters.values())
    torch.testing.assert_close(local.state_dict(), single.state_dict())
    assert all(p.grad is None for p in local.parameters())  # zeroed for the next step
    assert updaters["local"].state_dict().keys() == updaters["single"].state_dict().keys()


WORLD = 2


def _ddp_batch() -> tuple[Tensor, Tensor]:
    return two_views(8, seed=3).double(), torch.zeros(8, dtype=torch.long)  # (8, 2, 3, 16, 16)


def _ddp_model(overlap: int) -> LoCoModel:
    return make_model("small_cnn", overlap=overlap).double()


def _ddp_worker(rank: int, port: int, queue: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        x, y = _ddp_batch()
        rows = slice(rank * 4, rank * 4 + 4)
        out: dict[str, Any] = {}
        for overlap in (0, 1):
            for mode in ("eval", "train"):
                updaters = _updaters(_ddp_model(overlap), gather=True)
                for name, updater in updaters.items():
                    model = unwrap(updater.modules()["model"])
                    model.train(mode == "train")
                    updater.model = DistributedDataParallel(model)
                    _one_step(updater, (x[rows], y[rows]))
                    out[f"{overlap}-{mode}-{name}"] = model.state_dict()
        buffer = io.BytesIO()
        torch.save((rank, out), buffer)  # plain bytes: shared-memory tensors die with the process
        queue.put(buffer.getvalue())
    finally:
        dist.destroy_process_group()
    exit_without_teardown(queue)


@pytest.fixture(scope="module")
def two_ranks() -> dict[int, dict[str, Any]]:
    """One 2-process gloo run serves the DDP tests (spawning costs seconds)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = [ctx.Process(target=_ddp_worker, args=(r, port, queue)) for r in range(WORLD)]
    for proc in procs:
        proc.start()
    results = {}
    for _ in procs:
        rank, out = torch.load(io.BytesIO(queue.get(timeout=300)), weights_only=True)
        results[rank] = out
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    return results


@pytest.mark.parametrize("overlap", [0, 1])
def test_local_updater_on_two_ranks_equals_one_process_on_the_whole_batch(
    two_ranks: dict[int, dict[str, Any]], overlap: int
) -> None:
    """2 gloo ranks, half the batch each, negatives gathered: after one per-unit step every
    rank holds the weights one process gets from the whole batch (batch norm in eval mode, so
    that the statistics do not depend on the split); float64."""
    model = _ddp_model(overlap).eval()
    updater = _updaters(model, gather=False)["local"]
    _one_step(updater, _ddp_batch())
    expected = unwrap(updater.modules()["model"]).state_dict()
    for rank in range(WORLD):
        torch.testing.assert_close(
            two_ranks[rank][f"{overlap}-eval-local"], expected, rtol=0, atol=1e-12
        )


@pytest.mark.parametrize("overlap", [0, 1])
def test_local_updater_on_two_ranks_equals_ddp_single_backward(
    two_ranks: dict[int, dict[str, Any]], overlap: int
) -> None:
    """In train mode (per-rank batch statistics), the per-unit step with its own all-reduce
    equals DDP's reducer on the single-backward step, on both ranks."""
    for rank in range(WORLD):
        got = two_ranks[rank]
        local, single = got[f"{overlap}-train-local"], got[f"{overlap}-train-single"]
        torch.testing.assert_close(_weights(local), _weights(single), rtol=0, atol=1e-12)
    # and the ranks agree on every weight
    weights = [_weights(two_ranks[rank][f"{overlap}-train-local"]) for rank in range(WORLD)]
    torch.testing.assert_close(weights[0], weights[1], rtol=0, atol=1e-12)


def _weights(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The trained tensors of a state dict (batch-norm buffers are each rank's own)."""
    return {k: v for k, v in state.items() if "running" not in k and "batches" not in k}


def test_local_backward_step_refuses_a_ddp_wrapper() -> None:
    class FakeDDP(DistributedDataParallel):
        def __init__(self) -> None:  # no process group needed to test the refusal
            nn.Module.__init__(self)

    with pytest.raises(ValueError, match="LocalUpdater"):
        local_backward_step(FakeDDP(), _ddp_batch(), views=fixed_views_of, temperature=TAU)


# dynamo reads .grad of the non-leaf inputs of a unit's modules (LoCo's decoder stage, the heads):
# silent in a normal run, an error under this suite's warnings-as-errors
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
def test_compile_units_compiles_what_the_per_unit_path_runs() -> None:
    """``compile_units`` compiles every stage, decoder and head in place: the per-unit step runs
    compiled graphs, the gradients and the state-dict keys are those of the plain model."""
    calls: list[int] = []  # one entry per run of a compiled graph

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Tensor]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            calls.append(1)
            return gm.forward(*args)

        return run

    plain = make_model("small_cnn", overlap=1, decoder_depth=1)
    compiled = copy.deepcopy(plain)
    compiled.compile_units(backend=backend)
    assert list(compiled.state_dict()) == list(plain.state_dict())
    batch = (two_views(4), torch.zeros(4, dtype=torch.long))
    try:
        for model in (plain, compiled):
            local_backward_step(model, batch, views=fixed_views_of, temperature=TAU)
    finally:
        torch._dynamo.reset()
    # each call of a stage (own or shared), decoder and head ran compiled graphs
    modules_called = len(compiled.stages) + sum(len(u.decoder) + 2 for u in compiled.units)
    assert len(calls) >= modules_called
    grads = dict(compiled.named_parameters())
    for name, param in plain.named_parameters():
        torch.testing.assert_close(grads[name].grad, param.grad, msg=name)


def test_train_build_compiles_the_loco_units() -> None:
    """`imagecl train --method loco --compile` compiles the modules its step calls."""
    argv = [*TINY_LOCO, "--compile"]
    cfg = parse_config(Config, argv, prog="imagecl train", presets={"quick": QUICK})
    built = models.build(cfg, device=CPU)
    loco = unwrap(built.model)
    assert isinstance(loco, LoCoModel)
    for module in (*loco.stages, *loco.decoders, *loco.heads):
        assert module._compiled_call_impl is not None


def test_imagecl_train_loco_steps_through_the_local_updater(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI's LoCo steps are the per-unit updater's (local learning's memory)."""
    steps: list[int] = []
    original = LocalUpdater.step

    def spy(self: LocalUpdater, batches: Any, ctx: StepContext) -> dict[str, Any]:
        steps.append(ctx.step)
        return original(self, batches, ctx)

    monkeypatch.setattr(LocalUpdater, "step", spy)
    train.main([*TINY_LOCO, "--max-steps", "2", "--out", str(tmp_path / "run")])
    assert steps == [1, 2]


# --- the run folder and learning ------------------------------------------------------------------


def test_loco_run_plots_and_reports_the_readout_of_every_stage(tmp_path: Path) -> None:
    out = tmp_path / "gim"
    summary = train.main([*TINY_LOCO, "--overlap", "0", "--max-steps", "2", "--out", str(out)])
    assert (out / "plots" / "loco_readout.png").stat().st_size > 0
    assert (out / "plots" / "training.png").stat().st_size > 0
    report = (out / "report.md").read_text()
    assert "![loco_readout](plots/loco_readout.png)" in report
    assert "## Readout per stage" in report and "Greedy InfoMax (overlap 0)" in report
    accuracies = [summary[f"stage{k}_probe_accuracy"] for k in range(4)]
    # the last stage is the backbone's h: its readout is the run's linear probe
    assert accuracies[-1] == summary["linear_probe_accuracy"]
    for k, accuracy in enumerate(accuracies):
        assert f"| {k + 1} | " in report and f"{100 * accuracy:.1f} |" in report
    assert json.loads((out / "summary.json").read_text())["stage0_probe_accuracy"] == accuracies[0]


def test_readout_table_lists_each_stage_with_its_width() -> None:
    model = make_model("small_cnn")  # width 8: stage dims 8, 16, 32, 32
    table = readout_table(model, [0.1, 0.25, 0.5, 0.755])
    assert table.splitlines()[2:] == [
        "| 1 | 8 | 10.0 |",
        "| 2 | 16 | 25.0 |",
        "| 3 | 32 | 50.0 |",
        "| 4 | 32 | 75.5 |",
    ]


@pytest.mark.slow
def test_loco_readout_on_digits_beats_the_random_init_encoder(tmp_path: Path) -> None:
    """Learning: 252 LoCo steps on digits lift the last stage's readout probe well above the
    same network at its initial weights.

    Measured (seed 0, 1 thread): random init 59 %, LoCo 79 % (stages 1-4: 49, 64, 73, 79 %).
    The width is 4 so that random pooled features are weak: at width 32 a random small CNN
    already probes 92 % on digits, which leaves no room to show learning in a short test.
    """
    summary = train.main([*TINY_LOCO, "--epochs", "12", "--out", str(tmp_path / "run")])
    data = load_data("digits", seed=0)
    torch.manual_seed(0)  # the initial weights of the run (build seeds the same way)
    random_init = build_backbone("small_cnn", in_channels=1, width=4)
    baseline = evaluate_encoder(random_init, data, device=CPU, knn_k=())
    learned = summary["stage3_probe_accuracy"]
    assert learned - baseline["linear_probe_accuracy"] > 0.1, (
        learned,
        baseline["linear_probe_accuracy"],
    )


# --- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: split_stages(build_backbone("small_cnn"), 0), "stages"),
        (lambda: split_stages(build_backbone("small_cnn"), 5), "stages"),
        (lambda: split_stages(build_backbone("small_cnn"), True), "stages"),
        (lambda: split_stages(nn.Linear(3, 3), 4), "ResNetBackbone and SmallCNN"),
        (lambda: make_model("small_cnn", overlap=2), "overlap"),
        (lambda: make_model("small_cnn", overlap=True), "overlap"),
        (lambda: make_model("small_cnn", head_dim=0), "head_dim"),
        (lambda: make_model("small_cnn", decoder_depth=-1), "decoder_depth"),
        (lambda: make_model("small_cnn", unit_weights=[1.0, 1.0]), "4 unit weights"),
        (lambda: make_model("small_cnn", unit_weights=[1.0, -1.0, 1.0, 1.0]), ">= 0"),
        (lambda: make_model("small_cnn", unit_weights=[1.0, float("nan"), 1.0, 1.0]), ">= 0"),
        (lambda: make_model("small_cnn", end_to_end=True, unit_weights=[1.0, 1.0]), "1 unit"),
        (lambda: make_model("small_cnn").readout(torch.zeros(1, 3, 8, 8), 4), "stage"),
        (lambda: make_model("small_cnn").readout(torch.zeros(1, 3, 8, 8), -1), "stage"),
    ],
)
def test_bad_settings_raise(build: Callable[[], object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build()


def test_bad_loss_inputs_raise() -> None:
    z = torch.randn(4, 8)
    two, three = LoCoOutput([], [z, z]), LoCoOutput([], [z, z, z])
    with pytest.raises(ValueError, match="units"):
        loco_loss(two, three, temperature=TAU)
    with pytest.raises(ValueError, match="2 unit weights"):
        loco_loss(two, two, temperature=TAU, weights=[1.0])
    model = make_model("small_cnn")
    batch = (torch.zeros(2, 3, 8, 8, dtype=torch.uint8), torch.zeros(2, dtype=torch.long))
    three_views = fixed_views(torch.zeros(2, 3, 3, 8, 8))
    with pytest.raises(ValueError, match="exactly 2 views"):
        loco_train_step(model, batch, views=three_views, temperature=TAU, gather=False)
    with pytest.raises(TypeError, match="LoCoModel"):
        loco_train_step(nn.Linear(2, 2), batch, views=three_views, temperature=TAU, gather=False)
