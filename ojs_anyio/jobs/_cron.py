"""Periodic (cron) jobs, fired by exactly one scheduler instance per tick (issue 6).

::

    sched = ojs.Scheduler(name="default")        # the leadership group
    sched.add("reports.daily", "0 3 * * *", args=["eu"], queue="reports", timezone="Europe/Paris")

    async with ojs.connect() as client:
        await sched.run(client)                  # until cancelled, or sched.stop()

Cron expressions (croniter's) and the misfire rule: ``_schedule.py``.

Leadership
----------
One token message in a single-active-consumer queue per group: holding it unacked is
being the leader; it carries the record of fired ticks and is swapped after each fire.
How, and why it is safe, is ``_leader.py`` (:class:`LeaderToken`, the I/O) and
``_schedule.Leadership`` (the pure table of transitions).

Failures.  A push the broker refused (queue full, unroutable) is logged, reported in
:class:`Fired` with its ``error``, and counts as fired (no retry storm).  A push whose
outcome is unknown (connection lost; or leadership lost while it waited, which cancels it)
is not recorded: the tick is then missed, and ``misfire`` decides.  A channel error on the
leadership channel drops leadership and re-joins after ``retry_delay``; a connection that
fails for good ends :meth:`Scheduler.run` with its error.  If the token disappears while
we lead (the queue was deleted, or purged during a swap: the leader's publish is
unroutable, or the swapped token doesn't come back within ``SWAP_TIMEOUT``), the leader
steps down, re-declares the queue and creates a token if it has none.

Structure.  :meth:`Scheduler.run` owns a task group with three tasks: the leadership
task (:meth:`LeaderToken.serve`: consumes tokens, drops duplicates), the presence
announcer (``_presence.announce_scheduler``) and the fire loop (sleeps to the next tick,
pushes through the client's public ``push_job``, so ``around_push`` middleware applies,
swaps).  Nothing outlives ``run()``; cancellation propagates; the swap and giving the token
back on the way out are shielded and bounded.  The cron and misfire logic
(:class:`Schedule`, :func:`due_tick`) is pure: time is passed in.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

import anyio

from ojs_anyio.amqp import UsageError

from .. import amqp
from .._common import single_error
from ._build import new_job
from ._client import Client
from ._durations import DurationLike, duration_seconds
from ._errors import PushError, PushNotSentError, PushOutcomeUnknownError, TopologyConflictError
from ._leader import LeaderToken, SchedulerClock, WallClock
from ._presence import announce_scheduler
from ._retry import RetryPolicy
from ._schedule import (
    MISFIRE_POLICIES,
    Fired,
    Leadership,
    LeadershipChanged,
    Misfire,
    Schedule,
    SchedulerEvent,
    SchedulerStatistics,
    check_name,
    due_tick,
    leader_queue_name,
    skipped_ticks,
)
from ._topology import quorum_queue_arguments

__all__ = [
    "Fired",
    "LeadershipChanged",
    "Misfire",
    "Schedule",
    "Scheduler",
    "SchedulerEvent",
    "SchedulerStatistics",
    "due_tick",
    "leader_queue_name",
]

log = logging.getLogger("ojs_anyio.scheduler")

# ------------------------------------------------------------------ the scheduler


class Scheduler:
    """Pushes jobs on cron schedules; among the instances of a group, only the leader fires.

    :param name: the leadership group: instances with the same name (and client prefix)
        share one leader and one record of fired ticks.
    :param misfire: default missed-tick policy of the schedules (``"skip"`` or ``"once"``).
    :param misfire_grace: default bound on how old a missed tick ``"once"`` still fires.
    :param token_refresh: seconds between token swaps when nothing fires (well under the
        broker's ``consumer_timeout``).
    :param retry_delay: seconds before re-joining after the leadership channel failed.
    :param clock: where ticks are read and waited for (default: the wall clock); tests pass
        ``JobTester.scheduler_clock`` to fire ticks on a virtual clock.
    """

    def __init__(
        self,
        name: str = "default",
        *,
        misfire: Misfire = "skip",
        misfire_grace: DurationLike = timedelta(hours=1),
        token_refresh: DurationLike = 60.0,
        retry_delay: DurationLike = 1.0,
        instance_id: str | None = None,
        clock: SchedulerClock | None = None,
    ) -> None:
        self.name = check_name("scheduler name", name)
        self._clock: SchedulerClock = clock or WallClock()
        if misfire not in MISFIRE_POLICIES:
            raise UsageError(f"misfire must be 'skip' or 'once', not {misfire!r}")
        self.misfire: Misfire = misfire
        # Durations: seconds, a timedelta or ISO 8601 (the forms every option takes).
        self.misfire_grace = timedelta(seconds=duration_seconds(misfire_grace, "misfire_grace"))
        self.token_refresh = duration_seconds(token_refresh, "token_refresh", allow_zero=False)
        self.retry_delay = duration_seconds(retry_delay, "retry_delay")
        self.instance_id = instance_id or uuid.uuid4().hex[:12]
        self._schedules: dict[str, Schedule] = {}
        self._listeners: list[Callable[[SchedulerEvent], None]] = []
        #: Last fired tick per schedule name: the token's, merged with what we fired.
        self._fired: dict[str, datetime] = {}
        #: Whether this instance leads (the pure table of ``_schedule.Leadership``).
        self._leadership = Leadership()
        #: The leader queue's token: consuming, holding, swapping it (``_leader.py``).
        self._token = LeaderToken(
            self.name,
            self.instance_id,
            clock=self._clock,
            fired=self._fired,
            live_schedules=self._schedules.keys,
            gained=self._gained,
            lost=self._lose,
            wake=self._wake,
            token_refresh=self.token_refresh,
            retry_delay=self.retry_delay,
        )
        self._changed: anyio.Event | None = None
        #: The push in flight: cancelled when leadership is lost (see _lose).
        self._push_scope: anyio.CancelScope | None = None
        self._scope: anyio.CancelScope | None = None
        self._running = False
        self._stop_requested = False
        # statistics
        self._n_fired = 0
        self._n_failed = 0

    # ------------------------------------------------------------ configuration

    def add(
        self,
        job_type: str,
        cron: str,
        *,
        args: Sequence[Any] = (),
        name: str | None = None,
        queue: str = "default",
        timezone: str = "UTC",
        misfire: Misfire | None = None,
        misfire_grace: timedelta | None = None,
        priority: int | None = None,
        timeout: int | None = None,
        retry: RetryPolicy | None = None,
        meta: dict[str, Any] | None = None,
    ) -> Schedule:
        """Push a ``job_type`` job with ``args`` to ``queue`` on every tick of ``cron``.

        ``name`` (default: ``job_type``) identifies the schedule: it keys the record of
        fired ticks and the idempotency key, so give two schedules of one job type
        different names.  The job is validated now (``InvalidJobError``), not at the tick.
        """
        # Validate the job now (InvalidJobError), not at the first tick.
        new_job(job_type, args, queue=queue, meta=meta, priority=priority, timeout=timeout, retry=retry)
        schedule = Schedule(
            name=name if name is not None else job_type,
            cron=cron,
            job_type=job_type,
            args=tuple(args),
            queue=queue,
            timezone=timezone,
            misfire=misfire if misfire is not None else self.misfire,
            misfire_grace=misfire_grace if misfire_grace is not None else self.misfire_grace,
            priority=priority,
            timeout=timeout,
            retry=retry,
            meta=meta,
        )
        if schedule.name in self._schedules:
            raise UsageError(f"scheduler {self.name!r} already has a schedule named {schedule.name!r}")
        self._schedules[schedule.name] = schedule
        self._wake()  # a running fire loop recomputes its next wake-up
        return schedule

    def remove(self, name: str) -> None:
        """Stop firing schedule ``name`` (its record stays in the token for a while)."""
        del self._schedules[name]
        self._wake()

    @property
    def schedules(self) -> list[Schedule]:
        return list(self._schedules.values())

    def add_listener(self, callback: Callable[[SchedulerEvent], None]) -> Callable[[], None]:
        """Call ``callback`` (synchronously) on each :class:`Fired` and :class:`LeadershipChanged`.
        Returns a function that removes it."""
        self._listeners.append(callback)

        def remove() -> None:
            if callback in self._listeners:
                self._listeners.remove(callback)

        return remove

    # ------------------------------------------------------------ introspection

    @property
    def is_leader(self) -> bool:
        """True while this instance is its group's active consumer (it fires the ticks)."""
        return self._leadership.leading

    @property
    def leader_since(self) -> datetime | None:
        return self._leadership.since if self._leadership.leading else None

    def last_fired(self, schedule: str) -> datetime | None:
        """The last fired tick of ``schedule`` this instance knows of."""
        return self._fired.get(schedule)

    def statistics(self) -> SchedulerStatistics:
        return SchedulerStatistics(
            leader=self._leadership.leading,
            leader_since=self.leader_since,
            fired=self._n_fired,
            failed=self._n_failed,
            leader_changes=self._leadership.changes,
            duplicate_tokens=self._token.duplicates,
            token_swaps=self._token.swaps,
        )

    # ------------------------------------------------------------ running

    async def run(self, client: Client) -> None:
        """Join the group and fire while leader, until cancelled or :meth:`stop`.

        Everything runs in a task group owned by this call.  On the way out the token (if
        held) goes back to the queue for the next instance.  A connection that fails for
        good raises its error here.
        """
        if self._running:
            raise UsageError("this Scheduler is already running")
        self._running = True
        # A quorum client (one QueueOptions for every queue) gets a quorum leader queue, so
        # leadership survives the loss of the node a classic queue would live on.
        shared = client.shared_queue_options
        arguments = quorum_queue_arguments({"x-single-active-consumer": True}, shared)
        token = self._token
        token.token_refresh, token.retry_delay = self.token_refresh, self.retry_delay
        try:
            # Fail fast on a queue declared with other arguments (TopologyConflictError).
            for queue in sorted({s.queue for s in self._schedules.values()}):
                await client.declare_queue(queue)
        except BaseException:
            self._running = False
            raise
        token.reset(leader_queue_name(client.names, self.name), arguments)
        self._changed = anyio.Event()
        remove_listener = client.conn.add_listener(token.on_connection_event)
        try:
            with anyio.CancelScope() as scope:
                self._scope = scope
                if self._stop_requested:
                    scope.cancel()
                try:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(token.serve, client.conn, name="ojs-scheduler-leadership")
                        tg.start_soon(self._fire_loop, client, name="ojs-scheduler-fire")
                        tg.start_soon(announce_scheduler, self, client)  # for observers: docs/jobs.md
                except BaseExceptionGroup as eg:
                    raise (single_error(eg) or eg) from None
        finally:
            remove_listener()
            self._scope = None
            self._running = False
            self._stop_requested = False
            token.drop()
            self._lose("scheduler stopped", logging.INFO)
            self._changed = None  # add()/remove() outside run() have nothing to wake

    def stop(self) -> None:
        """Make :meth:`run` return (the token goes back to the queue).  Idempotent."""
        self._stop_requested = True
        if self._scope is not None:
            self._scope.cancel()

    # ------------------------------------------------------------ leadership

    def _emit(self, event: SchedulerEvent) -> None:
        for cb in list(self._listeners):
            try:
                cb(event)
            except Exception:
                log.exception("scheduler listener %r raised", cb)

    def _wake(self) -> None:
        changed = self._changed
        if changed is not None:
            self._changed = anyio.Event()
            changed.set()

    def _lose(self, reason: str, level: int = logging.WARNING) -> None:
        if self._push_scope is not None:
            self._push_scope.cancel()  # a push in flight is no longer ours to make
        changed = self._leadership.lost(self._clock.now(), reason)
        if changed is not None:
            log.log(level, "scheduler %s/%s is no longer leader: %s", self.name, self.instance_id, reason)
            self._emit(changed)
        self._wake()

    def _gained(self) -> None:
        changed = self._leadership.gained(self._clock.now())
        if changed is not None:
            log.info("scheduler %s/%s became leader", self.name, self.instance_id)
            self._emit(changed)

    # ------------------------------------------------------------ firing

    async def _fire_loop(self, client: Client) -> None:
        """While we hold the token: fire what is due, swap the token, sleep to the next tick."""
        token = self._token
        while True:
            changed = self._changed
            assert changed is not None
            held = token.holding()
            if held is None or self._leadership.since is None:
                await token.await_return(changed)
                continue
            fired = await self._fire_due(client, held, self._leadership.since)
            held_now = token.holding()
            if held_now is not held or held_now is None:
                continue
            if token.swap_due(fired):
                await token.swap_if_held(held_now)
                continue
            await self._sleep_until_due(changed)

    async def _sleep_until_due(self, changed: anyio.Event) -> None:
        """Until the next tick (on the scheduler's clock), the token's refresh (on the loop's
        clock: RabbitMQ's consumer_timeout is wall time) or a change, whichever is first.  One
        timed by the other woke a virtual clock every ``token_refresh`` of virtual time."""
        now = self._clock.now()
        ticks = [(schedule.next_tick(now) - now).total_seconds() for schedule in self._schedules.values()]
        with anyio.move_on_after(max(self._token.refresh_at - anyio.current_time(), 0.001)):
            if ticks:
                await self._clock.wait(changed, max(min(ticks), 0.001))
            else:
                await changed.wait()

    async def _fire_due(self, client: Client, held: amqp.IncomingMessage, since: datetime) -> bool:
        """Fire every schedule's due tick while ``held`` is our token; True if any was done."""
        now = self._clock.now()
        fired = False
        for schedule in list(self._schedules.values()):
            tick, late = due_tick(
                schedule,
                last_fired=self._fired.get(schedule.name),
                leader_since=since,
                now=now,
            )
            if tick is None:
                continue
            if self._token.holding() is not held:
                break
            fired |= await self._fire(client, schedule, tick, late)
        return fired

    async def _fire(self, client: Client, schedule: Schedule, tick: datetime, late: bool) -> bool:
        """Push one tick's job.  True when the tick is done with (pushed, or refused)."""
        key = schedule.idempotency_key(tick)
        last = self._fired.get(schedule.name)
        skipped = skipped_ticks(
            schedule, tick, last_fired=last, late=late, leader_since=self._leadership.since
        )
        if skipped is not None:
            log.log(skipped[0], "scheduler %s: %s", self.name, skipped[1])
        error: Exception | None = None
        job_id: str | None = None
        scope = self._push_scope = anyio.CancelScope()
        try:
            with scope:
                if self._token.holding() is None:
                    scope.cancel()
                built = client.build(
                    schedule.job_type,
                    list(schedule.args),
                    queue=schedule.queue,
                    priority=schedule.priority,
                    timeout=schedule.timeout,
                    retry=schedule.retry,
                    meta=dict(schedule.meta) if schedule.meta is not None else None,
                )
                # The public push path, so the client's around_push middleware sees every
                # scheduled job.  The key is a label of the tick (x-ojs-idempotency-key,
                # claimed by nobody: window None); the leader lease, not the key, is what
                # keeps a tick from firing twice.
                job = await client.push_job(built, idempotency_key=key, idempotency_window=None)
                job_id = job.id
        except (PushOutcomeUnknownError, PushNotSentError) as exc:
            # Not sent, or maybe not: the tick is not recorded, and fires again.
            log.warning("scheduler %s: %s not confirmed (%s); not recorded", self.name, key, exc)
            if self._token.holding() is not None:
                await anyio.sleep(self.retry_delay)  # still leader (e.g. publish timeout): pace retries
            return False
        except (PushError, TopologyConflictError) as exc:
            log.error("scheduler %s: the broker refused %s: %s", self.name, key, exc)
            error = exc
        finally:
            self._push_scope = None
        if scope.cancelled_caught:
            # Leadership was lost mid-push (e.g. while waiting out a reconnect): the job may
            # or may not have reached the broker; the tick is not ours to record.
            log.warning("scheduler %s: leadership lost while pushing %s; not recorded", self.name, key)
            return False
        if last is None or tick > last:
            self._fired[schedule.name] = tick
        if error is None:
            self._n_fired += 1
            log.info(
                "scheduler %s fired %s%s (job %s)", self.name, key, " (missed tick)" if late else "", job_id
            )
        else:
            self._n_failed += 1
        self._emit(
            Fired(
                schedule=schedule.name, tick=tick, idempotency_key=key, job_id=job_id, late=late, error=error
            )
        )
        return True
