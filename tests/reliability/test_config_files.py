"""``--config FILE`` (YAML or JSON) of every command, broken in every way a hand-written file is.

An unknown key, a value of the wrong type, a wrong choice, bad YAML or JSON, a file that is not
a mapping, not UTF-8, missing or of another suffix: each must end with status 2 and ONE line
``<prog>: error: ...`` that names the file (and the key or the line where there is one), never
a traceback. Commands and fields come from ``test_cli_arguments`` (the config class each
command hands to ``parse_config``), so a new command is covered by itself.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, NamedTuple

import pytest

from shared.field_types import describe_type, field_hints
from tests.reliability.test_cli_arguments import DISCOVERED, Command, Outcome, run_cli

pytestmark = pytest.mark.reliability


def _first_field(command: Command, kind: Callable[[Any, Any], bool]) -> str | None:
    hints = field_hints(command.cls)
    for f in dataclasses.fields(command.cls):
        inner, _, tuple_args = describe_type(hints[f.name], f.name)
        if kind(inner, tuple_args):
            return f.name
    return None


def _int_field(command: Command) -> str | None:
    return _first_field(command, lambda inner, tup: inner is int and tup is None)


def _choice_field(command: Command) -> str | None:
    return _first_field(command, lambda inner, tup: typing.get_origin(inner) is Literal)


class FileCase(NamedTuple):
    why: str
    name: str  # the file's name
    content: bytes | None  # None: the file does not exist
    mentions: tuple[str, ...]  # besides the file's path, the error line names each of these


def file_cases(command: Command) -> list[FileCase]:
    found = [
        FileCase("unknown-key", "c.yaml", b"no_such_key: 1\n", ("no_such_key",)),
        FileCase("unknown-key-json", "c.json", b'{"no_such_key": 1}', ("no_such_key",)),
        FileCase("unclosed-bracket", "c.yaml", b"seed: [1, 2\n", ("line",)),
        FileCase("tab-indent", "c.yaml", b"a:\n\t- 1\n", ("line",)),
        FileCase("bad-mapping", "c.yaml", b"a: b: c\n", ("line",)),
        FileCase("bad-json", "c.json", b'{"seed": 1,}', ("line",)),
        FileCase("not-a-mapping", "c.yaml", b"- 1\n- 2\n", ("mapping",)),
        FileCase("not-utf8", "c.yaml", b"seed: \xff\xfe\n", ()),
        FileCase("missing", "absent.yaml", None, ()),
        FileCase("suffix", "c.toml", b"seed = 1\n", ("suffix",)),
    ]
    int_field = _int_field(command)
    if int_field:
        found.append(FileCase("wrong-type", "c.yaml", f"{int_field}: abc\n".encode(), (int_field,)))
        found.append(FileCase("float-for-int", "c.json", f'{{"{int_field}": 1.5}}'.encode(), ()))
        found.append(FileCase("list-for-int", "c.yaml", f"{int_field}: [1]\n".encode(), ()))
    choice = _choice_field(command)
    if choice:
        text = f"{choice}: no-such-choice\n".encode()
        found.append(FileCase("wrong-choice", "c.yaml", text, (choice,)))
    return found


CASES = [(command, case) for command in DISCOVERED for case in file_cases(command)]


def _check_one_line(command: Command, outcome: Outcome, path: Path, mentions: tuple[str, ...]):
    assert outcome.cfg is None, f"accepted: {outcome.cfg}"
    assert outcome.status == 2, outcome
    assert "Traceback" not in outcome.err, outcome.err
    lines = outcome.err.strip().splitlines()
    assert len(lines) == 1, f"not one line:\n{outcome.err}"
    assert lines[0].startswith(f"{command.prog}: error: "), lines[0]
    assert str(path) in lines[0], f"the error does not name the file: {lines[0]}"
    for word in mentions:
        assert word.lower() in lines[0].lower(), f"the error does not name {word!r}: {lines[0]}"


@pytest.mark.parametrize(
    ("command", "case"), CASES, ids=[f"{c.name}:{case.why}" for c, case in CASES]
)
def test_bad_config_file_exits_2_with_one_line(
    command: Command, case: FileCase, tmp_path: Path
) -> None:
    path = tmp_path / case.name
    if case.content is not None:
        path.write_bytes(case.content)
    outcome = run_cli(command.cli, [*command.words, *command.base, "--config", str(path)])
    _check_one_line(command, outcome, path, case.mentions)


@pytest.mark.parametrize("command", DISCOVERED, ids=[c.name for c in DISCOVERED])
def test_good_config_file_is_read_and_flags_win(command: Command, tmp_path: Path) -> None:
    """The harness: a valid file sets its keys (an empty one changes nothing), and a flag on
    the command line wins over the file."""
    field = _int_field(command)
    assert field is not None
    default = getattr(run_cli(command.cli, [*command.words, *command.base]).cfg, field)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    outcome = run_cli(command.cli, [*command.words, *command.base, "--config", str(empty)])
    assert getattr(outcome.cfg, field) == default
    for suffix, text in ((".yaml", f"{field}: 7\n"), (".json", json.dumps({field: 7}))):
        path = tmp_path / f"good{suffix}"
        path.write_text(text)
        argv = [*command.words, *command.base, "--config", str(path)]
        assert getattr(run_cli(command.cli, argv).cfg, field) == 7
        flag = "--" + field.replace("_", "-")
        assert getattr(run_cli(command.cli, [*argv, flag, "9"]).cfg, field) == 9


def test_config_file_without_a_value_names_the_command(tmp_path: Path) -> None:
    """``--config`` given last, without its file: argparse's one line, with the command's name."""
    for command in DISCOVERED:
        outcome = run_cli(command.cli, [*command.words, *command.base, "--config"])
        assert outcome.status == 2 and "Traceback" not in outcome.err, outcome
        last = outcome.err.strip().splitlines()[-1]
        assert last.startswith(f"{command.prog}: error: ") and "--config" in last, last


@pytest.mark.parametrize("command", DISCOVERED, ids=[c.name for c in DISCOVERED])
def test_an_out_of_range_value_in_the_file_names_the_file(command: Command, tmp_path: Path) -> None:
    """The config refuses ``seed: -1`` (``batch_size`` where there is no seed) from the file with
    the file's name; a flag that overrides the value wins."""
    names = {f.name for f in dataclasses.fields(command.cls)}
    field = "seed" if "seed" in names else "batch_size"
    assert field in names, command.name
    flag = "--" + field.replace("_", "-")
    path = tmp_path / "bad.yaml"
    path.write_text(f"{field}: -1\n")
    argv = [*command.words, *command.base, "--config", str(path)]
    _check_one_line(command, run_cli(command.cli, argv), path, (field,))
    assert run_cli(command.cli, [*argv, flag, "3"]).cfg is not None
    good = tmp_path / "good.yaml"
    good.write_text(f"{field}: 3\n")
    assert run_cli(command.cli, [*command.words, *command.base, "--config", str(good)]).cfg
