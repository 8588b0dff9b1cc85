"""The field types a config may use: checking them, converting values to them, and back to JSON.

Supported: ``int``, ``float``, ``str``, ``bool``, ``pathlib.Path``, ``Literal[...]``,
``tuple[X, ...]`` and fixed ``tuple[X, Y]`` of those scalars, and ``X | None``. :func:`coerce`
checks a value from a file, a preset or the command line against a field's type and normalises
it (lists to tuples, strings to paths); :func:`scalar_parser` is the string converter argparse
uses for one flag; :func:`jsonable` turns a config's values into plain JSON values.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "SCALARS",
    "coerce",
    "describe_type",
    "field_hints",
    "jsonable",
    "scalar_parser",
    "split_optional",
]

SCALARS: tuple[type, ...] = (int, float, str, bool, Path)


def field_hints(cls: type[Any]) -> dict[str, Any]:
    """Resolve the field annotations (strings under ``from __future__ import annotations``)."""
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"expected a dataclass type, got {cls!r}")
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if field.name == "config":
            raise TypeError(f"{cls.__name__}: a field may not be called 'config' (it is --config)")
        describe_type(hints[field.name], f"{cls.__name__}.{field.name}")
    return hints


def split_optional(hint: Any) -> tuple[Any, bool]:
    """``X | None`` -> (X, True); anything else -> (hint, False)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"unsupported union {hint!r}: only X | None is allowed")
        return args[0], len(args) < len(typing.get_args(hint))
    return hint, False


def describe_type(hint: Any, where: str) -> tuple[Any, bool, tuple[Any, ...] | None]:
    """Validate a field type; return (inner type, optional, tuple element types or None)."""
    inner, optional = split_optional(hint)
    if typing.get_origin(inner) is tuple:
        args = typing.get_args(inner)
        elements = args[:1] if len(args) == 2 and args[1] is Ellipsis else args
        # One element type: argparse converts every value of a flag with the same function.
        if len(set(elements)) != 1 or elements[0] not in SCALARS or elements[0] is bool:
            raise TypeError(f"{where}: unsupported tuple type {inner!r}")
        return inner, optional, args
    if typing.get_origin(inner) is Literal or inner in SCALARS:
        return inner, optional, None
    raise TypeError(f"{where}: unsupported config field type {hint!r}")


def scalar_parser(kind: Any, optional: bool) -> Callable[[str], Any]:
    """A string converter for argparse whose ``__name__`` reads well in its error messages."""
    if typing.get_origin(kind) is Literal:
        by_text = {str(choice): choice for choice in typing.get_args(kind)}

        def convert(text: str) -> Any:
            if optional and text.lower() == "none":
                return None
            return by_text.get(text, text)  # unknown text is reported by argparse's choices

    elif kind is bool:

        def convert(text: str) -> Any:
            lowered = text.lower()
            if optional and lowered == "none":
                return None
            if lowered not in ("true", "false"):
                raise ValueError(text)
            return lowered == "true"

    else:

        def convert(text: str) -> Any:
            if optional and text.lower() == "none":
                return None
            return kind(text)

    convert.__name__ = getattr(kind, "__name__", "choice")
    return convert


def coerce(value: Any, hint: Any, where: str) -> Any:
    """Check ``value`` against the field type and normalise it (lists to tuples, str to Path).

    ``where`` names the source (file and key, or the flag) in the error message.
    """
    inner, optional, tuple_args = describe_type(hint, where)
    if value is None:
        if optional:
            return None
        raise ValueError(f"{where}: None is not allowed for type {hint!r}")
    if tuple_args is not None:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{where}: expected a list for {hint!r}, got {value!r}")
        variadic = len(tuple_args) == 2 and tuple_args[1] is Ellipsis
        if not variadic and len(value) != len(tuple_args):
            raise ValueError(f"{where}: expected {len(tuple_args)} values, got {value!r}")
        kinds = [tuple_args[0]] * len(value) if variadic else list(tuple_args)
        return tuple(coerce(v, k, where) for v, k in zip(value, kinds, strict=True))
    if typing.get_origin(inner) is Literal:
        if value not in typing.get_args(inner):
            raise ValueError(f"{where}: {value!r} is not one of {list(typing.get_args(inner))}")
        return value
    return _coerce_scalar(value, inner, where)


def _coerce_scalar(value: Any, kind: Any, where: str) -> Any:
    if kind is bool and isinstance(value, bool):
        return value
    if kind is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if kind is float and isinstance(value, str):
        # PyYAML follows YAML 1.1, which reads `1e-3` (no dot) as a string, not a float.
        try:
            return float(value)
        except ValueError:
            pass
    if kind is str and isinstance(value, str):
        return value
    if kind is Path and isinstance(value, (str, Path)):
        return Path(value)
    raise ValueError(f"{where}: expected {kind.__name__}, got {value!r}")


def jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value
