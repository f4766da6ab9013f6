"""The library runs on its declared core dependencies alone.

anyio 4.12 and later no longer require sniffio, so ``import sniffio`` in the library broke
``pip install ojs-anyio`` without the trio extra (found when a benchmark ran our code in a
venv holding only the core dependencies); the dev environment hid it, since Trio brings
sniffio.  Two checks: every module-level import of ``ojs_anyio`` names the standard library,
a core dependency, or the extra its subpackage belongs to; and a job runs end to end on
asyncio (``memory://``, with ``ojs_anyio.testing``) in a process where sniffio and Trio
cannot be imported.  Pure: no RabbitMQ.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import ojs_anyio

LIBRARY = Path(ojs_anyio.__file__).parent
ROOT = LIBRARY.parent

#: ``[project] dependencies`` of pyproject.toml, as import names.
CORE = {"anyio", "pamqp", "msgspec", "opentelemetry", "croniter", "uuid6", "ojs_codec", "ojs_anyio"}
#: Subpackages and modules that belong to an extra, or are loaded only by a tool that brings
#: its own package (the pytest plugin, by pytest).
EXTRAS = {"dashboard": {"starlette", "hypercorn"}, "testing/pytest_plugin.py": {"pytest"}}


def module_level_imports(path: Path) -> set[str]:
    """Top-level package names imported when the module is imported: module-level
    statements, not those inside functions, ``if TYPE_CHECKING:`` or ``try:`` blocks."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_every_import_is_a_declared_dependency() -> None:
    found: dict[str, set[str]] = {}
    for path in sorted(LIBRARY.rglob("*.py")):
        relative = path.relative_to(LIBRARY)
        own = EXTRAS.get(relative.parts[0], set()) | EXTRAS.get(relative.as_posix(), set())
        allowed = CORE | own | set(sys.stdlib_module_names)
        extra = module_level_imports(path) - allowed
        if extra:
            found[relative.as_posix()] = extra
    assert found == {}


def test_the_check_sees_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import sniffio\nfrom trio import lowlevel\ndef f():\n    import pydantic\n")
    assert module_level_imports(module) == {"sniffio", "trio"}


SCRIPT = """
import sys
sys.modules["sniffio"] = None  # import sniffio raises ImportError, as in a core-only venv
sys.modules["trio"] = None
import anyio
import ojs_anyio as ojs
from ojs_anyio.testing import job_tester

async def main():
    worker = ojs.Worker(queues=["default"], concurrency=2)
    seen = []

    @worker.handler("add")
    async def add(ctx, a, b):
        seen.append(a + b)
        return a + b

    async with job_tester(worker=worker) as jobs:
        job = await jobs.push("add", [1, 2])
        outcomes = await jobs.drain()
    assert seen == [3], seen
    assert [o.outcome for o in outcomes] == ["completed"], outcomes
    print("ran", job.id)

anyio.run(main)
"""


def test_a_job_runs_without_sniffio_or_trio() -> None:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'codec'}"}
    command = [sys.executable, "-c", SCRIPT]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("ran ")
