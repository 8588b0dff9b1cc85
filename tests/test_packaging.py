"""What the package promises about its environment: the torch floor and optional dependencies."""

from __future__ import annotations

import importlib
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

# Every torch API the code uses that is newer than torch 2.0, with the first release that has it
# (read from the torch 2.4.1, 2.5.1, 2.6.0 and 2.11.0 sources; the suite passes on 2.6 and 2.11).
NEWER_TORCH_APIS = {
    "torch.serialization.get_unsafe_globals_in_checkpoint": (2, 6),  # save_checkpoint
    "torch.is_autocast_enabled(device_type)": (2, 4),  # losses.common.autocast_off
}


def _torch_floor() -> tuple[int, int]:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (spec,) = [dep for dep in project["dependencies"] if re.match(r"torch\s*[<>=]", dep)]
    match = re.search(r">=\s*(\d+)\.(\d+)", spec)
    assert match, f"torch has no lower bound in pyproject.toml: {spec!r}"
    return int(match.group(1)), int(match.group(2))


def test_the_torch_floor_has_every_api_the_code_uses() -> None:
    floor = _torch_floor()
    too_new = {api: v for api, v in NEWER_TORCH_APIS.items() if v > floor}
    assert not too_new, f"pyproject allows torch {floor}, but these need newer: {too_new}"
    assert callable(torch.serialization.get_unsafe_globals_in_checkpoint)
    assert torch.is_autocast_enabled("cpu") in (True, False)


def test_shared_imports_without_the_optional_domain_packages() -> None:
    """GPU machines have torch, PyG, torchmetrics, scikit-image, but no rdkit, datamol, kornia."""
    blocker = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in {'rdkit', 'datamol', 'kornia'}:\n"
        "            raise ImportError(f'{name} is blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import importlib, pkgutil, shared\n"
        "for info in pkgutil.walk_packages(shared.__path__, 'shared.'):\n"
        "    importlib.import_module(info.name)\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", blocker], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_every_shared_module_imports() -> None:
    import shared

    names = [info.name for info in pkgutil.walk_packages(shared.__path__, "shared.")]
    assert "shared.losses.info_nce" in names and "shared.losses.queue" in names
    for name in names:
        importlib.import_module(name)
