"""Helpers shared by the AMQP runtime tests (tests/amqp)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager

import anyio
from harness import list_connections
from support.waits import wait_message_count, wait_until

from ojs_anyio import amqp


async def broker_connection_names() -> set[str]:
    """``connection_name`` client properties of the connections the broker lists now."""
    names: set[str] = set()
    for row in await list_connections("name", "client_properties"):
        for item in row.get("client_properties") or []:
            if isinstance(item, list) and len(item) == 3 and item[0] == "connection_name":
                names.add(str(item[2]))
    return names


async def wait_broker_forgets(name: str, *, timeout: float = 10.0) -> None:
    """Wait until the broker no longer lists a connection called ``name``."""
    with anyio.fail_after(timeout):
        while name in await broker_connection_names():  # noqa: ASYNC110 (the broker: no event)
            await anyio.sleep(0.1)


def closed_port() -> int:
    """A local TCP port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@asynccontextmanager
async def deleted_afterwards(
    conn: amqp.Connection, *, queues: Iterable[str] = (), exchanges: Iterable[str] = ()
) -> AsyncIterator[None]:
    """Delete these queues and exchanges when the block ends (on a fresh channel, shielded),
    even if the test's own channel was closed by an error."""
    try:
        yield
    finally:
        with anyio.CancelScope(shield=True), anyio.fail_after(10):
            if conn.is_open:
                async with conn.channel(confirms=False) as ch:
                    for queue in queues:
                        await ch.queue_delete(queue)
                    for exchange in exchanges:
                        await ch.exchange_delete(exchange)


@asynccontextmanager
async def scratch_channel(
    url: str, *, queues: Iterable[str] = (), exchanges: Iterable[str] = ()
) -> AsyncIterator[amqp.Channel]:
    """A channel on a connection of its own; these queues and exchanges are deleted when
    the block ends (see :func:`deleted_afterwards`), then the channel and connection close."""
    async with (
        amqp.connect(url) as conn,
        conn.channel() as ch,
        deleted_afterwards(conn, queues=queues, exchanges=exchanges),
    ):
        yield ch


async def numbered_queue(ch: amqp.Channel, n: int) -> str:
    """A new exclusive server-named queue holding ``b"0"`` … ``b"n-1"``, confirmed; its name."""
    queue = (await ch.queue_declare("", exclusive=True)).name
    window = ch.publish_window()
    for i in range(n):
        await window.publish(b"%d" % i, routing_key=queue)
    assert await window.wait_all() == []
    return queue


async def drain(ch: amqp.Channel, queue: str) -> list[bytes]:
    """Basic.Get (no_ack) every message left in ``queue``; return the bodies in order."""
    bodies = []
    while (msg := await ch.get(queue, no_ack=True)) is not None:
        bodies.append(msg.body)
    return bodies


#: Shared with every test folder (tests/support/waits.py); the old name kept for its callers.
wait_for_message_count = wait_message_count
__all__ = ["wait_for_message_count", "wait_until"]  # re-exported


def _typed(value: object) -> list[object]:
    kind = "bool" if isinstance(value, bool) else "long" if isinstance(value, int) else "longstr"
    return [kind, value]


def memory_rows(url: str, kind: str) -> dict[str, dict[str, object]]:
    """``rabbitmqctl list_{kind}``'s rows (same keys and argument form) for a memory:// broker."""
    from ojs_anyio.memory import get_broker

    parsed = amqp.parse_url(url)
    broker = get_broker(parsed.host)
    rows: dict[str, dict[str, object]] = {}
    if kind == "exchanges":
        for name, x in broker.exchanges(parsed.virtual_host).items():
            rows[name] = {
                "name": name,
                "type": x.kind,
                "durable": x.durable,
                "auto_delete": x.auto_delete,
                "internal": x.internal,
                "arguments": [[k, *_typed(v)] for k, v in x.arguments.items()],
            }
    elif kind == "queues":
        for name, q in broker.queues(parsed.virtual_host).items():
            rows[name] = {
                "name": name,
                "durable": q.durable,
                "auto_delete": q.auto_delete,
                "exclusive": q.owner is not None,
                "arguments": [[k, *_typed(v)] for k, v in q.arguments.items()],
                "messages_ready": q.ready,
                "messages_unacknowledged": sum(c.unacked for c in q.consumers),
                "consumers": len(q.consumers),
            }
    else:
        raise ValueError(kind)
    return rows


async def connections_on(url: str, *columns: str) -> list[dict[str, object]]:
    """The broker's list of connections (``rabbitmqctl list_connections`` rows, JSON form)."""
    if url.startswith("memory://"):
        from ojs_anyio.memory import get_broker

        return get_broker(amqp.parse_url(url).host).connection_rows()
    return await list_connections(*columns)


async def force_close_on(url: str, explanation: str, *, connection_name: str) -> int:
    """Close connections from the broker's side (clients get 320 CONNECTION_FORCED)."""
    if url.startswith("memory://"):
        from ojs_anyio.memory import get_broker

        return get_broker(amqp.parse_url(url).host).close_connections(
            explanation, connection_name=connection_name
        )
    from harness import close_connections

    return await close_connections(explanation, connection_name=connection_name)


async def unacked_on(url: str, queue: str) -> int:
    """``messages_unacknowledged`` of ``queue`` as the broker counts it."""
    if url.startswith("memory://"):
        from ojs_anyio.memory import get_broker

        return get_broker(amqp.parse_url(url).host).unacked_count(queue, amqp.parse_url(url).virtual_host)
    import json

    from harness import rabbitmqctl

    output = await rabbitmqctl("list_queues", "name", "messages_unacknowledged", "--formatter", "json", "-q")
    rows = {row["name"]: row for row in json.loads(output)}
    return int(rows[queue]["messages_unacknowledged"])
