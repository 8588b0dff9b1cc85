"""``imagecl study <name>``: the papers' findings as grids of small runs (imagecl.studies)."""

from __future__ import annotations

from imagecl.studies import main as study_main

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """``imagecl study <name> [options]``: the study's own dispatch; a failed study exits with
    its status."""
    status = study_main(argv)
    if status:
        raise SystemExit(status)
    return status
