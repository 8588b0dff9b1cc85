"""Every kind of ``imagecl train`` run can be evaluated and fine-tuned afterwards.

Each method and option ``imagecl train`` accepts trains for two steps at a tiny size (a small
CNN of width 4 on a folder of 8×8 images), and then ``imagecl eval`` and ``imagecl finetune``
run on its checkpoint through their ``main``. Runs are trained once per module and shared by
the tests that read them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.torch
import torch
from PIL import Image

from imagecl import models
from imagecl.commands import eval as eval_command
from imagecl.commands import finetune, train
from shared.checkpoint import load_checkpoint, save_checkpoint

CPU = torch.device("cpu")
CLASSES, PER_CLASS = 4, 40  # 30 train and 10 test images per class (test fraction 0.25);
# the t-SNE plot of every run needs more test images than its perplexity (30)
STEPS = 2
LABEL_FRACTION = 0.2  # 6 of the 30 training images of each class
TINY = [
    "--device",
    "cpu",
    "--data",
    "imagefolder",
    "--image-size",
    "8",
    "--backbone",
    "small_cnn",
    "--width",
    "4",
    "--head-dim",
    "8",
    "--batch-size",
    "16",
    "--epochs",
    "1",
    "--max-steps",
    str(STEPS),
    "--optimizer",
    "adam",
    "--lr",
    "1e-3",
    "--warmup-epochs",
    "0",
    "--log-every",
    "1",
]

Trained = Callable[[str], tuple[Path, dict[str, Any]]]

# every method and training option, as the arguments that select it
KINDS: dict[str, list[str]] = {
    "simclr": ["--method", "simclr"],
    "supcon": ["--method", "supcon"],
    "ce": ["--method", "ce"],
    "clae": ["--method", "clae"],
    "loco": ["--method", "loco"],
    "loco-overlap-0": ["--method", "loco", "--overlap", "0"],
    "loco-end-to-end": ["--method", "loco", "--end-to-end"],
    "simclr-adversarial": ["--method", "simclr", "--adversarial"],
    "supcon-adversarial": ["--method", "supcon", "--adversarial"],
    "nt_logistic": ["--loss", "nt_logistic"],
    "triplet": ["--loss", "triplet"],
    "generalized": ["--loss", "generalized"],
    "queue": ["--queue-size", "32"],
    "compile": ["--compile"],
}


def _write_image_folder(root: Path) -> Path:
    """``CLASSES`` sub-folders of ``PER_CLASS`` 8×8 PNGs, each class its own mean colour."""
    rng = np.random.default_rng(0)
    for c in range(CLASSES):
        folder = root / f"class{c}"
        folder.mkdir(parents=True)
        colour = rng.integers(0, 256, size=3)
        for i in range(PER_CLASS):
            noise = rng.integers(-40, 41, size=(8, 8, 3))
            pixels = np.clip(colour + noise, 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(folder / f"{i}.png")
    return root


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    """``trained(kind)``: the run folder and summary of ``kind``, trained once per module."""
    base = tmp_path_factory.mktemp("every_method")
    images = _write_image_folder(base / "images")
    cache: dict[str, tuple[Path, dict[str, Any]]] = {}

    def get(kind: str) -> tuple[Path, dict[str, Any]]:
        if kind not in cache:
            out = base / kind
            summary = train.main(
                [*TINY, "--data-root", str(images), "--out", str(out), *KINDS[kind]]
            )
            cache[kind] = out, summary
        return cache[kind]

    return get


def _clean_encoder_state(model_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The backbone's entries of a training checkpoint, with a dual batch norm's clean branch
    as the plain layer (``bn.clean.weight`` -> ``bn.weight``, ``bn.adversarial.*`` dropped)."""
    state = {}
    for key, value in model_state.items():
        parts = key.split(".")
        if parts[0] != "backbone" or "adversarial" in parts:
            continue
        state[".".join(p for p in parts[1:] if p != "clean")] = value
    return state


@pytest.mark.parametrize(
    "kind", [k if k != "compile" else pytest.param(k, marks=pytest.mark.slow) for k in KINDS]
)
def test_eval_and_finetune_run_on_every_kind_of_training_run(
    trained: Trained,
    kind: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run, summary = trained(kind)
    assert summary["steps"] == STEPS
    checkpoint = str(run / "checkpoints" / "last.pt")

    numbers = eval_command.main(
        [
            "--checkpoint",
            checkpoint,
            "--device",
            "cpu",
            "--no-corruptions",
            "--labels-per-class",
            "1",
            "--knn-k",
            "3",
            "--out",
            str(tmp_path / "eval"),
        ]
    )
    # the checkpoint holds the encoder the run evaluated: the same probe, the same accuracy
    assert numbers["linear_probe_accuracy"] == summary["linear_probe_accuracy"]

    starts: list[dict[str, torch.Tensor]] = []
    train_one = finetune._train_one

    def spy(sub: Any, cfg: Any, data: Any, device: Any, backbone: Any) -> float:
        if backbone is not None:
            starts.append({k: v.clone() for k, v in backbone.state_dict().items()})
        return train_one(sub, cfg, data, device, backbone)

    monkeypatch.setattr(finetune, "_train_one", spy)
    result = finetune.main(
        [
            "--checkpoint",
            checkpoint,
            "--device",
            "cpu",
            "--label-fraction",
            str(LABEL_FRACTION),
            "--steps",
            str(STEPS),
            "--batch-size",
            "16",
            "--no-compare-scratch",
            "--out",
            str(tmp_path / "ft"),
        ]
    )
    assert result["labels"] == CLASSES * round(LABEL_FRACTION * (PER_CLASS - PER_CLASS // 4))
    assert "finetuned_accuracy" in result and "scratch_accuracy" not in result
    # fine-tuning starts from the trained encoder (a dual batch norm's clean branch)
    expected = _clean_encoder_state(load_checkpoint(checkpoint)["model"])
    (start,) = starts
    assert start.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(start[key], value), key
    rows = (tmp_path / "ft" / "finetuned" / "metrics.csv").read_text().splitlines()
    assert rows[-1].split(",")[0] == str(STEPS)  # the last logged step
    # the exported encoder is that plain encoder too (a CLAE export loads into a plain backbone)
    exported = safetensors.torch.load_file(str(run / "encoder.safetensors"))
    assert exported.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(exported[key], value), key


@pytest.mark.slow
def test_compile_leaves_checkpoint_and_export_keys_unchanged(
    trained: Trained,
) -> None:
    plain, _ = trained("simclr")
    compiled, _ = trained("compile")
    plain_state = load_checkpoint(plain / "checkpoints" / "last.pt")["model"]
    compiled_state = load_checkpoint(compiled / "checkpoints" / "last.pt")["model"]
    assert compiled_state.keys() == plain_state.keys()
    with (
        safetensors.safe_open(str(plain / "encoder.safetensors"), framework="pt") as a,
        safetensors.safe_open(str(compiled / "encoder.safetensors"), framework="pt") as b,
    ):
        assert set(b.keys()) == set(a.keys())
        assert b.metadata() == a.metadata()


def test_a_checkpoint_with_compile_wrapper_keys_still_loads(
    trained: Trained, tmp_path: Path
) -> None:
    """Runs whose backbone was wrapped by ``torch.compile`` saved ``backbone._orig_mod.*``."""
    run, _ = trained("simclr")
    state = load_checkpoint(run / "checkpoints" / "last.pt")
    old = tmp_path / "old"
    (old / "checkpoints").mkdir(parents=True)
    (old / "config.json").write_text((run / "config.json").read_text())
    wrapped = {
        k.replace("backbone.", "backbone._orig_mod.", 1): v for k, v in state["model"].items()
    }
    save_checkpoint(old / "checkpoints" / "last.pt", {**state, "model": wrapped})
    _, _, model = models.load_trained(old / "checkpoints" / "last.pt", device=CPU)
    loaded = model.state_dict()
    assert loaded.keys() == state["model"].keys()
    for key, value in state["model"].items():
        assert torch.equal(loaded[key], value), key
