"""Waits on a bounded ladder of TTL queues: the part the job layer and the event bus share.

Both make a message wait in a queue with a queue-wide TTL (``x-message-ttl``) that
dead-letters it back when it expires: the job layer's retry queues
(``ojs_anyio.jobs._retry``: ``RETRY_LADDER_MS``) and the event bus's wait queues
(``ojs_anyio.events._redelivery``: ``WAIT_LADDER_MS``).  One queue per delay keeps expiry
in arrival order; rounding every delay to a rung of a fixed series keeps the number of
queues bounded.  Each layer has its own series and its own error type; the rounding and
the queue arguments are here.

A leaf: pure (no I/O, no clock) and it imports nothing of ``ojs_anyio`` or ``ojs_codec``,
so both layers may use it without depending on each other (``lint-imports`` checks it).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["nearest_rung", "ttl_queue_arguments"]


def nearest_rung(
    rungs: Sequence[int],
    delay_ms: int,
    *,
    max_ms: int | None = None,
    error: Callable[[str], Exception] = ValueError,
) -> int:
    """Round ``delay_ms`` to the nearest of ``rungs`` (ascending, positive; ties go up).

    0 stays 0 (no wait at all); any positive delay gives a rung, so never 0.  With
    ``max_ms`` only rungs ``<= max_ms`` are candidates (a policy's cap stays a hard cap),
    unless ``max_ms`` is below the lowest rung, which is then used.  Delays above the top
    rung get the top rung.  Monotone: a longer delay never gets a shorter rung.  A
    ``delay_ms`` that is not an int ``>= 0`` raises ``error(text)``.
    """
    if isinstance(delay_ms, bool) or not isinstance(delay_ms, int) or delay_ms < 0:
        raise error(f"delay_ms must be a non-negative int, got {delay_ms!r}")
    if delay_ms == 0:
        return 0
    if max_ms is not None:
        rungs = rungs[: max(1, bisect_left(rungs, max_ms + 1))]
    i = bisect_left(rungs, delay_ms)
    if i == 0:
        return rungs[0]
    if i == len(rungs):
        return rungs[-1]
    lower, upper = rungs[i - 1], rungs[i]
    return lower if delay_ms - lower < upper - delay_ms else upper


def ttl_queue_arguments(
    ttl_ms: int, *, dead_letter_exchange: str, dead_letter_routing_key: str
) -> dict[str, Any]:
    """The arguments of a wait queue: every message expires after ``ttl_ms`` and is
    dead-lettered to ``dead_letter_exchange`` with ``dead_letter_routing_key``."""
    return {
        "x-dead-letter-exchange": dead_letter_exchange,
        "x-dead-letter-routing-key": dead_letter_routing_key,
        "x-message-ttl": ttl_ms,
    }
