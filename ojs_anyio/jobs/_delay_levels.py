"""Scheduled jobs without the plugin: the binary delay levels, as pure data (routing keys,
queue arguments, bindings).  Entity names are ``_topology.Names``; the ``Declarer``
declares them; ``_route.route`` picks the key.

A TTL queue delays correctly only if all its messages have the same TTL (001 §8.2), so
an arbitrary delay ``d`` (0 <= d <= :data:`MAX_DELAY_MS` = 2**32 - 1 ms, 49.7 days) is
spent in a chain of fixed-TTL queues: level ``k`` (k = 0..31) waits exactly 2**k ms, and
a message visits level ``k`` iff bit ``k`` of ``d`` is set.  The levels are shared by
every job queue of a prefix.  As in NServiceBus's RabbitMQ delayed delivery:

* The routing key carries the bits, most significant first, then the OJS queue name:
  ``b31.b30. ... .b1.b0.{queue}``, each ``b`` being ``0`` or ``1``
  (:func:`delay_routing_key`).  Routing keys are never rewritten by dead-lettering
  unless ``x-dead-letter-routing-key`` is set, and the level queues do not set it, so
  the key travels unchanged down the chain.
* Each level has its own topic exchange ``ojs.exchange.delay.{k:02d}`` and queue
  ``ojs.queue.delay.{k:02d}``.  A single shared exchange cannot work: the key never
  changes, so after level ``k`` the message would match level ``k`` again (a loop), and
  a key with several set bits would be copied into several level queues at once.  The
  exchange a message is in is the "program counter" of the chain.
* Exchange ``k`` has two bindings that test word ``31 - k`` of the key (bit ``k``):
  ``*.*. ... .1.#`` (``31 - k`` stars) to queue ``k``, and ``*.*. ... .0.#`` to the next
  exchange down (an exchange-to-exchange binding).  Exactly one of the two matches.
* Queue ``k`` has ``x-message-ttl = 2**k`` and dead-letters (key unchanged) to exchange
  ``k - 1``; level 0 and exchange 0's "bit clear" binding lead to the topic exchange
  ``ojs.exchange.delay.deliver``.
* Publishing goes to the top exchange ``ojs.exchange.delay.31``.  The message enters
  the queue of the highest set bit, and leaves the chain after exactly
  ``sum(2**k for set bits) == d`` ms, having visited each level at most once (so
  RabbitMQ's dead-letter cycle detection never fires).
* Last hop.  ``ojs.exchange.delay.deliver`` binds, for each job queue ``q``, the key
  ``*.*. ... .*.{q}`` (32 stars, then ``q``'s words; ``*`` is exactly one word, so a
  different queue name cannot match) to a per-job-queue landing queue
  ``ojs.queue.delay.deliver.{q}`` declared with ``x-message-ttl = 0``,
  ``x-dead-letter-exchange = ojs.exchange.direct`` and
  ``x-dead-letter-routing-key = {q}``.  A TTL-0 queue without consumers dead-letters
  at once, and this dead-lettering is the only broker step that can *replace* a routing
  key, so the message re-enters ``ojs.exchange.direct`` with routing key ``{q}``, the
  same way a PUSH does (001 §5.1), and reaches ``ojs.queue.{q}`` through the job queue's
  normal binding.  (An exchange-to-exchange binding from the delay exchanges into
  ``ojs.exchange.direct`` would keep the ``b31...b0.{q}`` key, which no direct binding
  matches.)  Declare the landing queue and its binding together with the job queue: a
  delayed message for a queue without one is dropped at the last hop.

Caveats for the runtime: classic-queue dead-lettering is at-most-once, so each hop can
lose a message if a broker node fails at that instant (quorum queues with at-least-once
dead-lettering, :meth:`QueueOptions.quorum`, redo such a hop instead); a job queue with
``x-overflow=reject-publish`` drops (not dead-letters) a delayed message that arrives
while it is full.  Messages that went through the levels (or a retry queue) carry
``x-death`` headers; strip them (:func:`strip_dead_letter_headers`) before republishing,
or RabbitMQ's cycle detection may drop the republished message when it expires from a
queue it already expired from.
"""

from __future__ import annotations

from typing import Any, Literal

from .._ladder import ttl_queue_arguments
from ._topology import DELAY_LEVELS, MAX_DELAY_MS, Binding, Names, check_delay, check_level, check_queue

__all__ = [
    "delay_deliver_binding",
    "delay_landing_queue_arguments",
    "delay_level_binding_key",
    "delay_level_bindings",
    "delay_level_queue_arguments",
    "delay_routing_key",
]


def delay_routing_key(delay_ms: int, queue: str) -> str:
    """``b31.b30. ... .b0.{queue}``: publish with this key to ``names.delay_entry_exchange``.

    Raises :class:`DelayOutOfRangeError` unless ``0 <= delay_ms <= MAX_DELAY_MS``.
    """
    check_delay(delay_ms, low=0, high=MAX_DELAY_MS, what="scheduling delay")
    return ".".join(format(delay_ms, f"0{DELAY_LEVELS}b")) + "." + check_queue(queue)


def delay_level_binding_key(level: int, bit: Literal["0", "1"]) -> str:
    """Topic pattern matching keys whose bit ``level`` is ``bit`` (word ``31 - level``)."""
    return "*." * (DELAY_LEVELS - 1 - check_level(level)) + bit + ".#"


def delay_level_bindings(names: Names) -> list[Binding]:
    """All bindings of the delay levels, from level 31 down to 0.

    For each level ``k``: queue ``k`` on exchange ``k`` when bit ``k`` is 1, and the next
    exchange down (``to_exchange=True``; the deliver exchange after level 0) when it is 0.
    """
    bindings: list[Binding] = []
    for k in reversed(range(DELAY_LEVELS)):
        exchange = names.delay_exchange(k)
        bindings.append(Binding(names.delay_queue(k), exchange, delay_level_binding_key(k, "1")))
        bindings.append(
            Binding(names.delay_next_exchange(k), exchange, delay_level_binding_key(k, "0"), to_exchange=True)
        )
    return bindings


def delay_level_queue_arguments(names: Names, level: int) -> dict[str, Any]:
    """Queue ``level`` waits 2**level ms, then dead-letters to the next exchange, key unchanged."""
    return {
        "x-message-ttl": 2 ** check_level(level),
        "x-dead-letter-exchange": names.delay_next_exchange(level),
    }


def delay_deliver_binding(names: Names, queue: str) -> Binding:
    """The landing queue of ``queue`` on the deliver exchange: 32 one-word bits, then ``queue``."""
    key = "*." * DELAY_LEVELS + queue
    return Binding(names.delay_landing_queue(queue), names.delay_deliver_exchange, key)


def delay_landing_queue_arguments(names: Names, queue: str) -> dict[str, Any]:
    """TTL 0, dead-letter to the direct exchange with routing key ``queue`` (the last hop)."""
    return ttl_queue_arguments(
        0, dead_letter_exchange=names.direct_exchange, dead_letter_routing_key=check_queue(queue)
    )
