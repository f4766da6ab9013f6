"""Broker-side control for tests: rabbitmqctl, memory alarms, stopping the app, readiness.

Every helper that changes the broker restores it in a ``finally`` shielded from cancellation
and bounded by a timeout.  As a last resort (the test process dies with the block still open),
an ``atexit`` hook runs the pending restores synchronously.

These helpers act on the whole broker node (shared by every test that runs at the same time):
mark tests that use ``lowered_memory_watermark``, ``broker_stopped`` or ``close_all_connections``
with ``@pytest.mark.broker`` and don't run them concurrently with other broker tests.

Memory alarm semantics verified on RabbitMQ 3.10.8: ``set_vm_memory_high_watermark <fraction>``
takes a fraction of the OS-reported memory (``absolute <bytes>`` for an absolute limit); 0 sets
the limit to 0 bytes, so the memory alarm fires at once (``rabbitmqctl status`` lists it).  A
connection that publishes then receives ``Connection.Blocked`` (reason "low on memory", if it
announced the ``connection.blocked`` capability) and the broker stops reading from its socket;
connections that never publish are not blocked.  Restoring the previous value clears the alarm
at once, the broker sends ``Connection.Unblocked`` and processes the held publishes.  The
current setting is read from ``rabbitmqctl status --formatter json``
(``vm_memory_high_watermark_setting``: ``{"relative": 0.4}`` or ``{"absolute": n}``);
``rabbitmqctl environment`` keeps showing the configured value, not the runtime one.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

import anyio
from anyio import CancelScope
from anyio.abc import ByteStream

__all__ = [
    "AMQP_PROTOCOL_HEADER",
    "MemoryWatermark",
    "RabbitmqctlError",
    "broker_stopped",
    "close_all_connections",
    "close_connections",
    "get_memory_alarms",
    "get_memory_watermark",
    "list_connections",
    "lowered_memory_watermark",
    "rabbitmqctl",
    "rabbitmqctl_sync",
    "read_connection_start",
    "set_memory_watermark",
    "wait_broker_ready",
]

AMQP_PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
BROKER_HOST = os.environ.get("OJS_BROKER_HOST", "127.0.0.1")
BROKER_PORT = int(os.environ.get("OJS_BROKER_PORT", "5672"))
RABBITMQCTL = os.environ.get("OJS_RABBITMQCTL", "rabbitmqctl")
_FRAME_END = 0xCE
_MAX_START_FRAME = 128 * 1024


class RabbitmqctlError(RuntimeError):
    """``rabbitmqctl`` exited with a non-zero status."""

    def __init__(self, args: tuple[str, ...], returncode: int, stdout: str, stderr: str) -> None:
        super().__init__(
            f"rabbitmqctl {' '.join(args)} exited with {returncode}: {stderr.strip() or stdout.strip()}"
        )
        self.args_ = args
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr


# ---------------------------------------------------------------------- rabbitmqctl


async def rabbitmqctl(*args: str, timeout: float = 60) -> str:
    """Run ``rabbitmqctl *args``; return its stdout, raise ``RabbitmqctlError`` on failure."""
    with anyio.fail_after(timeout):
        result = await anyio.run_process([RABBITMQCTL, *args], check=False)
    stdout = result.stdout.decode(errors="replace")
    if result.returncode != 0:
        raise RabbitmqctlError(args, result.returncode, stdout, result.stderr.decode(errors="replace"))
    return stdout


def rabbitmqctl_sync(*args: str, timeout: float = 60) -> str:
    """Blocking variant of ``rabbitmqctl()`` (for sync fixtures and the atexit safety net)."""
    result = subprocess.run([RABBITMQCTL, *args], capture_output=True, timeout=timeout, check=False)
    stdout = result.stdout.decode(errors="replace")
    if result.returncode != 0:
        raise RabbitmqctlError(args, result.returncode, stdout, result.stderr.decode(errors="replace"))
    return stdout


async def _status() -> dict[str, Any]:
    status: dict[str, Any] = json.loads(await rabbitmqctl("status", "--formatter", "json", "-q"))
    return status


# ---------------------------------------------------------------------- memory watermark


@dataclass(frozen=True, slots=True)
class MemoryWatermark:
    """A ``vm_memory_high_watermark`` setting: a fraction of OS memory or absolute bytes."""

    kind: Literal["relative", "absolute"]
    value: float

    def rabbitmqctl_args(self) -> tuple[str, ...]:
        if self.kind == "relative":
            return ("set_vm_memory_high_watermark", repr(float(self.value)))
        return ("set_vm_memory_high_watermark", "absolute", str(int(self.value)))


DEFAULT_WATERMARK = MemoryWatermark("relative", 0.4)


async def get_memory_watermark() -> MemoryWatermark:
    """The broker's current watermark setting (falls back to the default 0.4 if unreadable)."""
    setting = (await _status()).get("vm_memory_high_watermark_setting")
    if isinstance(setting, dict):
        if isinstance(relative := setting.get("relative"), int | float):
            return MemoryWatermark("relative", float(relative))
        if isinstance(absolute := setting.get("absolute"), int | float):
            return MemoryWatermark("absolute", int(absolute))
    return DEFAULT_WATERMARK


async def set_memory_watermark(watermark: MemoryWatermark) -> None:
    await rabbitmqctl(*watermark.rabbitmqctl_args())


async def get_memory_alarms() -> list[dict[str, Any]]:
    """The broker's active memory alarms (``rabbitmqctl status``)."""
    alarms = (await _status()).get("alarms", [])
    return [alarm for alarm in alarms if isinstance(alarm, dict) and alarm.get("resource") == "memory"]


async def _wait_memory_alarm(present: bool) -> None:
    # Polling an external process: there is no event to wait on.
    while bool(await get_memory_alarms()) != present:  # noqa: ASYNC110
        await anyio.sleep(0.1)


@asynccontextmanager
async def lowered_memory_watermark(timeout: float = 60) -> AsyncIterator[MemoryWatermark]:
    """Set the memory watermark to 0 (memory alarm: publishers get blocked) for the block.

    Waits until the alarm is active before entering, yields the previous setting, and on exit
    (shielded, bounded by ``timeout``) restores it and waits until the alarm is gone.
    """
    with anyio.fail_after(timeout):
        previous = await get_memory_watermark()
    if previous.kind == "relative" and previous.value == 0:
        previous = DEFAULT_WATERMARK  # left over from an interrupted run
    restore_args = previous.rabbitmqctl_args()
    _pending.append(restore_args)
    try:
        with anyio.fail_after(timeout):
            await rabbitmqctl("set_vm_memory_high_watermark", "0")
            await _wait_memory_alarm(True)
        yield previous
    finally:
        with CancelScope(shield=True), anyio.fail_after(timeout):
            await rabbitmqctl(*restore_args)
            _discard_pending(restore_args)
            await _wait_memory_alarm(False)


# ---------------------------------------------------------------------- stop / start


@asynccontextmanager
async def broker_stopped(timeout: float = 60) -> AsyncIterator[None]:
    """``rabbitmqctl stop_app`` for the block; ``start_app`` and wait until ready on exit.

    The restart runs in a shielded ``finally`` (bounded by ``timeout``), so it happens even if
    the block fails or is cancelled.
    """
    _pending.append(("start_app",))
    try:
        await rabbitmqctl("stop_app", timeout=timeout)
        yield
    finally:
        with CancelScope(shield=True), anyio.fail_after(2 * timeout):
            await rabbitmqctl("start_app", timeout=timeout)
            _discard_pending(("start_app",))
            await wait_broker_ready(timeout)


async def read_connection_start(stream: ByteStream) -> bytes:
    """Send the AMQP 0-9-1 protocol header; return the first frame, which must be
    ``Connection.Start`` (type 1, channel 0, class 10, method 10).  Raises ``ValueError`` if not.
    """
    await stream.send(AMQP_PROTOCOL_HEADER)
    buffer = bytearray()
    while len(buffer) < 7:
        buffer += await stream.receive()
    if buffer.startswith(b"AMQP"):
        raise ValueError(f"the server rejected the protocol header, it wants {bytes(buffer[:8])!r}")
    size = int.from_bytes(buffer[3:7], "big")
    if size > _MAX_START_FRAME:
        raise ValueError(f"first frame too large ({size} bytes)")
    while len(buffer) < 7 + size + 1:
        buffer += await stream.receive()
    frame = bytes(buffer[: 7 + size + 1])
    if frame[0] != 1 or frame[1:3] != b"\x00\x00" or frame[7:11] != b"\x00\x0a\x00\x0a":
        raise ValueError(f"not a Connection.Start frame: {frame[:16]!r}")
    if frame[-1] != _FRAME_END:
        raise ValueError("frame end octet missing")
    return frame


async def wait_broker_ready(timeout: float = 60, host: str = BROKER_HOST, port: int = BROKER_PORT) -> None:
    """Wait until the broker answers the protocol header with ``Connection.Start``.

    Polls every 0.2 s (it waits for an external process); raises ``TimeoutError`` with the
    last error after ``timeout`` seconds.
    """
    last_error: BaseException | None = None
    try:
        with anyio.fail_after(timeout):
            while True:
                try:
                    with anyio.fail_after(5):
                        async with await anyio.connect_tcp(host, port) as stream:
                            await read_connection_start(stream)
                    return
                except (OSError, anyio.EndOfStream, anyio.BrokenResourceError, ValueError) as exc:
                    last_error = exc  # TimeoutError (per attempt) is an OSError
                await anyio.sleep(0.2)
    except TimeoutError as exc:
        raise TimeoutError(
            f"the broker on {host}:{port} did not send Connection.Start within {timeout}s"
            f" (last error: {last_error!r})"
        ) from exc


# ---------------------------------------------------------------------- connections


async def list_connections(*columns: str) -> list[dict[str, Any]]:
    """``rabbitmqctl list_connections`` as dicts (JSON; default columns: name, user, vhost,
    peer_port, client_properties).  Note: the JSON ``pid`` is not usable with close_connection.
    """
    columns = columns or ("name", "user", "vhost", "peer_port", "client_properties")
    output = await rabbitmqctl("list_connections", *columns, "--formatter", "json", "-q")
    rows: list[dict[str, Any]] = json.loads(output) if output.strip() else []
    return rows


async def close_all_connections(explanation: str = "closed by the test harness", *, vhost: str = "/") -> None:
    """Close every AMQP connection of ``vhost`` (broker side: clients get CONNECTION_FORCED)."""
    await rabbitmqctl("close_all_connections", "--vhost", vhost, explanation)


async def close_connections(
    explanation: str = "closed by the test harness",
    *,
    connection_name: str | None = None,
    match: Callable[[dict[str, Any]], bool] | None = None,
) -> int:
    """Close (broker side) the connections whose client property ``connection_name`` equals
    ``connection_name`` and/or for which ``match(row)`` is true (rows as ``list_connections()``
    gives them, plus ``connection_name``).  Returns how many were closed.
    """
    rows = await list_connections()
    # JSON pids ("#PID<...>") are refused by close_connection; the table form is accepted.
    table = await rabbitmqctl("list_connections", "pid", "name", "--no-table-headers", "-q")
    pids: dict[str, str] = {}
    for line in table.splitlines():
        pid, _, name = line.partition("\t")
        if name:
            pids[name] = pid
    closed = 0
    for row in rows:
        row["connection_name"] = _client_property(row.get("client_properties"), "connection_name")
        if connection_name is not None and row["connection_name"] != connection_name:
            continue
        if match is not None and not match(row):
            continue
        pid = pids.get(str(row.get("name")))
        if pid is None:
            continue
        try:
            await rabbitmqctl("close_connection", pid, explanation)
        except RabbitmqctlError:
            continue  # it went away meanwhile
        closed += 1
    return closed


def _client_property(properties: object, key: str) -> object:
    if isinstance(properties, list):
        for item in properties:
            if isinstance(item, list) and len(item) == 3 and item[0] == key:
                return item[2]
    return None


# ---------------------------------------------------------------------- atexit safety net

#: rabbitmqctl commands that undo a change still in effect; run at exit if still pending.
_pending: list[tuple[str, ...]] = []


def _discard_pending(args: tuple[str, ...]) -> None:
    try:
        _pending.remove(args)
    except ValueError:
        pass


@atexit.register
def _run_pending_restores() -> None:
    while _pending:
        args = _pending.pop()
        try:
            rabbitmqctl_sync(*args, timeout=60)
        except (OSError, subprocess.SubprocessError, RabbitmqctlError):
            pass
