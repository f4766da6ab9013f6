"""What a push's failure means: sent or not, and how long it may wait before sending.

Every push (``push``, ``push_job``, ``push_for_result``, ``push_batch``, the typed handles,
``SyncClient``) ends in one of these, decided here by :func:`push_error`:

* the broker confirmed the job: no error;
* the broker said no to the sent job: :class:`UnroutableJobError`, :class:`QueueFullError`;
* the job was sent and no confirm came (the connection died, or ``confirm_timeout``
  passed): :class:`PushOutcomeUnknownError`, the job may be enqueued;
* the job was never sent (the connection was not usable within ``publish_timeout``, or it
  failed before the job was written): :class:`PushNotSentError`, the job is not enqueued.

What a push does before its job is sent (declaring its queue, opening the channel, the
result queue, waiting for a recovering connection) is bounded by one
:class:`SendDeadline`, the connection's ``publish_timeout`` from the moment the push finds
the connection away; the wait for the confirm by the client's ``confirm_timeout``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import anyio

from .. import amqp
from ._envelope import Job
from ._errors import PushError, PushNotSentError, PushOutcomeUnknownError, QueueFullError, UnroutableJobError

__all__ = ["SEND_FAILURES", "UNAVAILABLE", "SendDeadline", "before_sending", "push_error"]

#: The connection could not be used: raised only before anything is written (a wait for a
#: recovering or blocked connection that timed out, a connection or channel gone).
UNAVAILABLE: tuple[type[amqp.AMQPError], ...] = (
    amqp.OperationTimeoutError,
    amqp.ConnectionLostError,
    amqp.ConnectionClosedError,
    amqp.ChannelClosedError,
    amqp.ConnectionLevelError,
)
#: What ``Channel.publish`` (and a publish window) raise for a job: its outcome, or UNAVAILABLE.
SEND_FAILURES: tuple[type[amqp.AMQPError], ...] = (amqp.PublishError, *UNAVAILABLE)


class SendDeadline:
    """The bound on a push's waits before its job is sent: the connection's
    ``publish_timeout`` (None: none), counted from the first moment the push finds the
    connection away (nothing to wait for before that; no clock read on the hot path), until
    :meth:`restart`."""

    __slots__ = ("conn", "ends_at", "limit")

    def __init__(self, conn: amqp.Connection) -> None:
        self.conn = conn
        self.limit = conn.publish_timeout
        #: When the bound passes (``anyio.current_time()``); None until a wait started it.
        self.ends_at: float | None = None

    def restart(self) -> None:
        self.ends_at = None

    def left(self) -> float | None:
        """Seconds left (0 once passed), or None without a limit."""
        if self.limit is None:
            return None
        if self.ends_at is None:
            if self.conn.is_open:
                return self.limit  # not started: a wait from now on gets all of it
            self.ends_at = anyio.current_time() + self.limit
        return max(0.0, self.ends_at - anyio.current_time())


_UNBOUNDED = nullcontext()


def before_sending(deadline: SendDeadline) -> AbstractContextManager[None]:
    """Run a push's preparation (declarations, channel, result queue) within ``deadline``;
    when it passes, raise :class:`amqp.OperationTimeoutError` (nothing of the job was sent).

    Armed only while the connection is away (what the bound is for): on an open connection
    the block runs as it is, and a loss during it fails the call in flight at once.
    """
    if deadline.limit is None or deadline.conn.is_open:
        return _UNBOUNDED
    return _bounded(deadline)


@contextmanager
def _bounded(deadline: SendDeadline) -> Iterator[None]:
    with anyio.move_on_after(deadline.left()) as scope:
        yield
    if scope.cancelled_caught:
        raise amqp.OperationTimeoutError(
            f"the connection was not usable within publish_timeout ({deadline.limit:.3g}s)"
        )


def push_error(exc: BaseException, job: Job) -> PushError:
    """The push error for ``exc``: a :data:`SEND_FAILURES` error (or a PushError, returned
    as it is) raised while pushing ``job``.  Its ``__cause__`` is ``exc``."""
    if isinstance(exc, PushError):
        return exc
    error = _push_error(exc, job)
    error.__cause__ = exc
    return error


def _push_error(exc: BaseException, job: Job) -> PushError:
    kind, text = _meaning(exc, job)
    return kind(text, job_id=job.id, queue=job.queue)


def _meaning(exc: BaseException, job: Job) -> tuple[type[PushError], str]:
    where = f"queue {job.queue!r}"
    if isinstance(exc, amqp.UnroutableError):
        return UnroutableJobError, (
            f"job {job.id} could not be routed to {where}: {exc.reply_text} "
            f"(is ojs.queue.{job.queue} declared and bound?)"
        )
    if isinstance(exc, amqp.PublishNackedError):
        # A nack carries no reason.  Besides a full queue, a quorum queue nacks while it
        # has no leader (an election after a node failure, or its majority down).
        return QueueFullError, (
            f"QUEUE_FULL: {where} rejected job {job.id} (full with x-overflow=reject-publish, "
            "or a quorum queue without a leader at that moment); it was not enqueued"
        )
    if isinstance(exc, amqp.PublishOutcomeUnknownError):
        return PushOutcomeUnknownError, f"outcome of job {job.id} on {where} is unknown: {exc}"
    # A publish timeout (PublishTimeoutError) or any UNAVAILABLE error: nothing was written.
    return PushNotSentError, f"job {job.id} was not sent to {where}, so it is not enqueued: {exc}"
