"""Recovery policy: when and how often a lost connection is re-established."""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["DEFAULT_CONFIRM_TIMEOUT", "DEFAULT_PUBLISH_TIMEOUT", "NO_RECOVERY", "RecoveryPolicy"]

#: Seconds a call waits for a recovering (or blocked) connection, by default, in the
#: layers that turn recovery on for callers who must answer soon (``ojs_anyio.connect``,
#: ``events.connect``): the first two reconnect attempts of the default policy fit
#: (after about 1 s and 3 s), a web request does not hang.  ``docs/failure-handling.md``.
DEFAULT_PUBLISH_TIMEOUT = 5.0
#: Seconds a push or an event publish waits for the broker's confirm once it was sent, by
#: default in the same layers.  A healthy broker confirms within milliseconds.
DEFAULT_CONFIRM_TIMEOUT = 5.0


@dataclass(frozen=True, slots=True, kw_only=True)
class RecoveryPolicy:
    """Automatic reconnection.  Delay before attempt N: ``min(initial * multiplier**(N-1), max)``
    seconds, with ±``jitter`` (a fraction) randomisation.
    """

    enabled: bool = True
    initial_delay: float = 1.0
    multiplier: float = 2.0
    max_delay: float = 60.0
    jitter: float = 0.25
    #: Give up after this many failed attempts in a row (None: never).
    max_attempts: int | None = None
    #: Give up when the connection has been down this many seconds (None: never).
    deadline: float | None = None
    #: Delay before re-registering a consumer the broker cancelled.
    consumer_resubscribe_delay: float = 1.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        base = min(self.initial_delay * self.multiplier ** (attempt - 1), self.max_delay)
        if self.jitter:
            base *= 1 + rng.uniform(-self.jitter, self.jitter)
        return max(0.0, base)


NO_RECOVERY = RecoveryPolicy(enabled=False)
