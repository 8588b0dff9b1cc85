"""The console scripts' dispatcher."""

from __future__ import annotations

import pytest

from contragan.cli import main as contragan_main
from graphcl.cli import main as graphcl_main
from imagecl.cli import main as imagecl_main
from shared.cli import dispatch


def test_dispatch_runs_the_named_pipeline_with_the_remaining_arguments() -> None:
    seen: list[list[str]] = []
    pipelines = {"pretrain": ("pre-train", seen.append), "probe": ("probe", seen.append)}
    assert dispatch("prog", "demo", pipelines, ["pretrain", "--epochs", "2", "--name", "x"]) == 0
    assert seen == [["--epochs", "2", "--name", "x"]]


def test_dispatch_lists_pipelines_and_rejects_unknown_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pipelines = {"pretrain": ("pre-train a GNN", lambda argv: None)}
    assert dispatch("prog", "demo", pipelines, []) == 0
    assert "pretrain" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        dispatch("prog", "demo", pipelines, ["nope"])
    assert exit_info.value.code == 2
    assert "unknown pipeline 'nope' (available: pretrain)" in capsys.readouterr().err


@pytest.mark.parametrize("main", [graphcl_main, imagecl_main, contragan_main])
def test_console_scripts_answer_help(main, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    assert main([]) == 0
    assert "usage:" in capsys.readouterr().out


def test_bad_input_is_one_line_and_exit_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    def missing(argv: list[str]) -> None:
        raise FileNotFoundError("cifar10 not found under ~/data; pass --download")

    assert dispatch("imagecl", "demo", {"train": ("train", missing)}, ["train"]) == 2
    err = capsys.readouterr().err
    assert err == "imagecl train: error: cifar10 not found under ~/data; pass --download\n"
