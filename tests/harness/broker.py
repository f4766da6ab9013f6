"""Broker-side control for tests: rabbitmqctl, memory alarms, readiness, connections.

Two kinds of node (:class:`Node`):

* **The default broker** (``DEFAULT_NODE``: ``rabbitmqctl`` on this host, AMQP on
  the host and port of ``OJS_AMQP_URL``, see ``tests/support/brokers.py``) may be the user's own
  RabbitMQ.  The harness only queries it and manages what the tests create on it: its
  ``ctl()`` runs ``status``, ``list_*``, ``close_connection`` (of a connection the test
  opened and named), and the tests' own vhosts (not ``/``), users (``ojs-test-…``) and
  their permissions, and raises :class:`DefaultBrokerGuardError` for anything else, before
  any process starts.
* **The suite's private node** (:class:`harness.private_node.PrivateNode`, the
  ``private_node`` fixture) is started by the suite for its disruptive tests, with its own
  ports, epmd, cookie and directories.  Only it has the disruptive helpers (stopping the
  app, lowering the memory watermark, closing every connection), as its methods.

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

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import anyio
from anyio.abc import ByteStream
from support.brokers import RABBITMQ_HOST, RABBITMQ_PORT, require_rabbitmq

from ojs_anyio.amqp import UsageError

__all__ = [
    "AMQP_PROTOCOL_HEADER",
    "DEFAULT_NODE",
    "DefaultBrokerGuardError",
    "MemoryWatermark",
    "Node",
    "TEST_USER_PREFIX",
    "RabbitmqctlError",
    "close_connections",
    "get_memory_alarms",
    "get_memory_watermark",
    "list_connections",
    "rabbitmqctl",
    "rabbitmqctl_sync",
    "read_connection_start",
    "wait_broker_ready",
]

AMQP_PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
BROKER_HOST, BROKER_PORT = RABBITMQ_HOST, RABBITMQ_PORT
RABBITMQCTL = os.environ.get("OJS_RABBITMQCTL", "rabbitmqctl")
_FRAME_END = 0xCE
_MAX_START_FRAME = 128 * 1024

#: The users the tests create on the default broker, and only those, have names beginning so.
TEST_USER_PREFIX = "ojs-test-"
#: Options that would point rabbitmqctl at another node than the one the ``Node`` names.
_NODE_OPTIONS = ("-n", "--node", "-l", "--longnames")


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


class DefaultBrokerGuardError(UsageError):
    """A rabbitmqctl command that could disrupt the default broker was refused (never run)."""


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


# ---------------------------------------------------------------------- nodes


class Node:
    """A RabbitMQ node: where its AMQP listener is, and the command line that runs
    ``rabbitmqctl`` against it (``command`` + the arguments, with ``env`` added)."""

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        *,
        host: str,
        port: int,
        env: Mapping[str, str] | None = None,
        disruptable: bool = False,
    ) -> None:
        self.name = name
        self.host = host
        self.port = port
        self._command = tuple(command)
        self._env = dict(env or {})
        #: Only the suite's private node is: the guard refuses all but ordinary commands on others.
        self.disruptable = disruptable

    def __repr__(self) -> str:
        return f"<Node {self.name} amqp {self.host}:{self.port}>"

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{self.host}:{self.port}/"

    def check_command(self, args: Sequence[str]) -> None:
        """Raise ``DefaultBrokerGuardError`` unless ``rabbitmqctl *args`` may run on this node."""
        if self.disruptable:
            return
        command = args[0] if args else ""
        if any(a in _NODE_OPTIONS or a.startswith(("--node=", "--longnames=")) for a in args):
            raise DefaultBrokerGuardError(
                f"refusing rabbitmqctl {' '.join(args)}: the harness never re-targets {self.name}"
            )
        if not _ordinary(command, args[1:]):
            raise DefaultBrokerGuardError(
                f"refusing rabbitmqctl {' '.join(args)} against {self.name} ({self.host}:{self.port}), "
                "which may be the user's own broker: disruptive commands run only against the "
                "suite's private node (the private_node fixture)"
            )

    def _argv(self, args: Sequence[str]) -> tuple[list[str], dict[str, str] | None]:
        self.check_command(args)
        if not self.disruptable:
            require_rabbitmq(f"rabbitmqctl {' '.join(args)}")
        env = {**os.environ, **self._env} if self._env else None
        return [*self._command, *args], env

    async def ctl(self, *args: str, timeout: float = 60) -> str:
        """Run ``rabbitmqctl *args`` against this node; return its stdout, raise
        ``RabbitmqctlError`` on failure (``DefaultBrokerGuardError`` before running it, if
        the command is not allowed here)."""
        argv, env = self._argv(args)
        with anyio.fail_after(timeout):
            for _ in range(_LIST_RETRIES):
                result = await anyio.run_process(argv, check=False, env=env)
                if not _listed_a_dying_object(args, result.returncode, result.stdout + result.stderr):
                    break
        return _output(args, result.returncode, result.stdout, result.stderr)

    def ctl_sync(self, *args: str, timeout: float = 60) -> str:
        """Blocking variant of ``ctl()`` (for sync fixtures)."""
        argv, env = self._argv(args)
        for _ in range(_LIST_RETRIES):
            result = subprocess.run(argv, capture_output=True, timeout=timeout, check=False, env=env)
            if not _listed_a_dying_object(args, result.returncode, result.stdout + result.stderr):
                break
        return _output(args, result.returncode, result.stdout, result.stderr)

    async def status(self) -> dict[str, Any]:
        """``rabbitmqctl status`` as a dict (JSON form): ``pid``, ``uptime``, ``alarms``…"""
        status: dict[str, Any] = json.loads(await self.ctl("status", "--formatter", "json", "-q"))
        return status

    async def get_memory_watermark(self) -> MemoryWatermark:
        """The current watermark setting (the default 0.4 if unreadable)."""
        setting = (await self.status()).get("vm_memory_high_watermark_setting")
        if isinstance(setting, dict):
            if isinstance(relative := setting.get("relative"), int | float):
                return MemoryWatermark("relative", float(relative))
            if isinstance(absolute := setting.get("absolute"), int | float):
                return MemoryWatermark("absolute", int(absolute))
        return DEFAULT_WATERMARK

    async def get_memory_alarms(self) -> list[dict[str, Any]]:
        """The active memory alarms (``rabbitmqctl status``)."""
        alarms = (await self.status()).get("alarms", [])
        return [alarm for alarm in alarms if isinstance(alarm, dict) and alarm.get("resource") == "memory"]

    async def list_connections(self, *columns: str) -> list[dict[str, Any]]:
        """``rabbitmqctl list_connections`` as dicts (JSON; default columns: name, user, vhost,
        peer_port, client_properties).  Note: the JSON ``pid`` is not usable with close_connection.
        """
        wanted = columns or ("name", "user", "vhost", "peer_port", "client_properties")
        output = await self.ctl("list_connections", *wanted, "--formatter", "json", "-q")
        rows: list[dict[str, Any]] = json.loads(output) if output.strip() else []
        return rows

    async def close_connections(
        self, explanation: str = "closed by the test harness", *, connection_name: str
    ) -> int:
        """Close (broker side) the connections whose client property ``connection_name`` is
        ``connection_name``: a connection the test opened and named itself.  Returns how many."""
        rows = await self.list_connections()
        # JSON pids ("#PID<...>") are refused by close_connection; the table form is accepted.
        table = await self.ctl("list_connections", "pid", "name", "--no-table-headers", "-q")
        pids: dict[str, str] = {}
        for line in table.splitlines():
            pid, _, name = line.partition("\t")
            if name:
                pids[name] = pid
        closed = 0
        for row in rows:
            if client_property(row.get("client_properties"), "connection_name") != connection_name:
                continue
            pid = pids.get(str(row.get("name")))
            if pid is None:
                continue
            try:
                await self.ctl("close_connection", pid, explanation)
            except RabbitmqctlError:
                continue  # it went away meanwhile
            closed += 1
        return closed

    async def wait_ready(self, timeout: float = 60) -> None:
        """Wait until the node answers the protocol header with ``Connection.Start``."""
        await wait_broker_ready(timeout, self.host, self.port)


def _ordinary(command: str, rest: Sequence[str]) -> bool:
    """Whether ``rabbitmqctl command *rest`` only queries a broker or manages what the tests
    themselves made on it: their connections, vhosts other than ``/``, users named
    ``ojs-test-…``, and permissions of those users or in those vhosts."""
    if command.startswith("list_") or command in ("status", "version", "close_connection"):
        return True
    vhost, operands = None, []
    items = iter(rest)
    for item in items:
        if item in ("-p", "--vhost"):
            vhost = next(items, None)
        elif item.startswith("--vhost="):
            vhost = item.partition("=")[2]
        elif not item.startswith("-"):
            operands.append(item)
    first = operands[0] if operands else ""
    if command in ("add_vhost", "delete_vhost"):
        return first not in ("", "/")
    if command in ("add_user", "delete_user"):
        return first.startswith(TEST_USER_PREFIX)
    if command == "set_permissions":
        return first.startswith(TEST_USER_PREFIX) or vhost not in (None, "/")
    return False


def _output(args: Sequence[str], returncode: int, stdout: bytes, stderr: bytes) -> str:
    text = stdout.decode(errors="replace")
    if returncode != 0:
        raise RabbitmqctlError(tuple(args), returncode, text, stderr.decode(errors="replace"))
    return text


def client_property(properties: object, key: str) -> object:
    """A client property of a ``list_connections`` row (JSON form: ``[[key, type, value], ...]``)."""
    if isinstance(properties, list):
        for item in properties:
            if isinstance(item, list) and len(item) == 3 and item[0] == key:
                return item[2]
    return None


#: The broker the suite runs its ordinary tests against; possibly the user's own.
DEFAULT_NODE = Node("the default broker", [RABBITMQCTL], host=BROKER_HOST, port=BROKER_PORT)


#: ``rabbitmqctl list_*`` asks each object it listed for its details; one that died in
#: between (a queue another client deleted: ``{:badrpc, {:EXIT, {:noproc, ...}}}``, exit 70)
#: fails the whole listing.  Seen with the suite's own cleanup running beside a listing:
#: such a listing is asked again, a few times.
_LIST_RETRIES = 5


def _listed_a_dying_object(args: tuple[str, ...], returncode: int, output: bytes) -> bool:
    return returncode != 0 and bool(args) and args[0].startswith("list_") and b"noproc" in output


# The default broker's helpers under their long-standing names.


async def rabbitmqctl(*args: str, timeout: float = 60) -> str:
    """``rabbitmqctl *args`` against the default broker (ordinary commands only)."""
    return await DEFAULT_NODE.ctl(*args, timeout=timeout)


def rabbitmqctl_sync(*args: str, timeout: float = 60) -> str:
    """Blocking variant of ``rabbitmqctl()``."""
    return DEFAULT_NODE.ctl_sync(*args, timeout=timeout)


async def get_memory_watermark() -> MemoryWatermark:
    return await DEFAULT_NODE.get_memory_watermark()


async def get_memory_alarms() -> list[dict[str, Any]]:
    return await DEFAULT_NODE.get_memory_alarms()


async def list_connections(*columns: str) -> list[dict[str, Any]]:
    return await DEFAULT_NODE.list_connections(*columns)


async def close_connections(explanation: str = "closed by the test harness", *, connection_name: str) -> int:
    return await DEFAULT_NODE.close_connections(explanation, connection_name=connection_name)


# ---------------------------------------------------------------------- readiness


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
