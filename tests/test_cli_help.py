"""``--help`` of every command: each option says what it does, and each flag is spelled once.

The commands come from the console scripts' tables (``PIPELINES`` of every ``cli.py`` and the
studies of ``imagecl study``), and the options from the parser each command builds, so a new
command or a new config field is covered without touching this file.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence

import pytest

from contragan import cli as contragan_cli
from graphcl import cli as graphcl_cli
from imagecl import cli as imagecl_cli
from imagecl.studies import STUDIES

CLIS: dict[str, Callable[[Sequence[str] | None], int]] = {
    "graphcl": graphcl_cli.main,
    "imagecl": imagecl_cli.main,
    "contragan": contragan_cli.main,
}
COMMANDS = [
    *[("graphcl", [name]) for name in graphcl_cli.PIPELINES],
    *[("imagecl", [name]) for name in imagecl_cli.PIPELINES if name != "study"],
    *[("imagecl", ["study", name]) for name in STUDIES],
    *[("contragan", [name]) for name in contragan_cli.PIPELINES],
]


def _words(text: str) -> str:
    return " ".join(re.sub(r"[-_]", " ", text).lower().split())


def _help_parser(
    monkeypatch: pytest.MonkeyPatch, cli: str, command: list[str]
) -> argparse.ArgumentParser:
    """Run ``<cli> <command> --help`` and return the parser that printed the help."""
    printed: list[argparse.ArgumentParser] = []
    original = argparse.ArgumentParser.print_help

    def record(self: argparse.ArgumentParser, file: object = None) -> None:
        printed.append(self)
        original(self, file)  # type: ignore[arg-type]

    monkeypatch.setattr(argparse.ArgumentParser, "print_help", record)
    with pytest.raises(SystemExit) as excinfo:
        CLIS[cli]([*command, "--help"])
    assert excinfo.value.code == 0
    assert len(printed) == 1
    return printed[0]


def test_every_command_is_covered() -> None:
    assert {" ".join([cli, *command]) for cli, command in COMMANDS} >= {
        "graphcl pretrain",
        "graphcl finetune",
        "graphcl probe",
        "graphcl augment",
        "imagecl train",
        "imagecl eval",
        "imagecl finetune",
        "imagecl study head",
        "contragan train",
        "contragan sample",
        "contragan evaluate",
    }


@pytest.mark.parametrize(
    ("cli", "command"), COMMANDS, ids=["-".join([cli, *command]) for cli, command in COMMANDS]
)
def test_every_option_says_what_it_does_once(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    cli: str,
    command: list[str],
) -> None:
    parser = _help_parser(monkeypatch, cli, command)
    text = capsys.readouterr().out
    options = [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]
    assert len(options) > 1
    for action in options:
        long = [flag for flag in action.option_strings if not flag.startswith("--no-")]
        assert len(long) == 1, f"{action.dest}: one spelling per flag, got {long}"
        flag = long[0]
        assert "_" not in flag, f"{flag}: dashes, not underscores"
        assert (
            text.count(f"\n  {flag} ") + text.count(f"\n  {flag}\n") + text.count(f"\n  {flag}, ")
            == 1
        ), f"{flag} is listed more than once in --help"
        help_text = (action.help or "").replace("(default: %(default)s)", "").strip()
        assert help_text, f"{flag} has no help text"
        assert _words(help_text) != _words(action.dest), f"{flag}: help repeats the name"
        assert len(help_text.split()) >= 3, f"{flag}: {help_text!r} does not say what it does"
