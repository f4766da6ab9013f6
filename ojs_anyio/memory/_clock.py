"""The broker's clocks: the event loop's (default) and a virtual one that moves only when told."""

from __future__ import annotations

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

    def now(self) -> float:
        return self._now

    def _set(self, when: float) -> None:
        if when > self._now:
            self._now = when
