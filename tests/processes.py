"""The processes a test started, all of them: torchrun puts each rank in a session of its own.

``os.killpg`` on the launcher's group alone leaves the ranks of a timed-out job running (and
writing into its run folder); :func:`kill_job` reaches every process group below the launcher.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

__all__ = ["kill_job", "process_groups"]


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
