"""Settings of the reliability tests: the ``reliability`` marker."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "reliability: hostile input, crashes and resumes through the user's commands"
    )
