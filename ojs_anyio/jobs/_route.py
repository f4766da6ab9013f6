"""Where a job goes: ``route(job, now, scheduler, names) -> Route``.  Pure: no I/O, the
clock passed in.

A route says which exchange and routing key the job is published with, the extra headers
its message carries, whether the publish is mandatory, and the entities that must exist
first (:attr:`Route.needs`, which the client's :class:`~ojs_anyio.jobs._declarer.Declarer`
ensures).  ``Client.push`` is route → ``declarer.ensure(route.needs)`` → publish.

* A job due now (no ``scheduled_at``, or one not in the future) goes to
  ``ojs.exchange.direct`` with its queue as the key, and needs its job queue.
* A job due later, with the binary delay levels (``scheduler="levels"``, the default),
  goes to the delay-entry exchange with a key that spells the delay's bits
  (``docs/scheduling.md``), and needs the delay levels and its queue's landing queue.
* With the delayed-message plugin (``"plugin"``), it goes to ``ojs.exchange.delayed``
  with ``x-delay`` (001 §9.1.2), not mandatory (the plugin's exchange routes only after the
  delay, so it would return every mandatory message), and needs its queue's binding there.
* A delay beyond what RabbitMQ can hold raises :class:`DelayOutOfRangeError`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal

from ._delay_levels import delay_routing_key
from ._envelope import Job, parse_timestamp
from ._errors import DelayOutOfRangeError
from ._topology import MAX_DELAY_MS, Names

__all__ = [
    "H_DELAY", "SCHEDULE_IMMEDIATE_MS", "DelayedBinding", "JobQueue", "Landing", "Need", "Route", "route",
]  # fmt: skip

#: A scheduled job due in this many milliseconds or less goes straight to its queue.
#: Zero: a job must never run before its ``scheduled_at``.
SCHEDULE_IMMEDIATE_MS: Final = 0
#: The plugin's delay header (001 §9.1.2), in milliseconds.
H_DELAY: Final = "x-delay"

Scheduler = Literal["levels", "plugin"]


@dataclass(frozen=True, slots=True)
class JobQueue:
    """``ojs.queue.{q}``, its dead-letter queue, the base exchanges and their bindings."""

    queue: str


@dataclass(frozen=True, slots=True)
class Landing:
    """The binary delay levels, and ``queue``'s landing queue with its binding."""

    queue: str


@dataclass(frozen=True, slots=True)
class DelayedBinding:
    """``ojs.queue.{q}`` bound to the plugin's ``ojs.exchange.delayed`` with key ``q``."""

    queue: str


Need = JobQueue | Landing | DelayedBinding

_NO_HEADERS: Final[Mapping[str, Any]] = {}


@dataclass(frozen=True, slots=True)
class Route:
    exchange: str
    routing_key: str
    #: Headers the message carries besides the job's own (``x-delay``).
    headers: Mapping[str, Any]
    #: What must exist before the publish, in declaration order.
    needs: tuple[Need, ...]
    mandatory: bool = True
    #: Milliseconds until the job is due (0: now).
    delay_ms: int = 0


def delay_ms(due: datetime, now: datetime) -> int:
    """Milliseconds from ``now`` to ``due``, rounded up (a job never runs early)."""
    return math.ceil((due - now).total_seconds() * 1000)


def route(job: Job, now: datetime, scheduler: Scheduler, names: Names) -> Route:
    """Where ``job`` goes when published at ``now`` (see the module docstring)."""
    queue = job.queue
    if isinstance(job.scheduled_at, str):
        wait = delay_ms(parse_timestamp(job.scheduled_at), now)
        if wait > SCHEDULE_IMMEDIATE_MS:
            if wait > MAX_DELAY_MS:
                raise DelayOutOfRangeError(
                    f"job {job.id}: scheduled_at {job.scheduled_at} is {wait} ms away, beyond the "
                    f"longest delay RabbitMQ can hold, {MAX_DELAY_MS} ms (2**32-1 ms, about 49.7 days); "
                    "nothing was published"
                )
            if scheduler == "plugin":
                needs: tuple[Need, ...] = (JobQueue(queue), DelayedBinding(queue))
                headers = {H_DELAY: wait}
                return Route(names.delayed_exchange, queue, headers, needs, mandatory=False, delay_ms=wait)
            key = delay_routing_key(wait, queue)
            needs = (JobQueue(queue), Landing(queue))
            return Route(names.delay_entry_exchange, key, _NO_HEADERS, needs, delay_ms=wait)
    found = _due_now.get((names, queue))
    if found is None:
        if len(_due_now) >= 1024:
            _due_now.clear()
        found = _due_now[names, queue] = Route(names.direct_exchange, queue, _NO_HEADERS, (JobQueue(queue),))
    return found


# The route of a job due now depends on its queue and the names alone (a few per
# application): made once each, and the same (immutable) object every push.
_due_now: dict[tuple[Names, str], Route] = {}
