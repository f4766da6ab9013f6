"""The private 3-node cluster of ``scripts/cluster``, started once per session.

Tests here are marked ``cluster``.  The session fixture runs ``scripts/cluster ensure``
(which starts the nodes on 127.0.0.1:5681-5683, beside the default broker, and installs
nothing but the Debian rabbitmq-server when it is missing) and ``scripts/cluster stop``
at the end, which removes everything the cluster created (unless ``OJS_CLUSTER_KEEP=1``).
Figures the tests measure (recovery times, duplicates) are printed in the terminal summary.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "cluster"
NODES = ("a", "b", "c")
#: Lines for the terminal summary, added by the tests.
FIGURES: list[str] = []


class Cluster:
    """Drives ``scripts/cluster`` from async tests (each CLI call takes a second or two)."""

    def url(self, *nodes: str) -> str:
        nodes = nodes or NODES
        hosts = ",".join(f"127.0.0.1:{self.port(n)}" for n in nodes)
        return f"amqp://guest:guest@{hosts}/"

    @staticmethod
    def port(node: str) -> int:
        return int(os.environ.get("OJS_CLUSTER_PORT", "5681")) + NODES.index(node)

    async def run(self, *args: str) -> str:
        done = await anyio.run_process([str(SCRIPT), *args], check=False)
        if done.returncode != 0:
            raise AssertionError(
                f"scripts/cluster {' '.join(args)} exited {done.returncode}: "
                f"{done.stdout.decode()[-2000:]}{done.stderr.decode()[-2000:]}"
            )
        return done.stdout.decode()

    async def leader(self, queue: str, *, ask: str = "a") -> str:
        """The node (a, b or c) whose member of quorum queue ``queue`` leads it."""
        out = await self.run("ctl", ask, "-q", "list_queues", "name", "leader", "--no-table-headers")
        for line in out.splitlines():
            name, _, node = line.partition("\t")
            if name == queue and node.strip().startswith("ojs-"):
                return node.strip()[4]
        raise AssertionError(f"no leader for {queue!r} in:\n{out}")

    async def messages(self, queue: str, *, ask: str = "a") -> int:
        out = await self.run("ctl", ask, "-q", "list_queues", "name", "messages", "--no-table-headers")
        for line in out.splitlines():
            name, _, count = line.partition("\t")
            if name == queue:
                return int(count)
        raise AssertionError(f"queue {queue!r} not listed:\n{out}")

    async def stop_app(self, node: str) -> None:
        await self.run("stop_app", node)

    async def kill(self, node: str) -> None:
        await self.run("kill", node)

    async def restart(self, node: str) -> None:
        await self.run("restart", node)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    started = subprocess.run([str(SCRIPT), "ensure"], capture_output=True, text=True, timeout=600)
    if started.returncode != 0:
        pytest.fail(f"scripts/cluster ensure failed:\n{started.stdout}\n{started.stderr}")
    try:
        yield Cluster()
    finally:
        if not os.environ.get("OJS_CLUSTER_KEEP"):  # developers: keep it for the next run
            subprocess.run([str(SCRIPT), "stop"], capture_output=True, timeout=600)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if FIGURES:
        terminalreporter.section("cluster figures")
        for line in FIGURES:
            terminalreporter.write_line(line)
