"""``ojs_anyio.connect()``: a job client on its own connection, for an ``async with`` block."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio

from .. import amqp
from ._client import DEFAULT_URL, Client
from ._middleware import Middleware
from ._retry import RetryPolicy
from ._topology import Names, QueueOptions

__all__ = ["connect"]


@asynccontextmanager
async def connect(
    url: str | None = None,
    *,
    prefix: str = "",
    declare: str = "lazy",
    queue_options: QueueOptions | dict[str, QueueOptions] | None = None,
    retry: RetryPolicy | None = None,
    recovery: amqp.RecoveryPolicy | None = None,
    scheduler: str = "levels",
    queues: Iterable[str] = ("default",),
    middleware: Sequence[Middleware] | None = None,
    publish_timeout: float | None = amqp.DEFAULT_PUBLISH_TIMEOUT,
    confirm_timeout: float | None = amqp.DEFAULT_CONFIRM_TIMEOUT,
    **amqp_options: Any,
) -> AsyncIterator[Client]:
    """``async with ojs_anyio.connect("amqp://guest:guest@localhost/") as client:``

    ``url`` defaults to ``$OJS_AMQP_URL``, then ``amqp://guest:guest@localhost:5672/`` (the
    event bus, by contrast, falls back to ``memory://``).  The connection is named
    ``ojs-jobs pid=N`` unless ``name=`` says otherwise (RabbitMQ's ``connection_name``).
    Recovery (reconnect with backoff, topology re-declared, consumers re-registered) is on
    by default here; pass ``recovery=amqp.RecoveryPolicy(enabled=False)`` to turn it off.

    Nothing waits for a recovering connection without bound: ``publish_timeout`` (5 s)
    bounds every call's wait for it (a push's whole preparation counts as one wait; then
    :class:`PushNotSentError`, other calls ``amqp.OperationTimeoutError``), and
    ``confirm_timeout`` (5 s) a push's wait for the broker's confirm once the job was sent
    (then :class:`PushOutcomeUnknownError`).  ``None`` waits without bound.

    ``scheduler`` picks how scheduled jobs wait (``docs/scheduling.md``): ``"levels"``
    (default: the binary delay levels, no plugin), ``"plugin"`` (the
    delayed-message-exchange plugin; :class:`SchedulerUnavailableError` here if the broker
    lacks it) or ``"auto"`` (the plugin when the broker has it, else the levels).  The two
    last ones ask the broker on a separate short-lived connection while connecting.

    ``declare="eager"`` declares, before this returns, the exchanges and every entity of
    each queue in ``queues`` (see :meth:`Client.declare_eagerly`); ``"lazy"`` (default)
    declares each queue's entities on first use.  Both are idempotent.
    """
    url = url or os.environ.get("OJS_AMQP_URL") or DEFAULT_URL
    policy = recovery if recovery is not None else amqp.RecoveryPolicy()
    # Named, so an operator tells the job layer's connections apart in list_connections.
    amqp_options.setdefault("name", f"ojs-jobs pid={os.getpid()}")
    async with amqp.connect(url, recovery=policy, publish_timeout=publish_timeout, **amqp_options) as conn:
        client = Client(
            conn,
            names=Names(prefix),
            declare=declare,
            queue_options=queue_options,
            retry=retry,
            scheduler=scheduler,
            middleware=middleware,
            confirm_timeout=confirm_timeout,
            probe_options=amqp_options,
        )
        try:
            async with anyio.create_task_group() as tg:
                client.use_task_group(tg)  # the result queue's reader, started on first use
                if scheduler != "levels":
                    await client.resolve_scheduler()
                if declare == "eager":
                    await client.declare_eagerly(queues)
                try:
                    yield client
                finally:
                    tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await client.aclose()
