"""The console scripts' common front: ``graphcl``, ``imagecl`` and ``contragan`` each dispatch
``<prog> <pipeline> [options]`` to the ``main(argv)`` of one of their pipelines."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence

from shared.runs import discard_unused_runs

__all__ = ["PipelineMain", "dispatch"]

PipelineMain = Callable[[list[str]], object]


def dispatch(
    prog: str,
    description: str,
    pipelines: Mapping[str, tuple[str, PipelineMain]],
    argv: Sequence[str] | None = None,
) -> int:
    """Run ``pipelines[name]``'s main with the remaining arguments; list them on ``--help``.

    ``pipelines`` maps a command name to ``(one-line help, main)``. Returns the exit status:
    0, or 2 after printing one line instead of a traceback for bad input (a ``ValueError``),
    a file that cannot be read or written (any ``OSError``: missing, a full disk, a read-only
    folder) or a run stopped by a NaN/inf loss (``FloatingPointError``) from the pipeline.
    """
    listing = "\n".join(f"  {name:16} {text}" for name, (text, _) in pipelines.items())
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog=f"pipelines:\n{listing}"
        if pipelines
        else "no pipeline has landed in this package yet",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("pipeline", nargs="?", help="the pipeline to run; its --help lists options")
    parser.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.pipeline is None:
        parser.print_help()
        return 0
    if ns.pipeline not in pipelines:
        known = ", ".join(pipelines) or "none yet"
        parser.error(f"unknown pipeline {ns.pipeline!r} (available: {known})")
    try:
        with discard_unused_runs():  # a failed start leaves no empty run folder
            pipelines[ns.pipeline][1](list(ns.args))
    except (ValueError, OSError, FloatingPointError) as exc:
        # bad input (a missing data set, a changed config on resume, ...), a full disk or a
        # read-only folder, a diverged run (a NaN loss): one clear line
        print(f"{prog} {ns.pipeline}: error: {_message(exc)}", file=sys.stderr)
        return 2
    return 0


def _message(exc: BaseException) -> str:
    """The line shown for ``exc``; an ``OSError`` without Python's ``[Errno N]`` prefix."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror if exc.filename is None else f"{exc.strerror}: {exc.filename}"
    return str(exc)
