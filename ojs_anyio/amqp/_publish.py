"""Publishing and publisher confirms: :class:`Publisher`, the part of a channel that
publishes (``Channel.publish`` is its bound :meth:`Publisher.publish`), the bulk
:class:`PublishWindow`, and the reader's Basic.Ack / Basic.Nack / Basic.Return handling.

The publisher owns the channel's :class:`~._confirms.ConfirmTracker` and resolves what it
returns; it reads the shared :class:`~._channel_state.ChannelState` and sends through the
:class:`~._link.ChannelLink`."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from itertools import repeat
from typing import TYPE_CHECKING, Any

import anyio
from pamqp import commands

from ojs_codec import BasicProperties, Confirmed, Returned, UsageError

from . import _metrics, _park
from ._confirms import ConfirmTracker, Outcome
from ._errors import (
    ConnectionLostError,
    OperationTimeoutError,
    PublishOutcomeUnknownError,
    PublishTimeoutError,
    UnroutableError,
)
from ._link import FLUSH_THRESHOLD

if TYPE_CHECKING:
    from ._calls import Calls
    from ._channel import Channel
    from ._channel_state import ChannelState
    from ._link import ChannelLink

__all__ = ["PublishHandle", "PublishWindow", "Publisher", "WindowOps"]

log = logging.getLogger("ojs_anyio.amqp")

#: At most one confirm-latency sample per channel per this many seconds (an SDK histogram
#: record costs microseconds; at low rates every Basic.Ack frame is sampled).
_CONFIRM_SAMPLE_INTERVAL = 0.001
_PUBLISHED = _metrics.stats.published
_KNOWN_QUEUES = _metrics.queues
_OTHER = _metrics.OTHER


class PublishHandle:
    """The outcome of one publish: pending until the broker confirms it.

    ``await handle.wait()`` returns when the broker acked it, and raises
    :class:`UnroutableError`, :class:`PublishNackedError` or
    :class:`PublishOutcomeUnknownError` otherwise.
    """

    __slots__ = (
        "_event", "_result", "_waiter", "_window", "confirm_by", "confirm_timeout", "exchange", "routing_key",
        "sent_at", "tag",
    )  # fmt: skip

    def __init__(
        self, tag: int, exchange: str, routing_key: str, window: PublishWindow | None, done: bool = False
    ) -> None:
        self.tag = tag
        self.exchange = exchange
        self.routing_key = routing_key
        #: ``True`` once acked (at once with ``done``: a publish without confirms), or the error.
        self._result: BaseException | bool | None = True if done else None
        #: The task waiting for the confirm (see _park): no Event per publish.
        self._waiter: Any = None
        #: Only when a second task waits on the same handle.
        self._event: anyio.Event | None = None
        self._window = window
        self.sent_at = 0.0
        #: When its wait for the confirm ends (``time.monotonic()``; 0: when it comes), and
        #: the ``confirm_timeout`` that set it (see _confirm_deadlines).
        self.confirm_by = 0.0
        self.confirm_timeout = 0.0

    @property
    def done(self) -> bool:
        return self._result is not None

    @property
    def error(self) -> BaseException | None:
        r = self._result
        return r if isinstance(r, BaseException) else None

    def _resolve(self, result: BaseException | bool) -> None:
        if self._result is not None:
            return
        self._result = result
        _park.wake(self)
        if self._event is not None:
            self._event.set()
        if self._window is not None:
            self._window._on_done(self, result)

    async def wait(self) -> None:
        if self._result is None:
            if self._waiter is None:
                await _park.wait(self)
            else:
                if self._event is None:
                    self._event = anyio.Event()
                await self._event.wait()
        if isinstance(self._result, BaseException):
            raise self._result

    def __repr__(self) -> str:
        state = "pending" if self._result is None else ("ok" if self._result is True else repr(self._result))
        return f"<PublishHandle tag={self.tag} {self.exchange!r}/{self.routing_key!r} {state}>"


def _resolve(outcomes: Iterable[Outcome]) -> None:
    """Resolve what the confirm tracker returned (wakes the tasks waiting on each)."""
    for handle, outcome in outcomes:
        handle._resolve(outcome)


_PublishNowait = Callable[
    [bytes, str, str, "BasicProperties | None", bool, "float | None", "PublishWindow | None"],
    Awaitable["PublishHandle"],
]


class WindowOps:
    """What a :class:`PublishWindow` may do with its channel (its bound methods)."""

    __slots__ = ("flush", "give_up", "link", "publish_nowait")

    def __init__(
        self,
        *,
        publish_nowait: _PublishNowait,
        flush: Callable[[], Awaitable[None]],
        give_up: Callable[[PublishWindow, float], None],
        link: ChannelLink,
    ) -> None:
        self.publish_nowait = publish_nowait
        self.flush = flush
        #: Every publish of the window still without a confirm fails "outcome unknown".
        self.give_up = give_up
        self.link = link


class PublishWindow:
    """Keep up to ``max_in_flight`` publishes unconfirmed from one task, without a task per message.

    ::

        window = ch.publish_window(max_in_flight=1024)
        for body in bodies:
            await window.publish(body, exchange="", routing_key="q")  # waits only when full
        failed = await window.wait_all()  # [] when every publish was confirmed

    ``publish`` returns a :class:`PublishHandle`; ``wait_all`` flushes and waits until
    every publish of the window is resolved, and returns the handles that failed.
    """

    def __init__(self, channel: Channel, max_in_flight: int = 1024) -> None:
        if max_in_flight < 1:
            raise UsageError("max_in_flight must be >= 1")
        self.channel = channel
        #: The channel's verbs for a window (publish without waiting, flush, give up).
        self._ops = channel._window_ops
        self.max_in_flight = max_in_flight
        self.in_flight = 0
        self.failures: list[PublishHandle] = []
        self._wakeup: anyio.Event | None = None
        self._wake_at = 0

    async def publish(
        self,
        body: bytes,
        *,
        exchange: str = "",
        routing_key: str = "",
        properties: BasicProperties | None = None,
        mandatory: bool = False,
        timeout: float | None = None,
    ) -> PublishHandle:
        if self.in_flight >= self.max_in_flight:
            await self._wait_below(self.max_in_flight - 1)
        ops = self._ops
        handle = await ops.publish_nowait(body, exchange, routing_key, properties, mandatory, timeout, self)
        if handle.tag:  # awaits a confirm (none can have come yet: nothing awaited since)
            self.in_flight += 1
        if len(ops.link.outbound) >= FLUSH_THRESHOLD:
            await ops.flush()
        return handle

    async def flush(self) -> None:
        await self._ops.flush()

    async def wait_all(self, timeout: float | None = None) -> list[PublishHandle]:
        """Flush, wait until no publish of this window is pending; return the failed ones.

        ``timeout`` bounds the wait for the confirms (default: until each one comes, or the
        connection is declared dead).  When it passes, every publish of the window still
        without a confirm fails with :class:`PublishOutcomeUnknownError` and is among the
        returned handles.
        """
        await self.flush()
        if timeout is None:
            await self._wait_below(0)
        else:
            with anyio.move_on_after(timeout):
                await self._wait_below(0)
            if self.in_flight:
                self._ops.give_up(self, timeout)
        failed, self.failures = self.failures, []
        return failed

    async def _wait_below(self, limit: int) -> None:
        while self.in_flight > limit:
            # Armed before flushing: confirms that arrive while the flush is sending must
            # find it, or nothing would wake us once the last one is in.
            wakeup = self._wakeup = anyio.Event()
            self._wake_at = limit
            await self._ops.flush()
            await wakeup.wait()

    def _on_done(self, handle: PublishHandle, result: BaseException | bool) -> None:
        self.in_flight -= 1
        if isinstance(result, BaseException):
            self.failures.append(handle)
        if self._wakeup is not None and self.in_flight <= self._wake_at:
            self._wakeup.set()
            self._wakeup = None


class Publisher:
    """The publishing part of a channel: publish, windows, confirms and returns."""

    __slots__ = (
        "_call",
        "_confirms",
        "_link",
        "_next_sample",
        "_ready",
        "_returns_without_confirm",
        "_state",
        "_timing",
        "window_ops",
    )

    def __init__(self, state: ChannelState, link: ChannelLink, calls: Calls) -> None:
        self._state = state
        self._link = link
        self._ready = calls.ready
        self._call = calls.call
        #: The publishes waiting for their confirm (pure: it returns what to resolve).
        self._confirms = ConfirmTracker()
        self._returns_without_confirm: list[Returned] = []
        #: What a PublishWindow of this channel may do (read by PublishWindow).
        self.window_ops = WindowOps(
            publish_nowait=self.publish_nowait,
            flush=self.flush,
            give_up=self.give_up_window,
            link=link,
        )
        #: Time publishes for the confirm-latency histogram (an SDK is installed).
        self._timing = False
        self._next_sample = 0.0

    def opened(self) -> None:
        """The channel was opened on a transport: time confirms if an SDK is installed now."""
        self._timing = _metrics.timing_enabled()

    def fail_pending(self, error: BaseException) -> None:
        """The channel or its transport died: fail the call in flight, and every publish
        waiting for its confirm fails "outcome unknown"."""
        self._state.fail_waiter(error)
        if self._confirms.pending:
            _resolve(self._confirms.fail_all(error))

    def _give_up_confirms(self, handles: list[PublishHandle], timeout: float) -> None:
        """Stop waiting for these handles' confirms (see ConfirmTracker.give_up)."""
        _resolve(self._confirms.give_up(handles, timeout))

    def give_up_overdue(self, now: float) -> float | None:
        """The connection's deadline watcher: fail the publishes whose ``confirm_timeout``
        passed; return the earliest deadline still pending (see _confirm_deadlines)."""
        outcomes, earliest = self._confirms.overdue(now)
        if outcomes:
            _resolve(outcomes)
        return earliest

    def give_up_window(self, window: PublishWindow, timeout: float) -> None:
        self._give_up_confirms([h for h in self._confirms.pending.values() if h._window is window], timeout)

    # -------------------------------------------------- events from the reader

    def on_confirmed(self, ev: Confirmed) -> None:
        if self._timing and ev.ack:
            # Sampled: the oldest publish a Basic.Ack frame confirms, at most once per
            # _CONFIRM_SAMPLE_INTERVAL (under load a frame covers many publishes).
            now = time.monotonic()
            if now >= self._next_sample:
                first = self._confirms.oldest(ev.tags)
                if first is not None and first.sent_at:
                    self._next_sample = now + _CONFIRM_SAMPLE_INTERVAL
                    latency = now - first.sent_at
                    _metrics.record_confirm_latency(latency, first.routing_key)
        acked, failed = self._confirms.confirmed(ev)
        _resolve(zip(acked, repeat(True)))
        if failed:
            for _handle, outcome in failed:
                if isinstance(outcome, UnroutableError):
                    _metrics.bump(_metrics.stats.returned, _metrics.label(outcome.routing_key))
            _resolve(failed)

    def on_returned(self, ev: Returned) -> None:
        # Only on channels without confirms: nothing to tie it to.  Keep a bounded log.
        _metrics.bump(_metrics.stats.returned, _metrics.label(ev.routing_key))
        log.warning("unroutable message returned on channel %d: %r", ev.channel_id, ev)
        self._returns_without_confirm.append(ev)
        del self._returns_without_confirm[:-100]

    # ----------------------------------------------------------- publishing

    async def flush(self) -> None:
        link = self._link
        try:
            await link.flush()
        except ConnectionLostError:
            pass  # pending handles are failed with "outcome unknown" by the supervisor

    async def publish_nowait(
        self,
        body: bytes,
        exchange: str,
        routing_key: str,
        properties: BasicProperties | None,
        mandatory: bool,
        timeout: float | None,
        window: PublishWindow | None,
    ) -> PublishHandle:
        link = self._link
        state = self._state
        if not state.usable or not link.connected.is_set():
            # Recovering: wait for it, up to the caller's timeout.
            await self._ready_to_publish(timeout if timeout is not None else link.publish_timeout)
        if not link.unblocked.is_set():
            limit = timeout if timeout is not None else link.publish_timeout
            await link.wait_unblocked(limit)
            await self._ready_to_publish(limit)
        tag = link.publish(state.cid, exchange, routing_key, body, properties, mandatory)
        handle = PublishHandle(tag, exchange, routing_key, window, not tag)
        q = routing_key if routing_key in _KNOWN_QUEUES else _OTHER  # bounded labels, see _metrics
        _PUBLISHED[q] = _PUBLISHED.get(q, 0) + 1
        if tag:
            if self._timing:
                handle.sent_at = time.monotonic()
            self._confirms.pending[tag] = handle
        return handle

    async def _ready_to_publish(self, limit: float | None) -> None:
        """``_ready``, with its timeout reported as the publish's own."""
        try:
            await self._ready(limit)
        except PublishTimeoutError:
            raise
        except OperationTimeoutError as exc:
            raise PublishTimeoutError(str(exc)) from exc

    async def publish(
        self,
        body: bytes,
        *,
        exchange: str = "",
        routing_key: str = "",
        properties: BasicProperties | None = None,
        mandatory: bool = False,
        timeout: float | None = None,
        confirm_timeout: float | None = None,
    ) -> None:
        """Publish one message.  With confirms on, return once the broker acked it.

        Raises :class:`UnroutableError` (mandatory and no queue matched),
        :class:`PublishNackedError`, :class:`PublishOutcomeUnknownError` (the channel or
        connection died first, or no confirm came within ``confirm_timeout`` seconds of
        sending), or :class:`BlockedTimeoutError` / ``PublishTimeoutError`` (nothing was
        sent) when ``timeout`` (default: the connection's ``publish_timeout``) passes while
        the broker blocks publishers or the connection is recovering.  Without
        ``confirm_timeout`` the confirm is awaited until it comes or the connection is
        declared dead (missed heartbeats).  ``properties`` are never modified.
        """
        handle = await self.publish_nowait(body, exchange, routing_key, properties, mandatory, timeout, None)
        try:
            await self._link.flush()
        except ConnectionLostError as exc:
            if handle.tag:
                self._confirms.forget(handle.tag)
            raise PublishOutcomeUnknownError(f"connection failed while sending the publish: {exc}") from exc
        if handle.tag:
            if confirm_timeout is not None:
                # Bounded by the connection's one deadline watcher, not a timer of its own
                # (a handle already confirmed is no longer pending: the watcher never sees it).
                handle.confirm_by = at = time.monotonic() + confirm_timeout
                handle.confirm_timeout = confirm_timeout
                self._link.deadlines.watch(self, at)
            await handle.wait()  # the confirm, or the watcher gave up on it

    @property
    def unconfirmed(self) -> int:
        return len(self._confirms)

    async def confirm_select(self) -> None:
        await self._call(commands.Confirm.Select())
        self._state.set_confirms(True)
