"""The suite's private RabbitMQ node, the only broker its disruptive tests act on.

The session fixture ``private_node`` (``tests/conftest.py``) starts it the first time a test
asks for it, so a run without disruptive tests never starts it, and stops it at the end of
the session, removing everything it wrote.  It is ``scripts/cluster`` in its single-node
mode (``OJS_CLUSTER_NODES=private``), so it is isolated from the default broker exactly as
the 3-node cluster is: node ``ojs-private@localhost``, its own AMQP port and distribution
port (AMQP + 20000) on 127.0.0.1, its own epmd, Erlang cookie, HOME, config, data and log
directories, all under ``<tmp>/ojs-anyio-private-<pid>``.

Ports: the first free AMQP port of 5690-5789 whose distribution port is free too, and the
first free epmd port of 4371-4470, tried in random order so that two sessions on one
machine (two worktrees, or the suite's own test that runs disruptive tests in a
subprocess) do not collide; ``OJS_PRIVATE_NODE_PORT`` and ``OJS_PRIVATE_NODE_EPMD_PORT``
choose them.  The default broker's ports (5672, 25672, epmd 4369) and the cluster's
(5681-5683, 25681-25683, epmd 4370) are refused.

A session that dies without its teardown (SIGKILL) leaves its node running; the next
session that starts a private node stops it (its owner pid is recorded and gone).
"""

from __future__ import annotations

import atexit
import errno
import json
import os
import random
import socket
import subprocess
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
from anyio import CancelScope

from ojs_anyio.amqp import UsageError

from .broker import MemoryWatermark, Node

__all__ = ["PrivateNode", "PrivateNodeError"]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "cluster"
NODE = "private"
DIR_PREFIX = "ojs-anyio-private-"
#: scripts/cluster puts a node's distribution port this far above its AMQP port.
DIST_OFFSET = 20000
AMQP_PORTS = range(5690, 5790)
EPMD_PORTS = range(4371, 4471)
#: The default broker's ports and those of scripts/cluster's 3-node cluster.
RESERVED_AMQP_PORTS = frozenset({5672, 5681, 5682, 5683})
RESERVED_DIST_PORTS = frozenset({25672, 25681, 25682, 25683})
RESERVED_EPMD_PORTS = frozenset({4369, 4370})


class PrivateNodeError(RuntimeError):
    """``scripts/cluster`` could not start (or stop) the private node; the message has its output."""


class PrivateNode(Node):
    """A single RabbitMQ node of the suite's own, with the disruptive helpers as methods."""

    def __init__(self, directory: Path, port: int, epmd_port: int) -> None:
        for what, value, reserved in (
            ("AMQP port", port, RESERVED_AMQP_PORTS),
            ("distribution port", port + DIST_OFFSET, RESERVED_DIST_PORTS),
            ("epmd port", epmd_port, RESERVED_EPMD_PORTS),
        ):
            if value in reserved:
                raise UsageError(
                    f"the private node cannot use {what} {value}: it belongs to the default broker "
                    f"or to scripts/cluster's cluster (reserved: {sorted(reserved)})"
                )
        self.directory = directory
        self.epmd_port = epmd_port
        self.dist_port = port + DIST_OFFSET
        self._running = False
        super().__init__(
            f"ojs-{NODE}@localhost",
            [str(SCRIPT), "ctl", NODE],
            host="127.0.0.1",
            port=port,
            env={
                "OJS_CLUSTER_NODES": NODE,
                "OJS_CLUSTER_DIR": str(directory),
                "OJS_CLUSTER_PORT": str(port),
                "OJS_CLUSTER_EPMD_PORT": str(epmd_port),
            },
            disruptable=True,
        )

    @classmethod
    def create(cls) -> PrivateNode:
        """A node for this process: ports from the environment or free ones, its directory
        ``<tmp>/ojs-anyio-private-<pid>``.  Nothing is started yet."""
        port = _env_port("OJS_PRIVATE_NODE_PORT") or _free_port(AMQP_PORTS, offset=DIST_OFFSET)
        epmd_port = _env_port("OJS_PRIVATE_NODE_EPMD_PORT") or _free_port(EPMD_PORTS, ipv6=True)
        return cls(Path(tempfile.gettempdir()) / f"{DIR_PREFIX}{os.getpid()}", port, epmd_port)

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 600) -> None:
        """Start the node (``scripts/cluster ensure``) and wait until it is healthy."""
        stop_abandoned_nodes()
        self.directory.mkdir(parents=True, exist_ok=True)
        owner = {"owner": os.getpid(), "port": self.port, "epmd_port": self.epmd_port}
        (self.directory / "owner.json").write_text(json.dumps(owner))
        self._running = True
        atexit.register(self.stop)  # the fixture's teardown stops it first; this is the net
        self._script("ensure", timeout=timeout)

    def stop(self, timeout: float = 300) -> None:
        """Stop the node and its epmd and remove its directory (idempotent)."""
        if not self._running:
            return
        self._running = False
        atexit.unregister(self.stop)
        self._script("stop", timeout=timeout)

    def _script(self, command: str, *, timeout: float) -> None:
        done = subprocess.run(
            [str(SCRIPT), command],
            env={**os.environ, **self._env},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise PrivateNodeError(
                f"scripts/cluster {command} for the private node {self.name} (AMQP {self.port}, "
                f"epmd {self.epmd_port}, {self.directory}) exited {done.returncode}:\n"
                f"{done.stdout[-2000:]}{done.stderr[-2000:]}"
            )

    # ------------------------------------------------------------------ disruptive helpers
    # Each restores the node in a ``finally`` shielded from cancellation and bounded by a
    # timeout.  They act on the whole node: pytest runs one test at a time.

    @asynccontextmanager
    async def broker_stopped(self, timeout: float = 60) -> AsyncIterator[None]:
        """``rabbitmqctl stop_app`` for the block; ``start_app`` and wait until ready on exit,
        even if the block fails or is cancelled."""
        try:
            await self.ctl("stop_app", timeout=timeout)
            yield
        finally:
            with CancelScope(shield=True), anyio.fail_after(2 * timeout):
                await self.ctl("start_app", timeout=timeout)
                await self.wait_ready(timeout)

    async def set_memory_watermark(self, watermark: MemoryWatermark) -> None:
        await self.ctl(*watermark.rabbitmqctl_args())

    @asynccontextmanager
    async def lowered_memory_watermark(self, timeout: float = 60) -> AsyncIterator[MemoryWatermark]:
        """Set the memory watermark to 0 (memory alarm: publishers get blocked) for the block.

        Waits until the alarm is active before entering, yields the previous setting, and on
        exit (shielded, bounded by ``timeout``) restores it and waits until the alarm is gone.
        """
        with anyio.fail_after(timeout):
            previous = await self.get_memory_watermark()
        try:
            with anyio.fail_after(timeout):
                await self.ctl("set_vm_memory_high_watermark", "0")
                await self._wait_memory_alarm(True)
            yield previous
        finally:
            with CancelScope(shield=True), anyio.fail_after(timeout):
                await self.set_memory_watermark(previous)
                await self._wait_memory_alarm(False)

    async def _wait_memory_alarm(self, present: bool) -> None:
        # Polling an external process: there is no event to wait on.
        while bool(await self.get_memory_alarms()) != present:  # noqa: ASYNC110
            await anyio.sleep(0.1)

    async def close_all_connections(
        self, explanation: str = "closed by the test harness", *, vhost: str = "/"
    ) -> None:
        """Close every AMQP connection of ``vhost`` (broker side: clients get CONNECTION_FORCED)."""
        await self.ctl("close_all_connections", "--vhost", vhost, explanation)


def stop_abandoned_nodes() -> list[Path]:
    """Stop the private nodes whose session died without its teardown (owner pid gone);
    return their directories."""
    stopped = []
    for directory in Path(tempfile.gettempdir()).glob(f"{DIR_PREFIX}*"):
        try:
            owner = json.loads((directory / "owner.json").read_text())
        except (OSError, ValueError):
            continue  # not one of ours, or still being written
        if Path(f"/proc/{owner['owner']}").exists():
            continue
        node = PrivateNode(directory, int(owner["port"]), int(owner["epmd_port"]))
        node._running = True
        try:
            node.stop()
        except (PrivateNodeError, subprocess.TimeoutExpired):
            continue  # ours to start regardless; the next session tries again
        stopped.append(directory)
    return stopped


def _env_port(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value else None


def _free_port(ports: range, *, offset: int = 0, ipv6: bool = False) -> int:
    """A port of ``ports`` (tried in random order) that nothing uses on loopback, nor
    ``port + offset`` when ``offset`` is given; the reserved ports are never picked."""
    reserved = RESERVED_AMQP_PORTS | RESERVED_DIST_PORTS | RESERVED_EPMD_PORTS
    for port in random.sample(ports, len(ports)):
        wanted = [port, port + offset] if offset else [port]
        if reserved.isdisjoint(wanted) and all(_unused(p, ipv6=ipv6) for p in wanted):
            return port
    raise PrivateNodeError(f"no free port in {ports.start}-{ports.stop - 1} for the private node")


def _unused(port: int, *, ipv6: bool) -> bool:
    hosts = [(socket.AF_INET, "127.0.0.1")] + ([(socket.AF_INET6, "::1")] if ipv6 else [])
    for family, host in hosts:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:  # anything else (no IPv6 here) is no conflict
                return False
    return True
