"""Configs are frozen dataclasses; the command line is derived from their fields.

Every pipeline's ``Config`` is a frozen dataclass with the paper's defaults, validated in
``__post_init__`` (see docs/architecture.md, "Configs"). :func:`parse_config` builds an
``argparse`` parser from the fields, accepts ``--config FILE.yaml|.yml|.json`` whose keys replace
the defaults (flags on the command line win over the file), rejects unknown keys, and constructs
the dataclass so its own validation runs. The resolved config is saved with every run as
``config.json``.

Supported field types: ``int``, ``float``, ``str``, ``bool`` (``--flag/--no-flag``),
``pathlib.Path``, ``Literal[...]`` (choices), ``tuple[X, ...]`` and fixed ``tuple[X, Y]`` of
those scalars, and ``X | None`` (the word ``none`` on the command line, ``null`` in a file);
:mod:`shared.field_types` checks and converts them.

Each flag is spelled once, with dashes (field ``data_root`` is ``--data-root``). Its help is
written once, next to the field, in the first of these places that has it: ``metadata={"help":
...}``, a docstring on the line below the field, or the field's trailing ``# comment`` (the
conventions tyro reads). A comment line ``# group: <title>`` in the class body puts the fields
below it, up to the next such line, under that heading in ``--help`` (:mod:`shared.field_notes`
reads them)::

    @dataclass(frozen=True)
    class Config:
        # group: optimisation
        lr: float = 0.3  # base learning rate; > 0
        epochs: int = 100
        "passes over the training set; >= 1"
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import re
import sys
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import yaml

from shared.checkpoint import atomic_write
from shared.field_notes import FieldNote, field_notes
from shared.field_types import coerce, describe_type, field_hints, jsonable, scalar_parser

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "FieldNote",
    "config_to_dict",
    "field_notes",
    "load_config",
    "parse_config",
    "read_config_file",
    "save_config",
]

C = TypeVar("C", bound="DataclassInstance")

# --help lists these groups first, in this order; any other group title follows in source order
_GROUP_ORDER = {
    title: i for i, title in enumerate(("data", "model", "method", "optimisation", "run"))
}


def parse_config(
    cls: type[C],
    argv: Sequence[str] | None = None,
    *,
    prog: str | None = None,
    presets: Mapping[str, Mapping[str, Any]] | None = None,
) -> C:
    """Build ``cls`` from the command line ``argv`` (``sys.argv[1:]`` when ``None``).

    Precedence: command-line flags, then the ``--config`` file, then the chosen preset, then the
    dataclass defaults. ``presets`` maps a name to field values; each becomes a flag
    (``presets={"quick": {...}}`` gives ``--quick``), at most one of which may be given.
    Unknown flags exit through argparse (status 2); unknown file or preset keys raise
    ``ValueError``.
    """
    hints = field_hints(cls)
    presets = dict(presets or {})
    valid = {f.name for f in dataclasses.fields(cls) if f.init}
    for preset, values in presets.items():
        unknown = sorted(set(values) - valid)
        if unknown or preset in valid or preset == "config":
            raise ValueError(f"preset {preset!r} clashes with the fields or sets unknown {unknown}")
    # allow_abbrev=False: a prefix such as --temp must not silently mean --temperature.
    # prog: its errors (``--config`` without a file) name the command, as the main parser's do
    pre = argparse.ArgumentParser(prog=prog, add_help=False, allow_abbrev=False)
    pre.add_argument("--config", type=Path, default=None)
    for preset in presets:
        pre.add_argument(f"--{preset}", action="store_true")
    known, _ = pre.parse_known_args(argv)
    chosen = [preset for preset in presets if getattr(known, preset.replace("-", "_"))]
    if len(chosen) > 1:
        raise ValueError(f"choose one preset, got {['--' + name for name in chosen]}")
    preset_values = {
        key: coerce(value, hints[key], f"preset --{preset} key {key!r}")
        for preset in chosen
        for key, value in presets[preset].items()
    }
    from_file = read_config_file(cls, known.config) if known.config is not None else {}
    file_values = {**preset_values, **from_file}

    doc = inspect.getdoc(cls) or ""
    if doc.startswith(f"{cls.__name__}("):
        doc = ""  # the signature dataclasses write when there is no docstring
    parser = argparse.ArgumentParser(
        prog=prog,
        description=doc.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="a YAML or JSON file whose keys replace the defaults (flags given here win)",
    )
    for preset, values in presets.items():
        shown = ", ".join(f"{key}={value}" for key, value in values.items())
        text = (
            f"preset, sets {shown} (--config and flags win)"
            if values
            else "accepted for symmetry with the other commands; changes nothing"
        )
        parser.add_argument(f"--{preset}", action="store_true", help=text.replace("%", "%%"))
    notes = field_notes(cls)
    titles = sorted(
        dict.fromkeys(note.group for note in notes.values() if note.group),
        key=lambda title: _GROUP_ORDER.get(title, len(_GROUP_ORDER)),  # stable: others follow
    )
    groups = {title: parser.add_argument_group(title) for title in titles}
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        default = file_values.get(field.name, _field_default(field))
        help_text, title = notes.get(field.name, FieldNote("", ""))
        target: argparse._ActionsContainer = groups[title] if title else parser
        _add_argument(target, field, hints[field.name], default, help_text)
    namespace = vars(parser.parse_args(argv))
    namespace.pop("config")
    for preset in presets:
        namespace.pop(preset.replace("-", "_"))
    try:
        values = {
            name: coerce(_none_list(value), hints[name], f"--{name}")
            for name, value in namespace.items()
        }
    except ValueError as exc:
        parser.error(str(exc))  # exits with status 2 and the usage, like any bad flag
    try:
        return cls(**values)
    except ValueError as exc:
        # a value the file set (no flag overrode it) that the config refuses: name the file
        given = sys.argv[1:] if argv is None else argv
        flags = {a[2:].split("=")[0].replace("-", "_") for a in given if a.startswith("--")}
        culprits = [key for key in from_file if key not in flags]
        if any(re.search(rf"\b{key}\b", str(exc)) for key in culprits):
            raise ValueError(f"config file {known.config}: {exc}") from None
        raise


def read_config_file(cls: type[DataclassInstance], path: str | Path) -> dict[str, Any]:
    """Read a YAML/JSON config file and return its values, checked against the fields of ``cls``.

    Raises ``ValueError`` naming the file for an unknown key (listing the valid ones), a value of
    the wrong type, a file whose top level is not a mapping, text that is not UTF-8, or invalid
    YAML/JSON (with the line and column, on one line).
    """
    source = Path(path)
    if not source.is_file():
        raise FileNotFoundError(f"config file {source} does not exist")
    try:
        text = source.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"config file {source} is not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None
    suffix = source.suffix.lower()
    if suffix in (".yaml", ".yml"):
        try:
            raw = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"config file {source}: invalid YAML: {_yaml_problem(exc)}") from None
    elif suffix == ".json":
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"config file {source}: invalid JSON: {exc.msg} at line {exc.lineno}, "
                f"column {exc.colno}"
            ) from None
    else:
        raise ValueError(
            f"config file {source}: unsupported suffix {suffix!r}; use .yaml/.yml/.json"
        )
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise ValueError(f"config file {source} must hold a mapping, got {type(raw).__name__}")
    hints = field_hints(cls)
    valid = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = [key for key in raw if key not in valid]
    if unknown:
        raise ValueError(
            f"config file {source}: unknown key {unknown[0]!r} (all unknown: {unknown}); "
            f"valid keys for {cls.__name__}: {valid}"
        )
    return {
        key: coerce(value, hints[key], f"config file {source}: key {key!r}")
        for key, value in raw.items()
    }


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's error on one line: what is wrong and where (its own message spans several)."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        what = exc.problem or exc.context or "invalid syntax"
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        return f"{what}{where}"
    return " ".join(str(exc).split())


def load_config(cls: type[C], path: str | Path, *, command: str | None = None) -> C:
    """Build ``cls`` from a YAML/JSON file (e.g. a run's ``config.json``).

    Keys missing from the file take the dataclass defaults; unknown keys raise ``ValueError``.
    ``command`` (say ``"imagecl train"``) marks ``path`` as a run's saved config: keys that
    command does not know then mean the folder is another command's run (or an older
    version's), and the error says so instead of listing the valid keys.
    """
    if command is not None:
        source = Path(path)
        try:
            raw = json.loads(source.read_text(encoding="utf-8")) if source.is_file() else None
        except (UnicodeDecodeError, json.JSONDecodeError):
            raw = None  # read_config_file names the problem
        if isinstance(raw, dict):
            valid = {f.name for f in dataclasses.fields(cls) if f.init}
            unknown = sorted(str(key) for key in raw if key not in valid)
            if unknown:
                raise ValueError(
                    f"{source} is not the config of a run of {command}: {len(unknown)} of its keys "
                    f"are not {command}'s options ({', '.join(map(repr, unknown[:3]))}"
                    f"{', ...' if len(unknown) > 3 else ''}); is it another command's run, or "
                    "one from an older version?"
                )
    return cls(**read_config_file(cls, path))


def config_to_dict(cfg: DataclassInstance) -> dict[str, Any]:
    """Return the config as a JSON-ready dict: tuples become lists, paths become strings."""
    if not dataclasses.is_dataclass(cfg) or isinstance(cfg, type):
        raise TypeError(f"expected a dataclass instance, got {type(cfg).__name__}")
    plain = jsonable(dataclasses.asdict(cfg))
    assert isinstance(plain, dict)
    return plain


def save_config(cfg: DataclassInstance, path: str | Path) -> Path:
    """Write the resolved config as JSON, atomically; a folder ``path`` gets ``config.json`` inside.

    Returns the file written, which :func:`load_config` reads back into an equal config.
    """
    target = Path(path)
    if target.is_dir():
        target = target / "config.json"
    text = json.dumps(config_to_dict(cfg), indent=2, sort_keys=False) + "\n"
    with atomic_write(target) as handle:
        handle.write(text.encode("utf-8"))
    return target


def _field_default(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def _add_argument(
    parser: argparse._ActionsContainer,
    field: dataclasses.Field[Any],
    hint: Any,
    default: Any,
    help_text: str,
) -> None:
    inner, optional, tuple_args = describe_type(hint, field.name)
    flag = f"--{field.name.replace('_', '-')}"
    # argparse %-formats help strings; ArgumentDefaultsHelpFormatter appends the default.
    shown = help_text.replace("%", "%%") if help_text else "(default: %(default)s)"
    kwargs: dict[str, Any] = {"dest": field.name, "help": shown}
    if default is dataclasses.MISSING:
        kwargs["required"] = True
    else:
        kwargs["default"] = default
    if tuple_args is not None:
        fixed = not (len(tuple_args) == 2 and tuple_args[1] is Ellipsis)
        kwargs["nargs"] = len(tuple_args) if fixed and not optional else "+"
        kwargs["type"] = scalar_parser(tuple_args[0], optional)
        kwargs["metavar"] = tuple_args[0].__name__.upper()
    elif inner is bool and not optional:
        kwargs["action"] = argparse.BooleanOptionalAction
    else:
        kwargs["type"] = scalar_parser(inner, optional)
        if typing.get_origin(inner) is Literal:
            kwargs["choices"] = [*typing.get_args(inner), *([None] if optional else [])]
        else:  # the value's type, not the field's name again: --lr FLOAT, --out PATH
            kwargs["metavar"] = inner.__name__.upper() + ("|none" if optional else "")
    parser.add_argument(flag, **kwargs)


def _none_list(value: Any) -> Any:
    """``--sizes none`` arrives from argparse as ``[None]``: it means the field is ``None``."""
    return None if isinstance(value, list) and value == [None] else value
