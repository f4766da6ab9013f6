"""Every test, test file and source path the docs cite exists.

The docs name tests as evidence (``docs/conformance.md``'s last column, ``docs/testing.md``,
``docs/architecture.md``): ``folder/test_file.py::test_name`` (a trailing ``…`` or ``*``
stands for any test whose name begins so), a bare ``test_file.py``, a bare ``test_name``, or a
path from the repository's root (``tests/support/brokers.py``, ``ojs_anyio/amqp/_link.py``).
A renamed or deleted test must take its citations with it.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]

CITED_TEST = re.compile(r"([\w/]+\.py)::(test_\w*)([…*]?)")
TEST_FILE = re.compile(r"(?<![\w/.])(test_\w+\.py)\b")
TEST_NAME = re.compile(r"(?<![\w/.:])(test_\w+)\b(?![.\w(])")
REPO_PATH = re.compile(r"(?<![\w/.-])((?:tests|ojs_anyio|codec|benchmarks|scripts|docs)/[\w./-]*\w)")


@cache
def _defs_in(path: Path) -> frozenset[str]:
    return frozenset(re.findall(r"^\s*(?:async\s+)?def\s+(test_\w+)", path.read_text(), re.M))


@cache
def _all_defs() -> frozenset[str]:
    return frozenset().union(*(_defs_in(p) for p in TESTS.rglob("test_*.py")))


@cache
def _test_files() -> frozenset[str]:
    return frozenset(p.name for p in [*TESTS.rglob("test_*.py"), *(ROOT / "docs").rglob("test_*.py")])


def _resolve(cited: str) -> Path | None:
    for base in (TESTS, ROOT):
        if (base / cited).is_file():
            return base / cited
    return None


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_cited_test_exists(doc: Path) -> None:
    text = doc.read_text()
    missing = []
    for file, name, wildcard in CITED_TEST.findall(text):
        path = _resolve(file)
        if path is None:
            missing.append(f"{file} (no such file)")
        elif not any(d == name or (wildcard and d.startswith(name)) for d in _defs_in(path)):
            missing.append(f"{file}::{name}{wildcard}")
    without_citations = CITED_TEST.sub("", text)
    missing += [f for f in TEST_FILE.findall(without_citations) if f not in _test_files()]
    missing += [n for n in TEST_NAME.findall(without_citations) if n not in _all_defs()]
    assert not missing, f"{doc.name} cites tests that do not exist: {sorted(set(missing))}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_cited_path_exists(doc: Path) -> None:
    missing = []
    for cited in REPO_PATH.findall(doc.read_text()):
        path = cited.rstrip("/.").split("::")[0]
        if any(ch in path for ch in "*{<"):
            continue  # a pattern, not a path
        if not any((base / path).exists() for base in (ROOT, TESTS, ROOT / "docs")):
            missing.append(path)
    assert not missing, f"{doc.name} names paths that do not exist: {sorted(set(missing))}"
