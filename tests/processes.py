"""The processes a test started: finding and killing all of them, and ending its DDP workers.

torchrun puts each rank in a session of its own: ``os.killpg`` on the launcher's group alone
leaves the ranks of a timed-out job running (and writing into its run folder); :func:`kill_job`
reaches every process group below the launcher. :func:`exit_without_teardown` ends a spawned DDP
worker that finished its work without the interpreter teardown where gloo can abort it.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

__all__ = ["exit_without_teardown", "kill_job", "process_groups"]


def process_groups(root: int) -> list[int]:
    """The process groups of every process below ``root`` (Linux: from ``/proc``)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (name)": state, ppid, pgrp, ...
        parents.setdefault(int(fields[1]), []).append(int(entry))
    below, todo = [], [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            below.append(child)
            todo.append(child)
    groups = []
    for pid in below:
        try:
            group = os.getpgid(pid)
        except ProcessLookupError:
            continue
        if group != root and group not in groups:
            groups.append(group)
    return groups


def kill_job(root: int, sig: signal.Signals = signal.SIGKILL) -> None:
    """Send ``sig`` to ``root``'s process group and to every process group below it.

    The groups are collected before the first signal: the ranks of a killed launcher are no
    longer its children.
    """
    for group in [root, *process_groups(root)]:
        try:
            os.killpg(group, sig)
        except (ProcessLookupError, PermissionError):
            continue


def exit_without_teardown(*queues: Any) -> None:
    """End a spawned DDP worker that finished its work, with exit code 0, skipping teardown.

    After the process group is destroyed, gloo's threads can still abort the interpreter's
    teardown at random (SIGABRT, "terminate called without an active exception"), which fails a
    test whose work was done. ``os._exit`` skips that teardown. Each of ``queues`` (a
    ``multiprocessing`` queue the worker put its result on) is flushed first: its feeder thread
    would otherwise die with the process before the result reached the pipe. A worker that raised
    never gets here and exits 1 as usual.
    """
    for queue in queues:
        queue.close()
        queue.join_thread()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
