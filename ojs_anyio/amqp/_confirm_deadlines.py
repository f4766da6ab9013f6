"""When a publish stops waiting for its confirm: one watcher per connection, not a timer per publish.

``Channel.publish(confirm_timeout=…)`` must not wait for ever for a confirm that does not
come (a broker gone silent, before the heartbeats notice).  Arming a timer per publish
costs a timer handle and a heap push and pop on asyncio, and a cancel scope on Trio, for
every message, though the confirm nearly always comes first.  Instead each publish writes
its deadline on its handle (:attr:`PublishHandle.confirm_by`, on the ``time.monotonic``
clock) and tells :class:`ConfirmDeadlines`, which only has to wake its watcher when that
deadline comes before the one the watcher is armed for: with one ``confirm_timeout`` per
client the deadlines come in publish order, so that is only when the watcher is idle.

The watcher (:meth:`ConfirmDeadlines.run`, a task of the connection's transport) sleeps
until the earliest deadline it knows, then asks each publisher that has deadlines to give
up on its overdue publishes (each fails "outcome unknown", at its own deadline) and to
name its next one.  A publish confirmed in time costs nothing more.  While no transport
runs there is nothing to watch: a transport's loss fails every pending confirm at once.
"""

from __future__ import annotations

import math
import time
from typing import Any, NoReturn, Protocol

from . import _park

__all__ = ["ConfirmDeadlines", "HasDeadlines"]


class HasDeadlines(Protocol):
    """A publisher as the watcher sees it (``Publisher`` is one)."""

    def give_up_overdue(self, now: float) -> float | None:
        """Fail the publishes whose confirm deadline is ``now`` or earlier; return the
        earliest deadline still pending, or None when none is."""
        ...


class ConfirmDeadlines:
    """The confirm deadlines of one connection's publishers (see the module docstring)."""

    __slots__ = ("_waiter", "armed", "publishers")

    def __init__(self) -> None:
        #: The watcher, while it sleeps (see _park).
        self._waiter: Any = None
        #: The deadline the watcher wakes up at (``inf``: none, it sleeps until woken).
        self.armed = math.inf
        #: The publishers that may have deadlines pending.
        self.publishers: set[HasDeadlines] = set()

    def watch(self, publisher: HasDeadlines, at: float) -> None:
        """A publish of ``publisher`` must be confirmed by ``at`` (``time.monotonic()``)."""
        self.publishers.add(publisher)
        if at < self.armed:
            self.armed = at
            _park.wake(self)

    def check(self) -> float:
        """Give up on every overdue publish now; return the earliest deadline left (``inf``: none)."""
        now = time.monotonic()
        earliest = math.inf
        publishers = self.publishers
        for publisher in list(publishers):
            at = publisher.give_up_overdue(now)
            if at is None:
                publishers.discard(publisher)
            elif at < earliest:
                earliest = at
        self.armed = earliest
        return earliest

    async def run(self) -> NoReturn:
        """The watcher: check, sleep until the earliest deadline or until :meth:`watch`
        brings an earlier one, and again (until cancelled with its transport)."""
        while True:
            earliest = self.check()
            await _park.wait(self, None if earliest == math.inf else max(0.0, earliest - time.monotonic()))
