"""Target columns of a molecule source: raw strings to a float tensor, and the task they imply.

A value that is empty or ``nan``/``na``/``n/a``/``none``/``null`` is missing (NaN). A column
that holds a non-number is read as class names, mapped to 0..K-1 in sorted string order (then
``task`` must not be ``"regression"``). ``task=None`` infers: class names, or only 0/1 values →
``"classification"``, anything else → ``"regression"``; with no targets it is None.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

__all__ = ["MISSING_VALUES", "TaskKind", "parse_targets"]

MISSING_VALUES = frozenset({"", "nan", "na", "n/a", "none", "null"})

TaskKind = Literal["regression", "classification"]


def parse_targets(
    rows: list[tuple[str, ...]], names: Sequence[str], wheres: list[str], task: str | None
) -> tuple[Tensor | None, TaskKind | None]:
    """Raw strings → ``(N, T)`` float32 (NaN = missing) and the task (inferred when None).

    Args:
        rows: one tuple of raw target strings per molecule, one string per name
        names: the target names (columns)
        wheres: where each row was read (``"file:line"``), for error messages
        task: ``"regression"``, ``"classification"`` or None (inferred)
    """
    if not names:
        return None, None
    columns, has_classes = [], False
    for t, name in enumerate(names):
        column, named = _target_column([row[t] for row in rows], name, wheres, task)
        columns.append(column)
        has_classes |= named
    values = torch.tensor(columns, dtype=torch.float32).t().contiguous()  # (N, T)
    known = values[~values.isnan()]
    if task is None:
        binary = bool(((known == 0) | (known == 1)).all())
        task = "classification" if has_classes or binary else "regression"
    if task == "classification" and not bool(((known >= 0) & (known == known.round())).all()):
        raise ValueError(f"task='classification' needs class ids 0, 1, ... in {', '.join(names)}")
    return values, task  # type: ignore[return-value]


def _target_column(
    raw: list[str], name: str, wheres: list[str], task: str | None
) -> tuple[list[float], bool]:
    """One target column as floats; non-numeric columns are class names (sorted → 0..K-1)."""
    texts = [value.strip() for value in raw]
    numbers: list[float] = []
    for text, where in zip(texts, wheres, strict=True):
        if text.lower() in MISSING_VALUES:
            numbers.append(float("nan"))
            continue
        try:
            numbers.append(float(text))
        except ValueError:
            if task == "regression":
                raise ValueError(
                    f"target {name!r} at {where} is {text!r}, not a number; "
                    "pass task='classification' for class labels"
                ) from None
            break
    else:
        return numbers, False
    classes = sorted({text for text in texts if text.lower() not in MISSING_VALUES})
    index = {label: float(i) for i, label in enumerate(classes)}
    return [index.get(text, float("nan")) for text in texts], True
