"""The ojs_anyio.testing fixtures under each pytest runner a user may have.

A user's test module runs in a subprocess, with a pytest configuration of its own (the
project's pyproject.toml does not apply), the way it would in the user's repository.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "test_fastapi_app.py"


def _pytest(tmp_path: Path, target: Path, *options: str) -> subprocess.CompletedProcess[str]:
    ini = tmp_path / "pytest.ini"
    ini.write_text("[pytest]\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "codec")]))
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(ini)]
    command += ["--rootdir", str(ROOT), *options, str(target)]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_the_fastapi_tests_pass_under_anyio_auto_mode_on_asyncio_and_trio(tmp_path: Path) -> None:
    result = _pytest(tmp_path, EXAMPLE, "-p", "no:asyncio", "-o", "anyio_mode=auto")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 passed" in result.stdout  # 2 tests x (asyncio, trio)


def test_the_same_fastapi_tests_pass_under_pytest_asyncio_auto_mode(tmp_path: Path) -> None:
    result = _pytest(tmp_path, EXAMPLE, "-p", "asyncio", "-o", "asyncio_mode=auto")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout


def _user_module(tmp_path: Path, marker: str) -> Path:
    module = tmp_path / "test_user_jobs.py"
    module.write_text(
        f"""
import pytest
import ojs_anyio as ojs
from ojs_anyio.testing import JobTester

pytest_plugins = ["ojs_anyio.testing.pytest_plugin"]
{marker}

async def test_push_then_see_it_enqueued(job_tester: JobTester, ojs_client: ojs.Client) -> None:
    job = await ojs_client.push("report.build", [1], queue="reports")
    [seen] = job_tester.assert_enqueued(queue="reports", type="report.build")
    assert seen.id == job.id
"""
    )
    return module


def test_the_fixtures_run_under_pytest_asyncio_strict_mode_with_its_marker(tmp_path: Path) -> None:
    module = _user_module(tmp_path, "pytestmark = pytest.mark.asyncio")
    result = _pytest(tmp_path, module, "-p", "asyncio", "-o", "asyncio_mode=strict")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout


def test_the_fixtures_run_under_the_anyio_marker(tmp_path: Path) -> None:
    module = _user_module(tmp_path, "pytestmark = pytest.mark.anyio")
    result = _pytest(tmp_path, module, "-p", "no:asyncio")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout  # anyio's default backends: asyncio and Trio


@pytest.mark.parametrize("plugins", [["-p", "no:asyncio"], ["-p", "asyncio", "-o", "asyncio_mode=strict"]])
def test_a_test_no_runner_claims_gets_one_error_naming_both_runners(
    tmp_path: Path, plugins: list[str]
) -> None:
    module = _user_module(tmp_path, "")
    result = _pytest(tmp_path, module, *plugins)
    assert result.returncode != 0
    out = result.stdout + result.stderr
    assert "@pytest.mark.anyio" in out and "@pytest.mark.asyncio" in out, out
    assert "async generator" not in out
