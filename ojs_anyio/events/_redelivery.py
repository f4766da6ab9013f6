"""Redelivery with backoff (the policy of Orb's publisher/subscriber) on a bounded ladder.

Pure: no I/O, no clock.

The policy
    A handler that raises rejects the event.  The first rejection redelivers it at once;
    rejection ``n`` (``n >= 2``) waits ``initial_interval * multiplier**(n-1)``, capped at
    ``max_interval``.  With Orb's example (2 s, x1.5) the waits are 0, 3 s, 4.5 s, 6.75 s...
    After ``max_attempts`` redeliveries the next rejection sends the event to the
    subscriber's dead-letter queue.  So the handler runs at most ``max_attempts + 1`` times.

The ladder
    A wait happens in a queue with a queue-wide TTL (``x-message-ttl``), one queue per
    delay, so every message in it expires in arrival order and none waits behind a longer
    one.  (A single wait queue with per-message expirations, as Orb has, expires messages
    only at its head: a 30 s wait at the head holds back a 3 s wait behind it.)  To keep
    the number of wait queues bounded whatever the policies, each delay is rounded to the
    nearest rung of :data:`WAIT_LADDER_MS`, a Renard R10 series (ten steps per decade,
    x1.25 apart) from 100 ms to 24 h, so rounding moves a delay by at most 12 %.  A
    subscriber queue has at most :data:`MAX_WAIT_QUEUES` wait queues; a given policy uses
    at most ``max_attempts - 1`` of them.  ``max_interval`` stays a hard cap: only rungs
    at or below it are used (unless it is below the lowest rung).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from .._ladder import nearest_rung
from .._misuse import UsageError

__all__ = ["MAX_WAIT_QUEUES", "WAIT_LADDER_MS", "RedeliveryPolicy", "ladder_ms"]

_R10: Final = (100, 125, 160, 200, 250, 315, 400, 500, 630, 800)
#: The rungs, in milliseconds: 100, 125, 160, ... 63 000 000, 80 000 000, then 24 h.
WAIT_LADDER_MS: Final[tuple[int, ...]] = (
    *(r * 10**decade for decade in range(6) for r in _R10),
    86_400_000,
)
#: The most wait queues one subscriber queue can have.
MAX_WAIT_QUEUES: Final = len(WAIT_LADDER_MS)


def ladder_ms(delay_ms: int, *, max_ms: int | None = None) -> int:
    """Round ``delay_ms`` to the nearest rung (ties go up); 0 stays 0 (no wait at all).

    With ``max_ms`` only rungs ``<= max_ms`` are candidates, unless ``max_ms`` is below the
    lowest rung.  Monotone: a longer delay never gets a shorter rung.
    """
    return nearest_rung(WAIT_LADDER_MS, delay_ms, max_ms=max_ms)


@dataclass(frozen=True, slots=True, kw_only=True)
class RedeliveryPolicy:
    """How a rejected event comes back (seconds).  See the module docstring.

    ``max_attempts`` counts redeliveries, as Orb's ``mq-redelivery-max-attempts`` does:
    0 sends the first rejection straight to the dead-letter queue.
    """

    initial_interval: float = 2.0
    multiplier: float = 1.5
    max_interval: float = 30.0
    max_attempts: int = 10

    def __post_init__(self) -> None:
        if not (self.initial_interval > 0 and math.isfinite(self.initial_interval)):
            raise UsageError(f"initial_interval must be > 0 seconds, got {self.initial_interval!r}")
        if not (self.multiplier >= 1 and math.isfinite(self.multiplier)):
            raise UsageError(f"multiplier must be >= 1, got {self.multiplier!r}")
        if not (self.max_interval >= self.initial_interval and math.isfinite(self.max_interval)):
            raise UsageError(
                "max_interval must be >= initial_interval "
                f"({self.max_interval!r} < {self.initial_interval!r})"
            )
        attempts = self.max_attempts
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 0:
            raise UsageError(f"max_attempts must be an int >= 0, got {self.max_attempts!r}")

    def exact_delay(self, rejection: int) -> float:
        """The policy's wait in seconds after rejection number ``rejection`` (1-based)."""
        if rejection < 1:
            raise UsageError(f"rejection must be >= 1, got {rejection!r}")
        if rejection == 1:
            return 0.0
        growth = (rejection - 1) * math.log(self.multiplier)
        if growth >= math.log(self.max_interval / self.initial_interval):
            return self.max_interval
        return min(self.initial_interval * math.exp(growth), self.max_interval)

    def wait_ms(self, rejection: int) -> int:
        """The wait actually applied (the rung of the ladder) after rejection ``rejection``."""
        exact = round(self.exact_delay(rejection) * 1000)
        return ladder_ms(exact, max_ms=round(self.max_interval * 1000))

    def exhausted(self, rejection: int) -> bool:
        """Whether rejection number ``rejection`` goes to the dead-letter queue."""
        return rejection > self.max_attempts
