"""Every option of every command, given bad values: exit status 2 and one clear line.

The commands come from the console scripts' tables (``PIPELINES`` of each ``cli.py``, and the
studies of ``imagecl study``); the options from the config dataclass each command hands to
``shared.config.parse_config``, found by running ``<command> --help`` with that function
wrapped. So a new command or a new config field gets its cases without touching this file:

* a required option left out (argparse's ``required``, or a check in ``__post_init__``);
* an unknown flag, and a flag without its value;
* a value of the wrong type for every int, float, choice, bool and tuple field;
* out-of-range values for every field whose name matches a row of :data:`RANGES`.

A case must end with status 2 and stderr whose last line is ``<prog>: error: ...`` naming the
option, after nothing but argparse's usage: never a traceback. The bad value must be refused by
the time the config is built: the command's ``parse_config`` is wrapped so that a config that
parses raises :class:`Accepted` instead of running (a test fails with the config it built). A
few cases run through the installed console scripts as a user would, and one per CLI names an
unknown data set, which only loading the data can tell.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
import subprocess
import sys
import typing
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

import pytest

import shared.config
from contragan import cli as contragan_cli
from graphcl import cli as graphcl_cli
from imagecl import cli as imagecl_cli
from imagecl.studies import STUDIES
from shared.field_types import coerce, describe_type, field_hints

pytestmark = pytest.mark.reliability

CLIS: dict[str, Callable[[Sequence[str] | None], int]] = {
    "graphcl": graphcl_cli.main,
    "imagecl": imagecl_cli.main,
    "contragan": contragan_cli.main,
}
COMMANDS: list[tuple[str, tuple[str, ...]]] = [
    *[("graphcl", (name,)) for name in graphcl_cli.PIPELINES],
    *[("imagecl", (name,)) for name in imagecl_cli.PIPELINES if name != "study"],
    *[("imagecl", ("study", name)) for name in STUDIES],
    *[("contragan", (name,)) for name in contragan_cli.PIPELINES],
]
PACKAGES = ("graphcl", "imagecl", "contragan")
REAL_PARSE_CONFIG = shared.config.parse_config


class Accepted(Exception):  # not an error: the config parsed
    """Raised instead of running a command whose arguments made a valid config."""

    def __init__(self, cfg: object) -> None:
        super().__init__(f"accepted: {cfg}")
        self.cfg = cfg


class _Found(Exception):
    def __init__(self, cls: type[Any], presets: dict[str, Any]) -> None:
        super().__init__(cls.__name__)
        self.cls, self.presets = cls, presets


@contextlib.contextmanager
def wrapped_parse_config(hook: Callable[..., Any]) -> Iterator[None]:
    """Replace ``parse_config`` in every loaded module of the pipelines by ``hook``."""
    patched = [
        module
        for name, module in list(sys.modules.items())
        if name.partition(".")[0] in PACKAGES
        and getattr(module, "parse_config", None) is REAL_PARSE_CONFIG
    ]
    for module in patched:
        module.parse_config = hook  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for module in patched:
            module.parse_config = REAL_PARSE_CONFIG  # type: ignore[attr-defined]


def _accept(cls: type[Any], argv: Sequence[str] | None = None, **kwargs: Any) -> Any:
    raise Accepted(REAL_PARSE_CONFIG(cls, argv, **kwargs))


def _record(cls: type[Any], argv: Sequence[str] | None = None, **kwargs: Any) -> Any:
    raise _Found(cls, dict(kwargs.get("presets") or {}))


class Outcome(NamedTuple):
    status: int | str | None
    err: str
    cfg: object = None  # the config, when the arguments were accepted


def run_cli(cli: str, argv: Sequence[str], *, accept: bool = True) -> Outcome:
    """``<cli> *argv`` in this process; with ``accept`` a valid config stops before running."""
    err, out = io.StringIO(), io.StringIO()
    hook = wrapped_parse_config(_accept) if accept else contextlib.nullcontext()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out), hook:
        try:
            status: int | str | None = CLIS[cli](list(argv))
        except SystemExit as exc:
            status = exc.code
        except Accepted as exc:
            return Outcome(None, err.getvalue(), exc.cfg)
    return Outcome(status, err.getvalue())


class Command(NamedTuple):
    cli: str
    words: tuple[str, ...]
    cls: type[Any]  # the config dataclass
    presets: dict[str, Any]
    base: tuple[str, ...]  # arguments that make a valid config (the required ones)

    @property
    def prog(self) -> str:
        return " ".join([self.cli, *self.words])

    @property
    def name(self) -> str:
        return "-".join([self.cli, *self.words])


def _dummy(hint: Any) -> str:
    inner, _, _ = describe_type(hint, "dummy")
    if inner is Path:
        return "missing-input.pt"
    if typing.get_origin(inner) is Literal:
        return str(typing.get_args(inner)[0])
    return {int: "1", float: "0.5", str: "x"}[inner]


def _base_arguments(cls: type[Any]) -> tuple[str, ...]:
    """The fewest dummy values that make ``cls`` valid: the required fields, then the optional
    paths (a ``checkpoint: Path | None`` its ``__post_init__`` requires)."""
    hints = field_hints(cls)
    fields = [f for f in dataclasses.fields(cls) if f.init]
    values: dict[str, str] = {
        f.name: _dummy(hints[f.name])
        for f in fields
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    paths = [f.name for f in fields if describe_type(hints[f.name], f.name)[0] is Path]
    for extra in [None, *paths]:
        if extra is not None:
            values.setdefault(extra, _dummy(hints[extra]))
        try:
            cls(**{k: coerce(v, hints[k], k) for k, v in values.items()})
        except (TypeError, ValueError):
            continue
        return tuple(a for k, v in values.items() for a in (_flag(k), v))
    raise AssertionError(f"{cls.__name__}: no valid set of dummy arguments")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def discover() -> list[Command]:
    """Each command's config class and presets, from ``<command> --help`` (parse_config
    recorded, not run); the first call imports the lazily loaded command modules."""
    commands = []
    for cli, words in COMMANDS:
        run_cli(cli, [*words, "--help"], accept=False)  # imports the command's module
        with (
            contextlib.redirect_stdout(io.StringIO()),
            wrapped_parse_config(_record),
            pytest.raises(_Found) as found,
        ):
            CLIS[cli]([*words, "--help"])
        cls, presets = found.value.cls, found.value.presets
        commands.append(Command(cli, words, cls, presets, _base_arguments(cls)))
    return commands


DISCOVERED = discover()

# --------------------------------------------------------------------------- the cases

# Out-of-range values by field name (first match wins), for int and float fields; from the
# ranges the fields' help texts state.
RANGES: list[tuple[str, tuple[str, ...]]] = [
    # >= 0
    (
        r"^(seed|seeds|queue_size|num_workers|decoder_depth|ema_start|weight_decay|"
        r"warmup_epochs|lam|lambda_2c|ac_weight|adv_alpha|margin)$",
        ("-1",),
    ),
    # > 0
    (r"(^|_)(lr|temperature|tau|gamma)$", ("0", "-1", "nan")),
    # probabilities and fractions
    (
        r"(^|_)(p|ratio|fraction|dropout|momentum|beta1|beta2|ema_decay|accuracy|eps)$",
        ("-0.1", "1.5", "nan"),
    ),
    # counts, sizes and periods >= 1
    (
        r"(^|_)(batch_size|epochs|steps|every|image_size|head_dim|hidden|layers|width|views|"
        r"stages|per_class|molecules|limit|threads|n_dis|knn_k|flips)$",
        ("0", "-1"),
    ),
    (r"^severities$", ("0", "6")),
    (r"^overlap$", ("2",)),
]


class Case(NamedTuple):
    command: Command
    argv: tuple[str, ...]
    why: str
    names: tuple[str, ...]  # the error line must name one of these (empty: anything)

    @property
    def id(self) -> str:
        return f"{self.command.name}:{self.why}"


def _wrong_types(inner: Any, tuple_args: Any, optional: bool) -> list[str]:
    if tuple_args is not None:
        element = tuple_args[0]
        return ["abc"] if element in (int, float) else []
    if typing.get_origin(inner) is Literal:
        return ["no-such-choice"]
    return {int: ["abc", "1.5"], float: ["abc"], bool: ["maybe"]}.get(inner, [])


def cases() -> list[Case]:
    found = []
    for command in DISCOVERED:
        base = list(command.base)
        hints = field_hints(command.cls)
        fields = [f for f in dataclasses.fields(command.cls) if f.init]
        if base:  # every required option left out
            required = tuple(base[::2])
            found.append(Case(command, (), "missing-required", tuple(f[2:] for f in required)))
        found.append(Case(command, (*base, "--no-such-option", "1"), "unknown-flag", ()))
        found.append(Case(command, (*base, "--quick=yes"), "value-for-a-switch", ()))
        for f in fields:
            inner, optional, tuple_args = describe_type(hints[f.name], f.name)
            flag, names = _flag(f.name), (f.name, _flag(f.name))
            is_switch = inner is bool and not optional and tuple_args is None
            if is_switch:
                found.append(Case(command, (*base, f"{flag}=maybe"), f"{f.name}=maybe", names))
                continue
            found.append(Case(command, (*base, flag), f"{f.name}-without-value", names))
            for value in _wrong_types(inner, tuple_args, optional):
                found.append(Case(command, (*base, flag, value), f"{f.name}={value}", names))
            numeric = inner in (int, float) or (tuple_args is not None and tuple_args[0] is int)
            for pattern, values in RANGES if numeric else []:
                if re.search(pattern, f.name):
                    for value in values:
                        if value == "nan" and inner is not float:
                            continue
                        argv = (*base, flag, value)
                        found.append(Case(command, argv, f"{f.name}={value}", names))
                    break
    return found


CASES = cases()


def _check_refused(case: Case, outcome: Outcome) -> None:
    prog = case.command.prog
    argv = " ".join(case.argv)
    assert outcome.cfg is None, f"{prog} {argv}: accepted, would run with {outcome.cfg}"
    assert outcome.status == 2, f"{prog} {argv}: exit status {outcome.status}\n{outcome.err}"
    assert "Traceback" not in outcome.err, outcome.err
    lines = outcome.err.strip().splitlines()
    assert lines, f"{prog} {argv}: no message"
    # one error line, after nothing but argparse's usage
    assert lines[-1].startswith(f"{prog}: error: "), f"{prog} {argv}: {outcome.err}"
    assert len(lines) == 1 or lines[0].startswith("usage: "), outcome.err
    assert sum("error" in line for line in lines) == 1, outcome.err
    if case.names:
        text = lines[-1].lower()
        assert any(
            name.lower() in text or name.lower().replace("_", " ") in text for name in case.names
        ), f"{prog} {argv}: the error names none of {case.names}: {lines[-1]}"


def test_every_command_and_field_has_cases() -> None:
    assert {c.command.prog for c in CASES} == {" ".join([cli, *w]) for cli, w in COMMANDS}
    assert len(CASES) > 400, len(CASES)
    for command in DISCOVERED:  # every numeric field of every command gets a bad value
        hints = field_hints(command.cls)
        for f in dataclasses.fields(command.cls):
            inner, _, tuple_args = describe_type(hints[f.name], f.name)
            if inner in (int, float) or (tuple_args and tuple_args[0] in (int, float)):
                assert any(c.why.startswith(f"{f.name}=") for c in CASES if c.command == command)


@pytest.mark.parametrize("command", DISCOVERED, ids=[c.name for c in DISCOVERED])
def test_base_arguments_are_accepted(command: Command) -> None:
    """The harness itself: the base arguments (the required ones) make a config, so every
    refusal below is the bad value's doing."""
    outcome = run_cli(command.cli, [*command.words, *command.base])
    assert outcome.cfg is not None, outcome


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_argument_exits_2_with_one_line(case: Case) -> None:
    outcome = run_cli(case.command.cli, [*case.command.words, *case.argv])
    _check_refused(case, outcome)


# --------------------------------------------------------------------------- as a user


def _console_script(cli: str) -> Path:
    script = Path(sys.executable).parent / cli
    if not script.is_file():
        pytest.skip(f"the {cli} console script is not installed next to {sys.executable}")
    return script


# (prog, arguments, what the error line names): a type (through the nested study dispatch) and
# a range (the config's own check); two, as each starts a Python that imports torch
AS_A_USER = [
    ("imagecl study head", ["--quick", "--steps", "abc"], "--steps"),
    ("contragan train", ["--quick", "--beta1", "1.5"], "beta1"),
]


def test_console_scripts_exit_2_with_one_line(tmp_path: Path) -> None:
    """The installed scripts, as a user runs them (all at once: each starts a Python)."""
    running = []
    for i, (prog, argv, expected) in enumerate(AS_A_USER):
        cli, *words = prog.split()
        out = tmp_path / f"run{i}"
        command = [str(_console_script(cli)), *words, *argv, "--out", str(out)]
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path
        )
        running.append((prog, expected, out, process))
    for prog, expected, out, process in running:
        _, err = process.communicate(timeout=180)
        assert process.returncode == 2, err
        assert "Traceback" not in err
        last = err.strip().splitlines()[-1]
        assert last.startswith(f"{prog}: error: ") and expected in last, err
        assert not out.exists(), "a refused command left a run folder"


@pytest.mark.parametrize(
    ("cli", "argv"),
    [
        ("graphcl", ["pretrain", "--quick", "--data", "no-such-set"]),
        ("graphcl", ["finetune", "--quick", "--data", "no-such-set.csv"]),
        ("imagecl", ["train", "--quick", "--data", "no-such-set"]),
        ("contragan", ["train", "--quick", "--data", "no-such-set"]),
    ],
)
def test_unknown_data_set_exits_2_with_one_line(
    cli: str, argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run for real (nothing is stopped early): the data set is looked up before any training."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CONTRASTKIT_CACHE", str(tmp_path / "cache"))
    outcome = run_cli(cli, [*argv, "--out", str(tmp_path / "run")], accept=False)
    assert outcome.status == 2, outcome
    lines = outcome.err.strip().splitlines()
    assert "Traceback" not in outcome.err and "no-such-set" in lines[-1], outcome.err
    assert len(lines) == 1 or lines[0].startswith("usage: "), outcome.err
