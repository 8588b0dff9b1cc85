"""Every console-script command under ``torchrun --nproc-per-node 2``: gloo on the CPU, tiny sizes.

The training commands (``graphcl pretrain``, ``imagecl train`` for every method, ``contragan
train``) train with DDP on both ranks: one run folder, written by rank 0, whose checkpoint,
metrics and summary count the global batch (each rank takes half of every epoch). The
one-process commands (``graphcl finetune`` / ``probe``, ``imagecl eval`` / ``finetune``,
``contragan sample`` / ``evaluate``) run on rank 0 alone while every other rank exits at once
with status 0 (``shared.runtime.runs_on_this_rank``). A NaN on one rank stops the job instead of
leaving the other rank waiting in a collective. Each command is launched the way the README
shows, ``torchrun ... --no-python <script> <pipeline> [options]``, under a timeout, so a hang
fails the test instead of stalling the suite.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

from shared.checkpoint import load_checkpoint
from tests.processes import kill_job

WORLD = 2
TIMEOUT_S = 240  # a hung collective ends here as a failure, not as a stalled test run
STAMP = r"\d{8}-\d{6}"  # the time stamp of a default run folder name

# imagecl at 8×8 pixels with a 4-channel small CNN: one step is a few milliseconds
IMAGE = [
    "--quick",
    "--device",
    "cpu",
    "--data",
    "digits",
    "--image-size",
    "8",
    "--width",
    "4",
    "--head-dim",
    "8",
    "--log-every",
    "1",
    "--eval-every",
    "none",
    "--amp",
    "off",
]
IMAGE_BATCH = 64  # per rank
GRAPH = ["--device", "cpu", "--num-layers", "2", "--hidden", "16", "--amp", "off"]
MOLECULES, GRAPH_BATCH = 96, 16
GAN = [
    "--data",
    "digits",
    "--image-size",
    "16",
    "--arch",
    "digits",
    "--width",
    "8",
    "--batch-size",
    "16",
    "--n-dis",
    "2",
    "--ema-start",
    "2",
    "--ema-decay",
    "0.9",
    "--log-every",
    "1",
    "--device",
    "cpu",
    "--amp",
    "off",
    "--max-steps",
    "2",
]


class Launch(NamedTuple):
    """What one ``torchrun`` job left: its exit status, the launcher's output, each rank's."""

    returncode: int
    output: str
    ranks: list[str]  # rank r's stdout and stderr


def torchrun(command: list[str], cwd: Path, logs: Path, *options: str) -> Launch:
    """Run ``command`` (a console script and its arguments, or a .py file) on 2 local ranks.

    Each rank's stdout and stderr go to files under ``logs`` (torchrun's ``--redirects 3``);
    ``options`` are more of torchrun's own.
    The job runs in its own process group, killed whole if it outlives :data:`TIMEOUT_S`.
    """
    env = {k: v for k, v in os.environ.items() if k not in _TORCHRUN_VARS}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["CONTRASTKIT_CACHE"] = str(logs.parent / "molecule-cache")  # the ranks share it
    program = command[0]  # a .py file runs in torchrun's python, a console script on its own
    launch = [program] if program.endswith(".py") else ["--no-python", _script(program)]
    args = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={WORLD}",
        f"--log-dir={logs}",
        "--redirects=3",
        *options,
        *launch,
        *command[1:],
    ]
    cwd.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        args,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        kill_job(proc.pid)  # the launcher and both ranks, each in a session of its own
        proc.communicate()
        pytest.fail(f"{' '.join(command[:2])} under torchrun did not end in {TIMEOUT_S} s")
    ranks = []
    for rank in range(WORLD):
        files = sorted(logs.glob(f"*/attempt_0/{rank}/std*.log"))
        ranks.append("".join(path.read_text(errors="replace") for path in files))
    return Launch(proc.returncode, output, ranks)


def _script(name: str) -> str:
    """The console script ``name`` installed beside this python (``pip install -e .``)."""
    path = Path(sys.executable).with_name(name)
    assert path.is_file(), f"{path} is missing: install the package (pip install -e .)"
    return str(path)


_TORCHRUN_VARS = {
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
}


def _ok(job: Launch) -> None:
    """Exit 0 from the launcher, which means exit 0 on every rank."""
    assert job.returncode == 0, (job.output[-3000:], [text[-3000:] for text in job.ranks])


def _only_entry(folder: Path, pattern: str, prefix: str = "") -> Path:
    """The single entry of ``folder`` whose name starts with ``prefix``; it matches ``pattern``."""
    entries = sorted(p.name for p in folder.iterdir() if p.name.startswith(prefix))
    assert len(entries) == 1 and re.fullmatch(pattern, entries[0]), entries
    return folder / entries[0]


def _metric_steps(run: Path) -> list[int]:
    with (run / "metrics.csv").open(newline="") as handle:
        return [int(row["step"]) for row in csv.DictReader(handle)]


def _assert_one_process_command(job: Launch, command: str) -> None:
    """Rank 0 ran the command; rank 1 said it had nothing to do and wrote nothing."""
    _ok(job)
    assert f"{command}: runs in one process, rank 0; rank 1 exits" in job.ranks[1]
    assert "runs in one process" not in job.ranks[0]


@pytest.fixture(scope="module")
def digits_train_size() -> int:
    from imagecl.data import load_data

    return len(load_data("digits", seed=0, image_size=8).train)


def _check_image_training(
    tmp_path: Path, method: str, n_train: int, job: Launch, extra_files: tuple[str, ...] = ()
) -> Path:
    """One folder ``runs/imagecl/<method>-<time>`` for the 2-rank job, counting global batches."""
    _ok(job)
    work = tmp_path / "work"
    assert sorted(p.name for p in work.iterdir()) == ["runs"]  # nothing else in the cwd
    run = _only_entry(work / "runs" / "imagecl", rf"{method}-{STAMP}")
    steps = (n_train // WORLD) // IMAGE_BATCH  # each rank takes half the epoch, whole batches
    ckpt = load_checkpoint(run / "checkpoints" / "last.pt")
    assert ckpt["step"] == steps and ckpt["world_size"] == WORLD
    assert len(ckpt["rng_per_rank"]) == WORLD
    assert _metric_steps(run) == list(range(1, steps + 1))  # one row per step, rank 0's alone
    summary = json.loads((run / "summary.json").read_text())
    assert summary["method"] == method and summary["steps"] == steps
    assert summary["linear_probe_accuracy"] > 0.2  # 10 classes: chance is 0.1
    for name in ("config.json", "encoder.safetensors", "report.md", *extra_files):
        assert (run / name).is_file(), name
    return run


def _train_images(tmp_path: Path, method: str, *extra: str) -> Launch:
    argv = [*IMAGE, "--method", method, "--batch-size", str(IMAGE_BATCH), "--epochs", "1"]
    return torchrun(["imagecl", "train", *argv, *extra], tmp_path / "work", tmp_path / "logs")


@pytest.mark.parametrize(
    ("method", "extra", "files"),
    [
        ("supcon", [], ()),
        ("ce", [], ()),
        ("clae", [], ("plots/robust_accuracy.png",)),
        ("loco", ["--stages", "2"], ("plots/loco_readout.png",)),
    ],
)
def test_imagecl_train_under_torchrun(
    tmp_path: Path, digits_train_size: int, method: str, extra: list[str], files: tuple[str, ...]
) -> None:
    job = _train_images(tmp_path, method, *extra)
    _check_image_training(tmp_path, method, digits_train_size, job, files)


def test_imagecl_simclr_then_eval_and_finetune_under_torchrun(
    tmp_path: Path, digits_train_size: int
) -> None:
    """SimCLR on 2 ranks (gathered negatives); its DDP checkpoint feeds eval and finetune."""
    job = _train_images(tmp_path, "simclr")
    run = _check_image_training(tmp_path, "simclr", digits_train_size, job)
    ckpt = str(run / "checkpoints" / "last.pt")
    work, logs = tmp_path / "work", tmp_path / "logs"

    argv = [
        "--checkpoint",
        ckpt,
        "--device",
        "cpu",
        "--no-corruptions",
        "--knn-k",
        "5",
        "--labels-per-class",
        "1",
    ]
    job = torchrun(["imagecl", "eval", *argv], work, logs / "eval")
    _assert_one_process_command(job, "imagecl eval")
    evaluation = _only_entry(run, rf"eval-{STAMP}", prefix="eval")
    summary = json.loads((evaluation / "summary.json").read_text())
    assert summary["method"] == "simclr" and summary["linear_probe_accuracy"] > 0.2

    argv = [
        "--checkpoint",
        ckpt,
        "--device",
        "cpu",
        "--quick",
        "--steps",
        "2",
        "--batch-size",
        "16",
        "--label-fraction",
        "0.1",
    ]
    job = torchrun(["imagecl", "finetune", *argv], work, logs / "finetune")
    _assert_one_process_command(job, "imagecl finetune")
    finetuned = _only_entry(work / "runs" / "imagecl", rf"finetune-0\.1-{STAMP}", prefix="fine")
    summary = json.loads((finetuned / "summary.json").read_text())
    assert summary["finetuned_accuracy"] > 0.1
    assert load_checkpoint(finetuned / "finetuned" / "checkpoints" / "last.pt")["step"] == 2


def test_imagecl_nan_on_one_rank_stops_both_ranks_with_the_same_error(tmp_path: Path) -> None:
    """Only rank 1's loss is NaN: both ranks raise the same error at step 1, and the job ends.

    torchrun stops the other ranks once one has failed; checking the workers every 3 s (not
    every 0.1 s) gives rank 0 the time to raise on its own, which is what is asserted.
    """
    script = tmp_path / "nan_on_rank1.py"
    script.write_text(
        textwrap.dedent(
            """
            import os
            import sys

            import imagecl.commands.train
            from imagecl.cli import main

            if os.environ["RANK"] == "1":
                make_step = imagecl.commands.train.make_step

                def nan_make_step(*args, **kwargs):
                    step = make_step(*args, **kwargs)

                    def nan_step(*args, **kwargs):
                        out = step(*args, **kwargs)
                        return {**out, "loss": out["loss"] * float("nan")}

                    return nan_step

                imagecl.commands.train.make_step = nan_make_step
            sys.exit(main())
            """
        )
    )
    argv = [*IMAGE, "--method", "simclr", "--batch-size", "16", "--max-steps", "3"]
    job = torchrun(
        [str(script), "train", *argv], tmp_path / "work", tmp_path / "logs", "--monitor-interval=3"
    )
    assert job.returncode != 0
    error = "imagecl train: error: loss is nan at step 1 on rank 1; training stopped"
    for rank in range(WORLD):  # one line from the console script, not a traceback
        assert error in job.ranks[rank], (rank, job.ranks[rank][-3000:])
        assert "Traceback" not in job.ranks[rank], (rank, job.ranks[rank][-3000:])
    run = _only_entry(tmp_path / "work" / "runs" / "imagecl", rf"simclr-{STAMP}")
    assert not (run / "checkpoints" / "last.pt").exists()  # no checkpoint from poisoned weights


@pytest.fixture(scope="module")
def molecules_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """FreeSolv's first molecules with their target, as a user's CSV file."""
    pytest.importorskip("rdkit")
    from graphcl.data import load_molecules

    data = load_molecules("freesolv")
    assert data.targets is not None
    path = tmp_path_factory.mktemp("molecules") / "mols.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["smiles", "expt"])
        targets = data.targets[:MOLECULES, 0].tolist()
        writer.writerows(zip(data.smiles[:MOLECULES], targets, strict=True))
    return path


def test_graphcl_pretrain_then_finetune_and_probe_under_torchrun(
    tmp_path: Path, molecules_csv: Path
) -> None:
    work, logs = tmp_path / "work", tmp_path / "logs"
    data = ["--data", str(molecules_csv), "--smiles-column", "smiles"]
    argv = [*GRAPH, *data, "--batch-size", str(GRAPH_BATCH), "--epochs", "1", "--log-every", "1"]
    job = torchrun(["graphcl", "pretrain", *argv], work, logs / "pretrain")
    _ok(job)
    assert sorted(p.name for p in work.iterdir()) == ["runs"]
    run = _only_entry(work / "runs" / "graphcl", rf"pretrain-{STAMP}")
    steps = (MOLECULES // WORLD) // GRAPH_BATCH
    ckpt = load_checkpoint(run / "checkpoints" / "last.pt")
    assert ckpt["step"] == steps and ckpt["world_size"] == WORLD
    assert _metric_steps(run) == list(range(1, steps + 1))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["molecules"] == MOLECULES and summary["steps"] == steps
    assert torch.isfinite(torch.tensor(summary["final_loss"]))
    encoder = str(run / "encoder.safetensors")

    argv = [
        *GRAPH[:6],
        *data,
        "--target",
        "expt",
        "--encoder",
        encoder,
        "--epochs",
        "1",
        "--seeds",
        "0",
    ]
    job = torchrun(["graphcl", "finetune", *argv], work, logs / "finetune")
    _assert_one_process_command(job, "graphcl finetune")
    finetuned = _only_entry(work / "runs" / "graphcl", rf"finetune-{STAMP}", prefix="finetune")
    summary = json.loads((finetuned / "summary.json").read_text())
    assert summary["molecules"] == MOLECULES and summary["pretrained/final_rmse"] > 0

    argv = ["--device", "cpu", *data, "--target", "expt", "--encoder", encoder]
    job = torchrun(["graphcl", "probe", *argv], work, logs / "probe")
    _assert_one_process_command(job, "graphcl probe")
    probed = _only_entry(work / "runs" / "graphcl", rf"probe-{STAMP}", prefix="probe")
    summary = json.loads((probed / "summary.json").read_text())
    assert summary["pretrained/expt/ridge_rmse"] > 0


def test_contragan_train_then_sample_and_evaluate_under_torchrun(tmp_path: Path) -> None:
    work, logs = tmp_path / "work", tmp_path / "logs"
    job = torchrun(["contragan", "train", *GAN], work, logs / "train")
    _ok(job)
    assert sorted(p.name for p in work.iterdir()) == ["runs"]
    run = _only_entry(work / "runs" / "contragan", rf"contra-{STAMP}")
    ckpt = load_checkpoint(run / "checkpoints" / "last.pt")
    assert ckpt["step"] == 2 and ckpt["world_size"] == WORLD
    assert _metric_steps(run) == [1, 2]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["loss"] == "contra"
    last = str(run / "checkpoints" / "last.pt")

    argv = [
        "--checkpoint",
        last,
        "--device",
        "cpu",
        "--classes",
        "0-2",
        "--per-class",
        "2",
        "--out",
        "grid.png",
    ]
    job = torchrun(["contragan", "sample", *argv], work, logs / "sample")
    _assert_one_process_command(job, "contragan sample")
    assert sorted(p.name for p in work.iterdir()) == ["grid.png", "runs"]
    assert "wrote grid.png (3 classes × 2)" in job.ranks[0]

    argv = [
        "--checkpoint",
        last,
        "--device",
        "cpu",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--extractor-epochs",
        "1",
        "--cas-epochs",
        "1",
        "--seeds",
        "1",
        "--min-extractor-accuracy",
        "0",
    ]
    job = torchrun(["contragan", "evaluate", *argv], work, logs / "evaluate")
    _assert_one_process_command(job, "contragan evaluate")
    summary = json.loads((run / "evaluation" / "summary.json").read_text())
    assert summary["seeds"] == 1 and summary["fd"] > 0
    assert len(list((tmp_path / "cache").iterdir())) >= 1  # one extractor, trained by rank 0


@pytest.mark.parametrize(
    ("cli", "config_module"),
    [
        ("graphcl", "graphcl.commands.pretrain"),
        ("imagecl", "imagecl.commands.train"),
        ("contragan", "contragan.commands.train"),
    ],
)
def test_readme_shows_the_one_machine_and_the_several_machine_command(
    cli: str, config_module: str
) -> None:
    """README's torchrun lines for each console script parse as torchrun and pipeline options."""
    import importlib

    from torch.distributed.run import get_args_parser

    from shared.config import parse_config

    path = Path(__file__).resolve().parents[1] / "README.md"
    readme = path.read_text(encoding="utf-8")
    command = re.compile(rf"torchrun .*--no-python {cli} ")
    lines = [line for line in readme.splitlines() if command.match(line)]
    launches = [get_args_parser().parse_args(shlex.split(line)[1:]) for line in lines]
    single = [args for args in launches if args.nnodes == "1:1"]  # torchrun's default
    several = [args for args in launches if args.nnodes == "2"]
    assert single and several, lines
    for args in several:
        assert args.rdzv_backend == "c10d" and re.fullmatch(r"HOST:\d+", args.rdzv_endpoint)
        assert args.node_rank == 0
    module = importlib.import_module(config_module)
    for args in launches:
        assert args.no_python and args.training_script == cli
        assert args.training_script_args[0] == config_module.split(".")[-1]
        parse_config(module.Config, args.training_script_args[1:])  # every option exists
