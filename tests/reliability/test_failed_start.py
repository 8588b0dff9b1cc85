"""A command that fails before it has trained anything leaves no run folder behind.

Each case gives a command data that does not exist: the command makes its run folder (the
folder is checked for writability first), fails while loading the data, prints one line and
exits 2, and the folder it made is gone, so the same command with a corrected option works
without ``--resume`` and without another ``--out``. A folder that was there before is kept.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.reliability

CASES = {
    "graphcl pretrain": ["pretrain", "--data", "{missing}/mols.csv"],
    "graphcl finetune": ["finetune", "--data", "{missing}/mols.csv"],
    "imagecl train": ["train", "--data", "imagefolder", "--data-root", "{missing}"],
    "contragan train": ["train", "--data", "imagefolder", "--data-root", "{missing}"],
}


def _main(command: str):  # type: ignore[no-untyped-def]
    package = command.split()[0]
    if package == "graphcl":
        from graphcl.cli import main
    elif package == "imagecl":
        from imagecl.cli import main
    else:
        from contragan.cli import main
    return main


def _run(command: str, out: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    argv = [arg.format(missing=tmp_path / "missing") for arg in CASES[command]]
    capsys.readouterr()
    status = _main(command)([*argv, "--quick", "--device", "cpu", "--out", str(out)])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert "missing" in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("command", sorted(CASES))
def test_a_failed_start_leaves_no_run_folder(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "runs" / "new"
    _run(command, out, tmp_path, capsys)
    assert not out.exists(), sorted(p.name for p in out.rglob("*"))


@pytest.mark.parametrize("command", sorted(CASES))
def test_a_folder_that_was_there_is_kept(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "runs" / "existing"
    out.mkdir(parents=True)
    _run(command, out, tmp_path, capsys)
    assert out.is_dir()
