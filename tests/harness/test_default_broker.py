"""The disruptive tests leave the default broker alone: it only ever sees ordinary clients.

The suite's disruptive tests (every test marked ``disruptive``, but this one) run in a pytest
subprocess, which starts its own private node.  Meanwhile this test watches the default
broker the way a user's application would see it, and with read-only ``rabbitmqctl`` queries:

* its Erlang VM is the same process, and its uptime grew by the time the run took: it was
  not restarted;
* a connection of ours, open on it through the whole run and publishing every 0.2 s, is
  never closed (``close_all_connections``, ``stop_app`` would close it) and never blocked
  (a memory alarm would block it); the broker lists it, the same connection, before and
  after;
* no memory alarm, and the same memory watermark setting, after the run.

The count of connections is compared for the connections this test owns, not for the
whole broker: on a shared machine, other clients of the default broker come and go.

Each backend runs the disruptive tests of its own backend, so the two runs together cover
all of them once.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import uuid
from pathlib import Path

import anyio
import pytest

from harness import DEFAULT_NODE, PrivateNode
from harness.broker import client_property
from ojs_anyio import amqp

pytestmark = [pytest.mark.anyio, pytest.mark.disruptive]

ROOT = Path(__file__).resolve().parents[2]
#: The subprocess starts a node and runs seven tests; minutes on a loaded 2-core machine.
RUN_BOUND = 600


@pytest.mark.timeout(RUN_BOUND + 120)
@pytest.mark.rabbitmq_only("watches the default RabbitMQ broker")
async def test_disruptive_tests_leave_the_default_broker_alone(
    amqp_url: str, anyio_backend_name: str, tmp_path: Path
) -> None:
    # The subprocess's private node: free ports chosen here, so we can check them afterwards.
    planned = PrivateNode.create()
    name = f"ojs-test-sentinel-{uuid.uuid4().hex[:12]}"
    events: list[amqp.RecoveryEvent] = []
    with anyio.fail_after(60):
        before = await DEFAULT_NODE.status()
    started = anyio.current_time()
    async with amqp.connect(amqp_url, name=name) as conn, conn.channel() as ch:
        conn.add_listener(events.append)
        with anyio.fail_after(60):
            ours_before = await _our_connections(name)
        async with anyio.create_task_group() as tg:
            tg.start_soon(_publish_every_200ms, ch)
            returncode, pid, output = await _run_disruptive_tests(anyio_backend_name, planned, tmp_path)
            tg.cancel_scope.cancel()
        with anyio.fail_after(60):
            ours_after = await _our_connections(name)
        # Still usable: a round trip on the same connection.
        await ch.publish(b"after", routing_key=f"ojs-test-nowhere-{uuid.uuid4().hex}", timeout=30)
    elapsed = anyio.current_time() - started
    with anyio.fail_after(60):
        after = await DEFAULT_NODE.status()

    print(output[-3000:])
    assert returncode == 0, output[-5000:]
    summary = output.strip().splitlines()[-1]
    assert " passed" in summary and not any(word in summary for word in ("failed", "error", "skipped")), (
        summary
    )
    assert int(summary.split(" passed")[0].split()[-1]) >= 7  # each helper ran, on this backend

    # The default broker: same VM, never restarted, never reconfigured.
    assert after["pid"] == before["pid"]
    assert after["uptime"] >= before["uptime"] + int(elapsed) - 2, (
        before["uptime"],
        after["uptime"],
        elapsed,
    )
    assert after["vm_memory_high_watermark_setting"] == before["vm_memory_high_watermark_setting"]
    assert after["alarms"] == []
    # Our connection: the same one (same client port), never closed, never blocked.
    assert len(ours_before) == len(ours_after) == 1
    assert ours_after == ours_before
    assert events == []
    assert conn.reconnections == 0

    # The subprocess's private node is gone: no directory, nothing on its ports.
    assert not (Path(tempfile.gettempdir()) / f"ojs-anyio-private-{pid}").exists()
    for port in (planned.port, planned.dist_port, planned.epmd_port):
        with pytest.raises(OSError):
            await anyio.connect_tcp("127.0.0.1", port)


async def _publish_every_200ms(ch: amqp.Channel) -> None:
    """A publishing client: the broker blocks it at once if a memory alarm goes off."""
    nowhere = f"ojs-test-nowhere-{uuid.uuid4().hex}"
    while True:
        await ch.publish(b"still here", routing_key=nowhere, timeout=30)
        await anyio.sleep(0.2)


async def _our_connections(name: str) -> list[str]:
    """The default broker's names (client and server address) of our connections."""
    rows = await DEFAULT_NODE.list_connections("name", "client_properties")
    return [
        str(r["name"]) for r in rows if client_property(r.get("client_properties"), "connection_name") == name
    ]


async def _run_disruptive_tests(backend: str, planned: PrivateNode, tmp_path: Path) -> tuple[int, int, str]:
    """Every disruptive test of ``backend`` but this file's, in a pytest subprocess with its
    own private node on ``planned``'s ports; returns its exit code, pid and output."""
    log = tmp_path / "disruptive.log"
    env = {
        **os.environ,
        "OJS_PRIVATE_NODE_PORT": str(planned.port),
        "OJS_PRIVATE_NODE_EPMD_PORT": str(planned.epmd_port),
    }
    argv = [
        sys.executable, "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider",
        "-m", "disruptive and not cluster", "-k", backend,
        f"--ignore={Path(__file__).relative_to(ROOT)}",
    ]  # fmt: skip
    with log.open("wb") as out:
        process = await anyio.open_process(argv, cwd=ROOT, env=env, stdout=out, stderr=out)
        try:
            with anyio.fail_after(RUN_BOUND):
                returncode = await process.wait()
        finally:
            if process.returncode is None:  # timed out or cancelled: let it stop its node
                with anyio.CancelScope(shield=True):
                    process.send_signal(signal.SIGINT)
                    with anyio.move_on_after(120):
                        await process.wait()
                    if process.returncode is None:
                        process.kill()
                        await process.wait()
    return returncode, process.pid, log.read_text(errors="replace")
