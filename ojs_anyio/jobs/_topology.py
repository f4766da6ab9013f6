"""OJS AMQP topology as pure data: entity names, declaration arguments, bindings.

Nothing here talks to a broker; the runtime declares what these functions describe.

Names (OJS AMQP binding §4.1)
    :class:`Names` builds every exchange and queue name, with an optional tenant prefix
    (``Names("tenant1.").job_queue("email") == "tenant1.ojs.queue.email"``).  Because the
    spec nests per-queue entities under ``ojs.queue.`` (``ojs.queue.dlx.email``), an OJS
    queue whose first segment is ``dlx``, ``retry``, ``control``, ``delay`` or ``ojs`` would
    collide with another queue's entities (queue ``dlx.email`` *is* the dead-letter queue of
    ``email``), so such names are refused with :class:`TopologyError`.

Queue arguments
    Job queues get exactly ``x-dead-letter-exchange``, ``x-dead-letter-routing-key`` and
    ``x-max-priority: 10`` by default (as in the binding's §15.1 example, so that it runs
    unchanged beside us); length limits, overflow,
    TTL and the queue type are opt-in through :class:`QueueOptions`.  Retry queues get
    exactly the three arguments of the binding's §8.2.  Dead-letter and control queues
    are plain durable queues with no arguments, as the binding declares them, so another OJS
    implementation can declare them first or second without a 406; their limits are
    opt-in too.  Dead-letter retention is enforced by ``DeadLetters.prune``.

Priority (binding §6.1: 0-9, only when the job has one)
    :func:`priority_to_amqp` keeps 0..9 and clamps anything else into it.

Scheduled jobs without the plugin: binary delay levels
    Their exchanges, queues and bindings are ``_delay_levels.py`` (how the chain works is
    its docstring).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Final, NamedTuple

import msgspec

from .._ladder import ttl_queue_arguments
from .._queue_options import (
    MAX_TTL_MS,
    QueueOptions,
    dead_letter_queue_arguments,
    queue_arguments,
    quorum_queue_arguments,
)
from ._errors import ArgumentTypeError, DelayOutOfRangeError, TopologyError
from ._field_rules import known_queue

__all__ = [
    "check_delay",
    "check_level",
    "check_queue",
    "delay_level_exchanges",
    "base_exchanges",
    "delayed_plugin_exchange",
    "CONTROL_MAX_LENGTH",
    "CONTROL_MESSAGE_TTL_MS",
    "DEAD_LETTER_HEADERS",
    "DELAY_LEVELS",
    "DLQ_MAX_AGE_MS",
    "DEATH_NOTES_MAX_LENGTH",
    "DLQ_MAX_LENGTH",
    "MAX_DELAY_MS",
    "MAX_TTL_MS",
    "RESERVED_QUEUE_SEGMENTS",
    "Binding",
    "ExchangeSpec",
    "Names",
    "QueueOptions",
    "control_queue_arguments",
    "control_queue_binding",
    "delayed_exchange_arguments",
    "death_notes_queue_arguments",
    "delayed_queue_binding",
    "dlx_queue_arguments",
    "dlx_queue_binding",
    "exchanges",
    "job_queue_arguments",
    "job_queue_binding",
    "priority_to_amqp",
    "quorum_queue_arguments",
    "retry_queue_arguments",
    "retry_queue_binding",
    "strip_dead_letter_headers",
]

#: Largest ``x-message-ttl`` RabbitMQ accepts (its ``MAX_EXPIRY_TIMER``): 2**32 - 1 ms, 49.7 days.
#: Number of binary delay levels; level k waits 2**k ms.
DELAY_LEVELS: Final = 32
#: Longest delay the levels express: all 32 bits set, 2**32 - 1 ms (49.7 days).
MAX_DELAY_MS: Final = 2**DELAY_LEVELS - 1
#: Dead-letter retention defaults (OJS dead-letter §5.2): 180 days, 10,000 jobs.  Enforced by
#: ``DeadLetters.prune``, not by queue arguments (the spec declares the DLQ without any).
DLQ_MAX_AGE_MS: Final = 180 * 86_400_000
DLQ_MAX_LENGTH: Final = 10_000
#: Bound of ``ojs.dlx-notes.{q}`` (the reasons of Nacked jobs): the DLQ's retention count.
DEATH_NOTES_MAX_LENGTH: Final = DLQ_MAX_LENGTH
#: Suggested bounds for the durable control queue when an operator opts into limits
#: (``control_queue_arguments(message_ttl_ms=..., max_length=...)``): 1 h, 10,000.
CONTROL_MESSAGE_TTL_MS: Final = 3_600_000
CONTROL_MAX_LENGTH: Final = 10_000
#: First segments an OJS queue name may not have (they would collide with other entities).
RESERVED_QUEUE_SEGMENTS: Final = frozenset(
    {"dlx", "retry", "control", "delay", "ojs", "scheduler", "redelivered"}
)
#: Headers RabbitMQ adds when it dead-letters a message.
DEAD_LETTER_HEADERS: Final = frozenset(
    {
        "x-death",
        "x-first-death-queue",
        "x-first-death-reason",
        "x-first-death-exchange",
        "x-last-death-queue",
        "x-last-death-reason",
        "x-last-death-exchange",
    }
)

_RESERVED_OWNER: Final = {
    "dlx": "the dead-letter queue of queue {q!r}",
    "retry": "a retry delay queue of another queue (ojs.queue.retry.{{queue}}.{{delay_ms}})",
    "control": "the control queue of queue {q!r}",
    "delay": "one of the scheduling delay queues (ojs.queue.delay.*)",
    "redelivered": "the queue of redelivered jobs of queue {q!r}",
}
_MAX_NAME_BYTES: Final = 255  # AMQP shortstr


def _check_queue(queue: str) -> str:
    if not known_queue(queue):
        raise TopologyError(f"{queue!r} is not an OJS queue name ([a-z0-9][a-z0-9.-]*, at most 128 chars)")
    head, dot, rest = queue.partition(".")
    if dot and head in RESERVED_QUEUE_SEGMENTS:
        owner = _RESERVED_OWNER.get(head, "one of the binding's or this library's own entities")
        words = ", ".join(s + "." for s in sorted(RESERVED_QUEUE_SEGMENTS))
        raise TopologyError(
            f"queue name {queue!r} is refused: its AMQP queue 'ojs.queue.{queue}' would be "
            f"{owner.format(q=rest)}. OJS queue names may not begin with {words} "
            "(a narrowing of the OJS schema, which allows them); pick another name"
        )
    return queue


def _check_name(name: str) -> str:
    if len(name.encode()) > _MAX_NAME_BYTES:
        raise TopologyError(f"AMQP name {name[:60]!r}... is longer than {_MAX_NAME_BYTES} bytes")
    return name


@functools.lru_cache(maxsize=1024)
def _prefixed_name(prefix: str, tail: str) -> str:
    # Cached: the exchange names are looked up several times per push.
    return _check_name(f"{prefix}{tail}")


def _check_delay(delay_ms: int, *, low: int, high: int, what: str) -> int:
    if isinstance(delay_ms, bool) or not isinstance(delay_ms, int):
        raise DelayOutOfRangeError(f"{what} must be an int of milliseconds, got {delay_ms!r}")
    if not low <= delay_ms <= high:
        raise DelayOutOfRangeError(f"{what} {delay_ms} ms is outside {low}..{high} ms")
    return delay_ms


class Names(msgspec.Struct, frozen=True):
    """Every AMQP entity name of the OJS binding, under an optional tenant ``prefix``.

    The prefix is empty or ends with ``.`` (``"tenant1."``) and applies to exchanges and
    queues alike; routing keys stay the bare OJS queue name.  Methods taking an OJS queue
    name validate it (pattern, length, reserved first segments).
    """

    prefix: str = ""

    def __post_init__(self) -> None:
        if self.prefix and (not self.prefix.endswith(".") or any(c.isspace() for c in self.prefix)):
            raise TopologyError(f"prefix {self.prefix!r} must be empty or end with '.', without spaces")

    def _name(self, tail: str) -> str:
        return _prefixed_name(self.prefix, tail)

    # Exchanges (001 §4.1)
    @property
    def direct_exchange(self) -> str:
        return self._name("ojs.exchange.direct")

    @property
    def dlx_exchange(self) -> str:
        return self._name("ojs.exchange.dlx")

    @property
    def retry_exchange(self) -> str:
        return self._name("ojs.exchange.retry")

    @property
    def control_exchange(self) -> str:
        """This library's own broadcast exchange for control messages (direct; key = OJS queue).

        Workers consume ``ojs.queue.control.{q}`` competitively and relay each message here;
        every worker's exclusive queue is bound with key ``q``, so all of them see it.
        Nothing binds the durable control queue here, so a relayed copy never loops back."""
        return self._name("ojs.exchange.control")

    @property
    def delayed_exchange(self) -> str:
        """The delayed-message-exchange plugin's exchange (001 §8.4, §9.1.2)."""
        return self._name("ojs.exchange.delayed")

    # Per-queue entities (001 §4.1)
    def job_queue(self, queue: str) -> str:
        return self._name(f"ojs.queue.{_check_queue(queue)}")

    def dlx_queue(self, queue: str) -> str:
        return self._name(f"ojs.queue.dlx.{_check_queue(queue)}")

    def retry_queue(self, queue: str, delay_ms: int) -> str:
        _check_delay(delay_ms, low=1, high=MAX_TTL_MS, what="retry delay")
        return self._name(f"ojs.queue.retry.{_check_queue(queue)}.{delay_ms}")

    def retry_routing_key(self, queue: str, delay_ms: int) -> str:
        """``{q}.{delay_ms}`` on the retry exchange (001 §8.1, §15.3)."""
        _check_delay(delay_ms, low=1, high=MAX_TTL_MS, what="retry delay")
        return f"{_check_queue(queue)}.{delay_ms}"

    def control_queue(self, queue: str) -> str:
        return self._name(f"ojs.queue.control.{_check_queue(queue)}")

    def redelivered_queue(self, queue: str) -> str:
        """This library's own: jobs of ``ojs.queue.{q}`` that were delivered and never
        settled (their worker died), each run on its own (see the worker's WORKER_LOST)."""
        return self._name(f"ojs.queue.redelivered.{_check_queue(queue)}")

    def death_notes_queue(self, queue: str) -> str:
        """This library's own: why each job of ``ojs.queue.{q}`` that was Nacked into the
        DLQ died (one small note per death, keyed by job id; ``_death_notes.py``).  Outside
        ``ojs.queue.``, so no OJS queue name can collide with it, and bound to no exchange:
        only a publish to it by name (default exchange) reaches it."""
        return self._name(f"ojs.dlx-notes.{_check_queue(queue)}")

    def control_routing_key(self, queue: str) -> str:
        """CANCEL and BEAT go to the direct exchange with the control queue's name as key (001 §5)."""
        return self.control_queue(queue)

    # Binary delay levels (see the module docstring)
    def delay_exchange(self, level: int) -> str:
        return self._name(f"ojs.exchange.delay.{_check_level(level):02d}")

    def delay_queue(self, level: int) -> str:
        return self._name(f"ojs.queue.delay.{_check_level(level):02d}")

    @property
    def delay_entry_exchange(self) -> str:
        """Where scheduled jobs are published (the highest level)."""
        return self.delay_exchange(DELAY_LEVELS - 1)

    @property
    def delay_deliver_exchange(self) -> str:
        return self._name("ojs.exchange.delay.deliver")

    def delay_landing_queue(self, queue: str) -> str:
        return self._name(f"ojs.queue.delay.deliver.{_check_queue(queue)}")

    def delay_next_exchange(self, level: int) -> str:
        """Where level ``level`` sends a message on: the level below, or the deliver exchange."""
        return self.delay_exchange(level - 1) if _check_level(level) else self.delay_deliver_exchange


def _check_level(level: int) -> int:
    if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level < DELAY_LEVELS:
        raise TopologyError(f"delay level must be an int in 0..{DELAY_LEVELS - 1}, got {level!r}")
    return level


#: The name checks, for the modules that describe more entities (``_delay_levels.py``).
check_queue, check_level, check_delay = _check_queue, _check_level, _check_delay


class Binding(NamedTuple):
    """``Queue.Bind`` (or ``Exchange.Bind`` when ``to_exchange``) of ``destination`` to ``source``."""

    destination: str
    source: str
    routing_key: str
    to_exchange: bool = False


class ExchangeSpec(NamedTuple):
    """An ``Exchange.Declare``: durable, not auto-delete, not internal."""

    name: str
    type: str
    arguments: dict[str, Any]


def base_exchanges(names: Names) -> list[ExchangeSpec]:
    """The direct, DLX and retry exchanges (direct, 001 §4.2, AMQP-001/002)."""
    return [
        ExchangeSpec(names.direct_exchange, "direct", {}),
        ExchangeSpec(names.dlx_exchange, "direct", {}),
        ExchangeSpec(names.retry_exchange, "direct", {}),
    ]


def delay_level_exchanges(names: Names) -> list[ExchangeSpec]:
    """The 32 delay-level exchanges and the deliver exchange (topic; docs/scheduling.md)."""
    return [
        *(ExchangeSpec(names.delay_exchange(k), "topic", {}) for k in reversed(range(DELAY_LEVELS))),
        ExchangeSpec(names.delay_deliver_exchange, "topic", {}),
    ]


def delayed_plugin_exchange(names: Names) -> ExchangeSpec:
    """The plugin's ``x-delayed-message`` exchange (001 §9.1.2; detected, not assumed)."""
    return ExchangeSpec(names.delayed_exchange, "x-delayed-message", delayed_exchange_arguments())


def exchanges(names: Names, *, delayed_plugin: bool = False) -> list[ExchangeSpec]:
    """Every exchange of the binding, in declaration order: :func:`base_exchanges`,
    :func:`delay_level_exchanges`, and :func:`delayed_plugin_exchange` when ``delayed_plugin``."""
    specs = [*base_exchanges(names), *delay_level_exchanges(names)]
    if delayed_plugin:
        specs.append(delayed_plugin_exchange(names))
    return specs


def delayed_exchange_arguments() -> dict[str, Any]:
    """Arguments of the plugin exchange (001 §8.4)."""
    return {"x-delayed-type": "direct"}


def job_queue_arguments(names: Names, queue: str, options: QueueOptions | None = None) -> dict[str, Any]:
    """``Queue.Declare`` arguments of ``ojs.queue.{q}`` (durable, not exclusive, not auto-delete).

    By default exactly ``{"x-dead-letter-exchange": <dlx>, "x-dead-letter-routing-key": q,
    "x-max-priority": 10}`` (001 §7.2, §15.1).  Every other argument appears only when its
    option is set.
    """
    options = QueueOptions() if options is None else options
    return queue_arguments(
        options, dead_letter_exchange=names.dlx_exchange, dead_letter_routing_key=_check_queue(queue)
    )


def job_queue_binding(names: Names, queue: str) -> Binding:
    return Binding(names.job_queue(queue), names.direct_exchange, queue)


def dlx_queue_arguments(names: Names, queue: str, options: QueueOptions | None = None) -> dict[str, Any]:
    """Arguments of ``ojs.queue.dlx.{q}``: none by default (durable, as 001 §4.2 declares it).

    Opt-in only: ``x-max-length`` = ``dlq_max_length`` (the default overflow, drop-head,
    drops the oldest first) and ``x-message-ttl`` = ``dlq_max_age_ms`` when it fits
    RabbitMQ's TTL limit (:data:`MAX_TTL_MS`, 49.7 days).  ``x-queue-type`` follows the
    job queue's when the user opted into one (dead letters deserve the same durability).
    The OJS retention defaults (180 days, 10,000 jobs) are enforced by
    ``DeadLetters.prune``.
    """
    _check_queue(queue)
    return dead_letter_queue_arguments(QueueOptions() if options is None else options)


def death_notes_queue_arguments() -> dict[str, Any]:
    """Arguments of ``ojs.dlx-notes.{q}`` (durable classic queue): ``x-max-length`` =
    :data:`DEATH_NOTES_MAX_LENGTH` with ``x-overflow: drop-head``, so it keeps the latest
    notes and never refuses one.  No TTL: the DLQ's 180 days exceed RabbitMQ's TTL limit."""
    return {"x-max-length": DEATH_NOTES_MAX_LENGTH, "x-overflow": "drop-head"}


def dlx_queue_binding(names: Names, queue: str) -> Binding:
    return Binding(names.dlx_queue(queue), names.dlx_exchange, queue)


def retry_queue_arguments(names: Names, queue: str, delay_ms: int) -> dict[str, Any]:
    """Exactly the arguments of the binding's §8.2, nothing more, so that other OJS
    implementations declare equivalent retry queues."""
    _check_delay(delay_ms, low=1, high=MAX_TTL_MS, what="retry delay")
    return ttl_queue_arguments(
        delay_ms, dead_letter_exchange=names.direct_exchange, dead_letter_routing_key=_check_queue(queue)
    )


def retry_queue_binding(names: Names, queue: str, delay_ms: int) -> Binding:
    key = names.retry_routing_key(queue, delay_ms)
    return Binding(names.retry_queue(queue, delay_ms), names.retry_exchange, key)


def control_queue_arguments(
    *, message_ttl_ms: int | None = None, max_length: int | None = None
) -> dict[str, Any]:
    """Arguments of the durable ``ojs.queue.control.{q}``: none by default, as 001 gives none.

    Running workers drain it (they consume it competitively and relay each message to
    every worker of the queue), so it only fills while no worker runs.  Bounds are
    opt-in (:data:`CONTROL_MESSAGE_TTL_MS`, :data:`CONTROL_MAX_LENGTH` are suggestions)
    and make the queue incompatible with an implementation that declares it plainly.
    """
    args: dict[str, Any] = {}
    if message_ttl_ms is not None:
        args["x-message-ttl"] = _check_delay(message_ttl_ms, low=0, high=MAX_TTL_MS, what="control TTL")
    if max_length is not None:
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 0:
            raise TopologyError(f"max_length must be a non-negative int or None, got {max_length!r}")
        args["x-max-length"] = max_length
    return args


def control_queue_binding(names: Names, queue: str) -> Binding:
    """The durable control queue on the direct exchange, key = its own name (001 §5.6)."""
    return Binding(names.control_queue(queue), names.direct_exchange, names.control_routing_key(queue))


def delayed_queue_binding(names: Names, queue: str) -> Binding:
    """Job queue binding on the plugin exchange (publish with ``x-delay``, key = queue, 001 §9.1.2)."""
    return Binding(names.job_queue(queue), names.delayed_exchange, queue)


# Priority ------------------------------------------------------------------------------


def priority_to_amqp(ojs_priority: int) -> int:
    """The AMQP priority of an OJS priority: 0..9 kept as is, anything else clamped into it.

    001 §6.1 maps the job's priority to the AMQP ``priority`` property "(0-9), if
    specified": a job without a priority carries no property (RabbitMQ reads that as 0, so
    such jobs stay FIFO with other unprioritised jobs, ours or another client's).  Any
    integer is accepted; values above 9 become 9 and below 0 become 0.  Non-integers
    raise ``TypeError``.
    """
    if isinstance(ojs_priority, bool) or not isinstance(ojs_priority, int):
        raise ArgumentTypeError(f"OJS priority must be an int, got {ojs_priority!r}")
    return 0 if ojs_priority < 0 else 9 if ojs_priority > 9 else ojs_priority


def strip_dead_letter_headers(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    """A copy of ``headers`` without the ``x-death`` family RabbitMQ adds on dead-lettering.

    Use it when republishing a delivered job (retry, reschedule): a republished message
    that still carries ``x-death`` for a queue may be dropped by RabbitMQ as a dead-letter
    cycle when it expires from that queue again.
    """
    return {k: v for k, v in (headers or {}).items() if k not in DEAD_LETTER_HEADERS}
