"""Every file the packages write goes through ``shared.checkpoint.atomic_write``.

A write straight to its final path (``fig.savefig(path)``, ``path.write_text(...)``,
``image.save(path)``) leaves a torn file when the disk fills or the process is killed in the
middle, and destroys the previous plot, report or result. This test reads the source of every
package module and names each call that writes a file outside a ``with atomic_write(...)``
block (``append_whole``, the metrics log's appender, counts as one too).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.reliability

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("shared", "graphcl", "imagecl", "contragan")
WRITERS = {"savefig", "write_text", "write_bytes", "save_image", "to_csv", "dump"}
GUARDS = {"atomic_write", "append_whole"}


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def _writes_a_file(call: ast.Call) -> bool:
    name = _name(call.func)
    if name in WRITERS:
        return True
    if name == "save" and isinstance(call.func, ast.Attribute):
        # torch.save(obj, path), image.save(path); not checkpoints.save(...), nor the bytes of
        # safetensors' save(tensors)
        receiver = call.func.value
        if _name(receiver) in ("checkpoints", "safetensors", "torch") and len(call.args) < 2:
            return False
        if _name(receiver) in ("checkpoints", "safetensors"):
            return False
        target = call.args[-1] if _name(receiver) == "torch" else (call.args or [None])[0]
        return not (isinstance(target, ast.Name) and target.id in ("buffer", "handle"))
    if name == "open" and len(call.args) >= 2 and isinstance(call.args[1], ast.Constant):
        return any(mode in str(call.args[1].value) for mode in "wax")
    return False


class _Finder(ast.NodeVisitor):
    def __init__(self) -> None:
        self.guarded = 0
        self.found: list[int] = []

    def visit_With(self, node: ast.With) -> None:
        guard = any(
            isinstance(item.context_expr, ast.Call) and _name(item.context_expr.func) in GUARDS
            for item in node.items
        )
        self.guarded += guard
        self.generic_visit(node)
        self.guarded -= guard

    def visit_Call(self, node: ast.Call) -> None:
        if not self.guarded and _writes_a_file(node):
            self.found.append(node.lineno)
        self.generic_visit(node)


def _unguarded_writes() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.relative_to(ROOT).as_posix() == "shared/checkpoint.py":
                continue  # atomic_write itself, and torch.save into its handle
            finder = _Finder()
            finder.visit(ast.parse(path.read_text(encoding="utf-8")))
            found += [f"{path.relative_to(ROOT)}:{line}" for line in finder.found]
    return found


def test_every_file_write_in_the_packages_is_atomic() -> None:
    assert _unguarded_writes() == []


def test_the_scan_finds_a_plain_write() -> None:
    finder = _Finder()
    finder.visit(ast.parse("fig.savefig(path)\nwith atomic_write(p) as h:\n    fig.savefig(h)\n"))
    assert finder.found == [1]
    finder = _Finder()
    finder.visit(ast.parse("image.save(str(path))\ntorch.save(state, path)\nopen(p, 'w')\n"))
    assert finder.found == [1, 2, 3]
