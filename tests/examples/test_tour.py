"""The demo tour's imagecl sections for CLAE and LoCo, on one epoch of the quick preset."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import tour

from shared.runs import RunDir


def test_clae_and_loco_sections_copy_their_plots_and_report_their_numbers(tmp_path: Path) -> None:
    out = RunDir(tmp_path / "demo")
    out.plots.mkdir(parents=True)
    clae_numbers, clae_text = tour.clae_section(out, seed=0, epochs=1)
    loco_numbers, loco_text = tour.loco_section(out, seed=0, epochs=1)
    plots = {p.name for p in out.plots.glob("*.png")}
    assert plots == {
        "imagecl_clae_training.png",
        "imagecl_clae_robust_accuracy.png",
        "imagecl_loco_loco_readout.png",
        "imagecl_loco_training.png",
    }
    for method in ("clae", "simclr_short"):
        clean = clae_numbers[f"imagecl_{method}_digits_m/linear_probe_accuracy"]
        robust = clae_numbers[f"imagecl_{method}_digits_m/pgd_robust_accuracy"]
        assert isinstance(clean, float) and isinstance(robust, float)
        # the attack (PGD-10, ε = 2/255) lowers the probe's accuracy, and the clean probe reads
        # the digits far above chance (10 classes). Seed 0, one epoch: clean 44.4 % (CLAE) and
        # 43.3 % (SimCLR), robust 4.2 % and 0.0 %.
        assert robust < clean and clean > 0.3, (method, clean, robust)
        assert f"{100 * clean:.1f} | {100 * robust:.1f} |" in clae_text
    assert clae_numbers["imagecl_clae_digits_m/steps"] == 10  # one epoch of batch 128
    learned = loco_numbers["imagecl_loco_digits_m/readout_per_stage"]
    baseline = loco_numbers["imagecl_loco_digits_m/random_init_readout_per_stage"]
    assert isinstance(learned, list) and isinstance(baseline, list)
    assert len(learned) == len(baseline) == 4
    assert f"| 4 | {100 * learned[3]:.1f} | {100 * baseline[3]:.1f} |" in loco_text


def test_contragan_section_shows_both_grids_and_every_figure_next_to_real(tmp_path: Path) -> None:
    out = RunDir(tmp_path / "demo")
    out.plots.mkdir(parents=True)
    numbers, text = tour.contragan_section(out, seed=0, steps=2)
    assert {p.name for p in out.plots.glob("*.png")} == {
        "contragan_samples.png",
        "contragan_losses.png",
        "contragan_proxy_losses.png",
    }
    for name in tour.GAN_VARIANTS:
        assert numbers[f"{name}_digits/steps"] == 2
        for key in ("fd", "gan_test_acc", "cas_acc", "precision", "coverage"):
            assert isinstance(numbers[f"{name}_digits/{key}"], float)
    # one table: a column per variant, then real vs real
    header = next(line for line in text.splitlines() if line.startswith("| figure |"))
    assert header.count("|") == 2 + len(tour.GAN_VARIANTS) + 2
    for key in ("fd", "gan_test_acc", "cas_acc", "precision", "coverage"):
        assert f"| {key} |" in text
    assert "--class-positives proxy --tau 0.2" in text
    gan_test = numbers["contragan_proxy_digits/gan_test_acc"]
    assert f"GAN-test {gan_test:.2f}" in text
