"""Test-session settings shared by every test file."""

from __future__ import annotations

import os

import torch

# pytest -n 2 runs two workers on two cores: one intra-op thread each avoids oversubscribed
# OpenMP barriers, which made small ops tens of times slower.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


def pytest_report_header() -> str:
    """Say where the ``cuda``-marked tests run (tests/shared/test_cuda.py), or why they skip."""
    target = os.environ.get("CONTRASTKIT_TEST_DEVICE", "cuda")
    if target.startswith("cuda") and not torch.cuda.is_available():
        return "cuda tests: skipped, CUDA is not available (CONTRASTKIT_TEST_DEVICE=cpu runs them)"
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return f"cuda tests: on {target} (CONTRASTKIT_TEST_DEVICE), {gpus} GPU(s) visible"
