"""Publishes that settle a delivery: retried through transient refusals, then given up.

A consumer that moves a delivery somewhere else (a job's retry, an annotated dead letter,
a relayed control message, an event's redelivery, a dead letter put back in its queue)
publishes a copy, waits for the broker's confirm, and only then acks the original.  When
the broker refuses the copy, that is rarely a verdict on the message:

* a quorum queue nacks publishes while it elects a new leader (seconds, after a node
  stopped), and any queue nacks when the broker hits an internal error;
* a publish cannot be written while the connection recovers or the broker blocks
  publishers (``PublishTimeoutError``: nothing was sent).

So :func:`republish` publishes the copy again with a bounded, jittered backoff
(:class:`RepublishPolicy`) and reports one of three results.  It never decides the
message's fate; the caller does, by the rule in ``docs/failure-handling.md``
("Transient refusals are not final outcomes"):

* **confirmed** — settle the original as planned (ack);
* **refused for good** (:attr:`Republished.final`) — the copy can never be accepted as it
  is: it does not fit in a frame, its route matches no queue even after the caller
  re-declared it, or the caller's ``refused_for_good`` check says the target is full by
  its own ``x-overflow``.  The caller may then give the message its final outcome;
* **gave up** — still refused when the policy's attempts or deadline ran out.  The caller
  leaves the original for the broker to deliver again (``Basic.Nack`` with requeue, or no
  settlement before the channel closes); the message's fate is not changed.

A publish whose outcome is unknown (the channel or the connection died before the
confirm: :class:`PublishOutcomeUnknownError`, :class:`ChannelClosedError`,
:class:`ConnectionLostError`) is not retried here: the exception propagates.  The original
delivery was on a channel that is gone too, so the broker redelivers it, and the copy, if
it was routed, makes a duplicate, never a loss.

**What a copy keeps.** The body and properties, less two: ``user_id`` (RabbitMQ checks it
against the *publishing* connection's user, so a copy of another client's validated
message would close our channel with 406) and ``expiration`` (RabbitMQ itself removes it
when it dead-letters a message: on a copy it would cut a delay queue's wait short, or
expire a dead letter out of its queue).
"""

from __future__ import annotations

import math
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio
import msgspec

from ojs_codec import BasicProperties, UsageError

from ._channel import Channel
from ._errors import PublishError, PublishNackedError, PublishTimeoutError, UnroutableError

__all__ = ["DEFAULT_REPUBLISH_POLICY", "RepublishPolicy", "Republished", "copy_properties", "republish"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RepublishPolicy:
    """How long a settling publish keeps trying through transient refusals (seconds).

    Attempt ``n`` (from 2) waits ``initial_delay * multiplier**(n-2)``, capped at
    ``max_delay``, with jitter (x0.5-1.0) so that many consumers refused at once do not
    come back at once.  At most ``attempts`` publishes, none started after ``deadline``
    seconds from the first.  The defaults ride out a quorum queue's leader election on a
    loaded machine (about 11 s of waits in all).
    """

    attempts: int = 10
    initial_delay: float = 0.1
    multiplier: float = 2.0
    max_delay: float = 2.0
    deadline: float = 15.0

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int) or self.attempts < 1:
            raise UsageError(f"RepublishPolicy.attempts must be an int >= 1, got {self.attempts!r}")
        for name in ("initial_delay", "max_delay", "deadline"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
                raise UsageError(f"RepublishPolicy.{name} must be a finite number >= 0, got {value!r}")
        if isinstance(self.multiplier, bool) or not isinstance(self.multiplier, int | float) or not (
            1 <= self.multiplier < math.inf
        ):
            raise UsageError(f"RepublishPolicy.multiplier must be a finite number >= 1: {self.multiplier!r}")

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """The wait before publish number ``attempt`` (2 or more), jittered."""
        exact = min(self.initial_delay * self.multiplier ** max(attempt - 2, 0), self.max_delay)
        return exact * (0.5 + 0.5 * (rng or random).random())


DEFAULT_REPUBLISH_POLICY = RepublishPolicy()


@dataclass(frozen=True, slots=True)
class Republished:
    """What :func:`republish` made of it: confirmed, refused for good, or given up."""

    #: The broker confirmed the copy.
    confirmed: bool
    #: The copy can never be accepted as it is (see the module docstring).
    final: bool = False
    #: Why it was not confirmed: the last refusal, in words.
    reason: str = ""
    #: Publishes made.
    attempts: int = 1
    #: The last refusal (``None`` when confirmed, or for a check's own verdict).
    error: BaseException | None = None

    @property
    def gave_up(self) -> bool:
        """Refused every time, but never for good: leave the original to the broker."""
        return not self.confirmed and not self.final


def copy_properties(properties: BasicProperties | None) -> BasicProperties | None:
    """``properties`` as a copy may carry them: without ``user_id`` and ``expiration``."""
    if properties is None or (properties.user_id is None and properties.expiration is None):
        return properties
    return msgspec.structs.replace(properties, user_id=None, expiration=None)


async def republish(
    ch: Channel,
    body: bytes,
    *,
    exchange: str,
    routing_key: str,
    properties: BasicProperties | None,
    mandatory: bool = False,
    policy: RepublishPolicy = DEFAULT_REPUBLISH_POLICY,
    redeclare: Callable[[], Awaitable[None]] | None = None,
    refused_for_good: Callable[[PublishNackedError], Awaitable[str | None]] | None = None,
    rng: random.Random | None = None,
) -> Republished:
    """Publish a settling copy on ``ch`` (confirms on), through transient refusals.

    ``properties`` pass through :func:`copy_properties`.  ``redeclare`` is awaited once,
    after the first ``Basic.Return`` (the route's queue may have been deleted since it was
    declared); a second return is final.  ``refused_for_good`` is asked after each nack
    and returns a reason when the nack is the target's own, lasting refusal (a queue full
    by its ``x-overflow``).  Outcome-unknown errors propagate (see the module docstring).
    """
    props = copy_properties(properties)
    started = anyio.current_time()
    redeclared = False
    attempt = 0
    last: PublishError | None = None
    while True:
        attempt += 1
        remaining = policy.deadline - (anyio.current_time() - started)
        try:
            await ch.publish(
                body,
                exchange=exchange,
                routing_key=routing_key,
                properties=props,
                mandatory=mandatory,
                timeout=max(remaining, 0.0),
            )
        except UsageError as exc:  # cannot be encoded (a content header beyond frame_max)
            reason = f"the copy cannot be sent: {exc}"
            return Republished(False, final=True, reason=reason, attempts=attempt, error=exc)
        except UnroutableError as exc:
            if redeclare is None or redeclared:
                return Republished(False, final=True, reason=str(exc), attempts=attempt, error=exc)
            redeclared = True
            await redeclare()
            continue  # at once: the route exists again
        except PublishNackedError as exc:
            if refused_for_good is not None:
                why = await refused_for_good(exc)
                if why is not None:
                    return Republished(False, final=True, reason=why, attempts=attempt, error=exc)
            last = exc
        except PublishTimeoutError as exc:  # not written: recovering or blocked
            last = exc
        else:
            return Republished(True, attempts=attempt)
        wait = policy.delay(attempt + 1, rng)
        if attempt >= policy.attempts or anyio.current_time() - started + wait > policy.deadline:
            elapsed = anyio.current_time() - started
            reason = f"{last} (refused {attempt} times over {elapsed:.1f}s)"
            return Republished(False, reason=reason, attempts=attempt, error=last)
        await anyio.sleep(wait)
