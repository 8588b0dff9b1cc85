"""contragan train and sample end to end: the run folder, exact resume of a GAN run, the EMA,
bad arguments and bad checkpoints."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch

import contragan.evaluate
from contragan.cli import main as cli_main
from contragan.commands.evaluate import main as evaluate_main
from contragan.commands.sample import grid_path, parse_classes
from contragan.commands.sample import main as sample_main
from contragan.commands.train import main as train_main
from contragan.models import load_generator
from contragan.steps import GanUpdater
from shared.checkpoint import load_checkpoint
from shared.updaters import StepContext
from tests.sync_counts import count_syncs

# digits at 16×16, narrow networks: a step takes a fraction of a second on one core
TINY = [
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
]


def _train(out: Path, *extra: str) -> dict[str, Any]:
    return train_main([*TINY, "--out", str(out), *extra])


@pytest.mark.parametrize("loss", ["contra", "proj", "ac"])
def test_train_writes_the_run_folder(tmp_path: Path, loss: str) -> None:
    out = tmp_path / loss
    summary = _train(out, "--loss", loss, "--max-steps", "3", "--eval-every", "2")
    for name in (
        "config.json",
        "arch.json",
        "metrics.csv",
        "summary.json",
        "report.md",
        "generator.safetensors",
        "checkpoints/last.pt",
        "plots/samples.png",
        "plots/losses.png",
        "samples/grid_step000002.png",
        "samples/grid_step000003.png",
    ):
        assert (out / name).is_file(), name
    assert summary["steps"] == 3 and summary["loss"] == loss
    header = (out / "metrics.csv").read_text().splitlines()[0].split(",")
    extra = {"contra": "d_2c", "ac": "d_ac", "proj": "d_adv"}[loss]
    assert {"d_loss", "g_loss", "d_real", "d_fake", extra} <= set(header)
    exported = safetensors.torch.load_file(out / "generator.safetensors")
    _, _, generator = load_generator(out / "checkpoints" / "last.pt", device=torch.device("cpu"))
    for name, value in generator.state_dict().items():
        assert torch.equal(exported[name], value), name
    assert "samples.png" in (out / "report.md").read_text()


def test_resume_after_a_crash_reaches_the_uninterrupted_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GAN run killed after a mid-epoch checkpoint and resumed ends with the G, D, EMA and
    optimizer states and metrics.csv bytes of the uninterrupted run."""
    args = ("--max-steps", "7", "--checkpoint-every", "3", "--eval-every", "3")
    _train(tmp_path / "whole", *args)
    original = GanUpdater.step

    def crashing(self: GanUpdater, batches: Iterator[Any], ctx: StepContext) -> Any:
        if ctx.step == 5:
            raise RuntimeError("preempted")
        return original(self, batches, ctx)

    monkeypatch.setattr(GanUpdater, "step", crashing)
    with pytest.raises(RuntimeError, match="preempted"):
        _train(tmp_path / "parts", *args)
    monkeypatch.setattr(GanUpdater, "step", original)
    _train(tmp_path / "parts", *args, "--resume")

    whole = load_checkpoint(tmp_path / "whole" / "checkpoints" / "last.pt")
    parts = load_checkpoint(tmp_path / "parts" / "checkpoints" / "last.pt")
    for key in ("generator", "discriminator", "generator_ema"):
        for name, value in whole[key].items():
            assert torch.equal(parts[key][name], value), f"{key}.{name}"
    for key in ("g_optimizer", "d_optimizer"):
        for index, state in whole[key]["state"].items():
            for name, value in state.items():
                assert torch.equal(parts[key]["state"][index][name], value), f"{key}.{name}"
    assert torch.equal(parts["ema_updates"], whole["ema_updates"])
    metrics = [(tmp_path / run / "metrics.csv").read_bytes() for run in ("whole", "parts")]
    assert metrics[0] == metrics[1]


def test_the_ema_generator_copies_then_averages(tmp_path: Path) -> None:
    _train(tmp_path / "ema", "--max-steps", "1", "--ema-start", "2")
    one = load_checkpoint(tmp_path / "ema" / "checkpoints" / "last.pt")
    for name, value in one["generator"].items():  # before ema_start the EMA is G
        assert torch.equal(one["generator_ema"][name], value), name
    _train(tmp_path / "ema", "--max-steps", "4", "--ema-start", "2", "--resume")
    four = load_checkpoint(tmp_path / "ema" / "checkpoints" / "last.pt")
    assert int(four["ema_updates"]) == 2  # steps 3 and 4
    name = next(k for k in four["generator"] if k.endswith("original"))
    assert not torch.equal(four["generator_ema"][name], four["generator"][name])


def test_the_ema_update_is_averaged_models_without_its_host_read() -> None:
    """Oracle: torch's AveragedModel.update_parameters with the EMA average, step for step
    across ema_start, bit for bit; and no op that waits for the device (AveragedModel reads
    its device counter n_averaged on the host at every update)."""
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    torch.manual_seed(0)
    g = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    updater = GanUpdater(
        g, torch.nn.Linear(3, 1), num_classes=2, z_dim=4, loss="proj", ema_decay=0.9, ema_start=2
    )
    oracle = AveragedModel(g, multi_avg_fn=get_ema_multi_avg_fn(0.9))
    for step in range(1, 7):
        with torch.no_grad():
            for p in g.parameters():
                p.add_(torch.randn_like(p))
        g(torch.randn(5, 4))  # moves the batch-norm statistics (buffers: copied, not averaged)
        with count_syncs() as syncs:
            updater._update_ema(step)
        assert sum(syncs.values()) == 0, syncs
        if step > 2:
            oracle.update_parameters(g)
        else:
            oracle.module.load_state_dict(g.state_dict())
        for b_oracle, b in zip(oracle.module.buffers(), g.buffers(), strict=True):
            b_oracle.copy_(b)
        assert updater.ema is not None
        assert torch.equal(updater.ema.n_averaged, oracle.n_averaged), step
        for (name, ours), theirs in zip(
            updater.ema.module.state_dict().items(),
            oracle.module.state_dict().values(),
            strict=True,
        ):
            assert torch.equal(ours, theirs), (step, name)
    restored = GanUpdater(
        g, torch.nn.Linear(3, 1), num_classes=2, z_dim=4, loss="proj", ema_decay=0.9, ema_start=2
    )
    restored.load_state_dict(updater.state_dict())
    assert restored._ema_updates == 4  # steps 3..6: a resumed run takes the averaging branch


def test_sample_draws_one_row_per_class_reproducibly(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _train(out, "--max-steps", "1")
    ckpt = str(out / "checkpoints" / "last.pt")
    args = ["--checkpoint", ckpt, "--classes", "0-2,7", "--per-class", "3", "--device", "cpu"]
    first = sample_main(
        [*args, "--out", str(tmp_path / "a.png"), "--tensors", str(tmp_path / "a.st")]
    )
    sample_main([*args, "--out", str(tmp_path / "b.png"), "--tensors", str(tmp_path / "b.st")])
    assert first["classes"] == [0, 1, 2, 7] and (tmp_path / "a.png").is_file()
    a, b = (safetensors.torch.load_file(tmp_path / f"{x}.st") for x in "ab")
    assert torch.equal(a["images"], b["images"])
    assert a["images"].shape == (12, 1, 16, 16) and a["images"].abs().max() <= 1
    assert a["labels"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 7, 7, 7]


def test_sample_out_may_name_a_folder_and_refuses_other_files(tmp_path: Path) -> None:
    assert grid_path(tmp_path) == tmp_path / "samples.png"  # an existing folder
    assert grid_path(tmp_path / "new" / "grids") == tmp_path / "new" / "grids" / "samples.png"
    assert (tmp_path / "new" / "grids").is_dir()
    assert grid_path(tmp_path / "deep" / "g.JPG") == tmp_path / "deep" / "g.JPG"
    with pytest.raises(ValueError, match=r"--out .*grid\.pt: the grid is an image"):
        grid_path(tmp_path / "grid.pt")


def test_parse_classes() -> None:
    assert parse_classes("all", 3) == [0, 1, 2]
    assert parse_classes("0-2, 5", 10) == [0, 1, 2, 5]
    with pytest.raises(ValueError, match=r"outside 0\.\.9"):
        parse_classes("8-11", 10)
    with pytest.raises(ValueError, match="'x' is not a class"):
        parse_classes("1,x", 10)
    with pytest.raises(ValueError, match="'5-2' is not a class"):
        parse_classes("5-2", 10)


def test_bad_checkpoints_get_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["sample", "--checkpoint", str(tmp_path / "none.pt")]) == 2
    assert "does not exist" in capsys.readouterr().err
    out = tmp_path / "run"
    _train(out, "--max-steps", "1")
    last = out / "checkpoints" / "last.pt"
    (out / "arch.json").rename(out / "arch.moved")
    assert cli_main(["sample", "--checkpoint", str(last), "--device", "cpu"]) == 2
    assert "arch.json does not exist" in capsys.readouterr().err
    (out / "arch.moved").rename(out / "arch.json")
    last.write_bytes(b"not a checkpoint")
    assert cli_main(["sample", "--checkpoint", str(last), "--device", "cpu"]) == 2
    assert str(last) in capsys.readouterr().err
    arch = json.loads((out / "arch.json").read_text())
    (out / "arch.json").write_text(json.dumps({**arch, "bogus": 1}))
    with pytest.raises(ValueError, match="not an architecture"):
        load_generator(last, device=torch.device("cpu"))


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--n-dis", "0"], "n_dis must be >= 1"),
        (["--tau", "0"], "tau must be > 0"),
        (["--ema-decay", "1.0"], "ema_decay must lie in"),
        (["--batch-size", "2000"], "fewer than one step's batch_size"),
    ],
)
def test_bad_arguments_get_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    code = cli_main(["train", *TINY, "--out", str(tmp_path / "bad"), *flags])
    assert code == 2 and message in capsys.readouterr().err


def test_cli_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main([]) == 0
    listing = capsys.readouterr().out
    assert all(name in listing for name in ("train", "sample", "evaluate"))
    with pytest.raises(SystemExit):
        cli_main(["train", "--loss", "wgan"])


def test_evaluate_reports_every_figure_next_to_real_vs_real(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    _train(out, "--max-steps", "1")
    ckpt = str(out / "checkpoints" / "last.pt")
    common = [
        "--checkpoint",
        ckpt,
        "--device",
        "cpu",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--extractor-epochs",
        "1",
        "--cas-epochs",
        "1",
        "--seeds",
        "2",
    ]
    # an extractor this weak is refused unless the threshold is lowered
    assert cli_main(["evaluate", *common]) == 2
    assert "below the required 0.9500" in capsys.readouterr().err
    summary = evaluate_main([*common, "--min-extractor-accuracy", "0"])
    # the console names the extractor's accuracy, the figure every feature-space number rests on
    accuracy = f"{summary['extractor_test_accuracy']:.1%}"
    accuracy_line = f"feature extractor: {accuracy} on the digits test split"
    assert accuracy_line in capsys.readouterr().out
    for key in (
        "fd",
        "kid_mean",
        "precision",
        "recall",
        "density",
        "coverage",
        "gan_test_acc",
        "cas_acc",
        "intra_fd_mean",
    ):
        assert math.isfinite(summary[key]) and math.isfinite(summary[f"real_{key}"]), key
        assert f"{key}_std" in summary and f"real_{key}_std" in summary
    # the refusal above saw the accuracy below 0.95; the run with the threshold at 0 reports it
    assert summary["seeds"] == 2 and summary["extractor_test_accuracy"] < 0.95
    report = (out / "evaluation" / "report.md").read_text()
    assert "| fd | lower |" in report and "real vs real" in report
    assert (out / "evaluation" / "plots" / "intra_class_fd.png").is_file()
    missing = str(tmp_path / "inception.pth")
    assert cli_main(["evaluate", *common, "--inception-weights", missing]) == 2
    assert "inception.pth does not exist" in capsys.readouterr().err
    assert cli_main(["evaluate", "--seeds", "0"]) == 2
    assert "seeds must be >= 1" in capsys.readouterr().err
    # CAS on a generated set of the train split's size: its own z (seed + offset), the train
    # split's labels; the scored sets are the same draws, so every other figure is unchanged
    drawn: list[tuple[int, int]] = []
    original = contragan.evaluate.generate

    def spy(generator: torch.nn.Module, labels: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        drawn.append((len(labels), kwargs["seed"]))
        return original(generator, labels, **kwargs)

    monkeypatch.setattr(contragan.evaluate, "generate", spy)
    whole = evaluate_main(
        [
            *common,
            "--min-extractor-accuracy",
            "0",
            "--cas-samples",
            "train",
            "--out",
            str(tmp_path / "ev"),
        ]
    )
    test_n, train_n = summary["num_samples"], whole["cas_num_samples"]
    offset = contragan.evaluate.CAS_SEED_OFFSET
    assert drawn[:4] == [(test_n, 0), (train_n, offset), (test_n, 1), (train_n, 1 + offset)]
    assert train_n == whole["real_cas_num_samples"] > test_n == summary["cas_num_samples"]
    assert (summary["cas_samples"], whole["cas_samples"]) == ("test", "train")
    for key in ("fd", "precision", "coverage", "gan_test_acc", "intra_fd_mean", "real_fd"):
        assert whole[key] == summary[key], key
    protocol = (tmp_path / "ev" / "report.md").read_text()
    assert f"CAS: a classifier trained on {int(train_n)} generated images per seed" in protocol
    assert f"trained on the {int(test_n)} generated images of each seed" in report
