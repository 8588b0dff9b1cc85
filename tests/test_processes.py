"""tests/processes.py: a job's processes in sessions of their own are killed with the launcher;
a worker that skips interpreter teardown still delivers its queued result and exits 0."""

from __future__ import annotations

import multiprocessing as mp
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.processes import exit_without_teardown, kill_job, process_groups

LAUNCHER = textwrap.dedent(
    """
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             start_new_session=True)
    print(child.pid, flush=True)
    time.sleep(60)
    """
)


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")  # a zombie has ended; its new parent reaps it


def test_kill_job_reaches_a_child_in_its_own_session() -> None:
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert launcher.stdout is not None
    child = int(launcher.stdout.readline())
    try:
        assert child in process_groups(launcher.pid)  # a group of its own, below the launcher
        kill_job(launcher.pid)
        launcher.wait(timeout=30)
        deadline = time.monotonic() + 30
        while not _gone(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(child)
    finally:
        launcher.kill()
        launcher.wait()
        launcher.stdout.close()
        subprocess.run(["kill", "-9", str(child)], check=False, capture_output=True)


PAYLOAD = 4 << 20  # bytes: far more than a pipe holds, so the queue's feeder thread is still busy


def _queue_worker(queue: Any, fail: bool) -> None:
    queue.put(b"x" * PAYLOAD)
    if fail:
        raise RuntimeError("worker failed")
    exit_without_teardown(queue)


@pytest.mark.parametrize("fail", [False, True])
def test_exit_without_teardown_flushes_the_queue_and_keeps_the_exit_code(fail: bool) -> None:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_queue_worker, args=(queue, fail))
    proc.start()
    got = queue.get(timeout=60)
    proc.join(timeout=60)
    assert len(got) == PAYLOAD
    assert proc.exitcode == (1 if fail else 0)
