"""Idempotency keys enforced by the broker: one small queue per key is the lock.

RabbitMQ cannot look a key up, but it can refuse a publish.  For a push with
``idempotency_key=k`` the client first claims ``k``:

* it declares ``{prefix}ojs.idempotency.{digest}`` (the digest is SHA-256 of the key alone:
  the scope of a key is the key), a durable classic queue (RabbitMQ 3.13 and later deprecate
  transient non-exclusive queues) with ``x-max-length: 1``,
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

* a key pushed again with another window finds its lock declared with the first window's
  arguments: while the first marker lives the push is a duplicate; once it expired the lock
  is deleted and declared again with the new window (three more round trips, on the rare
  push that changes a key's window);
* each key holds one queue for its window, and each keyed push costs two extra round trips
  (declare, confirmed marker publish);
* the window must fit RabbitMQ's TTL (at most 2**32-1 ms, about 49.7 days).
"""

from __future__ import annotations

import hashlib
from typing import Any, Final

import anyio

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

    def __init__(
        self, message: str, *, job_id: str, queue: str, key: str, existing_job_id: str | None = None
    ) -> None:
        self.key = key
        #: The id of the job that holds the key, when the lock could be read (else None).
        self.existing_job_id = existing_job_id
        super().__init__(message, job_id=job_id, queue=queue)


def lock_queue(prefix: str, key: str, window_ms: int | None = None) -> str:
    """The lock queue of ``key``: its name depends on the key alone (the scope of a key is
    the key, whatever window each push gives).  ``window_ms`` is accepted and unused."""
    del window_ms
    digest = hashlib.sha256(key.encode()).hexdigest()[:40]
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


async def claim(
    conn: amqp.Connection,
    name: str,
    window_ms: int,
    *,
    key: str,
    job_id: str,
    queue: str,
    record_holder: bool = False,
) -> None:
    """Claim the key (see the module docstring); raise :class:`DuplicateJobError` if taken.

    On a channel of its own: a lock queue that exists with another window's arguments (the
    same key pushed with another ``idempotency_window``) makes the broker close the channel
    (406).  Then the lock is looked at passively: a marker in it means the key is taken; an
    empty one (its marker expired) is deleted and declared again with this window.

    The lock itself is never read: a marker taken with ``Basic.Get`` would not count
    against ``x-max-length`` while held, and a second claim could win meanwhile.  With
    ``record_holder`` (``unique`` with ``on_conflict="ignore"``), the winner also writes its
    job id to ``{lock}.holder``, and a refused claim reads the holder's id from there (the
    error's ``existing_job_id``; None when the winner did not record it or not yet)."""
    async with conn.channel(confirms=True) as ch:
        try:
            await ch.queue_declare(name, durable=True, arguments=lock_arguments(window_ms))
        except amqp.PreconditionFailed:  # declared with another window: this channel is gone
            refused = None
        else:
            refused = await _mark(ch, name, job_id)
    if refused is None:
        refused = await _claim_again(conn, name, window_ms, job_id)
    if refused:
        holder = await _read_holder(conn, name) if record_holder else None
        raise _duplicate(key, job_id, queue, window_ms, holder)
    if record_holder:
        await _write_holder(conn, name, window_ms, job_id)


async def _claim_again(conn: amqp.Connection, name: str, window_ms: int, job_id: str) -> bool:
    """The lock exists with another window: taken if it holds a marker, else replaced by one
    with this window.  Whether the claim was refused."""
    async with conn.channel(confirms=False) as ch:
        if (await ch.queue_declare(name, passive=True)).message_count:
            return True
    try:
        async with conn.channel(confirms=True) as ch:
            await ch.queue_delete(name, if_empty=True)
            await ch.queue_delete(holder_queue(name))
            await ch.queue_declare(name, durable=True, arguments=lock_arguments(window_ms))
            return await _mark(ch, name, job_id)
    except (amqp.PreconditionFailed, amqp.UnroutableError):
        # Another claim got there in between (its marker made the delete refuse, or it
        # deleted the queue this one was about to mark): it holds the key.
        return True


async def _mark(ch: amqp.Channel, name: str, job_id: str) -> bool:
    """Publish the marker; whether the broker refused it (the lock is held)."""
    try:
        await ch.publish(job_id.encode(), exchange="", routing_key=name, mandatory=True)
    except amqp.PublishNackedError:
        return True
    return False


def holder_queue(lock: str) -> str:
    """Where the winner of ``lock`` records its job id (``unique`` with ``ignore``)."""
    return f"{lock}.holder"


async def _write_holder(conn: amqp.Connection, name: str, window_ms: int, job_id: str) -> None:
    arguments = {"x-max-length": 1, "x-message-ttl": window_ms, "x-expires": window_ms + EXPIRY_SLACK_MS}
    try:
        async with conn.channel(confirms=True) as ch:
            await ch.queue_declare(holder_queue(name), durable=True, arguments=arguments)
            await ch.publish(job_id.encode(), exchange="", routing_key=holder_queue(name), mandatory=True)
    except amqp.PreconditionFailed:  # a record of another window, expiring: none this time
        return


async def _read_holder(conn: amqp.Connection, name: str) -> str | None:
    """The job id the winner recorded, or None.  The winner writes it just after its marker
    was accepted, so a claim refused at the same moment may find none yet: looked for for
    at most :data:`HOLDER_WAIT` seconds (the broker's state: there is no event to wait on)."""
    with anyio.move_on_after(HOLDER_WAIT):
        while True:
            found = await _get_holder(conn, name)
            if found is not None:
                return found
            await anyio.sleep(0.02)
    return None


#: How long a refused ``unique`` claim with ``on_conflict="ignore"`` looks for the winner's id.
HOLDER_WAIT: Final = 0.5


async def _get_holder(conn: amqp.Connection, name: str) -> str | None:
    try:
        async with conn.channel(confirms=False) as ch:
            record = await ch.get(holder_queue(name))
            if record is None:
                return None
            with anyio.CancelScope(shield=True):
                await record.reject(requeue=True)
    except amqp.ChannelLevelError:  # no record queue (404)
        return None
    try:
        return record.body.decode("utf-8") or None
    except UnicodeDecodeError:
        return None


def _duplicate(key: str, job_id: str, queue: str, window_ms: int, holder: str | None) -> DuplicateJobError:
    held = f" (by job {holder})" if holder else ""
    return DuplicateJobError(
        f"job {job_id} was not pushed: idempotency key {key!r} was already used on this broker{held} "
        f"within its window (this push's idempotency_window: {window_ms / 1000:g} s)",
        job_id=job_id,
        queue=queue,
        key=key,
        existing_job_id=holder,
    )


async def release(ch: amqp.Channel, name: str) -> None:
    """Forget a claim whose job could not be published (its holder record, if any, expires
    with the window; a later winner's record replaces it: ``x-max-length: 1``, drop-head)."""
    await ch.queue_purge(name)
