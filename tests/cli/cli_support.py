"""Helpers for the CLI tests: run ``ojs-anyio`` as a subprocess of this worktree's code,
and read the broker's state (sync wrappers over ``ojs_anyio.amqp``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
from support.brokers import RABBITMQ_URL

from ojs_anyio import amqp

ROOT = Path(__file__).resolve().parents[2]
#: The broker the CLI subprocesses and these helpers use (``tests/support/brokers.py``).
URL = RABBITMQ_URL


def cli_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "codec")])
    env["OJS_AMQP_URL"] = URL
    env.pop("PYTHONSTARTUP", None)
    env.update(extra)
    return env


def cli_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "ojs_anyio.cli", *args]


def run_cli(
    *args: str, cwd: str | Path | None = None, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cli_cmd(*args),
        cwd=cwd,
        env=env or cli_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def run_many(cases: Sequence[Sequence[str]], timeout: float = 120) -> list[subprocess.CompletedProcess[str]]:
    """``run_cli`` for each argument list, all at once (they are independent)."""
    procs = [spawn_cli(*args, capture=True) for args in cases]
    results = []
    for args, proc in zip(cases, procs, strict=True):
        out, err = proc.communicate(timeout=timeout)
        results.append(subprocess.CompletedProcess(list(args), proc.returncode, out, err))
    return results


def spawn_cli(
    *args: str, cwd: str | Path | None = None, log: Path | None = None, capture: bool = False
) -> subprocess.Popen[str]:
    """Start ``ojs-anyio ARGS``; its stdout and stderr go to ``log`` (together), to pipes
    with ``capture`` (read them with ``communicate``), or nowhere."""
    if capture:
        return _popen(args, cwd, subprocess.PIPE, subprocess.PIPE)
    if log is None:
        return _popen(args, cwd, subprocess.DEVNULL, subprocess.DEVNULL)
    with open(log, "w") as out:  # the child has its own copy of the descriptor
        return _popen(args, cwd, out, subprocess.STDOUT)


def _popen(args: Sequence[str], cwd: str | Path | None, stdout: Any, stderr: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        cli_cmd(*args),
        cwd=cwd,
        env=cli_env(),
        stdout=stdout,
        stderr=stderr,
        stdin=subprocess.DEVNULL,
        text=True,
    )


@contextmanager
def reaped(proc: subprocess.Popen[str]) -> Iterator[subprocess.Popen[str]]:
    """Kill ``proc`` when the block ends if it still runs, so a failing test leaves no
    child process behind."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)  # reaped: no "still running" warning in a later test


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll ``predicate`` (observable state) until it is truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


# ------------------------------------------------------------------- broker truth


def _run(fn: Callable[..., Any], *args: Any) -> Any:
    return anyio.run(fn, *args)


def queue_count(name: str) -> int | None:
    async def go() -> int | None:
        async with amqp.connect(URL) as conn:
            try:
                async with conn.channel(confirms=False) as ch:
                    return (await ch.queue_declare(name, passive=True)).message_count
            except amqp.NotFound:
                return None

    result: int | None = _run(go)
    return result


def drain(name: str) -> list[amqp.IncomingMessage]:
    """Take every message out of ``name`` (acked), oldest first."""

    async def go() -> list[amqp.IncomingMessage]:
        out = []
        async with amqp.connect(URL) as conn, conn.channel(confirms=False) as ch:
            while (msg := await ch.get(name)) is not None:
                out.append(msg)
                await msg.ack()
        return out

    result: list[amqp.IncomingMessage] = _run(go)
    return result


def publish_raw(name: str, messages: Sequence[tuple[bytes, amqp.BasicProperties]]) -> None:
    """Publish straight into queue ``name`` (default exchange), confirmed."""

    async def go() -> None:
        async with amqp.connect(URL) as conn, conn.channel() as ch:
            window = ch.publish_window(max_in_flight=512)
            for body, props in messages:
                await window.publish(body, routing_key=name, properties=props)
            assert await window.wait_all() == []

    _run(go)


def declare_raw(name: str, arguments: dict[str, Any] | None) -> None:
    async def go() -> None:
        async with amqp.connect(URL) as conn, conn.channel(confirms=False) as ch:
            await ch.queue_delete(name)
            await ch.queue_declare(name, durable=True, arguments=arguments)

    _run(go)


def delete_queues(names: Sequence[str]) -> None:
    async def go() -> None:
        async with amqp.connect(URL) as conn, conn.channel(confirms=False) as ch:
            for name in names:
                await ch.queue_delete(name)

    _run(go)


def delete_exchanges(names: Sequence[str]) -> None:
    async def go() -> None:
        async with amqp.connect(URL) as conn, conn.channel(confirms=False) as ch:
            for name in names:
                await ch.exchange_delete(name)

    _run(go)
