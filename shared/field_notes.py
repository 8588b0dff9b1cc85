"""The help of a config's fields, read next to each field in the class body.

A field's help is, in the first of these places that has it: ``metadata={"help": ...}``, a
docstring on the line below the field, or the field's trailing ``# comment`` (the conventions tyro
reads). A comment line ``# group: <title>`` in the class body puts the fields below it, up to the
next such line, under that heading in ``--help``.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import re
import textwrap
import tokenize
import typing
from typing import Any

__all__ = ["FieldNote", "field_notes"]


class FieldNote(typing.NamedTuple):
    """What ``--help`` shows for one field: its help text and its group title ("" for none)."""

    help: str
    group: str


def field_notes(cls: type[Any]) -> dict[str, FieldNote]:
    """The help text and group of every field of the dataclass ``cls``, read next to the field.

    Help comes from ``metadata["help"]``, else the docstring right below the field, else the
    field's trailing ``# comment``; a ``# group: <title>`` comment line groups the fields below
    it. A field inherited from a base class is read from the base's source. Fields without any
    note are missing from the result.
    """
    notes: dict[str, FieldNote] = {}
    for field in dataclasses.fields(cls):
        owner = next((k for k in cls.__mro__ if field.name in inspect.get_annotations(k)), cls)
        text, group = _source_notes(owner).get(field.name, FieldNote("", ""))
        text = str(field.metadata.get("help", text))
        if text or group:
            notes[field.name] = FieldNote(" ".join(text.split()), group)
    return notes


_GROUP = re.compile(r"#\s*group:\s*(?P<title>.+?)\s*$")


@functools.cache
def _source_notes(cls: type[Any]) -> dict[str, FieldNote]:
    """Field name -> (docstring or trailing comment, group) from the class body's own source."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # no source: a class built at run time, an interactive session
        return {}
    notes: dict[str, FieldNote] = {}
    depth, body_col, group = 0, -1, ""
    line: list[tokenize.TokenInfo] = []  # the current logical line at the class body's depth
    last: str | None = None  # the field on the previous logical line, for its docstring
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.INDENT:
            depth += 1
            if depth == 1:
                body_col = len(token.string)
        elif token.type == tokenize.DEDENT:
            depth -= 1
        elif token.type == tokenize.COMMENT and not line and token.start[1] == body_col:
            marker = _GROUP.match(token.string)
            group = marker.group("title") if marker else group
        elif token.type == tokenize.NEWLINE and depth == 1 and line:
            last = _note_line(line, notes, group, last)
            line = []
        elif depth == 1 and token.type != tokenize.NL:
            line.append(token)
    return notes


def _note_line(
    line: list[tokenize.TokenInfo], notes: dict[str, FieldNote], group: str, last: str | None
) -> str | None:
    """Record the field on one logical line of the class body; return its name (or None)."""
    first = line[0]
    if first.type == tokenize.STRING and len(line) == 1 and last is not None:
        doc = inspect.cleandoc(str(ast.literal_eval(first.string)))  # the attribute docstring
        notes[last] = FieldNote(doc, notes[last].group)
        return None
    if first.type == tokenize.NAME and len(line) > 1 and line[1].string == ":":
        comments = [t.string.lstrip("#").strip() for t in line if t.type == tokenize.COMMENT]
        notes[first.string] = FieldNote(" ".join(comments), group)
        return first.string
    return None
