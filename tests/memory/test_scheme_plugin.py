"""memory:// is a plug-in of the client (ojs_anyio._schemes), not a dependency: the client
never imports the broker, yet ``connect("memory://")`` works without importing it first."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio
import pytest

import ojs_anyio.memory  # noqa: F401  (registers memory://)
from ojs_anyio import _schemes, amqp

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str) -> str:
    env_path = f"{ROOT}:{ROOT / 'codec'}"
    result = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_the_client_does_not_load_the_broker_until_memory_is_used() -> None:
    out = _run(
        "import sys, anyio, ojs_anyio\n"
        "from ojs_anyio import amqp\n"
        "print('before', 'ojs_anyio.memory' in sys.modules)\n"
        "async def main():\n"
        "    async with amqp.connect('memory://plug') as conn, conn.channel() as ch:\n"
        "        await ch.queue_declare('q')\n"
        "anyio.run(main)\n"
        "print('after', 'ojs_anyio.memory' in sys.modules)\n"
    )
    assert out.splitlines() == ["before False", "after True"]


def test_ojs_connect_memory_needs_no_import() -> None:
    out = _run(
        "import anyio, ojs_anyio\n"
        "async def main():\n"
        "    async with ojs_anyio.connect('memory://plug2') as client:\n"
        "        print((await client.push('t', [1], queue='q')).type)\n"
        "anyio.run(main)\n"
    )
    assert out == "t"


def test_registering_a_scheme() -> None:
    async def factory(host: str, port: int) -> anyio.abc.ByteStream:
        raise AssertionError("not called")

    with pytest.raises(ValueError, match="client's own scheme"):
        _schemes.register_scheme("amqp", factory)
    with pytest.raises(ValueError, match="already registered"):
        _schemes.register_scheme("memory", factory)
    with pytest.raises(LookupError, match="no plug-in serves"):
        _schemes.stream_factory("nosuch")
    with pytest.raises(amqp.InvalidURL, match="plug-in's \\('memory'\\)"):
        amqp.parse_url("nosuch://x/")
