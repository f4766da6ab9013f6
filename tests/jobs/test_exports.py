"""Every class or function the docs name as ``ojs.X`` / ``ojs_anyio.X`` is importable from
``ojs_anyio`` (no broker)."""

from __future__ import annotations

import re
from pathlib import Path

import ojs_anyio

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "docs").rglob("*.py"))]
#: ``ojs.Name`` with a capital (classes, errors); lower-case ones are entity names
#: (``ojs.queue.email``) or submodules.
NAMED = re.compile(r"\b(?:ojs|ojs_anyio)\.([A-Z]\w*)")


def test_every_name_the_docs_mention_is_exported() -> None:
    missing = {
        (path.relative_to(ROOT).as_posix(), name)
        for path in DOCS
        for name in NAMED.findall(path.read_text(encoding="utf-8"))
        if not hasattr(ojs_anyio, name)
    }
    assert not missing


def test_the_names_users_catch_and_read_are_exported() -> None:
    for name in ["JobFailedError", "JobInfo", "PendingResult", "SyncPendingResult", "UsageError",
                 "ArgumentTypeError", "PushNotSentError", "PushOutcomeUnknownError"]:  # fmt: skip
        assert name in ojs_anyio.__all__ and hasattr(ojs_anyio, name), name
    assert issubclass(ojs_anyio.ArgumentTypeError, ojs_anyio.UsageError)
