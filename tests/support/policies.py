"""Recovery policies the tests share."""

from __future__ import annotations

from ojs_anyio import amqp

__all__ = ["FAST"]

#: Fast recovery: backoff in milliseconds, so a client is back a few tens of ms after a fault ends.
FAST = amqp.RecoveryPolicy(
    initial_delay=0.01,
    multiplier=2.0,
    max_delay=0.1,
    jitter=0.1,
    consumer_resubscribe_delay=0.05,
)
