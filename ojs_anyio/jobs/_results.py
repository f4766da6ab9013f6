"""Job results over AMQP, without another datastore.

The pusher asks for a result with ``Client.push_for_result`` (or a typed handle's
``push_for_result``).  The job then carries ``reply_to`` = the client's result queue (OJS
AMQP binding §6.1 lists the property): an exclusive, auto-delete, server-named queue that
belongs to the client's connection, declared on first use.  When the job reaches its final
outcome (completed, or dead-lettered), the worker publishes one reply there through the
default exchange::

    {"job_id": "...", "state": "completed", "result": <the handler's return value>}
    {"job_id": "...", "state": "discarded", "error": {"code": ..., "type": ..., "message": ...}}

(``correlation_id`` on the job stays the job's own ``meta.correlation_id``; replies are
matched by ``job_id``.)  One reader task of the client's routes replies to the waiting
:class:`PendingResult`.

When the pusher has gone away (its connection closed, so its exclusive queue is gone), the
worker's reply is unroutable and the broker drops it: the reply is published without
``mandatory``, confirmed, and never retried, so nothing blocks the worker.  After a
reconnect the client's result queue gets a new name: results of jobs pushed before the cut
are lost the same way, and their :meth:`PendingResult.result` times out.  INFO still tells
the state (and the result, while the worker remembers it).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

import anyio
import msgspec

from .. import amqp
from .._pipeline import model_json
from ._durations import DurationLike, duration_seconds

if TYPE_CHECKING:
    from ._envelope import Job

__all__ = ["JobFailedError", "PendingResult", "ResultRouter", "encode_reply"]

log = logging.getLogger("ojs_anyio.results")

R = TypeVar("R")

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder(enc_hook=model_json)  # a pydantic result as its JSON form

#: Results awaited at once by one client (each holds an event and, later, a value).
MAX_PENDING_RESULTS = 100_000


class JobFailedError(Exception):
    """The job awaited with :meth:`PendingResult.result` was dead-lettered.

    ``code`` is the OJS error code, ``error_type`` and ``message`` the final failure's.
    """

    def __init__(self, job_id: str, code: str | None, error_type: str | None, message: str | None) -> None:
        self.job_id, self.code, self.error_type, self.message = job_id, code, error_type, message
        detail = f"{error_type or ''} {message or ''}".strip()
        super().__init__(f"job {job_id} failed: {code or 'ERROR'}: {detail}")


@dataclass(slots=True)
class _Slot:
    event: anyio.Event
    reply: dict[str, Any] | None = None


class PendingResult(Generic[R]):
    """A pushed job whose result can be awaited: ``await pending.result(timeout=30)``."""

    __slots__ = ("__weakref__", "_convert", "_router", "_slot", "job")

    def __init__(
        self, job: Job, router: ResultRouter, slot: _Slot, convert: Callable[[Any], R] | None = None
    ) -> None:
        self.job = job
        self._router = router
        self._slot = slot
        self._convert = convert

    @property
    def id(self) -> str:
        return self.job.id

    def done(self) -> bool:
        return self._slot.reply is not None

    async def result(self, timeout: DurationLike | None = None) -> R:
        """The handler's return value once the job completed.

        Raises :class:`JobFailedError` if it was dead-lettered, :class:`TimeoutError` when
        ``timeout`` (seconds, ``timedelta`` or ISO-8601) passes first; it can be awaited again.
        """
        seconds = None if timeout is None else duration_seconds(timeout, "timeout")
        if self._slot.reply is None:
            with anyio.fail_after(seconds):
                await self._slot.event.wait()
        reply = self._slot.reply
        assert reply is not None
        if isinstance(reply.get("result_error"), str):
            raise JobFailedError(self.job.id, "RESULT_NOT_JSON", "TypeError", reply["result_error"])
        if reply.get("state") != "completed":
            raw = reply.get("error")
            error: dict[str, Any] = raw if isinstance(raw, dict) else {}
            raise JobFailedError(self.job.id, error.get("code"), error.get("type"), error.get("message"))
        value = reply.get("result")
        if self._convert is not None:
            return self._convert(value)
        return cast(R, value)


class ResultRouter:
    """The client's result queue and the reader that routes replies to their waiters."""

    def __init__(self, conn: amqp.Connection, tg: anyio.abc.TaskGroup) -> None:
        self._conn = conn
        self._tg = tg
        self._slots: dict[str, _Slot] = {}
        self._queue: amqp.QueueInfo | None = None
        self._lock = anyio.Lock()
        self._failed: BaseException | None = None

    @property
    def queue_name(self) -> str | None:
        """The result queue's name, once declared."""
        return self._queue.name if self._queue is not None else None

    async def reply_to(self) -> str:
        """The result queue's current name (declared, and its reader started, on first use)."""
        if self._failed is not None:
            raise self._failed
        if self._queue is None:
            async with self._lock:
                if self._queue is None:
                    self._queue = await self._tg.start(self._read)
        return self._queue.name

    def expect(self, job: Job, convert: Callable[[Any], R] | None = None) -> PendingResult[R]:
        if len(self._slots) >= MAX_PENDING_RESULTS:
            raise RuntimeError(
                f"{MAX_PENDING_RESULTS} results are awaited already; await some before pushing more"
            )
        slot = _Slot(anyio.Event())
        self._slots[job.id] = slot
        pending: PendingResult[R] = PendingResult(job, self, slot, convert)
        # A handle dropped unread frees its slot (a late reply then finds no one: dropped).
        weakref.finalize(pending, self._slots.pop, job.id, None)
        return pending

    def forget(self, job_id: str) -> None:
        self._slots.pop(job_id, None)

    async def _read(self, *, task_status: anyio.abc.TaskStatus[amqp.QueueInfo]) -> None:
        started = False
        try:
            async with self._conn.channel(confirms=False) as ch:
                info = await ch.queue_declare("", exclusive=True, auto_delete=True)
                async with ch.consume(info.name, no_ack=True, max_buffer=1024) as replies:
                    task_status.started(info)
                    started = True
                    async for msg in replies:
                        if msg.malformed is not None:  # consumed with no_ack: nothing to settle
                            log.warning("ignoring a job result reply: malformed message: %s", msg.malformed)
                            continue
                        self._deliver(msg.body)
        except amqp.AMQPError as exc:
            if not started:
                raise  # to the push that asked for the queue (not sent); the next one tries again
            # Surface to every waiter and the next push_for_result, never only a log line.
            self._failed = exc
            self._queue = None
            log.error("result queue lost: %s; awaited results will time out", exc)
            raise

    def _deliver(self, body: bytes) -> None:
        try:
            reply = _decoder.decode(body)
        except msgspec.DecodeError:
            log.warning("malformed job result reply: %r", body[:200])
            return
        if not isinstance(reply, dict) or not isinstance(reply.get("job_id"), str):
            log.warning("job result reply without a job_id: %r", body[:200])
            return
        slot = self._slots.get(reply["job_id"])
        if slot is None or slot.reply is not None:
            return  # nobody waits for it any more, or a duplicate (a redelivered job ran twice)
        slot.reply = reply
        slot.event.set()


def encode_reply(
    job_id: str, state: str, *, result: Any = None, error: dict[str, Any] | None = None
) -> bytes:
    """The body the worker publishes to ``reply_to``.  A result JSON cannot carry becomes an
    error reply (the job itself still completed)."""
    body: dict[str, Any] = {"job_id": job_id, "state": state}
    if error is not None:
        body["error"] = error
    if state == "completed":
        body["result"] = result
        try:
            return _encoder.encode(body)
        except (TypeError, ValueError, OverflowError) as exc:
            body = {
                "job_id": job_id,
                "state": "completed",
                "result": None,
                "result_error": f"the handler's return value is not JSON: {exc}",
            }
    return _encoder.encode(body)
