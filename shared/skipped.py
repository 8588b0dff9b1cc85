"""The inputs a command left out (unreadable images, invalid SMILES): ``skipped.csv`` and one line.

Every command that reads user data writes ``skipped.csv`` into its run folder, even when nothing
was left out (the header alone), prints one line counting what was skipped and why, and records
the count in ``summary.json`` and the report.
"""

from __future__ import annotations

import csv
import io
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from shared.checkpoint import atomic_write
from shared.runs import RunDir

__all__ = ["report_skipped", "skipped_line", "write_skipped"]


def write_skipped(
    path: str | Path, rows: Sequence[Sequence[str]], header: Sequence[str] = ("file", "reason")
) -> Path:
    """Write the inputs a command left out as a CSV (``header``, then one row each), atomically.

    The file is written even when ``rows`` is empty (header only), so every run folder says
    whether anything was left out.
    """
    if any(len(row) != len(header) for row in rows):
        raise ValueError(f"every skipped row must have the {len(header)} columns {tuple(header)}")
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    with atomic_write(path) as handle:
        handle.write(buffer.getvalue().encode("utf-8"))
    return Path(path)


def skipped_line(reasons: Sequence[str], *, total: int, noun: str, listing: str | Path) -> str:
    """One line for the user: how many inputs were left out, why, and where the list is.

    ``reasons`` holds one reason per left-out input; the text before its first ``:`` (an
    exception name such as ``UnidentifiedImageError``) is what gets counted. ``total`` counts
    every input, the left-out ones included. E.g. ``"skipped 2 of 40 image files
    (UnidentifiedImageError: 1, OSError: 1); the list is in runs/x/skipped.csv"``.
    """
    if not reasons:
        return f"skipped 0 of {total} {noun}"
    counts = Counter(reason.split(":", 1)[0] for reason in reasons)
    why = ", ".join(f"{reason}: {count}" for reason, count in counts.most_common())
    return f"skipped {len(reasons)} of {total} {noun} ({why}); the list is in {listing}"


def report_skipped(
    run_dir: RunDir | str | Path,
    rows: Sequence[Sequence[str]],
    *,
    total: int,
    noun: str,
    header: Sequence[str] = ("file", "reason"),
) -> str | None:
    """Write ``skipped.csv`` into the run folder and print one line when anything was skipped.

    ``rows`` are the left-out inputs, their reason in the last column; ``total`` counts every
    input (left-out ones included). Returns the printed line, or ``None`` when nothing was left
    out (``skipped.csv`` then holds the header only).
    """
    run = run_dir if isinstance(run_dir, RunDir) else RunDir(Path(run_dir))
    write_skipped(run.skipped_path, rows, header)
    if not rows:
        return None
    line = skipped_line([row[-1] for row in rows], total=total, noun=noun, listing=run.skipped_path)
    print(line, flush=True)
    return line
