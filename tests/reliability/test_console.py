"""What a user sees on the console when a command fails: its one line, and nothing before it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(sys.executable).parent


def test_a_graphcl_error_is_the_only_line_on_stderr(tmp_path: Path) -> None:
    """PyG's import-time deprecation warning used to print two lines before every command."""
    done = subprocess.run(
        [str(SCRIPTS / "graphcl"), "pretrain", "--data", "no-such-source", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("graphcl pretrain: error: unknown molecule source 'no-such-source'")
