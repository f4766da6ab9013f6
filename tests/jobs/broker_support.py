"""Helpers for the job layer's real-broker tests (``tests/jobs/test_*_broker.py``).

* :func:`current_url`, :data:`OJS_VHOST`, :class:`Outcomes`, :func:`running`, :data:`WAIT`:
  from ``tests/support`` (re-exported for the job tests).
* :func:`wait_message_count`: wait until a queue holds ``n`` messages (for the one hop no
  worker event reports: the broker moving a rejected copy into ``ojs.queue.dlx.{q}``).
* :func:`queue_facts` / :func:`consumer_facts` / :func:`bindings_to`: broker-side truth
  from ``rabbitmqctl``.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Awaitable
from typing import Any, TypeVar

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream
from harness.broker import rabbitmqctl
from support.brokers import OJS_VHOST, current_url, memory_broker
from support.waits import wait_message_count as _wait_message_count
from support.workers import WAIT, Outcomes, running

from ojs_anyio import amqp

__all__ = [
    "OJS_VHOST",
    "WAIT",
    "Outcomes",
    "bindings_to",
    "both",
    "consumer_facts",
    "current_url",
    "header_type",
    "ProcessLog",
    "peek_raw",
    "queue_facts",
    "running",
    "wait_message_count",
]


def _memory_broker(vhost: str) -> Any:
    if not current_url().startswith("memory://"):
        return None
    broker = memory_broker(current_url())
    broker.add_vhost(vhost) if vhost not in broker.state.vhosts else None
    return broker


#: Wait until a queue holds exactly ``n`` ready messages (tests/support/waits.py), up to WAIT.
wait_message_count = functools.partial(_wait_message_count, timeout=WAIT)

A = TypeVar("A")
B = TypeVar("B")


async def peek_raw(queue: str, *, url: str | None = None) -> tuple[amqp.IncomingMessage, bytes]:
    """The head message of ``queue`` (left in place) and the raw bytes the broker sent for it.

    A Basic.Get on a fresh connection whose socket reads are recorded while the message
    comes in; :func:`header_type` reads a header's wire type code from those bytes.
    """
    with anyio.fail_after(WAIT):
        async with amqp.connect(url or current_url()) as conn:
            received: list[bytes] = []
            transport = conn._transport
            feed = transport.feed

            def recording(data: bytes) -> None:
                received.append(bytes(data))
                feed(data)

            transport.feed = recording  # type: ignore[method-assign]
            async with conn.channel(confirms=False) as ch:
                received.clear()
                msg = await ch.get(queue)
                assert msg is not None, f"{queue} is empty"
                await msg.reject(requeue=True)
            return msg, b"".join(received)


def header_type(raw: bytes, key: str) -> str:
    """The field type code (``"I"`` for int32, ``"b"`` for int8…) of header ``key`` in
    ``raw``, the bytes of exactly one message (a field table entry is: key length, key,
    type code, value)."""
    entry = bytes([len(key)]) + key.encode()
    at = raw.find(entry)
    assert at >= 0, f"header {key!r} not in the message"
    assert raw.find(entry, at + 1) < 0, f"header {key!r} appears twice"
    return chr(raw[at + len(entry)])


async def _ctl_json(*args: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(await rabbitmqctl(*args, "--formatter", "json", "-q"))
    return rows


def _args(raw: list[list[Any]]) -> dict[str, Any]:
    return {name: value for name, _type, value in raw}


async def queue_facts(*names: str, vhost: str = "/") -> dict[str, dict[str, Any]]:
    """``rabbitmqctl list_queues`` for ``names``: durable, auto_delete, exclusive, arguments
    (as a plain dict), type, messages_ready, messages_unacknowledged."""
    broker = _memory_broker(vhost)
    if broker is not None:
        return {
            name: {
                "name": name,
                "durable": q.durable,
                "auto_delete": q.auto_delete,
                "exclusive": q.owner is not None,
                "arguments": dict(q.arguments),
                "type": q.kind,
                "messages_ready": q.ready,
                "messages_unacknowledged": broker.unacked_count(name, vhost),
            }
            for name, q in broker.queues(vhost).items()
            if name in names
        }
    rows = await _ctl_json(
        "list_queues", "-p", vhost,
        "name", "durable", "auto_delete", "exclusive", "arguments", "type",
        "messages_ready", "messages_unacknowledged",
    )  # fmt: skip
    wanted = set(names)
    out = {}
    for row in rows:
        if row["name"] in wanted:
            row["arguments"] = _args(row["arguments"])
            out[row["name"]] = row
    return out


async def consumer_facts(queue: str, vhost: str = "/") -> list[dict[str, Any]]:
    """``rabbitmqctl list_consumers`` rows of ``queue``: ack_required, prefetch_count."""
    broker = _memory_broker(vhost)
    if broker is not None:
        found = broker.queues(vhost).get(queue)
        return [
            {"queue_name": queue, "ack_required": not c.no_ack, "prefetch_count": c.prefetch}
            for c in (found.consumers if found is not None else [])
        ]
    rows = await _ctl_json("list_consumers", "-p", vhost, "queue_name", "ack_required", "prefetch_count")
    return [row for row in rows if row["queue_name"] == queue]


async def bindings_to(*destinations: str, vhost: str = "/") -> dict[str, set[tuple[str, str]]]:
    """``{destination: {(source exchange, routing key), ...}}`` for every binding to one of
    ``destinations`` (bindings of the default exchange left out), in one ``rabbitmqctl`` call."""
    broker = _memory_broker(vhost)
    if broker is not None:
        found: dict[str, set[tuple[str, str]]] = {name: set() for name in destinations}
        for x in broker.exchanges(vhost).values():
            for _is_queue, dest, key, _ in x.bindings:
                if dest in found and x.name:
                    found[dest].add((x.name, key))
        return found
    rows = await _ctl_json("list_bindings", "-p", vhost, "source_name", "destination_name", "routing_key")
    out: dict[str, set[tuple[str, str]]] = {name: set() for name in destinations}
    for row in rows:
        if row["destination_name"] in out and row["source_name"]:
            out[row["destination_name"]].add((row["source_name"], row["routing_key"]))
    return out


async def both(first: Awaitable[A], second: Awaitable[B]) -> tuple[A, B]:
    """Await two things concurrently (two ``rabbitmqctl`` calls take the time of one)."""
    results: dict[int, Any] = {}

    async def run(i: int, awaitable: Awaitable[Any]) -> None:
        results[i] = await awaitable

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, 0, first)
        tg.start_soon(run, 1, second)
    return results[0], results[1]


class ProcessLog:
    """The lines a process writes to one stream, with a way to wait for one."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._changed = anyio.Event()

    async def read(self, stream: anyio.abc.ByteReceiveStream) -> None:
        buffered = BufferedByteReceiveStream(stream)
        try:
            while True:
                line = await buffered.receive_until(b"\n", 1 << 20)
                self.lines.append(line.decode(errors="replace"))
                self._changed.set()
                self._changed = anyio.Event()
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.ClosedResourceError):
            self._changed.set()

    async def wait_for(self, pattern: str, count: int = 1) -> re.Match[str]:
        while True:
            found = [m for line in self.lines if (m := re.search(pattern, line))]
            if len(found) >= count:
                return found[count - 1]
            await self._changed.wait()
