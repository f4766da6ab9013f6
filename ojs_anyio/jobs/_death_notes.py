"""Death notes: why a job that the worker Nacked into the dead-letter queue died.

A ``Basic.Nack`` (OJS AMQP binding §5.5, AMQP-009) cannot add headers, so a job that dies
in the default mode reaches ``ojs.queue.dlx.{q}`` with only RabbitMQ's ``x-death`` reason
(``rejected``).  That includes every death on a first attempt: a non-retryable error,
invalid arguments, an unknown type, ``max_attempts=1``.  So, before the Nack, the worker
publishes a small **death note** (:class:`DeathNote`: job id, type, attempt, error code and
message, time) to ``ojs.dlx-notes.{q}``:

* a queue only this library declares and reads, outside ``ojs.queue.``, bound to no
  exchange (published through the default exchange by its name), so no job consumer, ours
  or a foreign one, ever receives a note, and the job itself is never copied anywhere;
* durable, classic, bounded: ``x-max-length`` = the DLQ's retention count with
  ``x-overflow: drop-head`` (the oldest notes go first, a note is never refused);
* published mandatory and confirmed *before* the Nack.  A crash in between leaves a note
  and a job that is redelivered (and dies again, with a second note): never a dead job
  without its note.  If the note cannot be published, the job is Nacked all the same (the
  reason is then in the worker's log only, as before): a note never keeps a job alive.

Readers (:meth:`DeadLetters.peek`, hence ``ojs-anyio dlq peek`` and the dashboard) join a
dead job without annotation headers to the latest note with its id.  Notes are read with
``Basic.Get`` and put back, like the DLQ itself; anything in the queue that is not a note
(hostile or foreign input) is skipped, never removed.  Only the death path pays for this
(one confirmed publish); the success path does not touch it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import anyio
import msgspec

from .. import amqp
from ._declarer import Declarer
from ._envelope import format_timestamp
from ._errors import TopologyConflictError
from ._topology import DEATH_NOTES_MAX_LENGTH, Names

__all__ = ["NOTE_TYPE", "DeathNote", "read_notes", "write_note"]

log = logging.getLogger("ojs_anyio.worker")

#: The AMQP ``type`` property of a death note.
NOTE_TYPE = "ojs.death-note"
#: Longest a reader waits for the notes it counted (another reader may hold some).
READ_BOUND = 10.0
#: Longest error message a note carries (as the annotated copy's header).
_MESSAGE_CHARS = 1000


class DeathNote(msgspec.Struct, frozen=True, kw_only=True):
    """One job's death, as the worker that Nacked it wrote it down."""

    id: str
    code: str
    message: str
    attempt: int = 1
    type: str | None = None
    died_at: str | None = None


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(DeathNote)

Publish = Callable[..., Awaitable[amqp.Republished | None]]


async def write_note(
    ch: amqp.Channel,
    publish: Publish,
    *,
    declarer: Declarer,
    names: Names,
    queue: str,
    job_id: str,
    job_type: str | None,
    attempt: int,
    code: str,
    message: str,
) -> bool | None:
    """Publish the death note of ``job_id`` (see the module docstring) on ``ch`` with
    ``publish`` (the worker's :func:`amqp.republish`).  True when confirmed, False when it
    could not be (logged), None when the worker's grace period ran out first."""
    name = names.death_notes_queue(queue)
    try:
        await declarer.declare_death_notes_queue(queue)
    except TopologyConflictError as exc:  # declared by someone else, otherwise
        log.warning("job %s: no death note: %s", job_id, exc)
        return False
    note = DeathNote(
        id=job_id, code=code, message=message[:_MESSAGE_CHARS], attempt=attempt, type=job_type,
        died_at=format_timestamp(datetime.now(UTC)),
    )  # fmt: skip
    props = amqp.BasicProperties(
        content_type="application/json", delivery_mode=2, message_id=job_id, type=NOTE_TYPE
    )
    published = await publish(
        ch, _encoder.encode(note), exchange="", routing_key=name, properties=props, mandatory=True,
        redeclare=lambda: declarer.declare_death_notes_queue(queue, again=True),
    )  # fmt: skip
    if published is None:
        return None
    if not published.confirmed:
        log.warning(
            "job %s: its death note was not accepted by %r (%s); the reason is in this log only",
            job_id, name, published.reason,
        )  # fmt: skip
        return False
    return True


def _read(msg: amqp.IncomingMessage) -> DeathNote | None:
    if msg.malformed or amqp.property_text(msg.properties.type) != NOTE_TYPE:
        return None
    try:
        return _decoder.decode(msg.body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


async def read_notes(conn: amqp.Connection, names: Names, queue: str, ids: set[str]) -> dict[str, DeathNote]:
    """The latest note of each job id in ``ids``, from ``ojs.dlx-notes.{queue}`` (all left
    in place).  Empty when the queue does not exist (no worker ever Nacked a job of it).

    The notes present are consumed with a prefetch window as large as their count (at most
    :data:`DEATH_NOTES_MAX_LENGTH`, the queue's bound), never acked, and the channel is
    closed: the broker puts every one back where it was, marked redelivered.  One stream
    instead of a ``Basic.Get`` round trip per note.  A reader racing this one for the same
    notes can only make it stop early, after :data:`READ_BOUND` seconds at most."""
    if not ids:
        return {}
    name = names.death_notes_queue(queue)
    latest: dict[str, DeathNote] = {}
    try:
        async with conn.channel(confirms=False) as ch:
            present = min((await ch.queue_declare(name, passive=True)).message_count, DEATH_NOTES_MAX_LENGTH)
            if present == 0:
                return {}
            seen = 0
            with anyio.move_on_after(READ_BOUND):
                async with ch.consume(name, prefetch=present) as deliveries:
                    async for msg in deliveries:  # oldest first: a later death of the same id wins
                        note = _read(msg)
                        if note is not None and note.id in ids:
                            latest[note.id] = note
                        seen += 1
                        if seen >= present:
                            break
    except amqp.NotFound:
        return {}
    return latest
