"""Safe files: atomic checkpoints, weights-only loading, safetensors encoders, RNG round-trips."""

from __future__ import annotations

import os
import random
import stat
from collections import OrderedDict
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from shared.checkpoint import (
    atomic_write,
    export_encoder,
    load_checkpoint,
    load_encoder,
    rng_state,
    save_checkpoint,
    set_rng_state,
)


def _state() -> dict[str, object]:
    model = nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "step": 7,
        "best": None,
        "metrics": {"loss": 0.5},
        "rng": rng_state(),
    }


def test_checkpoint_round_trip_with_weights_only(tmp_path: Path) -> None:
    state = _state()
    path = save_checkpoint(tmp_path / "last.pt", state)
    loaded = load_checkpoint(path)
    assert loaded["step"] == 7 and loaded["best"] is None and loaded["metrics"] == {"loss": 0.5}
    for key, value in state["model"].items():  # type: ignore[attr-defined]
        assert torch.equal(loaded["model"][key], value)
    restored = torch.optim.Adam(nn.Linear(3, 2).parameters(), lr=0.1)
    restored.load_state_dict(loaded["optimizer"])
    assert restored.state_dict()["state"][0]["step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]  # no temporary left over


def test_crash_mid_write_keeps_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "last.pt"
    save_checkpoint(path, {"step": 1, "w": torch.arange(4.0)})
    real_save = torch.save

    def crashing_save(obj: object, f: Any, *args: object, **kwargs: object) -> None:
        real_save(obj, f)  # the bytes reach the temporary file, then the "machine dies"
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crashing_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, {"step": 2, "w": torch.zeros(4)})
    monkeypatch.undo()
    loaded = load_checkpoint(path)
    assert loaded["step"] == 1 and torch.equal(loaded["w"], torch.arange(4.0))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]


def test_unsafe_state_is_refused_before_replacing(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path / "last.pt", {"step": 1})
    with pytest.raises(ValueError, match=r"weights_only.*PurePosixPath"):
        save_checkpoint(path, {"step": 2, "where": PurePosixPath("a")})
    assert load_checkpoint(path) == {"step": 1}


def test_ordered_dict_state_is_accepted(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path / "c.pt", OrderedDict(a=torch.ones(1)))
    assert torch.equal(load_checkpoint(path)["a"], torch.ones(1))


def test_missing_and_corrupt_files_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pt"
    with pytest.raises(FileNotFoundError, match=r"nope\.pt"):
        load_checkpoint(missing)
    path = save_checkpoint(tmp_path / "last.pt", {"w": torch.ones(100)})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # truncated, as after a crash without atomicity
    with pytest.raises(ValueError, match=r"last\.pt"):
        load_checkpoint(path)
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=r"last\.pt"):
        load_checkpoint(path)


def test_non_dict_checkpoint_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.pt"
    torch.save(torch.ones(2), path)
    with pytest.raises(ValueError, match="expected a dict"):
        load_checkpoint(path)


def test_atomic_write_needs_existing_folder(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="missing"):
        with atomic_write(tmp_path / "missing" / "x.bin") as handle:
            handle.write(b"x")


def test_safetensors_export_round_trip_with_tied_weights(tmp_path: Path) -> None:
    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    encoder[2].weight = encoder[0].weight  # tied: shared storage that safetensors refuses as is
    path = export_encoder(encoder, tmp_path / "encoder.safetensors", metadata={"epochs": "3"})
    torch.manual_seed(1)
    fresh = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    meta = load_encoder(fresh, path)
    assert meta["epochs"] == "3" and meta["module"] == "Sequential"
    for (name, a), (_, b) in zip(
        encoder.state_dict().items(), fresh.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    x = torch.randn(2, 4)
    assert torch.equal(encoder(x), fresh(x))


def test_exports_of_the_same_weights_are_the_same_bytes(tmp_path: Path) -> None:
    """safetensors writes its metadata from a hash map (another key order at every save); the
    export sorts it, so equal weights give equal files, and nothing else in the file moves."""
    import safetensors.torch

    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Linear(3, 5), nn.Linear(5, 2))
    metadata = {f"key{i}": f"value {i} é" for i in range(9)}
    raw = {safetensors.torch.save(encoder.state_dict(), metadata=metadata) for _ in range(8)}
    assert len(raw) > 1  # the hash map's order does vary: the test would pass vacuously otherwise
    files = {
        export_encoder(encoder, tmp_path / f"e{i}.safetensors", metadata=metadata).read_bytes()
        for i in range(8)
    }
    assert len(files) == 1
    fresh = nn.Sequential(nn.Linear(3, 5), nn.Linear(5, 2))
    meta = load_encoder(fresh, tmp_path / "e0.safetensors")
    assert {k: v for k, v in meta.items() if k.startswith("key")} == metadata
    assert all(
        torch.equal(a, b)
        for a, b in zip(encoder.state_dict().values(), fresh.state_dict().values(), strict=True)
    )


def test_load_encoder_strict_and_errors(tmp_path: Path) -> None:
    path = export_encoder(nn.Linear(4, 4), tmp_path / "e.safetensors")
    with pytest.raises(ValueError, match=r"e\.safetensors does not fit Sequential: missing 2"):
        load_encoder(nn.Sequential(nn.Linear(4, 4)), path)
    with pytest.raises(ValueError, match="str to str"):
        export_encoder(nn.Linear(2, 2), tmp_path / "f.safetensors", metadata={"a": 1})  # type: ignore[dict-item]
    with pytest.raises(FileNotFoundError, match=r"g\.safetensors"):
        load_encoder(nn.Linear(4, 4), tmp_path / "g.safetensors")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"xx")
    with pytest.raises(ValueError, match=r"bad\.safetensors"):
        load_encoder(nn.Linear(4, 4), bad)


def _draw() -> tuple[float, float, float, float, float]:
    return (
        random.random(),
        random.gauss(0.0, 1.0),
        float(np.random.rand()),  # noqa: NPY002 - the global state is what is under test
        float(np.random.randn()),  # noqa: NPY002
        torch.rand(1).item(),
    )


def test_rng_state_round_trip_through_a_checkpoint(tmp_path: Path) -> None:
    random.seed(3)
    random.gauss(0.0, 1.0)  # leaves a cached gaussian in python's state
    np.random.seed(3)  # noqa: NPY002
    np.random.randn()  # noqa: NPY002 - and a cached one in numpy's
    torch.manual_seed(3)
    path = save_checkpoint(tmp_path / "rng.pt", {"rng": rng_state()})
    expected = _draw()
    assert _draw() != expected  # the generators moved on
    set_rng_state(load_checkpoint(path)["rng"])
    assert _draw() == expected


def test_rng_state_values_are_tensors_and_checked() -> None:
    state = rng_state()
    assert all(isinstance(v, torch.Tensor) for v in state.values())
    with pytest.raises(ValueError, match="numpy"):
        set_rng_state({k: v for k, v in state.items() if k != "numpy"})


def test_atomic_write_gives_a_new_file_the_umask_mode_and_keeps_an_old_files_mode(
    tmp_path: Path,
) -> None:
    """``mkstemp`` alone would make every checkpoint, summary and report private (0600)."""
    old = os.umask(0o027)
    try:
        with atomic_write(tmp_path / "new.json") as handle:
            handle.write(b"{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new.json").stat().st_mode) == 0o640
    kept = tmp_path / "kept.json"
    kept.write_bytes(b"{}")
    kept.chmod(0o604)
    with atomic_write(kept) as handle:
        handle.write(b"[]")
    assert stat.S_IMODE(kept.stat().st_mode) == 0o604
    assert kept.read_bytes() == b"[]"
