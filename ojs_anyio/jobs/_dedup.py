"""Idempotency keys enforced by the broker: one small queue per key is the lock.

RabbitMQ cannot look a key up, but it can refuse a publish.  For a push with
``idempotency_key=k`` the client first claims ``k``:

* it declares ``{prefix}ojs.idempotency.{digest}`` (the digest is SHA-256 of the window and
  the key), a transient classic queue with ``x-max-length: 1``,
  ``x-overflow: reject-publish``, ``x-message-ttl: window`` and ``x-expires: window + 60 s``;
* it publishes one marker (the job id) to it through the default exchange, with a confirm.

The first push of ``k`` within the window gets its marker accepted and then publishes the
job.  Any later one, from any client on the broker (the queue is the shared state), has its
marker *nacked* by the broker, because the queue is full, and raises
:class:`DuplicateJobError` without publishing anything.  When the marker expires (after the
window) the key may be used again; the queue itself is deleted by the broker once nobody has
declared it for ``window + 60 s``.

If publishing the job fails after the claim, the claim is released (the marker purged), so
a retry of the push may go through.  Limits, documented in ``docs/jobs.md``:

* the lock queues are transient: a broker restart forgets every key;
* each key holds one queue for its window, and each keyed push costs two extra round trips
  (declare, confirmed marker publish);
* the window must fit RabbitMQ's TTL (at most 2**32-1 ms, about 49.7 days).
"""

from __future__ import annotations

import hashlib
from typing import Any, Final

from ojs_anyio.amqp import UsageError

from .. import amqp
from ._errors import PushError

__all__ = [
    "DEFAULT_IDEMPOTENCY_WINDOW",
    "DuplicateJobError",
    "claim",
    "lock_arguments",
    "lock_queue",
    "release",
]

#: How long a key is remembered unless ``idempotency_window`` says otherwise: 24 h.
DEFAULT_IDEMPOTENCY_WINDOW: Final = 86_400.0
#: RabbitMQ's largest message TTL.
MAX_WINDOW_MS: Final = 2**32 - 1
#: The lock queue outlives its marker by this much (then the broker deletes it).
EXPIRY_SLACK_MS: Final = 60_000


class DuplicateJobError(PushError):
    """A job with the same idempotency key was pushed within the key's window.

    Nothing was published.  ``key`` is the idempotency key."""

    code = "DUPLICATE"

    def __init__(self, message: str, *, job_id: str, queue: str, key: str) -> None:
        self.key = key
        super().__init__(message, job_id=job_id, queue=queue)


def lock_queue(prefix: str, key: str, window_ms: int) -> str:
    digest = hashlib.sha256(f"{window_ms}\n{key}".encode()).hexdigest()[:40]
    return f"{prefix}ojs.idempotency.{digest}"


def lock_arguments(window_ms: int) -> dict[str, Any]:
    return {
        "x-max-length": 1,
        "x-overflow": "reject-publish",
        "x-message-ttl": window_ms,
        "x-expires": window_ms + EXPIRY_SLACK_MS,
    }


def check_window(window_ms: int) -> None:
    if not 1 <= window_ms <= MAX_WINDOW_MS:
        raise UsageError(
            f"idempotency_window must be between 1 ms and {MAX_WINDOW_MS} ms (about 49.7 days, "
            f"RabbitMQ's longest message TTL), got {window_ms} ms"
        )


async def claim(ch: amqp.Channel, name: str, window_ms: int, *, key: str, job_id: str, queue: str) -> None:
    """Claim the key (see the module docstring); raise :class:`DuplicateJobError` if taken."""
    await ch.queue_declare(name, durable=False, arguments=lock_arguments(window_ms))
    try:
        await ch.publish(job_id.encode(), exchange="", routing_key=name, mandatory=True)
    except amqp.PublishNackedError:
        raise DuplicateJobError(
            f"job {job_id} was not pushed: idempotency key {key!r} was already used on this broker "
            f"within the last {window_ms / 1000:g} s (idempotency_window)",
            job_id=job_id,
            queue=queue,
            key=key,
        ) from None


async def release(ch: amqp.Channel, name: str) -> None:
    """Forget a claim whose job could not be published."""
    await ch.queue_purge(name)
