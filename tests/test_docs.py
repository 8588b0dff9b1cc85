"""The repository explains itself: every file that code, tests or docs cite is in it.

Checked in every ``.py``, ``.md`` and ``.toml`` file and the ``Makefile``:

- a cited Markdown file (``*.md``, bare or with a path) exists in the repository, next to the
  citing file or from the root; run outputs such as ``report.md`` are the only exception;
- a path that starts with a folder or file of the repository root (``shared/losses/core.py``,
  ``docs/architecture.md``, ``benchmarks/losses.py``) exists;
- in the docs (``README.md``, ``docs/``), a bare or partial ``*.py`` path in inline code (between
  backticks) names a file of the repository, as ``supcon.py`` or ``losses/core.py`` do;
- a docs section cited by its heading, as in docs/architecture.md, "Configs" (or ``"A" and
  "B"``), is a heading of that page.

Paths of other projects (``chem/splitters.py`` of Hu et al., StudioGAN's ``src/utils/losses.py``)
start with no folder of ours and are not checked.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIP = {".git", ".venv", "runs", "build", "dist", "__pycache__"}
# files that commands write into their run folders: cited as outputs, not repository files
RUN_OUTPUTS = {"report.md", "gpu_check.md"}
CITED = re.compile(r"(?<![\w./\\-])((?:[\w.-]+/)*[\w-]+(?:\.[\w-]+)*\.(?:md|py|toml))(?![\w/])")
SECTIONS = re.compile(r'\A,?\s*"([^"\n]+)"(?:\s+and\s+"([^"\n]+)")?')


def _repository_files() -> list[Path]:
    found = []
    for folder, subfolders, names in os.walk(ROOT):
        subfolders[:] = [
            d for d in subfolders if (d not in SKIP and not d.startswith(".")) or d == ".ci"
        ]
        subfolders[:] = [d for d in subfolders if not d.endswith(".egg-info")]
        found += [Path(folder, name).relative_to(ROOT) for name in names]
    return sorted(found)


FILES = _repository_files()
PATHS = {path.as_posix() for path in FILES}
ROOT_NAMES = {path.parts[0] for path in FILES}
SOURCES = [p for p in FILES if p.suffix in (".py", ".md", ".toml") or p.name == "Makefile"]


def _headings(page: str) -> set[str]:
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    return {line.lstrip("#").strip() for line in lines if line.startswith("#")}


def missing_citations(source: Path, text: str) -> list[str]:
    """What ``text`` (the content of ``source``) cites that the repository does not hold."""
    problems = []
    in_docs = source.parts[0] == "docs" or source.as_posix() == "README.md"
    for match in CITED.finditer(text):
        cited = match.group(1)
        beside = (source.parent / cited).as_posix()
        exists = cited in PATHS or beside in PATHS
        if cited.endswith(".md"):
            named = cited.rsplit("/", 1)[-1]
            if not exists and named not in RUN_OUTPUTS:
                problems.append(f"{source}: {cited} is not in the repository")
                continue
        elif cited.split("/")[0] in ROOT_NAMES and "/" in cited:
            if not exists:
                problems.append(f"{source}: {cited} is not in the repository")
                continue
        elif in_docs and cited.endswith(".py") and text[match.start() - 1 : match.start()] == "`":
            if not any(path == cited or path.endswith("/" + cited) for path in PATHS):
                problems.append(f"{source}: {cited} names no file of the repository")
                continue
        page = cited if cited in PATHS else beside
        sections = SECTIONS.match(text[match.end() : match.end() + 200])
        if page.endswith(".md") and page in PATHS and sections:
            for heading in filter(None, sections.groups()):
                if heading not in _headings(page):
                    problems.append(f'{source}: {page} has no section "{heading}"')
    return problems


def test_the_check_finds_what_is_missing() -> None:
    text = (
        'decision 9 (PLAN.md); see docs/architecture.md, "No such heading" and '
        "shared/losses/gone.py, docs/gone.md; Hu et al.'s chem/loader.py is theirs; "
        'the run writes report.md; docs/architecture.md, "Configs" exists'
    )
    problems = missing_citations(Path("shared/x.py"), text)
    assert problems == [
        "shared/x.py: PLAN.md is not in the repository",
        'shared/x.py: docs/architecture.md has no section "No such heading"',
        "shared/x.py: shared/losses/gone.py is not in the repository",
        "shared/x.py: docs/gone.md is not in the repository",
    ]
    assert missing_citations(Path("docs/a.md"), "`supcon.py`, `nowhere.py`, your.py") == [
        "docs/a.md: nowhere.py names no file of the repository"
    ]


@pytest.mark.parametrize("source", SOURCES, ids=str)
def test_every_cited_file_is_in_the_repository(source: Path) -> None:
    text = (ROOT / source).read_text(encoding="utf-8")
    if source == Path(__file__).relative_to(ROOT):
        text = text.split("def test_the_check_finds_what_is_missing", 1)[0]  # its own examples
    assert missing_citations(source, text) == []
