"""Test-session settings shared by every test file."""

from __future__ import annotations

import os

import torch

# pytest -n 2 runs two workers on two cores: one intra-op thread each avoids oversubscribed
# OpenMP barriers, which made small ops tens of times slower.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)
