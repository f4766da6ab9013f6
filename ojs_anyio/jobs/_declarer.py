"""The Declarer: the one place the job topology is declared (001 §4, docs/jobs.md).

Exchanges, job queues and their dead-letter queues, redelivered, retry, control and landing
queues, the binary delay levels and the plugin's delayed exchange, with their bindings:
each declared once per client (remembered here), every queue checked against what exists
(a queue declared with other arguments raises :class:`TopologyConflictError` naming both
argument sets).  ``Client.push`` asks :meth:`Declarer.ensure` for what a route needs
(``_route.py``); the client's public ``declare_*`` methods are this object's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import anyio

from .. import amqp
from ._errors import QueueNotFoundError, TopologyConflictError
from ._route import DelayedBinding, JobQueue, Landing, Need
from ._topology import (
    DELAY_LEVELS,
    Binding,
    ExchangeSpec,
    Names,
    QueueOptions,
    base_exchanges,
    control_queue_arguments,
    control_queue_binding,
    death_notes_queue_arguments,
    delay_deliver_binding,
    delay_landing_queue_arguments,
    delay_level_bindings,
    delay_level_exchanges,
    delay_level_queue_arguments,
    delayed_queue_binding,
    dlx_queue_arguments,
    dlx_queue_binding,
    job_queue_arguments,
    job_queue_binding,
    quorum_queue_arguments,
    retry_queue_arguments,
    retry_queue_binding,
)

__all__ = ["Declarer"]


class Declarer:
    """Declares the job topology of one client, each entity once (see the module docstring)."""

    def __init__(
        self,
        conn: amqp.Connection,
        names: Names,
        channel: Callable[[], Awaitable[amqp.Channel]],
        queue_options: QueueOptions | dict[str, QueueOptions] | None,
    ) -> None:
        self.conn = conn
        self.names = names
        #: The client's publishing channel (re-opened after a channel error).
        self.channel = channel
        self._queue_options = queue_options
        self.declared_queues: set[str] = set()
        #: Job queues seen to exist by a passive declare (see :meth:`require_job_queue`).
        self.existing_queues: set[str] = set()
        self.declared_retry: set[tuple[str, int]] = set()
        self.declared_redelivered: set[str] = set()
        self.declared_death_notes: set[str] = set()
        #: Control queues this client sends to, checked (see use_control_queue).
        self.control_ready: set[str] = set()
        self.landing_declared: set[str] = set()
        self.delayed_bound: set[str] = set()
        #: Whether the plugin's delayed exchange is declared (``Client.resolve_scheduler``).
        self.delayed_declared = False
        self._base_declared = False
        self._delay_declared = False
        self._declare_lock = anyio.Lock()

    def queue_options(self, queue: str) -> QueueOptions | None:
        opts = self._queue_options
        if isinstance(opts, dict):
            return opts.get(queue)
        return opts

    @property
    def shared_queue_options(self) -> QueueOptions | None:
        """The one :class:`QueueOptions` for every queue, or None (none, or one per queue)."""
        opts = self._queue_options
        return opts if isinstance(opts, QueueOptions) else None

    def missing(self, needs: Iterable[Need]) -> bool:
        """Whether any of ``needs`` is not declared yet (a check, no I/O: the hot path)."""
        for need in needs:
            if isinstance(need, JobQueue):
                if need.queue not in self.declared_queues:
                    return True
            elif isinstance(need, Landing):
                if need.queue not in self.landing_declared:
                    return True
            elif need.queue not in self.delayed_bound:
                return True
        return False

    async def ensure(self, needs: Iterable[Need]) -> bool:
        """Make sure every entity a route needs exists; True if anything was declared now
        (the caller then measures a delay again: declaring takes time)."""
        did = False
        for need in needs:
            if isinstance(need, JobQueue) and need.queue not in self.declared_queues:
                await self.declare_queue(need.queue)
                did = True
            elif isinstance(need, Landing) and need.queue not in self.landing_declared:
                await self.landing(need.queue)
                did = True
            elif isinstance(need, DelayedBinding) and need.queue not in self.delayed_bound:
                await self.delayed_binding(need.queue)
                did = True
        return did

    async def declare_exchange(self, spec: ExchangeSpec) -> None:
        ch = await self.channel()
        await ch.exchange_declare(spec.name, spec.type, durable=True, arguments=spec.arguments or None)

    async def _declare_base(self, ch: amqp.Channel) -> None:
        if self._base_declared:
            return
        for spec in base_exchanges(self.names):  # direct, dlx, retry (AMQP-001/002)
            await ch.exchange_declare(spec.name, spec.type, durable=True, arguments=spec.arguments or None)
        self._base_declared = True

    async def declare_queue(self, queue: str) -> None:
        """Declare (idempotently) the exchanges, ``ojs.queue.{q}``, ``ojs.queue.dlx.{q}`` and
        their bindings.  A queue that exists with other arguments raises
        :class:`TopologyConflictError` naming it and showing both argument sets."""
        if queue in self.declared_queues:
            return
        async with self._declare_lock:
            if queue in self.declared_queues:
                return
            ch = await self.channel()
            await self._declare_base(ch)
            names = self.names
            options = self.queue_options(queue)
            dlq_args = dlx_queue_arguments(names, queue, options)
            await self._declare_checked(names.dlx_queue(queue), dlq_args)
            await self._bind(dlx_queue_binding(names, queue))
            args = job_queue_arguments(names, queue, options)
            await self._declare_checked(names.job_queue(queue), args)
            await self._bind(job_queue_binding(names, queue))
            self.declared_queues.add(queue)

    async def declare_redelivered_queue(self, queue: str, *, again: bool = False) -> None:
        """Declare ``ojs.queue.redelivered.{q}`` (a worker's: see ``Worker(max_deliveries=)``),
        with the job queue's own arguments, so a job rejected there is dead-lettered into
        ``ojs.queue.dlx.{q}`` like one rejected from the job queue.  Once per client,
        unless ``again`` (the broker returned a publish to it: it was deleted since)."""
        if again:
            self.declared_redelivered.discard(queue)
        if queue in self.declared_redelivered:
            return
        await self.declare_queue(queue)
        args = job_queue_arguments(self.names, queue, self.queue_options(queue))
        await self._declare_checked(self.names.redelivered_queue(queue), args)
        self.declared_redelivered.add(queue)

    async def declare_death_notes_queue(self, queue: str, *, again: bool = False) -> None:
        """Declare ``ojs.dlx-notes.{q}`` (``_death_notes.py``), once per client unless
        ``again`` (a note was returned: the queue was deleted since)."""
        if again:
            self.declared_death_notes.discard(queue)
        if queue in self.declared_death_notes:
            return
        await self._declare_checked(self.names.death_notes_queue(queue), death_notes_queue_arguments())
        self.declared_death_notes.add(queue)

    async def use_existing_queue(self, queue: str) -> amqp.QueueInfo:
        """Check that ``ojs.queue.{q}`` exists and push to it as it is, without declaring
        it (so a queue declared with other :class:`QueueOptions` is not re-declared).
        Raises :class:`QueueNotFoundError` if the queue does not exist.  Used by
        ``ojs-anyio push``."""
        info = await self.job_queue_info(queue)
        self.declared_queues.add(queue)
        return info

    async def job_queue_info(self, queue: str) -> amqp.QueueInfo:
        """A passive declare of ``ojs.queue.{q}``, on a channel of its own (the 404 of a
        missing queue closes that channel only).  Raises :class:`QueueNotFoundError`."""
        name = self.names.job_queue(queue)
        try:
            async with self.conn.channel(confirms=False) as ch:
                return await ch.queue_declare(name, passive=True)
        except amqp.NotFound as exc:
            raise QueueNotFoundError(f"queue {queue!r} does not exist ({name})", queue=queue) from exc

    async def require_job_queue(self, queue: str) -> None:
        """Raise :class:`QueueNotFoundError` unless ``ojs.queue.{q}`` exists: this client
        declared it, or a passive declare finds it (remembered, so it is asked once)."""
        if queue in self.declared_queues or queue in self.existing_queues:
            return
        await self.job_queue_info(queue)
        self.existing_queues.add(queue)

    async def _declare_checked(self, name: str, arguments: dict[str, Any]) -> None:
        ch = await self.channel()
        try:
            await ch.queue_declare(name, durable=True, arguments=arguments)
        except amqp.PreconditionFailed as exc:
            raise TopologyConflictError(
                f"queue {name!r} already exists with other arguments; ours are {arguments!r}, "
                f"the broker says: {exc.reply_text}.  Delete the queue or pass matching QueueOptions.",
                queue=name,
                ours=arguments,
                broker_text=exc.reply_text,
            ) from exc

    async def _bind(self, binding: Binding) -> None:
        ch = await self.channel()
        if binding.to_exchange:
            await ch.exchange_bind(binding.destination, binding.source, binding.routing_key)
        else:
            await ch.queue_bind(binding.destination, binding.source, binding.routing_key)

    async def declare_retry_queue(self, queue: str, delay_ms: int, *, again: bool = False) -> None:
        """Declare ``ojs.queue.retry.{q}.{delay_ms}`` exactly as 001 §8.2, bound to the retry exchange.

        Once per client, unless ``again`` (the broker returned a retry: the queue was
        deleted since)."""
        key = (queue, delay_ms)
        if again:
            self.declared_retry.discard(key)
        if key in self.declared_retry:
            return
        ch = await self.channel()
        await self._declare_base(ch)
        args = retry_queue_arguments(self.names, queue, delay_ms)
        args = quorum_queue_arguments(args, self.queue_options(queue))
        await self._declare_checked(self.names.retry_queue(queue, delay_ms), args)
        await self._bind(retry_queue_binding(self.names, queue, delay_ms))
        self.declared_retry.add(key)

    async def declare_delay_levels(self) -> None:
        """Declare the 32 binary delay levels shared by every queue (docs/scheduling.md)."""
        if self._delay_declared:
            return
        async with self._declare_lock:
            if self._delay_declared:
                return
            ch = await self.channel()
            for spec in delay_level_exchanges(self.names):
                await ch.exchange_declare(
                    spec.name, spec.type, durable=True, arguments=spec.arguments or None
                )
            shared = self.shared_queue_options  # the delay levels serve every queue
            for k in range(DELAY_LEVELS):
                await self._declare_checked(
                    self.names.delay_queue(k),
                    quorum_queue_arguments(delay_level_queue_arguments(self.names, k), shared),
                )
            for binding in delay_level_bindings(self.names):
                await self._bind(binding)
            self._delay_declared = True

    async def landing(self, queue: str) -> None:
        """The delay levels, and ``queue``'s landing queue and its binding (once per client)."""
        if queue in self.landing_declared:
            return
        await self.declare_delay_levels()
        args = delay_landing_queue_arguments(self.names, queue)
        args = quorum_queue_arguments(args, self.queue_options(queue))
        await self._declare_checked(self.names.delay_landing_queue(queue), args)
        await self._bind(delay_deliver_binding(self.names, queue))
        self.landing_declared.add(queue)

    async def delayed_binding(self, queue: str) -> None:
        """Bind ``ojs.queue.{q}`` to ``ojs.exchange.delayed`` with key ``q`` (001 §9.1.2)."""
        if queue not in self.delayed_bound:
            await self._bind(delayed_queue_binding(self.names, queue))
            self.delayed_bound.add(queue)

    async def declare_control_queue(self, queue: str) -> None:
        """The durable ``ojs.queue.control.{q}`` (OJS AMQP binding §4.1): no arguments, as the
        binding declares it, unless the queue's options make it quorum.

        Only for a queue whose job queue exists (declared by this client, or found by a
        passive declare); otherwise :class:`QueueNotFoundError`, and nothing is declared:
        a mistyped queue name must not leave a durable control queue behind, holding the
        messages sent to it for good."""
        await self.require_job_queue(queue)
        ch = await self.channel()
        await self._declare_base(ch)
        # Quorum too when the queue's options say so: a classic queue lives on one node, and
        # while that node is down every worker's control relay would fail with it.
        arguments = quorum_queue_arguments(control_queue_arguments(), self.queue_options(queue))
        await self._declare_checked(self.names.control_queue(queue), arguments)
        await self._bind(control_queue_binding(self.names, queue))

    async def use_control_queue(self, queue: str) -> None:
        """The control queue as it is, for a client that sends to it (CANCEL, BEAT, INFO):
        its workers declared it with their own options (quorum, say), which this client
        may not know, so an existing one is never declared again (that would be a 406 for a
        quorum queue); only its binding is made sure of.  A missing one is declared as
        :meth:`declare_control_queue` does.  Checked once per queue."""
        if queue in self.control_ready:
            return
        await self.require_job_queue(queue)
        name = self.names.control_queue(queue)
        try:
            async with self.conn.channel(confirms=False) as probe:
                await probe.queue_declare(name, passive=True)
        except amqp.NotFound:
            await self.declare_control_queue(queue)
        else:
            await self._declare_base(await self.channel())
            await self._bind(control_queue_binding(self.names, queue))
        self.control_ready.add(queue)
