"""A channel's state, with its transitions in one place.

Every delivery a channel hands out carries the channel's *generation*; settling it checks
that the generation is still current (else :class:`StaleDeliveryError`: the broker
redelivers it).  The generation moves, and the per-generation settling state is reset, on
exactly four transitions, all here:

* :meth:`ChannelState.opened`: Channel.Open went out on a new wire id;
* :meth:`ChannelState.lost`: the transport died, recovery will re-open the channel;
* :meth:`ChannelState.closed`: closed for good;
* :meth:`ChannelState.recovered`: Basic.Recover made the broker redeliver everything.

:meth:`~ChannelState.closing` (Channel.Close went out) and
:meth:`~ChannelState.failed_to_open` only stop it being ``usable``: the flag every publish
reads, kept by the transitions.

The one synchronous call in flight waits on a :class:`Waiter`: :meth:`ChannelState.begin_call`
makes it, :meth:`ChannelState.take_waiter` hands it over (once) to whoever completes or
fails it.  The settings recovery restores on a new channel (confirms, QoS prefetch,
transaction mode) are kept here too, changed by the methods that select them.  Every
attribute is written in this file only (``tests/amqp/test_amqp_structure.py`` checks it);
the parts of a channel (``_calls.py``, ``_publish.py``, ``_consume.py``, ``_recovery.py``)
share this one object.  No I/O, no awaiting.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

import anyio

__all__ = ["ChannelState", "Settle", "Waiter"]

#: At most this many runs of settled tags wait above the floor (``ChannelState.above``;
#: one more run per unsettled delivery between them, so the prefetch window bounds them);
#: past it, a tag is not recorded, the floor stops below it, and acks of the generation
#: are no longer folded (each is its own frame).
ABOVE_MAX = 4096


class Waiter:
    """The reply (or the error) one synchronous call waits for."""

    __slots__ = ("error", "event", "result")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.result: Any = None
        self.error: BaseException | None = None

    def complete(self, result: Any) -> None:
        self.result = result
        self.event.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.event.set()


class Settle:
    """What settling a delivery found (see :meth:`ChannelState.settle`)."""

    OK = 0
    ALREADY = 1
    STALE = 2


class ChannelState:
    """The state of one logical channel (it outlives its wire ids across recoveries)."""

    __slots__ = (
        "__weakref__",
        "above",
        "cid",
        "close_waiter",
        "closed",
        "closed_error",
        "confirms",
        "floor",
        "generation",
        "get_unacked",
        "internal",
        "opened_once",
        "openings",
        "prefetch",
        "recovering",
        "settled_upto",
        "transactional",
        "tx_opening",
        "usable",
        "waiter",
    )

    def __init__(self, *, confirms: bool = True, prefetch: int | None = None, internal: bool = False) -> None:
        #: The current wire id; 0 while the channel is not open on a transport.
        self.cid = 0
        #: Moves on every transition below: deliveries of an earlier one are stale.
        self.generation = 0
        #: Times the channel was opened on a transport (a transaction belongs to one).
        self.openings = 0
        #: Highest delivery tag settled with multiple=True in this generation.
        self.settled_upto = 0
        #: Every delivery of this generation with a tag up to ``floor`` is settled (acked,
        #: nacked or rejected by a frame queued or sent, or taken with no_ack); the settled
        #: tags above it wait in ``above``, as ascending disjoint runs ``[first, last]``
        #: (a delivery held for long costs one run, not one entry per later delivery).  An
        #: ack up to the floor may fold the ack queued before it into one ``multiple=True``
        #: frame (``AMQPConnection.ack``'s ``fold``).
        self.floor = 0
        self.above: list[list[int]] = []
        #: Unsettled Basic.Get deliveries of this generation, by queue label (for the gauge).
        self.get_unacked: dict[str, int] = {}
        self.opened_once = False
        self.closed = False
        self.closed_error: BaseException | None = None
        #: The synchronous call in flight, and the wait for our Close-Ok (while closing).
        self.waiter: Waiter | None = None
        self.close_waiter: Waiter | None = None
        #: Open on the current transport and not closing (kept by the transitions; read
        #: on every publish).
        self.usable = False
        #: A private channel of recovery's (never recovered itself; a broker close only
        #: resets it, as ``recovering`` does for the others).
        self.internal = internal
        #: While recovery re-opens it, a broker close only resets it.
        self.recovering = internal
        #: What recovery selects again on a new channel: confirms, the channel's QoS
        #: prefetch, the transaction mode (and the opening the transaction belongs to).
        self.confirms = confirms
        self.prefetch = prefetch
        self.transactional = False
        self.tx_opening = 0

    # ---------------------------------------------------------- transitions

    def _new_generation(self, *, drop_gets: bool) -> None:
        self.generation += 1
        self.settled_upto = 0
        self.floor = 0
        self.above = []
        if drop_gets:
            self.get_unacked = {}

    def opened(self, cid: int) -> None:
        """Channel.Open went out as wire id ``cid``."""
        self.cid = cid
        self.usable = not self.closed and self.close_waiter is None
        self.openings += 1
        self._new_generation(drop_gets=False)

    def lost(self) -> None:
        """The transport died; the channel waits to be re-opened."""
        self.cid = 0
        self.usable = False
        self._new_generation(drop_gets=True)

    def closed_for_good(self, error: BaseException) -> int:
        """Closed for good; returns the wire id it had (0: none), or -1 if it was closed already."""
        if self.closed:
            return -1
        self.closed = True
        self.usable = False
        if self.closed_error is None:
            self.closed_error = error
        cid, self.cid = self.cid, 0
        self._new_generation(drop_gets=True)
        return cid

    def recovered(self) -> None:
        """Basic.Recover: the broker redelivers every unacked delivery (their tags are void)."""
        self._new_generation(drop_gets=False)

    def failed_to_open(self) -> None:
        """Opening it failed (or was cancelled): it is closed, without an error to report."""
        self.closed = True
        self.usable = False

    def closing(self) -> Waiter:
        """Channel.Close went out: the call in flight is the wait for Close-Ok from now on
        (the caller failed the one it interrupted)."""
        waiter = self.close_waiter = self.waiter = Waiter()
        self.usable = False
        return waiter

    def open_once(self) -> bool:
        """The first open of this channel object (``False``: it was opened before)."""
        first, self.opened_once = not self.opened_once, True
        return first

    def broker_closed(self, error: BaseException) -> None:
        """The broker closed the channel with ``error`` (the error reported from now on)."""
        self.closed_error = error

    def begin_recovery(self) -> None:
        self.recovering = True

    def end_recovery(self) -> None:
        self.recovering = self.internal

    # ------------------------------------------------------------- settings

    def set_confirms(self, confirms: bool) -> None:
        """Confirm.Select went out (``True``), or the channel is made with(out) confirms."""
        self.confirms = confirms

    def set_transactional(self, transactional: bool) -> None:
        self.transactional = transactional

    def set_prefetch(self, prefetch: int | None) -> None:
        self.prefetch = prefetch

    def select_tx(self) -> None:
        """Tx.Select: the transaction belongs to the current opening."""
        self.transactional = True
        self.tx_opening = self.openings

    def transaction_lost(self) -> bool:
        """Whether a reconnect rolled the current transaction back; the next one starts
        on the channel as it is now."""
        lost = self.transactional and self.tx_opening != self.openings
        self.tx_opening = self.openings
        return lost

    # ------------------------------------------------------------- the call

    def begin_call(self) -> Waiter:
        """The synchronous call about to be sent waits on this (none may be in flight)."""
        waiter = self.waiter = Waiter()
        return waiter

    def drop_waiter(self, waiter: Waiter) -> None:
        """The call did not go out (or expects no reply): stop waiting on ``waiter``."""
        if self.waiter is waiter:
            self.waiter = None

    def take_waiter(self) -> Waiter | None:
        """The waiting call, now owned by the caller (who completes or fails it)."""
        waiter, self.waiter = self.waiter, None
        return waiter

    def fail_waiter(self, error: BaseException) -> None:
        """Fail the waiting call, if any."""
        waiter, self.waiter = self.waiter, None
        if waiter is not None:
            waiter.fail(error)

    # -------------------------------------------------------------- queries

    def got(self, label: str) -> None:
        """An unsettled Basic.Get delivery from the queue labelled ``label``."""
        self.get_unacked[label] = self.get_unacked.get(label, 0) + 1

    def settled_got(self, label: str) -> None:
        """One of those was settled (in the generation it came in)."""
        if self.get_unacked:
            self.get_unacked[label] = self.get_unacked.get(label, 1) - 1

    def metrics_unacked(self) -> list[tuple[str, int, int]]:
        """Unsettled Basic.Get deliveries by queue, for the unacked gauge (no prefetch)."""
        if self.closed:
            return []
        return [(queue, n, 0) for queue, n in self.get_unacked.items()]

    def is_stale(self, generation: int) -> bool:
        return generation != self.generation or self.cid == 0

    def settle(self, tag: int, generation: int, multiple: bool) -> int:
        """Check settling delivery ``tag`` of ``generation``; record a ``multiple`` one.

        Returns :attr:`Settle.ALREADY` when an earlier multiple ack/nack on this channel
        covered it, :attr:`Settle.STALE` when its channel closed or was recovered since,
        else :attr:`Settle.OK`."""
        current = generation == self.generation
        if current and tag <= self.settled_upto:
            return Settle.ALREADY
        if not current or self.cid == 0:
            return Settle.STALE
        if multiple:
            if tag > self.settled_upto:
                # Delivery tags grow per channel: this settles every earlier delivery too.
                self.settled_upto = tag
            if tag > self.floor:
                # The runs below tag go (none holds tag itself: it is being settled now).
                del self.above[: bisect_left(self.above, [tag + 1])]
                self.floor = tag - 1
        if tag == self.floor + 1 and not self.above:
            self.floor = tag  # settled_tag, inline: in order, the hot path
        else:
            self.settled_tag(tag)
        return Settle.OK

    def settled_tag(self, tag: int) -> None:
        """Delivery ``tag`` of this generation is settled, or never needed a settle (no_ack):
        move ``floor`` up past it and the run of settled tags right above it, or record it
        in ``above``."""
        floor = self.floor
        if tag <= floor:
            return
        above = self.above
        if tag == floor + 1:
            if above and above[0][0] == tag + 1:
                tag = above.pop(0)[1]
            self.floor = tag
            return
        if above and above[-1][1] + 1 == tag:  # the usual: it extends the highest run
            above[-1][1] = tag
            return
        i = bisect_left(above, [tag + 1])  # the first run that starts after tag
        before = above[i - 1] if i else None
        after = above[i] if i < len(above) else None
        if before is not None and before[1] >= tag:
            return  # recorded already
        if before is not None and before[1] + 1 == tag:
            before[1] = tag
            if after is not None and after[0] == tag + 1:
                before[1] = after[1]
                del above[i]
        elif after is not None and after[0] == tag + 1:
            after[0] = tag
        elif len(above) < ABOVE_MAX:
            above.insert(i, [tag, tag])
