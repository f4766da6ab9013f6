"""A blocking producer for Django, Flask and scripts: :class:`SyncClient`.

::

    client = ojs_anyio.SyncClient("amqp://guest:guest@localhost/")   # connects once
    client.push("email.send", ["a@b.c", "welcome"], queue="email")    # from any thread
    client.close()

One connection lives in a background event loop, run by anyio's blocking portal (a thread
the client owns, started in ``__init__`` and joined in :meth:`close`).  Every call hands its
coroutine to that loop and blocks until it finishes, so pushes from many threads share one
connection and one confirm-enabled channel, and each push still returns only once the
broker confirmed it.  Errors are the async client's (:class:`PushError` and friends),
raised in the calling thread.  So are the bounds: a push waits at most ``publish_timeout``
(5 s) for a recovering connection (then :class:`PushNotSentError`) and ``confirm_timeout``
(5 s) for its confirm (then :class:`PushOutcomeUnknownError`); the constructor connects
within ``connection_timeout`` (10 s a host).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Awaitable, Callable, Iterable, Sequence
from contextlib import AbstractContextManager, ExitStack
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from anyio.from_thread import BlockingPortal, start_blocking_portal

if TYPE_CHECKING:
    from ._client import Client, JobInfo, PushResult
    from ._durations import DurationLike
    from ._envelope import Job
    from ._results import PendingResult

__all__ = ["SyncClient", "SyncPendingResult"]

T = TypeVar("T")
R = TypeVar("R")

#: How long :meth:`SyncPendingResult.result` waits by default: a blocking call never waits
#: without bound unless asked to (``timeout=None``).
DEFAULT_RESULT_TIMEOUT = 60.0


class SyncClient:
    """A thread-safe, blocking OJS producer holding one connection.

    ``url`` and ``connect_options`` are :func:`ojs_anyio.connect`'s.  ``backend`` is the
    event loop the background thread runs (``"asyncio"`` or ``"trio"``).  Use it as a
    context manager, or call :meth:`close` (idempotent) when done.
    """

    def __init__(self, url: str | None = None, *, backend: str = "asyncio", **connect_options: Any) -> None:
        from ._connect import connect

        self._lock = threading.Lock()
        self._closed = False
        self._stack = ExitStack()
        try:
            self._portal: BlockingPortal = self._stack.enter_context(start_blocking_portal(backend))
            cm: AbstractContextManager[Client] = self._portal.wrap_async_context_manager(
                connect(url, **connect_options)
            )
            self._client: Client = self._stack.enter_context(cm)
        except BaseException:
            self._closed = True
            self._stack.close()
            raise

    # -------------------------------------------------------------- lifecycle

    def close(self) -> None:
        """Close the connection (after in-flight calls) and stop the background loop."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stack.close()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            warnings.warn("SyncClient was not closed", ResourceWarning, stacklevel=1)

    @property
    def closed(self) -> bool:
        return self._closed

    def _call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        if self._closed:
            raise RuntimeError("this SyncClient is closed")
        return self._portal.call(fn, *args)

    # -------------------------------------------------------------- operations

    def push(self, type: str, args: Sequence[Any] = (), **options: Any) -> Job:
        """:meth:`Client.push`, blocking until the broker confirmed the job."""
        client = self._client

        async def run() -> Job:
            return await client.push(type, args, **options)

        return self._call(run)

    def push_job(self, job: Job, **options: Any) -> Job:
        client = self._client

        async def run() -> Job:
            return await client.push_job(job, **options)

        return self._call(run)

    def push_batch(self, jobs: Iterable[Job], *, max_in_flight: int = 1024) -> list[PushResult]:
        """:meth:`Client.push_batch`: one result per job, in order."""
        client, batch = self._client, list(jobs)

        async def run() -> list[PushResult]:
            return await client.push_batch(batch, max_in_flight=max_in_flight)

        return self._call(run)

    def push_for_result(self, type: str, args: Sequence[Any] = (), **options: Any) -> SyncPendingResult[Any]:
        """:meth:`Client.push_for_result`, blocking until the broker confirmed the job; then
        ``pending.result(timeout=…)`` blocks until the worker's reply arrives.

        The reply comes to this client's own result queue, so it must stay open until then
        (from another process, read it with :meth:`info`)."""
        client = self._client

        async def run() -> PendingResult[Any]:
            return await client.push_for_result(type, args, **options)

        return SyncPendingResult(self, self._call(run))

    def push_job_for_result(
        self,
        job: Job,
        *,
        idempotency_key: str | None = None,
        convert: Callable[[Any], R] | None = None,
    ) -> SyncPendingResult[R]:
        """:meth:`push_for_result` for a job built with :meth:`build`."""
        client = self._client

        async def run() -> PendingResult[R]:
            return await client.push_job_for_result(job, idempotency_key=idempotency_key, convert=convert)

        return SyncPendingResult(self, self._call(run))

    def result(self, job_id: str, *, queue: str = "default", timeout: DurationLike = 30.0) -> Any:
        """:meth:`Client.result`, blocking: the result of ``job_id`` from any process."""
        client = self._client

        async def run() -> Any:
            return await client.result(job_id, queue=queue, timeout=timeout)

        return self._call(run)

    def build(self, type: str, args: Sequence[Any] = (), **options: Any) -> Job:
        """:meth:`Client.build`: a validated job, not pushed (no I/O)."""
        return self._client.build(type, args, **options)

    def cancel(self, job_id: str, *, queue: str = "default") -> None:
        client = self._client

        async def run() -> None:
            await client.cancel(job_id, queue=queue)

        self._call(run)

    def info(self, job_id: str, *, queue: str = "default", timeout: float = 5.0) -> JobInfo:
        client = self._client

        async def run() -> JobInfo:
            return await client.info(job_id, queue=queue, timeout=timeout)

        return self._call(run)


class SyncPendingResult(Generic[R]):
    """A job pushed with :meth:`SyncClient.push_for_result`: ``pending.result(timeout=30)``
    blocks the calling thread until the worker's reply arrives."""

    __slots__ = ("_owner", "_pending")

    def __init__(self, owner: SyncClient, pending: PendingResult[R]) -> None:
        self._owner = owner
        self._pending = pending

    @property
    def job(self) -> Job:
        return self._pending.job

    @property
    def id(self) -> str:
        return self._pending.id

    def done(self) -> bool:
        return self._pending.done()

    def result(self, timeout: DurationLike | None = DEFAULT_RESULT_TIMEOUT) -> R:
        """The handler's return value: :meth:`PendingResult.result`, blocking.  Waits at most
        ``timeout`` (60 s by default; ``None`` waits as long as it takes), then raises
        :class:`TimeoutError`; it can be called again."""
        return self._owner._call(self._pending.result, timeout)
