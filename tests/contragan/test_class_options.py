"""contragan's class options end to end: ``--loss reacgan``, ``--loss contra --class-positives
proxy`` (also with ``--adc``, ``--proj-adv`` or ``--lambda-2c-decay``) and ``--loss ac
--no-ac-fakes`` each train, resume bit for bit after a stop and sample, and a reacgan run and a
``--proj-adv`` run evaluate (the others have contra's and ac's generators, and evaluate reads no
more of their config than sample does); a resume compares the settings in use, so a run folder from
before these options resumes and explicit reference values equal unset ones; a class option given
with a loss it does not apply to is refused with one line, before any folder is made."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch

from contragan.cli import main as cli_main
from contragan.commands.evaluate import main as evaluate_main
from contragan.commands.sample import main as sample_main
from contragan.commands.train import main as train_main
from contragan.config import Config, resume_config
from contragan.steps import GanUpdater
from shared.checkpoint import load_checkpoint
from shared.updaters import StepContext
from tests.contragan.test_pipelines import TINY
from tests.reliability._commands import assert_same_checkpoint

# option -> (flags, the logged class term, what report.md says of it)
VARIANTS: dict[str, tuple[list[str], str, str]] = {
    "reacgan": (["--loss", "reacgan"], "d_d2dce", "D2D-CE (λ 0.5, τ 0.5, m_p 0.98)"),
    "contra-proxy": (
        ["--loss", "contra", "--class-positives", "proxy", "--tau", "0.1"],
        "d_2c",
        "2C (λ 1, τ 0.1, positives: proxy)",
    ),
    "contra-proxy-adc": (
        ["--loss", "contra", "--class-positives", "proxy", "--tau", "0.2", "--adc"],
        "g_adc",
        "2C (λ 1, τ 0.2, positives: proxy, ADC: fakes against a fake proxy per class)",
    ),
    "contra-proxy-pa": (
        ["--loss", "contra", "--class-positives", "proxy", "--tau", "0.2", "--proj-adv"],
        "d_2c",
        "2C (λ 1, τ 0.2, positives: proxy; adversarial logit with ProjGAN's ⟨v(y), h⟩)",
    ),
    "contra-proxy-pa-g0": (
        [
            *["--loss", "contra", "--class-positives", "proxy", "--tau", "0.2"],
            *["--lambda-2c", "0.25", "--g-lambda-2c", "0", "--proj-adv"],
        ],
        "g_2c",
        "2C (λ 0.25 (G: 0), τ 0.2, positives: proxy; adversarial logit with ProjGAN's ⟨v(y), h⟩)",
    ),
    "contra-proxy-pa-decay": (
        [
            *["--loss", "contra", "--class-positives", "proxy", "--tau", "0.2"],
            *["--lambda-2c", "0.25", "--lambda-2c-decay", "2", "--proj-adv"],
        ],
        "d_class_weight",
        "2C (λ 0.25, τ 0.2, both falling linearly to 0 by G step 3, positives: proxy;",
    ),
    "ac-real-only": (
        ["--loss", "ac", "--no-ac-fakes"],
        "d_ac",
        "(weight 1, D on real images)",
    ),
}
STEPS = ["--max-steps", "4", "--checkpoint-every", "2", "--eval-every", "none", "--no-progress"]


def _train(out: Path, *extra: str) -> dict[str, Any]:
    return train_main([*TINY, "--out", str(out), *extra])


@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_option_trains_resumes_samples_and_evaluates(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flags, logged, described = VARIANTS[name]
    _train(tmp_path / "whole", *flags, *STEPS)
    original = GanUpdater.step

    def stopping(self: GanUpdater, batches: Iterator[Any], ctx: StepContext) -> Any:
        if ctx.step == 3:
            raise RuntimeError("preempted")
        return original(self, batches, ctx)

    monkeypatch.setattr(GanUpdater, "step", stopping)
    with pytest.raises(RuntimeError, match="preempted"):
        _train(tmp_path / "parts", *flags, *STEPS)
    monkeypatch.setattr(GanUpdater, "step", original)
    summary = _train(tmp_path / "parts", *flags, *STEPS, "--resume")
    assert summary["steps"] == 4
    run = tmp_path / "parts"
    last = run / "checkpoints" / "last.pt"
    assert_same_checkpoint(tmp_path / "whole" / "checkpoints" / "last.pt", last)
    metrics = [(tmp_path / folder / "metrics.csv").read_bytes() for folder in ("whole", "parts")]
    assert metrics[0] == metrics[1]
    assert logged in metrics[0].decode().splitlines()[0].split(",")
    assert described in (run / "report.md").read_text(encoding="utf-8")

    tensors = tmp_path / "samples.safetensors"
    grid = ["--classes", "0-2", "--per-class", "2", "--out", str(tmp_path / "grid.png")]
    sample_main(["--checkpoint", str(last), "--device", "cpu", *grid, "--tensors", str(tensors)])
    drawn = safetensors.torch.load_file(tensors)
    assert drawn["images"].shape == (6, 1, 16, 16)
    assert drawn["labels"].tolist() == [0, 0, 1, 1, 2, 2]

    # evaluate reads the generator and the config, as sample just did; a --proj-adv D differs
    if name not in ("reacgan", "contra-proxy-pa"):
        return
    tiny = ["--extractor-epochs", "1", "--cas-epochs", "1", "--seeds", "1"]
    cache = ["--cache-dir", str(tmp_path / "cache"), "--min-extractor-accuracy", "0"]
    evaluated = evaluate_main(["--checkpoint", str(last), "--device", "cpu", *cache, *tiny])
    assert evaluated["loss"] == flags[1] and 0 <= evaluated["gan_test_acc"] <= 1
    assert (run / "evaluation" / "report.md").is_file()


def test_a_resume_compares_the_settings_in_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A contra run stores λ = τ = 1 and none of the later options, as every run folder did
    before them, so such a folder resumes; the reference values given explicitly resume it too;
    another setting is refused, named."""
    run = tmp_path / "run"
    _train(run, "--max-steps", "2", *STEPS[2:])
    stored = load_checkpoint(run / "checkpoints" / "last.pt")["config"]["pipeline"]
    assert (stored["lambda_2c"], stored["tau"]) == (1.0, 1.0)
    later = {"class_positives", "margin_pos", "ac_fakes", "adc", "proj_adv", "g_lambda_2c"}
    later |= {"lambda_2c_decay"}
    assert not later & set(stored)
    assert _train(run, "--max-steps", "3", "--lambda-2c", "1", "--tau", "1", "--resume")["steps"]
    changed = ["train", *TINY, "--out", str(run), "--max-steps", "4", "--resume"]
    capsys.readouterr()  # the progress bars so far
    assert cli_main([*changed, "--class-positives", "proxy"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "class_positives: '<absent>' -> 'proxy'" in err
    assert cli_main([*changed, "--tau", "0.5"]) == 2
    assert "tau: 1.0 -> 0.5" in capsys.readouterr().err
    assert cli_main([*changed, "--g-lambda-2c", "0"]) == 2
    assert "g_lambda_2c: '<absent>' -> 0.0" in capsys.readouterr().err
    assert cli_main([*changed, "--lambda-2c-decay", "100"]) == 2
    assert "lambda_2c_decay: '<absent>' -> 100" in capsys.readouterr().err
    # the refused resumes left config.json describing the weights in the folder
    saved = json.loads((run / "config.json").read_text(encoding="utf-8"))
    assert (saved["tau"], saved["class_positives"]) == (1.0, "all")


def test_resume_config_resolves_what_the_losses_use() -> None:
    unset = resume_config(Config(loss="reacgan"))
    given = resume_config(Config(loss="reacgan", lambda_2c=0.5, tau=0.5, margin_pos=0.98))
    assert unset == given and (unset["lambda_2c"], unset["tau"], unset["margin_pos"]) == (
        0.5,
        0.5,
        0.98,
    )
    assert resume_config(Config(loss="contra", lambda_2c=2.0))["lambda_2c"] == 2.0
    proxy = resume_config(Config(loss="contra", class_positives="proxy"))
    assert proxy["class_positives"] == "proxy" and "margin_pos" not in proxy
    assert resume_config(Config(loss="ac", ac_fakes=False))["ac_fakes"] is False
    assert "g_lambda_2c" not in resume_config(Config(loss="contra"))
    assert resume_config(Config(loss="contra", g_lambda_2c=0.0))["g_lambda_2c"] == 0.0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--loss", "proj", "--class-positives", "proxy"], "class_positives applies to loss"),
        (["--loss", "reacgan", "--class-positives", "proxy"], "class_positives applies to loss"),
        (["--margin-pos", "0.9"], "margin_pos applies to loss reacgan only, got loss 'contra'"),
        (["--loss", "ac", "--margin-pos", "0.9"], "margin_pos applies to loss reacgan only"),
        (["--loss", "contra", "--no-ac-fakes"], "ac_fakes applies to loss ac only"),
        (["--loss", "proj", "--adc"], "adc applies to losses contra and reacgan only"),
        (["--loss", "proj", "--proj-adv"], "proj_adv applies to losses contra and reacgan only"),
        (["--loss", "ac", "--proj-adv"], "proj_adv applies to losses contra and reacgan only"),
        (["--loss", "proj", "--g-lambda-2c", "0"], "g_lambda_2c applies to losses contra and"),
        (["--loss", "ac", "--g-lambda-2c", "0.1"], "g_lambda_2c applies to losses contra and"),
        (["--g-lambda-2c", "-1"], "g_lambda_2c must be >= 0, got -1"),
        (["--loss", "proj", "--lambda-2c-decay", "9"], "lambda_2c_decay applies to losses"),
        (["--lambda-2c-decay", "0"], "lambda_2c_decay must be >= 1 or none, got 0"),
        (["--loss", "reacgan", "--margin-pos", "1.5"], "margin_pos must lie in [0, 1], got 1.5"),
        (["--loss", "reacgan", "--lambda-2c", "nan"], "lambda_2c must be a finite number >= 0"),
        (["--loss", "reacgan", "--tau", "0"], "tau must be > 0"),
    ],
)
def test_a_class_option_the_loss_does_not_read_is_refused_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    out = tmp_path / "run"
    assert cli_main(["train", *TINY, "--out", str(out), *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert not out.exists()
