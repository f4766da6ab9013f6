"""Scanning a dead-letter queue without losing a message: shared by jobs and events.

A dead-letter queue is read with ``Basic.Get`` on a private channel.  What is looked at and
kept goes back with ``Basic.Reject(requeue)`` (shielded from cancellation), what is moved
is published with a confirm before its dead copy is acked (a failure in between leaves a
duplicate, never a loss), and what is dropped is acked.  The layers add what a message
*means* (a dead job, a dead event) and where a requeued one goes; the rules of the scan
live here once.

Uses only the public API of :mod:`ojs_anyio.amqp`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import anyio

from . import amqp
from ._misuse import ArgumentTypeError

__all__ = [
    "DEATH_CLOCK_SKEW",
    "ID_RESCAN_DELAY",
    "ID_SCANS",
    "DeadLetterQueue",
    "died_at",
    "latest_death",
    "return_to_queue",
    "usable_death_time",
]

T = TypeVar("T")

#: How far ahead of the reader's clock a death time may be (clock skew between the host
#: that wrote it and the one reading it); a later time cannot be right.
DEATH_CLOCK_SKEW = timedelta(minutes=5)


def latest_death(headers: dict[str, Any]) -> dict[str, Any] | None:
    """RabbitMQ's most recent ``x-death`` entry (they come most recent first), if any."""
    deaths = headers.get("x-death")
    if isinstance(deaths, list) and deaths and isinstance(deaths[0], dict):
        return deaths[0]
    return None


def usable_death_time(when: object, now: datetime) -> datetime | None:
    """``when`` in UTC if it is a datetime that can be a death time: not in the future by
    more than :data:`DEATH_CLOCK_SKEW`, and representable in UTC."""
    if not isinstance(when, datetime):
        return None
    try:
        utc = (when if when.tzinfo else when.replace(tzinfo=UTC)).astimezone(UTC)
    except OverflowError:  # an offset that takes it past year 1 or 9999
        return None
    return utc if utc <= now + DEATH_CLOCK_SKEW else None


def died_at(
    props: amqp.BasicProperties,
    stamp_header: str,
    parse: Callable[[str], datetime],
    *,
    now: datetime | None = None,
) -> datetime | None:
    """When a message was dead-lettered, in UTC, or None when that is unknown.

    The layer's own stamp (header ``stamp_header``, read with ``parse``: a copy the layer
    published, any ``x-death`` on it being from an earlier hop), else RabbitMQ's latest
    ``x-death`` time, else the message's ``timestamp`` (when it was created).  An unusable
    stamp falls back to the ``x-death`` time only, never to the creation time, so a bad
    stamp never makes a message look older than it is."""
    headers = props.headers or {}
    now = datetime.now(UTC) if now is None else now
    death = latest_death(headers)
    broker = usable_death_time(death.get("time"), now) if death is not None else None
    if stamp_header in headers:
        marked = headers[stamp_header]
        stamped = None
        if isinstance(marked, str):
            try:
                stamped = usable_death_time(parse(marked), now)
            except (ValueError, OverflowError):
                stamped = None
        return stamped if stamped is not None else broker
    return broker if broker is not None else usable_death_time(props.timestamp, now)


async def return_to_queue(held: Sequence[amqp.IncomingMessage]) -> None:
    """Put messages taken with ``Basic.Get`` back in their queue, in order (``Basic.Reject``
    with requeue), shielded from cancellation.  Once their channel or connection is gone
    the broker has put them back itself, so that is not an error (the error that closed it
    is the caller's to report)."""
    with anyio.CancelScope(shield=True):
        for msg in held:
            try:
                await msg.reject(requeue=True)
            except (amqp.StaleDeliveryError, amqp.ConnectionLostError, amqp.ConnectionClosedError):
                return


#: Scans of a requeue by id before an id is reported not found (see DeadLetterQueue.move).
ID_SCANS = 3
#: Seconds before the second scan (doubled before the third).
ID_RESCAN_DELAY = 0.2


class DeadLetterQueue:
    """The scans of one dead-letter queue ``name``, on channels of ``conn``."""

    def __init__(self, conn: amqp.Connection, name: str) -> None:
        self.conn = conn
        self.name = name

    async def count(self) -> int:
        async with self.conn.channel(confirms=False) as ch:
            return (await ch.queue_declare(self.name, passive=True)).message_count

    async def purge(self) -> int:
        async with self.conn.channel(confirms=False) as ch:
            return await ch.queue_purge(self.name)

    async def peek(self, limit: int, read: Callable[[amqp.IncomingMessage], T]) -> list[T]:
        """Up to ``limit`` messages, oldest first, each read with ``read``, all left in the
        queue (``Basic.Get``, then one ``Basic.Reject(requeue)`` each: they come back
        marked ``redelivered``, never removed)."""
        out: list[T] = []
        async with self.conn.channel(confirms=False) as ch:
            held: list[amqp.IncomingMessage] = []
            try:
                for _ in range(limit):
                    msg = await ch.get(self.name)
                    if msg is None:
                        break
                    held.append(msg)
                    out.append(read(msg))
            finally:
                await return_to_queue(held)
        return out

    async def move(
        self,
        republish: Callable[[amqp.Channel, amqp.IncomingMessage], Awaitable[None]],
        *,
        key: Callable[[amqp.IncomingMessage], str],
        limit: int | None = None,
        ids: Collection[str] | None = None,
        on_moved: Callable[[int], object] | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> int:
        """Move messages out: ``republish(ch, msg)`` publishes one and returns once the broker
        confirmed it (``ch`` has confirms), then the dead copy is acked.

        Only messages whose ``key(msg)`` is in ``ids``, when given; at most ``limit``; at
        most the messages present at the start are looked at.  Malformed messages (that
        cannot be published again as they are) and the ones left out are held while the
        queue is scanned and put back in their order.  ``on_moved(n)`` reports progress;
        ``stop()`` ends the scan early when true.  Returns how many were moved.

        With ``ids``, an id not found is looked for again, up to :data:`ID_SCANS` scans in
        all (after :data:`ID_RESCAN_DELAY` s, then twice that): a concurrent peek holds the
        messages it looks at unacked for a moment, and they are not counted as present then."""
        wanted = None if ids is None else set(ids)
        moved = 0
        async with self.conn.channel(confirms=True) as ch:
            for scan in range(ID_SCANS):
                moved = await self._move_scan(
                    ch, republish, key=key, limit=limit, wanted=wanted, on_moved=on_moved, stop=stop,
                    moved=moved,
                )  # fmt: skip
                if not wanted or (limit is not None and moved >= limit) or (stop is not None and stop()):
                    break
                if scan + 1 < ID_SCANS:
                    # An id not seen may be held for a moment by another reader of the queue
                    # (a peek: a dashboard's refresh, another command), which takes messages
                    # with Basic.Get and puts them back: look again before calling it absent.
                    await anyio.sleep(ID_RESCAN_DELAY * 2**scan)
        return moved

    async def _move_scan(
        self,
        ch: amqp.Channel,
        republish: Callable[[amqp.Channel, amqp.IncomingMessage], Awaitable[None]],
        *,
        key: Callable[[amqp.IncomingMessage], str],
        limit: int | None,
        wanted: set[str] | None,
        on_moved: Callable[[int], object] | None,
        stop: Callable[[], bool] | None,
        moved: int,
    ) -> int:
        """One pass of :meth:`move` over the messages present now; ``moved`` so far in, the
        new total out (``wanted`` loses each id moved)."""
        present = (await ch.queue_declare(self.name, passive=True)).message_count
        held: list[amqp.IncomingMessage] = []
        try:
            for _ in range(present):
                if (limit is not None and moved >= limit) or wanted == set():
                    break
                if stop is not None and stop():
                    break
                msg = await ch.get(self.name)
                if msg is None:
                    break
                name = key(msg)
                if msg.malformed is not None or (wanted is not None and name not in wanted):
                    held.append(msg)
                    continue
                try:
                    await republish(ch, msg)
                except BaseException:
                    held.append(msg)
                    raise
                await msg.ack()
                moved += 1
                if wanted is not None:
                    wanted.discard(name)
                if on_moved is not None:
                    on_moved(moved)
        finally:
            await return_to_queue(held)
        return moved

    async def prune(
        self,
        *,
        cutoff: datetime | None,
        max_count: int | None,
        limit: int,
        died: Callable[[amqp.BasicProperties, datetime], datetime | None],
        on_dropped: Callable[[int], object] | None = None,
        stop: Callable[[], bool] | None = None,
        count_name: str = "max_count",
    ) -> int:
        """Drop messages that died before ``cutoff``, then the oldest beyond ``max_count``.

        The queue is FIFO by death, so the scan stops at the first message young enough
        to keep while the count is within bounds; a message whose death time is unknown
        (``died(props, now)`` is None) is never dropped for its age, so the age rule stops
        there too.  At most ``limit`` are dropped.  ``max_count`` and ``limit`` must be whole
        numbers, zero or more (refused before anything is touched; ``count_name`` names
        ``max_count`` in the error, as the caller's own parameter is called)."""
        for value, name in ((max_count, count_name), (limit, "limit")):
            if value is None and name == count_name:
                continue
            if not isinstance(value, int) or isinstance(value, bool):
                raise ArgumentTypeError(f"{name} must be an int, not {type(value).__name__}")
            if value < 0:
                raise amqp.UsageError(f"{name} must be zero or more, got {value}")
        now = datetime.now(UTC)
        dropped = 0
        async with self.conn.channel(confirms=False) as ch:
            excess = 0
            if max_count is not None:
                info = await ch.queue_declare(self.name, passive=True)
                excess = max(0, info.message_count - max_count)
            while dropped < limit and not (stop is not None and stop()):
                msg = await ch.get(self.name)
                if msg is None:
                    break
                if dropped >= excess:
                    when = died(msg.properties, now)
                    if cutoff is None or when is None or when >= cutoff:
                        with anyio.CancelScope(shield=True):
                            await msg.reject(requeue=True)
                        break
                await msg.ack()
                dropped += 1
                if on_dropped is not None:
                    on_dropped(dropped)
        return dropped
