"""The broker's clocks: the event loop's (default) and a virtual one that moves only when told."""

from __future__ import annotations

import heapq
import itertools

import anyio

__all__ = ["Clock", "LoopClock", "VirtualClock"]


class Clock:
    """What the memory broker reads the time from (seconds, monotonic)."""

    #: True when time moves only through :meth:`VirtualClock.advance`.
    virtual: bool = False

    def now(self) -> float:
        raise NotImplementedError


class LoopClock(Clock):
    """The running event loop's clock (``anyio.current_time()``)."""

    def now(self) -> float:
        return anyio.current_time()


class VirtualClock(Clock):
    """Time that stands still until a test advances it (see ``MemoryBroker.advance``)."""

    virtual = True

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._wakeups: list[tuple[float, int, anyio.Event]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    def wake_at(self, when: float, event: anyio.Event) -> None:
        """Set ``event`` once the clock reaches ``when`` (at once if it already has)."""
        if when <= self._now:
            event.set()
        else:
            heapq.heappush(self._wakeups, (when, next(self._seq), event))

    def next_wakeup(self) -> float | None:
        return self._wakeups[0][0] if self._wakeups else None

    def _set(self, when: float) -> None:
        if when > self._now:
            self._now = when
        while self._wakeups and self._wakeups[0][0] <= self._now:
            heapq.heappop(self._wakeups)[2].set()
