"""Tests of the test harness itself, on asyncio and Trio."""

from __future__ import annotations

import os
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qs, urlsplit

import anyio
import pytest
from anyio import BrokenResourceError, ClosedResourceError, EndOfStream
from anyio.abc import ByteStream, SocketAttribute, SocketStream
from pamqp import body as amqp_body
from pamqp import commands as amqp
from pamqp import frame as amqp_frame
from pamqp import header as amqp_header
from support.brokers import RABBITMQ_HOST, RABBITMQ_PORT

from harness import (
    DEFAULT_NODE,
    DefaultBrokerGuardError,
    FaultProxy,
    Node,
    PrivateNode,
    TLSMaterial,
    TLSTerminatingProxy,
    broker,
    make_ca_and_cert,
    read_connection_start,
)
from harness.private_node import RESERVED_AMQP_PORTS, RESERVED_DIST_PORTS, RESERVED_EPMD_PORTS
from ojs_anyio.amqp import UsageError

pytestmark = pytest.mark.anyio

#: What a client may see when the proxy drops its connection.
CONNECTION_LOST = (EndOfStream, BrokenResourceError)


# ---------------------------------------------------------------------- helpers


@asynccontextmanager
async def echo_server() -> AsyncIterator[int]:
    """An echo server on 127.0.0.1 port 0; yields the port.  Counts bytes it received."""

    async def handle(stream: SocketStream) -> None:
        async with stream:
            try:
                async for chunk in stream:
                    await stream.send(chunk)
            except (BrokenResourceError, ClosedResourceError):
                pass

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    async with listener, anyio.create_task_group() as task_group:
        task_group.start_soon(listener.serve, handle, task_group)
        try:
            yield listener.extra(SocketAttribute.local_port)
        finally:
            task_group.cancel_scope.cancel()


async def receive_exactly(stream: ByteStream, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        data += await stream.receive(n - len(data))
    return bytes(data)


async def roundtrip(stream: ByteStream, payload: bytes = b"ping") -> None:
    await stream.send(payload)
    assert await receive_exactly(stream, len(payload)) == payload


# ---------------------------------------------------------------------- FaultProxy


async def test_forwards_bytes_both_ways() -> None:
    payload = os.urandom(1 << 20)
    with anyio.fail_after(10):
        async with echo_server() as port:
            async with FaultProxy("127.0.0.1", port) as proxy:
                assert proxy.port != port
                async with await anyio.connect_tcp("127.0.0.1", proxy.port) as client:
                    await proxy.wait_for_connections(1, timeout=5)
                    assert proxy.active_connections == 1
                    received = bytearray()

                    async def receive_all() -> None:
                        received.extend(await receive_exactly(client, len(payload)))

                    async with anyio.create_task_group() as task_group:
                        task_group.start_soon(receive_all)
                        await client.send(payload)
                    assert received == payload
            # The proxy has exited: every task is done, so the counters are final.
            assert proxy.bytes_up == len(payload)
            assert proxy.bytes_down == len(payload)
            assert proxy.connections_total == 1
            assert proxy.active_connections == 0


async def test_client_close_closes_target_side() -> None:
    with anyio.fail_after(10):
        async with echo_server() as port, FaultProxy("127.0.0.1", port) as proxy:
            client = await anyio.connect_tcp("127.0.0.1", proxy.port)
            async with client:
                await roundtrip(client)
            # The proxy sees EOF, closes both sides, and the count drops back.
            await proxy._wait_until(lambda: proxy.active_connections == 0)
            assert proxy.connections_total == 1


def test_url() -> None:
    proxy = FaultProxy()
    proxy._port = 45678
    assert proxy.url() == "amqp://guest:guest@127.0.0.1:45678/%2F"
    assert (
        proxy.url(user="u@x", password="p/w", vhost="jobs", heartbeat=5, connection_name="a b")
        == "amqp://u%40x:p%2Fw@127.0.0.1:45678/jobs?heartbeat=5&connection_name=a+b"
    )


@pytest.mark.parametrize("reset", [False, True], ids=["fin", "rst"])
async def test_cut_all_ends_client_stream_promptly(reset: bool) -> None:
    with anyio.fail_after(10):
        async with echo_server() as port, FaultProxy("127.0.0.1", port) as proxy:
            async with await anyio.connect_tcp("127.0.0.1", proxy.port) as client:
                await roundtrip(client)
                assert proxy.cut_all(reset=reset) == 1
                assert proxy.active_connections == 0
                assert proxy.connections_cut == 1
                with anyio.fail_after(2):
                    if reset:
                        with pytest.raises(BrokenResourceError):
                            await client.receive()
                    else:
                        with pytest.raises(EndOfStream):
                            await client.receive()
            # The proxy keeps accepting after a cut.
            async with await anyio.connect_tcp("127.0.0.1", proxy.port) as client:
                await roundtrip(client)
                assert proxy.connections_total == 2


@pytest.mark.parametrize("direction", ["both", "upstream", "downstream"])
async def test_stall_then_unstall(direction: Literal["both", "upstream", "downstream"]) -> None:
    with anyio.fail_after(10):
        async with (
            echo_server() as port,
            FaultProxy("127.0.0.1", port) as proxy,
            await anyio.connect_tcp("127.0.0.1", proxy.port) as client,
        ):
            await roundtrip(client, b"before")
            up_before = proxy.bytes_up
            proxy.stall(direction)
            await client.send(b"held")
            with anyio.move_on_after(0.3) as window:
                await client.receive()
            assert window.cancelled_caught, "bytes got through a stalled proxy"
            if direction == "downstream":
                assert proxy.bytes_up == up_before + 4  # it reached the echo server
            else:
                assert proxy.bytes_up == up_before
            proxy.unstall(direction)
            assert await receive_exactly(client, 4) == b"held"
            await roundtrip(client, b"after")


async def test_stall_applies_to_new_connections() -> None:
    with anyio.fail_after(10):
        async with echo_server() as port, FaultProxy("127.0.0.1", port) as proxy:
            proxy.stall()
            async with await anyio.connect_tcp("127.0.0.1", proxy.port) as client:
                await client.send(b"x")
                with anyio.move_on_after(0.2) as window:
                    await client.receive()
                assert window.cancelled_caught
                proxy.unstall()
                assert await receive_exactly(client, 1) == b"x"


async def test_latency_delays_each_direction() -> None:
    latency = 0.2
    with anyio.fail_after(10):
        async with echo_server() as port, FaultProxy("127.0.0.1", port) as proxy:
            async with await anyio.connect_tcp("127.0.0.1", proxy.port) as client:
                await roundtrip(client)
                proxy.set_latency(latency)
                started = anyio.current_time()
                await roundtrip(client)
                # Delayed on the way up and on the way down.
                assert anyio.current_time() - started >= 2 * latency - 0.01

                # Chunks are pipelined, not serialised: ten of them take ~one round trip.
                started = anyio.current_time()
                for _ in range(10):
                    await client.send(b"y")
                    await anyio.sleep(0.01)
                await receive_exactly(client, 10)
                elapsed = anyio.current_time() - started
                assert 2 * latency - 0.01 <= elapsed < 10 * latency

                proxy.set_latency(0)
                started = anyio.current_time()
                await roundtrip(client)
                assert anyio.current_time() - started < 2 * latency
            with pytest.raises(ValueError):
                proxy.set_latency(-1)


async def test_refuse_new() -> None:
    with anyio.fail_after(10):
        async with (
            echo_server() as port,
            FaultProxy("127.0.0.1", port) as proxy,
            await anyio.connect_tcp("127.0.0.1", proxy.port) as kept,
        ):
            await roundtrip(kept)
            proxy.refuse_new(True)
            async with await anyio.connect_tcp("127.0.0.1", proxy.port) as refused:
                with pytest.raises(CONNECTION_LOST):
                    await refused.receive()
            assert proxy.connections_refused == 1
            assert proxy.connections_total == 1
            # Existing connections are not affected.
            await roundtrip(kept)
            proxy.refuse_new(False)
            async with await anyio.connect_tcp("127.0.0.1", proxy.port) as accepted:
                await roundtrip(accepted)
            assert proxy.connections_total == 2


async def test_target_down_counts_as_failed() -> None:
    # A port that was free a moment ago: nothing listens there.
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    dead_port = listener.extra(SocketAttribute.local_port)
    await listener.aclose()
    with anyio.fail_after(10):
        async with FaultProxy("127.0.0.1", dead_port) as proxy:
            async with await anyio.connect_tcp("127.0.0.1", proxy.port) as client:
                with pytest.raises(CONNECTION_LOST):
                    await client.receive()
            assert proxy.connections_failed == 1
            assert proxy.connections_total == 0


async def test_wait_for_connections() -> None:
    with anyio.fail_after(10):
        async with echo_server() as port, FaultProxy("127.0.0.1", port) as proxy:
            with pytest.raises(TimeoutError):
                await proxy.wait_for_connections(1, timeout=0.05)
            async with (
                await anyio.connect_tcp("127.0.0.1", proxy.port) as first,
                await anyio.connect_tcp("127.0.0.1", proxy.port) as second,
            ):
                await proxy.wait_for_connections(2, timeout=5)
                assert proxy.active_connections == 2
                await roundtrip(first)
                await roundtrip(second)
                proxy.cut_all()
                await proxy.wait_for_total_connections(2, timeout=1)
                async with await anyio.connect_tcp("127.0.0.1", proxy.port):
                    await proxy.wait_for_connections(1, timeout=5)
                    await proxy.wait_for_total_connections(3, timeout=5)
            stats = proxy.statistics()
            assert stats.connections_total == 3
            assert stats.connections_cut == 2


async def test_cutting_every() -> None:
    with anyio.fail_after(10):
        async with echo_server() as port, FaultProxy("127.0.0.1", port) as proxy:
            async with proxy.cutting_every(0.1):
                for _ in range(2):
                    async with await anyio.connect_tcp("127.0.0.1", proxy.port) as client:
                        await proxy.wait_for_connections(1)
                        with pytest.raises(CONNECTION_LOST):
                            while True:
                                await roundtrip(client)
            cuts = proxy.connections_cut
            assert cuts >= 2
            # Leaving the block stops the cutting.
            async with await anyio.connect_tcp("127.0.0.1", proxy.port) as client:
                await roundtrip(client)
                await anyio.sleep(0.25)
                await roundtrip(client)
            assert proxy.connections_cut == cuts


async def test_exit_closes_everything() -> None:
    with anyio.fail_after(10):
        async with echo_server() as port:
            async with FaultProxy("127.0.0.1", port) as proxy:
                client = await anyio.connect_tcp("127.0.0.1", proxy.port)
                await roundtrip(client)
                proxy.stall()
            # The block exited with a connection open and stalled: its sockets are closed.
            async with client:
                with pytest.raises(CONNECTION_LOST):
                    await client.receive()
            with pytest.raises(OSError):
                await anyio.connect_tcp("127.0.0.1", proxy.port)


async def test_body_exception_propagates_unwrapped() -> None:
    with anyio.fail_after(10):
        async with echo_server() as port:
            with pytest.raises(KeyError):
                async with (
                    FaultProxy("127.0.0.1", port) as proxy,
                    await anyio.connect_tcp("127.0.0.1", proxy.port) as client,
                ):
                    await roundtrip(client)
                    raise KeyError("from the test body")
            with pytest.raises(KeyError):
                async with FaultProxy("127.0.0.1", port) as proxy, proxy.cutting_every(10):
                    raise KeyError("from the test body")


# ---------------------------------------------------------------------- TLS


def test_tls_material_files(tmp_path: Path) -> None:
    material = make_ca_and_cert("localhost", tmp_path)
    for path in (
        material.ca_cert_path,
        material.server_cert_path,
        material.server_key_path,
        material.client_cert_path,
        material.client_key_path,
        material.untrusted_ca_cert_path,
    ):
        assert path.parent == tmp_path
        assert path.read_bytes().startswith(b"-----BEGIN")
    assert material.server_key_path.stat().st_mode & 0o077 == 0
    assert isinstance(material.server_ssl_context(require_client_cert=True), ssl.SSLContext)


async def test_tls_proxy_forwards_after_verified_handshake(tls_material: TLSMaterial) -> None:
    with anyio.fail_after(10):
        async with echo_server() as port, TLSTerminatingProxy(tls_material, target_port=port) as tls:
            client = await anyio.connect_tcp(
                "127.0.0.1",
                tls.port,
                tls=True,
                ssl_context=tls_material.client_ssl_context(with_client_cert=False),
                tls_hostname="localhost",
            )
            # A standard-compatible close (close_notify both ways) must not raise.
            async with client:
                await roundtrip(client, b"over tls")
                await tls.wait_for_connections(1)
            await tls._wait_until(lambda: tls.active_connections == 0)
            assert tls.client_common_names == [None]
            assert tls.tls_handshake_failures == 0


async def test_tls_proxy_rejects_untrusted_server_cert(tls_material: TLSMaterial) -> None:
    with anyio.fail_after(10):
        async with echo_server() as port, TLSTerminatingProxy(tls_material, target_port=port) as tls:
            with pytest.raises(ssl.SSLCertVerificationError):
                await anyio.connect_tcp(
                    "127.0.0.1",
                    tls.port,
                    tls=True,
                    ssl_context=tls_material.client_ssl_context(trust_ca=False),
                    tls_hostname="localhost",
                )
            assert tls.connections_total == 0


async def test_tls_proxy_mutual_tls(tls_material: TLSMaterial) -> None:
    with anyio.fail_after(10):
        async with (
            echo_server() as port,
            TLSTerminatingProxy(tls_material, target_port=port, require_client_cert=True) as tls,
        ):
            async with await anyio.connect_tcp(
                "127.0.0.1",
                tls.port,
                tls=True,
                ssl_context=tls_material.client_ssl_context(with_client_cert=True),
                tls_hostname="localhost",
            ) as client:
                await roundtrip(client)
            assert tls.client_common_names == ["ojs-test-client"]


async def test_tls_proxy_refuses_client_without_cert(tls_material: TLSMaterial) -> None:
    with anyio.fail_after(10):
        async with (
            echo_server() as port,
            TLSTerminatingProxy(tls_material, target_port=port, require_client_cert=True) as tls,
        ):
            # With TLS 1.3 the client's handshake may complete; the rejection then shows on read.
            with pytest.raises((*CONNECTION_LOST, ssl.SSLError)):
                async with await anyio.connect_tcp(
                    "127.0.0.1",
                    tls.port,
                    tls=True,
                    ssl_context=tls_material.client_ssl_context(with_client_cert=False),
                    tls_hostname="localhost",
                    tls_standard_compatible=False,
                ) as client:
                    await client.send(b"ping")
                    await client.receive()
            assert tls.tls_handshake_failures == 1
            assert tls.connections_total == 0


def test_tls_url(tls_material: TLSMaterial) -> None:
    tls = TLSTerminatingProxy(tls_material, require_client_cert=True)
    tls._port = 45679
    url = tls.url(heartbeat=10)
    parts = urlsplit(url)
    assert parts.scheme == "amqps"
    assert parts.netloc == "guest:guest@127.0.0.1:45679"
    assert parts.path == "/%2F"
    query = {key: values[0] for key, values in parse_qs(parts.query).items()}
    assert query == {
        "cacertfile": str(tls_material.ca_cert_path),
        "certfile": str(tls_material.client_cert_path),
        "keyfile": str(tls_material.client_key_path),
        "verify": "verify_peer",
        "server_name_indication": "localhost",
        "heartbeat": "10",
    }
    without_cert = parse_qs(urlsplit(tls.url(client_cert=False)).query)
    assert "certfile" not in without_cert
    assert "keyfile" not in without_cert
    assert "verify=verify_none" in tls.url(verify="verify_none")


# ---------------------------------------------------------------------- the real broker


@pytest.mark.usefixtures("rabbitmq_url")
async def test_proxy_to_rabbitmq_connection_start() -> None:
    with anyio.fail_after(15):
        async with (
            FaultProxy(RABBITMQ_HOST, RABBITMQ_PORT) as proxy,
            await anyio.connect_tcp("127.0.0.1", proxy.port) as client,
        ):
            frame = await read_connection_start(client)
            assert frame[0] == 1
            assert frame[7:11] == b"\x00\x0a\x00\x0a"
            assert proxy.bytes_up == len(broker.AMQP_PROTOCOL_HEADER)


@pytest.mark.usefixtures("rabbitmq_url")
async def test_tls_proxy_to_rabbitmq_connection_start(tls_material: TLSMaterial) -> None:
    with anyio.fail_after(15):
        async with TLSTerminatingProxy(
            tls_material, RABBITMQ_HOST, RABBITMQ_PORT, require_client_cert=True
        ) as tls:
            client = await anyio.connect_tcp(
                "127.0.0.1",
                tls.port,
                tls=True,
                ssl_context=tls_material.client_ssl_context(),
                tls_hostname="localhost",
            )
            async with client:  # the close_notify exchange must succeed
                frame = await read_connection_start(client)
                assert frame[7:11] == b"\x00\x0a\x00\x0a"
            assert tls.client_common_names == ["ojs-test-client"]


@pytest.mark.usefixtures("rabbitmq_url")
async def test_broker_queries() -> None:
    with anyio.fail_after(60):
        await broker.wait_broker_ready(timeout=30)
        watermark = await broker.get_memory_watermark()
        assert watermark.kind in ("relative", "absolute")
        assert watermark.value > 0
        assert isinstance(await broker.list_connections(), list)
        assert "rabbit" in await broker.rabbitmqctl("status", "-q")
    with pytest.raises(broker.RabbitmqctlError):
        broker.rabbitmqctl_sync("list_queues", "no_such_column", timeout=30)


# ---------------------------------------------------------------------- the default broker's guard
# The default broker may be the user's own: the harness refuses, before starting any
# process, every rabbitmqctl command against it but queries and the tests' own vhosts,
# permissions and named connections.

DISRUPTIVE_COMMANDS = [
    ("stop_app",),
    ("start_app",),
    ("stop",),
    ("shutdown",),
    ("reset",),
    ("close_all_connections", "--vhost", "/", "bye"),
    ("set_vm_memory_high_watermark", "0"),
    ("set_disk_free_limit", "1000GB"),
    ("eval", "init:stop()."),
    ("delete_vhost", "/"),
    ("add_vhost",),
    ("set_permissions", "guest", "", "", ""),
    ("set_permissions", "-p", "/", "guest", "", "", ""),
    ("delete_user", "guest"),
    ("add_user", "admin", "secret"),
    ("change_password", "guest", "x"),
    ("-n", "ojs-private@localhost", "list_queues"),
    ("list_queues", "--node=rabbit@elsewhere"),
    (),
]


@pytest.mark.parametrize("args", DISRUPTIVE_COMMANDS, ids=lambda a: " ".join(a) or "nothing")
async def test_default_broker_refuses_disruptive_commands(args: tuple[str, ...]) -> None:
    # A node whose rabbitmqctl does not exist: had the guard let the command through, it
    # would fail with FileNotFoundError, not the guard's error.
    lookalike = Node("the default broker", ["/nonexistent/rabbitmqctl"], host="127.0.0.1", port=5672)
    with pytest.raises(DefaultBrokerGuardError, match="refusing rabbitmqctl"):
        await lookalike.ctl(*args)
    with pytest.raises(DefaultBrokerGuardError):
        lookalike.ctl_sync(*args)
    with pytest.raises(DefaultBrokerGuardError):
        DEFAULT_NODE.check_command(args)
    with pytest.raises(DefaultBrokerGuardError):
        await broker.rabbitmqctl(*args)
    assert not DEFAULT_NODE.disruptable


@pytest.mark.parametrize(
    "args",
    [
        ("status", "--formatter", "json"),
        ("list_queues", "-p", "t1", "name"),
        ("list_connections",),
        ("add_vhost", "ojs-test-x"),
        ("set_permissions", "-p", "ojs-test-x", "guest", ".*", ".*", ".*"),
        ("delete_vhost", "ojs-test-x"),
        ("add_user", "ojs-test-alice", "pw"),
        ("set_permissions", "-p", "/", "ojs-test-alice", ".*", ".*", ".*"),
        ("delete_user", "ojs-test-alice"),
        ("close_connection", "<rabbit@localhost.1.2.3>", "bye"),
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_default_broker_allows_queries_and_the_tests_own_entities(args: tuple[str, ...]) -> None:
    DEFAULT_NODE.check_command(args)  # no error


@pytest.mark.parametrize(
    ("port", "epmd_port"),
    [*((p, 4371) for p in sorted(RESERVED_AMQP_PORTS)), *((5690, p) for p in sorted(RESERVED_EPMD_PORTS))],
)
def test_private_node_refuses_the_default_and_cluster_ports(
    port: int, epmd_port: int, tmp_path: Path
) -> None:
    with pytest.raises(UsageError, match="belongs to the default broker"):
        PrivateNode(tmp_path, port, epmd_port)


def test_private_node_ports_differ_from_the_default_broker_and_the_cluster() -> None:
    node = PrivateNode.create()
    assert node.port not in RESERVED_AMQP_PORTS
    assert node.dist_port == node.port + 20000 and node.dist_port not in RESERVED_DIST_PORTS
    assert node.epmd_port not in RESERVED_EPMD_PORTS
    assert node.disruptable
    node.check_command(("stop_app",))  # the private node takes what the default refuses


# ---------------------------------------------------------------------- the private node


async def test_private_node_is_a_node_of_its_own(private_node: PrivateNode) -> None:
    """Its own VM, listeners, data and config: nothing in common with the default broker."""
    with anyio.fail_after(60):
        status = await private_node.status()
        default = await DEFAULT_NODE.status()  # read-only
    assert status["pid"] != default["pid"]
    listeners = {(item["protocol"], item["port"]) for item in status["listeners"]}
    assert listeners == {("amqp", private_node.port), ("clustering", private_node.dist_port)}
    assert status["data_directory"].startswith(str(private_node.directory))
    assert all(f.startswith(str(private_node.directory)) for f in status["config_files"])
    assert status["totals"]["virtual_host_count"] == 1
    with anyio.fail_after(60):
        await private_node.wait_ready(timeout=30)
        epmd = await anyio.run_process(["epmd", "-port", str(private_node.epmd_port), "-names"])
    names = [line.split()[1] for line in epmd.stdout.decode().splitlines() if line.startswith("name ")]
    assert names == ["ojs-private"]
    cookie = private_node.directory / "home" / ".erlang.cookie"
    assert cookie.stat().st_mode & 0o077 == 0


# ---------------------------------------------------------------------- broker-side control
# The disruptive helpers act on the whole private node; pytest runs tests one at a time, and
# each helper restores the node in a shielded finally.


class RawAMQP:
    """Just enough AMQP 0-9-1 (with pamqp) to open a connection and publish, for probing."""

    def __init__(self, stream: ByteStream) -> None:
        self.stream = stream
        self._buffer = bytearray()

    async def send(self, *frames: object, channel: int = 0) -> None:
        await self.stream.send(b"".join(amqp_frame.marshal(f, channel) for f in frames))  # type: ignore[arg-type]

    async def receive(self) -> object:
        while True:
            if len(self._buffer) >= 7:
                size = int.from_bytes(self._buffer[3:7], "big")
                if len(self._buffer) >= 8 + size:
                    raw = bytes(self._buffer[: 8 + size])
                    del self._buffer[: 8 + size]
                    return amqp_frame.unmarshal(raw)[2]
            self._buffer += await self.stream.receive()

    async def open(self, connection_name: str, vhost: str = "/") -> None:
        assert isinstance(await read_connection_start(self.stream), bytes)
        await self.send(
            amqp.Connection.StartOk(
                client_properties={
                    "connection_name": connection_name,
                    "capabilities": {"connection.blocked": True},
                },
                mechanism="PLAIN",
                response="\0guest\0guest",
            )
        )
        tune = await self.receive()
        assert isinstance(tune, amqp.Connection.Tune)
        await self.send(
            amqp.Connection.TuneOk(channel_max=tune.channel_max, frame_max=tune.frame_max, heartbeat=0),
            amqp.Connection.Open(virtual_host=vhost),
        )
        assert isinstance(await self.receive(), amqp.Connection.OpenOk)
        await self.send(amqp.Channel.Open(), channel=1)
        assert isinstance(await self.receive(), amqp.Channel.OpenOk)

    async def publish(self, routing_key: str, payload: bytes) -> None:
        await self.send(
            amqp.Basic.Publish(exchange="", routing_key=routing_key),
            amqp_header.ContentHeader(body_size=len(payload)),
            amqp_body.ContentBody(payload),
            channel=1,
        )


@pytest.mark.usefixtures("rabbitmq_url")
async def test_close_connections_by_name() -> None:
    name = f"harness-{os.getpid()}-{os.urandom(4).hex()}"
    with anyio.fail_after(60):
        async with await anyio.connect_tcp(RABBITMQ_HOST, RABBITMQ_PORT) as stream:
            peer = RawAMQP(stream)
            await peer.open(name)
            assert await broker.close_connections("bye from the harness", connection_name=name) == 1
            close = await peer.receive()
            assert isinstance(close, amqp.Connection.Close)
            assert close.reply_code == 320
            assert "bye from the harness" in close.reply_text
            await peer.send(amqp.Connection.CloseOk())
        assert await broker.close_connections(connection_name=name) == 0


async def test_close_all_connections_of_a_vhost(private_node: PrivateNode) -> None:
    # A vhost of its own, so that no other test's connection is closed.
    vhost = f"harness-{os.getpid()}-{os.urandom(4).hex()}"
    with anyio.fail_after(60):
        await private_node.ctl("add_vhost", vhost)
        try:
            await private_node.ctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
            async with await anyio.connect_tcp(private_node.host, private_node.port) as stream:
                peer = RawAMQP(stream)
                await peer.open("harness-vhost-probe", vhost=vhost)
                await private_node.close_all_connections("vhost cleared", vhost=vhost)
                close = await peer.receive()
                assert isinstance(close, amqp.Connection.Close)
                assert close.reply_code == 320
        finally:
            with anyio.CancelScope(shield=True):
                await private_node.ctl("delete_vhost", vhost)


async def test_lowered_memory_watermark_blocks_publishers(private_node: PrivateNode) -> None:
    with anyio.fail_after(60):
        before = await private_node.get_memory_watermark()
        async with await anyio.connect_tcp(private_node.host, private_node.port) as stream:
            peer = RawAMQP(stream)
            await peer.open(f"harness-blocked-{os.getpid()}")
            async with private_node.lowered_memory_watermark() as previous:
                assert previous == before
                assert await private_node.get_memory_alarms()
                await peer.publish("harness-nowhere", b"x")
                blocked = await peer.receive()
                assert isinstance(blocked, amqp.Connection.Blocked)
                assert "memory" in blocked.reason
            assert isinstance(await peer.receive(), amqp.Connection.Unblocked)
            assert await private_node.get_memory_alarms() == []
        assert await private_node.get_memory_watermark() == before


async def test_lowered_memory_watermark_restores_when_cancelled(private_node: PrivateNode) -> None:
    with anyio.fail_after(60):
        before = await private_node.get_memory_watermark()
        with anyio.CancelScope() as scope:
            async with private_node.lowered_memory_watermark():
                scope.cancel()
                await anyio.sleep_forever()
        assert await private_node.get_memory_watermark() == before
        assert await private_node.get_memory_alarms() == []


async def test_broker_stopped_restarts_even_on_error(private_node: PrivateNode) -> None:
    with anyio.fail_after(120):
        async with (
            FaultProxy(private_node.host, private_node.port) as proxy,
            await anyio.connect_tcp("127.0.0.1", proxy.port) as client,
        ):
            await read_connection_start(client)
            with pytest.raises(RuntimeError, match="boom"):
                async with private_node.broker_stopped():
                    # The broker dropped the connection, and answers no more.
                    with pytest.raises(CONNECTION_LOST):
                        while True:
                            await client.receive()
                    with pytest.raises(TimeoutError):
                        await private_node.wait_ready(timeout=1)
                    raise RuntimeError("boom")
        await private_node.wait_ready(timeout=5)
