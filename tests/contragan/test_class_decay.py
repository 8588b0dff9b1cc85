"""``--lambda-2c-decay N``: the class term's weights, D's λ and G's, fall linearly from their
values at G step 1 to 0 at step N + 1 and stay there. The schedule is checked against its
closed form and against the losses it weighs (every metrics.csv row: d_loss = d_adv + λ_t ·
d_2c and g_loss = g_adv + λ_G,t · g_2c); it is a function of the step alone, so a resumed run
weighs its steps as an uninterrupted one (the end-to-end resume, bit for bit, is in
test_class_options.py)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from contragan.commands.train import main as train_main
from contragan.config import Config, resume_config
from contragan.losses import LossSettings
from contragan.steps import GanUpdater
from tests.contragan.test_pipelines import TINY


def _updater(settings: LossSettings, decay: int | None) -> GanUpdater:
    return GanUpdater(
        torch.nn.Linear(4, 3),
        torch.nn.Linear(3, 1),
        num_classes=2,
        z_dim=4,
        loss="contra",
        settings=settings,
        class_decay=decay,
    )


@pytest.mark.parametrize(("g_lambda_2c", "g_start"), [(None, 0.25), (0.1, 0.1), (0.0, 0.0)])
def test_the_weights_fall_linearly_to_zero_and_stay_there(
    g_lambda_2c: float | None, g_start: float
) -> None:
    settings = LossSettings.resolve("contra", lambda_2c=0.25, tau=0.2, g_lambda_2c=g_lambda_2c)
    updater = _updater(settings, decay=4)
    at = [updater.settings_at(step) for step in range(1, 9)]
    left = [1.0, 0.75, 0.5, 0.25, 0.0, 0.0, 0.0, 0.0]
    assert [s.lambda_2c for s in at] == pytest.approx([0.25 * f for f in left])
    assert [s.g_weight for s in at] == pytest.approx([g_start * f for f in left])
    assert at[-1].lambda_2c == at[-1].g_weight == 0.0  # exactly zero, not a rounding residue
    assert all(s.tau == 0.2 and s.adc == settings.adc for s in at)  # nothing else changes


def test_without_a_decay_the_losses_read_the_settings_unchanged() -> None:
    settings = LossSettings.resolve("contra", lambda_2c=0.5)
    updater = _updater(settings, decay=None)
    assert all(updater.settings_at(step) is settings for step in (1, 10, 10_000))


def test_a_bad_decay_is_refused() -> None:
    with pytest.raises(ValueError, match="class_decay must be >= 1 or None, got 0"):
        _updater(LossSettings.resolve("contra"), decay=0)


@pytest.mark.parametrize("g_flags", [[], ["--g-lambda-2c", "0.1"]])
def test_metrics_log_the_weights_and_the_losses_use_them(
    tmp_path: Path, g_flags: list[str]
) -> None:
    out = tmp_path / "run"
    train_main(
        [
            *TINY,
            *["--loss", "contra", "--class-positives", "proxy", "--tau", "0.2"],
            *["--lambda-2c", "0.5", *g_flags, "--lambda-2c-decay", "2", "--max-steps", "4"],
            *["--log-every", "1", "--eval-every", "none", "--no-progress", "--out", str(out)],
        ]
    )
    with (out / "metrics.csv").open(encoding="utf-8") as f:
        rows = [row for row in csv.DictReader(f) if row.get("g_loss")]
    g_start = 0.1 if g_flags else 0.5
    assert [float(row["d_class_weight"]) for row in rows] == [0.5, 0.25, 0.0, 0.0]
    assert [float(row["g_class_weight"]) for row in rows] == pytest.approx(
        [g_start, g_start / 2, 0.0, 0.0]
    )
    for row in rows:
        d_total = float(row["d_adv"]) + float(row["d_class_weight"]) * float(row["d_2c"])
        assert float(row["d_loss"]) == pytest.approx(d_total, rel=1e-5, abs=1e-6)
        g_total = float(row["g_adv"]) + float(row["g_class_weight"]) * float(row["g_2c"])
        assert float(row["g_loss"]) == pytest.approx(g_total, rel=1e-5, abs=1e-6)
    assert "both falling linearly to 0 by G step 3" in (out / "report.md").read_text(
        encoding="utf-8"
    )


def test_a_resume_compares_the_decay() -> None:
    assert "lambda_2c_decay" not in resume_config(Config(loss="contra"))
    assert resume_config(Config(loss="contra", lambda_2c_decay=100))["lambda_2c_decay"] == 100
