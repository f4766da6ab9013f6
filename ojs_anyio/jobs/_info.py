"""The client's side of the control plane (OJS AMQP binding §5.6-5.8): CANCEL, BEAT and
INFO, and INFO's reply queue.  The workers' side is ``_control.py`` (which defines the
message kinds both use).  :class:`ClientControl` reaches the client through
:class:`ControlSender` (public names only).
"""

from __future__ import annotations

import logging
import uuid
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import msgspec

from .. import amqp
from ._control import CONTROL_CANCEL, CONTROL_HEARTBEAT, CONTROL_INFO
from ._declarer import Declarer
from ._durations import DurationLike, duration_seconds
from ._envelope import ErrorInfo, check_job_id, error_info
from ._renamed import warn_renamed
from ._topology import Names

__all__ = ["ClientControl", "ControlSender", "JobInfo"]

log = logging.getLogger("ojs_anyio.jobs")

_json = msgspec.json.Encoder()
_json_decode = msgspec.json.Decoder()


@dataclass(frozen=True, slots=True)
class JobInfo:
    """A worker's answer to INFO; ``state == "unknown"`` when no worker answered in time."""

    #: The job's id (``job_id`` is a deprecated alias).
    id: str
    state: str
    attempt: int | None = None
    worker_id: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    #: The OJS error object of the job's last failed attempt (type, message, backtrace).
    error: ErrorInfo | None = None
    #: An active job: a CANCEL reached the worker running it.
    cancel_requested: bool = False
    #: An active job: whether a CANCEL can stop its handler.  False for a plain ``def``
    #: handler, which runs in a thread: it runs to completion whatever CANCEL says.  None
    #: when the worker did not say (a finished job, another implementation's worker).
    interruptible: bool | None = None
    #: The worker's remark on the job's state, e.g. :data:`SYNC_CANCEL_DETAIL`.
    detail: str | None = None
    #: The job's error history (failed attempts retried so far, oldest first, at most 10):
    #: dicts of ``code``, ``message``, ``type``, ``attempt``, ``at``.
    errors: list[dict[str, Any]] | None = None
    #: What the handler returned, for a completed job whose worker keeps it for INFO (a
    #: JSON value of at most 4 KiB, and ``Worker(info_details=True)``); else None.
    result: Any = None

    @property
    def job_id(self) -> str:
        """Deprecated alias of :attr:`id`."""
        warn_renamed("JobInfo", "job_id", "id")
        return self.id


class ControlSender(Protocol):
    """What :class:`ClientControl` uses of its client (``Client`` is one)."""

    conn: amqp.Connection
    names: Names
    declarer: Declarer

    async def channel(self) -> amqp.Channel: ...


class ClientControl:
    """Sends CANCEL, BEAT and INFO for one client; owns INFO's reply queue."""

    def __init__(self, client: ControlSender) -> None:
        self._client = client
        self._info_lock = anyio.Lock()
        #: INFO's reply queue: (its channel, the queue, its consumer, what closes them).
        self._reply: tuple[amqp.Channel, amqp.QueueInfo, amqp.Consumer, AsyncExitStack] | None = None

    async def _publish(self, queue: str, kind: str, body: dict[str, Any], **props: Any) -> None:
        await self._client.declarer.use_control_queue(queue)
        ch = await self._client.channel()
        await ch.publish(
            _json.encode(body),
            exchange=self._client.names.direct_exchange,
            routing_key=self._client.names.control_routing_key(queue),
            properties=amqp.BasicProperties(
                type=kind, content_type="application/json", app_id="ojs", **props
            ),
            mandatory=True,
        )

    async def cancel(self, job_id: str, *, queue: str = "default") -> None:
        """CANCEL: ask the workers of ``queue`` to abort job ``job_id`` (001 §5.6).

        Asynchronous: the worker running it cancels its handler and acks it as cancelled;
        a worker receiving the job later skips it (the cancel is remembered for a while).
        A handler running in a thread (a plain ``def``) cannot be interrupted: it runs to
        completion, and INFO says so (``JobInfo.interruptible`` is False).

        Raises :class:`InvalidJobError` for an id that cannot be a job id (not a lowercase
        UUIDv7) and :class:`QueueNotFoundError` when ``ojs.queue.{q}`` does not exist;
        nothing is sent then.
        """
        check_job_id(job_id)
        await self._publish(queue, CONTROL_CANCEL, {"job_id": job_id})

    async def heartbeat(self, job_id: str, worker_id: str, *, queue: str = "default") -> None:
        """BEAT: tell every worker of ``queue`` that ``worker_id`` still runs ``job_id`` (001 §5.7)."""
        await self._publish(queue, CONTROL_HEARTBEAT, {"job_id": job_id, "worker_id": worker_id})

    async def info(self, job_id: str, *, queue: str = "default", timeout: DurationLike = 5.0) -> JobInfo:
        """INFO over RPC (001 §5.8): the state of ``job_id`` from the worker that knows it.

        The request goes to the control queue with ``reply_to`` = this client's exclusive,
        auto-delete reply queue (declared on first use, then reused) and a unique
        ``correlation_id``; replies with another id (late answers to earlier requests) are
        skipped.  Requests from one client are answered one at a time.  No answer within
        ``timeout`` gives ``JobInfo(state="unknown")``, not an exception.

        Raises at once, sending nothing: :class:`InvalidJobError` for an id that cannot be a
        job id (not a lowercase UUIDv7), :class:`QueueNotFoundError` when ``ojs.queue.{q}``
        does not exist.
        """
        check_job_id(job_id)
        timeout = duration_seconds(timeout, "timeout")
        await self._client.declarer.use_control_queue(queue)
        correlation_id = uuid.uuid4().hex
        async with self._info_lock:
            reply_queue, replies = await self._reply_queue()
            ch = await self._client.channel()
            await ch.publish(
                _json.encode({"job_id": job_id}),
                exchange=self._client.names.direct_exchange,
                routing_key=self._client.names.control_routing_key(queue),
                properties=amqp.BasicProperties(
                    type=CONTROL_INFO,
                    content_type="application/json",
                    reply_to=reply_queue.name,
                    correlation_id=correlation_id,
                    app_id="ojs",
                ),
                mandatory=True,
            )
            with anyio.move_on_after(timeout):
                try:
                    async for reply in replies:
                        if reply.malformed is not None:  # consumed with no_ack: nothing to settle
                            log.warning("ignoring an INFO reply: malformed message: %s", reply.malformed)
                            continue
                        if reply.properties.correlation_id != correlation_id:
                            continue
                        try:
                            data = _json_decode.decode(reply.body)
                        except msgspec.DecodeError:
                            log.warning("malformed INFO reply for job %s: %r", job_id, reply.body[:200])
                            continue
                        if isinstance(data, dict) and data.get("job_id") == job_id:
                            interruptible, detail = data.get("interruptible"), data.get("detail")
                            return JobInfo(
                                id=job_id,
                                state=str(data.get("state", "unknown")),
                                attempt=data.get("attempt"),
                                worker_id=data.get("worker_id"),
                                started_at=data.get("started_at"),
                                finished_at=data.get("finished_at"),
                                error=error_info(data.get("error")),
                                cancel_requested=data.get("cancel_requested") is True,
                                interruptible=interruptible if isinstance(interruptible, bool) else None,
                                detail=detail if isinstance(detail, str) else None,
                                result=data.get("result"),
                                errors=_records(data.get("errors")),
                            )
                except amqp.AMQPError:
                    await self.aclose()  # declared afresh by the next request
                    raise
        return JobInfo(id=job_id, state="unknown")

    async def _reply_queue(self) -> tuple[amqp.QueueInfo, amqp.Consumer]:
        """This client's INFO reply queue (exclusive, auto-delete) and its consumer."""
        if self._reply is not None and not self._reply[0].is_closed:
            return self._reply[1], self._reply[2]
        await self.aclose()
        stack = AsyncExitStack()
        try:
            ch = await stack.enter_async_context(self._client.conn.channel(confirms=False))
            info = await ch.queue_declare("", exclusive=True, auto_delete=True)
            replies = await stack.enter_async_context(ch.consume(info.name, no_ack=True, max_buffer=256))
        except BaseException:
            with anyio.CancelScope(shield=True):
                await stack.aclose()
            raise
        self._reply = (ch, info, replies, stack)
        return info, replies

    @property
    def reply_queue(self) -> str | None:
        """The name of INFO's reply queue while it exists (declared on the first INFO)."""
        return self._reply[1].name if self._reply is not None else None

    def owns_reply_queue(self, name: str) -> bool:
        """Whether ``name`` is this client's INFO reply queue."""
        return self._reply is not None and self._reply[1].name == name

    async def aclose(self) -> None:
        """Close INFO's reply queue (idempotent)."""
        reply, self._reply = self._reply, None
        if reply is not None:
            with anyio.CancelScope(shield=True):
                await reply[3].aclose()


def _records(value: object) -> list[dict[str, Any]] | None:
    """An INFO answer's error history, if it is a list of objects."""
    if not isinstance(value, list):
        return None
    return [r for r in value if isinstance(r, dict)] or None
