"""A channel's consumers: the registry by consumer tag, and each consumer's feed.

A :class:`ConsumerFeed` is the channel's side of one :class:`~._consume.Consumer`: what
was asked (queue, tag, prefetch, no_ack, exclusive, arguments) and the bounded buffer the
reader pushes deliveries into.  The public :class:`~._consume.Consumer` iterates over its
feed; the channel, its recovery and the reader only ever handle feeds, through the
methods here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from . import _metrics, _park

if TYPE_CHECKING:
    from ._consume import IncomingMessage
    from ._link import ChannelLink

__all__ = ["ChannelView", "ConsumerFeed", "ConsumerRegistry"]


class ChannelView(Protocol):
    """What a feed reads of its channel (public attributes of Channel)."""

    @property
    def is_closed(self) -> bool: ...

    @property
    def prefetch(self) -> int | None: ...


class ConsumerFeed:
    """One consumer's parameters and delivery buffer (see the module docstring)."""

    __slots__ = (
        "__weakref__",
        "active",
        "arguments",
        "buffer",
        "buffered",
        "channel",
        "closed",
        "consumer_tag",
        "ended",
        "error",
        "exclusive",
        "half_window",
        "label",
        "link",
        "max_buffer",
        "no_ack",
        "prefetch",
        "queue",
        "resubscribe_scope",
        "unacked",
        "waiters",
        "waking",
    )

    def __init__(
        self,
        channel: ChannelView,
        link: ChannelLink,
        queue: str,
        *,
        consumer_tag: str,
        prefetch: int | None,
        no_ack: bool,
        exclusive: bool,
        arguments: dict[str, Any] | None,
        max_buffer: int,
    ) -> None:
        self.queue = queue
        self.consumer_tag = consumer_tag
        self.prefetch = prefetch
        #: Half the prefetch window: a settle made with this many deliveries still buffered
        #: is written at once (``IncomingMessage._batching``).
        self.half_window = (prefetch or 0) // 2
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.arguments = arguments
        #: Deliveries received and not yet handed out, at most ``max_buffer`` of them.
        self.buffer: deque[IncomingMessage] = deque()
        self.max_buffer = max_buffer
        #: Tasks parked in ``__anext__`` until a delivery or the end comes (see _park).
        self.waiters: deque[Any] = deque()
        #: A parked reader was woken and has not run yet (see wake_reader).
        self.waking = False
        #: No more deliveries come (``end``); the buffer still drains.
        self.ended = False
        #: Closed for reading (``close``): iteration ends at once.
        self.closed = False
        self.error: BaseException | None = None
        #: Registered at the broker (Basic.Consume-Ok) and not cancelled since.
        self.active = False
        #: Deliveries handed out or buffered and not settled yet.
        self.unacked = 0
        #: Deliveries buffered and not yet handed to the user (``len(buffer)``).
        self.buffered = 0
        #: Set while a task re-registers a consumer the broker cancelled.
        self.resubscribe_scope: anyio.CancelScope | None = None
        #: Metric label of its queue (fixed when the consumer starts).
        self.label = _metrics.label(queue)
        #: Its channel, for the gauges (its prefetch, and whether it closed).
        self.channel = channel
        #: The connection's verbs (a reader about to wait sends the batched acks first).
        self.link = link
        _metrics.consumers.add(self)

    def push(self, msg: IncomingMessage, settled: bool) -> bool:
        """Buffer a delivery; ``False`` when the buffer is full or the feed ended."""
        if self.ended or self.closed or len(self.buffer) >= self.max_buffer:
            return False
        self.buffer.append(msg)
        self.buffered += 1
        if not settled:
            self.unacked += 1
        if self.waiters and not self.waking:
            self.wake_reader()
        return True

    def wake_reader(self) -> None:
        """Wake the longest-parked reader, unless one woken earlier has not run yet.

        One wake-up in flight at a time, passed on like a baton: a woken reader that takes
        a delivery and leaves more buffered wakes the next parked one before it hands its
        own over (``Consumer.__anext__``).  So while deliveries wait in the buffer and
        readers are parked, one reader is always on its way; readers still busy with a
        job take buffered deliveries as they come back, and a burst no longer wakes one
        reader per delivery only for most of them to find the buffer already emptied.
        Every reader leaving its park clears ``waking`` (a wake-up lost to a cancellation
        then costs at most one spare wake-up later, never a stalled delivery)."""
        self.waking = True
        _park.wake_first(self.waiters)

    def end(self, error: BaseException | None) -> None:
        """No more deliveries: readers drain the buffer, then see ``error`` (or the end)."""
        if error is not None and self.error is None:
            self.error = error
        self.active = False
        self.ended = True
        _park.wake_all(self.waiters)

    def close(self) -> None:
        """Stop iteration at once (the consume block is left); the buffer must be dropped."""
        self.ended = self.closed = True
        _park.wake_all(self.waiters)

    def drop_buffered(self) -> list[IncomingMessage]:
        dropped = list(self.buffer)
        self.buffer.clear()
        self.buffered = 0
        return dropped

    def stop_resubscribe(self) -> None:
        if self.resubscribe_scope is not None:
            self.resubscribe_scope.cancel()
            self.resubscribe_scope = None

    def metrics_unacked(self) -> list[tuple[str, int, int]]:
        """``[(queue, unsettled deliveries, prefetch window or 0)]`` for the gauges."""
        if self.channel.is_closed:
            return []
        window = 0
        if self.active and not self.no_ack:
            window = self.prefetch if self.prefetch is not None else (self.channel.prefetch or 0)
        return [(self.label, self.unacked, window)]


class ConsumerRegistry:
    """The consumers of one channel, by consumer tag."""

    __slots__ = ("by_tag",)

    def __init__(self) -> None:
        self.by_tag: dict[str, ConsumerFeed] = {}

    def __iter__(self) -> Iterator[ConsumerFeed]:
        """A snapshot: the registry may change while the caller awaits."""
        return iter(list(self.by_tag.values()))

    def __len__(self) -> int:
        return len(self.by_tag)

    def __contains__(self, consumer_tag: object) -> bool:
        return consumer_tag in self.by_tag

    def add(self, feed: ConsumerFeed) -> None:
        self.by_tag[feed.consumer_tag] = feed

    def get(self, consumer_tag: str) -> ConsumerFeed | None:
        return self.by_tag.get(consumer_tag)

    def holds(self, feed: ConsumerFeed) -> bool:
        """Whether ``feed`` is still registered (its consume block is still open)."""
        return self.by_tag.get(feed.consumer_tag) is feed

    def remove(self, consumer_tag: str) -> ConsumerFeed | None:
        return self.by_tag.pop(consumer_tag, None)

    def consumes(self, queue: str) -> bool:
        return any(f.queue == queue for f in self.by_tag.values())

    def clear(self) -> None:
        self.by_tag.clear()
