"""Periodic (cron) jobs: schedules, the misfire policy (pure), and on the real broker the
firing, single-leader election through ``x-single-active-consumer``, failover, misfires.

Broker tests use per-second schedules (croniter's sixth field is seconds) so ticks come fast;
they synchronise on the scheduler's events (:class:`ojs.Fired`, :class:`ojs.LeadershipChanged`)
under ``anyio.fail_after``.  They sleep only where time is the behaviour (a leadership gap).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import anyio.abc
import msgspec
import pytest
from harness import FaultProxy
from support.cleanup import Cleanup
from support.policies import FAST

import ojs_anyio as ojs
from ojs_anyio import amqp
from ojs_anyio.jobs._cron import Misfire, due_tick, leader_queue_name
from ojs_anyio.jobs._envelope import decode_job, format_timestamp, parse_timestamp
from ojs_anyio.jobs._schedule import Leadership, Schedule, merge_fired, skipped_ticks

from .broker_support import WAIT, current_url

EVERY_SECOND = "* * * * * *"


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


# ====================================================================== pure: schedules


def schedule(cron: str = EVERY_SECOND, **kw: Any) -> ojs.Schedule:
    return ojs.Schedule(name=kw.pop("name", "s"), cron=cron, job_type="t", **kw)


def test_ticks_at_and_between_whole_seconds() -> None:
    s = schedule("* * * * * */5")  # croniter: the sixth field is seconds
    assert s.latest_tick(at("2024-01-01T00:00:05")) == at("2024-01-01T00:00:05")
    assert s.latest_tick(at("2024-01-01T00:00:09.999")) == at("2024-01-01T00:00:05")
    assert s.next_tick(at("2024-01-01T00:00:05")) == at("2024-01-01T00:00:10")
    assert s.next_tick(at("2024-01-01T00:00:04.5")) == at("2024-01-01T00:00:05")


def test_ticks_follow_the_schedule_timezone() -> None:
    paris = schedule("0 3 * * *", timezone="Europe/Paris")
    assert paris.next_tick(at("2024-01-01T00:00:00")) == at("2024-01-01T02:00:00")  # UTC+1
    assert paris.next_tick(at("2024-07-01T00:00:00")) == at("2024-07-01T01:00:00")  # UTC+2 (DST)
    assert paris.next_tick(at("2024-01-01T00:00:00")).tzinfo is UTC


def test_idempotency_key_is_name_and_utc_tick() -> None:
    s = schedule("0 3 * * *", name="reports.daily", timezone="Europe/Paris")
    tick = s.next_tick(at("2026-02-15T00:00:00"))
    assert s.idempotency_key(tick) == "reports.daily:2026-02-15T02:00:00.000Z"


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"cron": "not cron"}, "invalid cron"),
        ({"cron": "0 0 30 2 *"}, "never matches"),
        ({"timezone": "Mars/Olympus"}, "unknown timezone"),
        ({"misfire": "always"}, "misfire"),
        ({"misfire_grace": timedelta(seconds=-1)}, "misfire_grace"),
        ({"name": "has space"}, "whitespace"),
    ],
)
def test_bad_schedules_are_refused(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        schedule(**kw)


def test_add_validates_the_job_and_the_name() -> None:
    sched = ojs.Scheduler("g")
    s = sched.add("reports.daily", "0 3 * * *", args=["eu"], queue="reports")
    assert (s.name, s.job_type, s.args, s.misfire) == ("reports.daily", "reports.daily", ("eu",), "skip")
    with pytest.raises(ValueError, match="already has"):
        sched.add("reports.daily", "0 4 * * *")
    assert sched.add("reports.daily", "0 4 * * *", name="reports.daily.late").name == "reports.daily.late"
    with pytest.raises(ojs.InvalidJobError):
        sched.add("t", "0 3 * * *", args="not a list", name="bad")  # type: ignore[arg-type]
    once = ojs.Scheduler("g", misfire="once", misfire_grace=timedelta(minutes=5))
    assert once.add("t", "0 3 * * *").misfire_grace == timedelta(minutes=5)
    assert once.add("u", "0 3 * * *", misfire="skip").misfire == "skip"


# ====================================================================== pure: misfire policy

LEADER = at("2024-01-01T00:00:10.5")


@pytest.mark.parametrize(
    ("misfire", "last", "now", "expected"),
    [
        # on time, leading since before the tick
        ("skip", "00:00:10", "00:00:11.001", ("00:00:11", False)),
        # already fired: nothing
        ("skip", "00:00:11", "00:00:11.5", None),
        # fell behind while leading: only the latest due tick (coalesced)
        ("skip", "00:00:11", "00:00:14.2", ("00:00:14", False)),
        # never fired: ticks from becoming leader on
        ("skip", None, "00:00:10.6", None),
        ("once", None, "00:00:10.6", None),
        ("skip", None, "00:00:11", ("00:00:11", False)),
        # missed during a gap (last fired 00:00:05, leader since 00:00:10.5)
        ("skip", "00:00:05", "00:00:10.6", None),
        ("once", "00:00:05", "00:00:10.6", ("00:00:10", True)),
    ],
)
def test_due_tick_table(misfire: str, last: str | None, now: str, expected: tuple[str, bool] | None) -> None:
    s = schedule(misfire=misfire, misfire_grace=timedelta(seconds=2))
    got = due_tick(
        s,
        last_fired=at(f"2024-01-01T{last}") if last else None,
        leader_since=LEADER,
        now=at(f"2024-01-01T{now}"),
    )
    want = (None, False) if expected is None else (at(f"2024-01-01T{expected[0]}"), expected[1])
    assert got == want


def test_misfire_grace_bounds_once() -> None:
    s = ojs.Schedule(
        name="d", cron="0 3 * * *", job_type="t", misfire="once", misfire_grace=timedelta(hours=1)
    )
    last = at("2024-01-01T03:00:00")
    # down for two days, back 30 minutes after a tick: fire that tick once, late
    assert due_tick(
        s, last_fired=last, leader_since=at("2024-01-03T03:30:00"), now=at("2024-01-03T03:30:00")
    ) == (
        at("2024-01-03T03:00:00"),
        True,
    )
    # back two hours after it: beyond the grace, dropped
    assert due_tick(
        s, last_fired=last, leader_since=at("2024-01-03T05:00:00"), now=at("2024-01-03T05:00:00")
    ) == (
        None,
        False,
    )


# ====================================================================== pure: leadership


T0, T1 = at("2024-01-01T00:00:00"), at("2024-01-01T00:00:05")

#: (leading before, input, leading after, what is reported: None or (leader, reason)).
LEADERSHIP_TABLE: list[tuple[bool, tuple[str, ...], bool, tuple[bool, str] | None]] = [
    (False, ("gained",), True, (True, "token received")),
    (True, ("gained",), True, None),
    (True, ("lost", "connection lost: boom"), False, (False, "connection lost: boom")),
    (False, ("lost", "scheduler stopped"), False, None),
]


@pytest.mark.parametrize(("before", "event", "after", "reported"), LEADERSHIP_TABLE, ids=repr)
def test_leadership_transitions_table(
    before: bool, event: tuple[str, ...], after: bool, reported: tuple[bool, str] | None
) -> None:
    lead = Leadership()
    if before:
        lead.gained(T0)
    changes = lead.changes
    out = lead.gained(T1) if event[0] == "gained" else lead.lost(T1, event[1])
    assert lead.leading is after
    if reported is None:
        assert out is None and lead.changes == changes
    else:
        assert out == ojs.LeadershipChanged(leader=reported[0], at=T1, reason=reported[1])
    assert lead.since == (T1 if not before and after else T0 if before else None)


def test_leadership_counts_changes_and_keeps_when_it_last_became_leader() -> None:
    lead = Leadership()
    for event in ("gained", "gained", "lost", "lost", "gained"):
        lead.gained(T1) if event == "gained" else lead.lost(T1, "x")
    assert (lead.leading, lead.changes, lead.since) == (True, 2, T1)


MERGE_TABLE: list[tuple[dict[str, str], dict[str, str], dict[str, str], bool]] = [
    ({}, {}, {}, False),
    ({}, {"a": "2024-01-01T00:00:05"}, {"a": "2024-01-01T00:00:05"}, False),
    ({"a": "2024-01-01T00:00:05"}, {}, {"a": "2024-01-01T00:00:05"}, True),
    ({"a": "2024-01-01T00:00:05"}, {"a": "2024-01-01T00:00:01"}, {"a": "2024-01-01T00:00:05"}, True),
    ({"a": "2024-01-01T00:00:01"}, {"a": "2024-01-01T00:00:05"}, {"a": "2024-01-01T00:00:05"}, False),
    ({"a": "2024-01-01T00:00:05"}, {"b": "2024-01-01T00:00:01"},
     {"a": "2024-01-01T00:00:05", "b": "2024-01-01T00:00:01"}, True),
]  # fmt: skip


@pytest.mark.parametrize(("ours", "theirs", "merged", "ahead"), MERGE_TABLE, ids=repr)
def test_token_merge_table(
    ours: dict[str, str], theirs: dict[str, str], merged: dict[str, str], ahead: bool
) -> None:
    """The later tick wins per schedule; ``ahead`` says the token must be saved again."""
    mine = {k: at(v) for k, v in ours.items()}
    assert merge_fired(mine, {k: at(v) for k, v in theirs.items()}) is ahead
    assert mine == {k: at(v) for k, v in merged.items()}


# ====================================================================== broker helpers


class Recorder:
    """Every event of some schedulers, labelled, with a way to wait for some."""

    def __init__(self, **schedulers: ojs.Scheduler) -> None:
        self.events: list[tuple[str, ojs.SchedulerEvent]] = []
        self._changed = anyio.Event()
        for label, sched in schedulers.items():
            sched.add_listener(lambda ev, label=label: self._on(label, ev))

    def _on(self, label: str, event: ojs.SchedulerEvent) -> None:
        self.events.append((label, event))
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    def fired(self, label: str | None = None) -> list[ojs.Fired]:
        return [ev for lb, ev in self.events if isinstance(ev, ojs.Fired) and label in (None, lb)]

    def fired_by(self) -> list[tuple[str, ojs.Fired]]:
        return [(lb, ev) for lb, ev in self.events if isinstance(ev, ojs.Fired)]

    async def wait_for(self, pred: Callable[[], bool], timeout: float = WAIT) -> None:
        with anyio.fail_after(timeout):
            while not pred():
                await self._changed.wait()


def unique_ticks(fired: list[ojs.Fired]) -> bool:
    keys = [f.idempotency_key for f in fired]
    return len(keys) == len(set(keys))


def group_name() -> str:
    return f"g{uuid.uuid4().hex[:10]}"


def register_leader_queue(cleanup: Cleanup, group: str) -> str:
    return cleanup.queue(leader_queue_name(ojs.Names(""), group))


async def drain(conn: amqp.Connection, queue: str) -> list[amqp.IncomingMessage]:
    """Every ready message of ``queue``, acked (Basic.Get until empty)."""
    out = []
    async with conn.channel(confirms=False) as ch:
        while (msg := await ch.get(queue)) is not None:
            await msg.ack()
            out.append(msg)
    return out


@asynccontextmanager
async def instances(
    *runs: tuple[ojs.Scheduler, str],
) -> AsyncIterator[dict[ojs.Scheduler, anyio.CancelScope]]:
    """Run each scheduler on its own ``ojs.connect(url)`` in the background; yields the
    cancel scope of each connection block (cancel it to kill that instance)."""
    async with anyio.create_task_group() as tg:
        scopes = {sched: await start_instance(tg, sched, url) for sched, url in runs}
        try:
            yield scopes
        finally:
            tg.cancel_scope.cancel()


async def start_instance(
    tg: anyio.abc.TaskGroup, sched: ojs.Scheduler, url: str | None = None
) -> anyio.CancelScope:
    """Start ``sched`` on its own connection in ``tg``; cancel the returned scope to kill it
    (its connection block is cancelled and its connection closed)."""

    async def one(*, task_status: anyio.abc.TaskStatus[anyio.CancelScope]) -> None:
        with anyio.CancelScope() as scope:
            async with ojs.connect(url or current_url(), recovery=FAST) as client:
                task_status.started(scope)
                await sched.run(client)

    scope: anyio.CancelScope = await tg.start(one)
    return scope


# ====================================================================== broker: firing


@pytest.mark.anyio
async def test_per_second_schedule_pushes_jobs_with_idempotency_keys(
    q: str, cleanup: Cleanup, raw: amqp.Connection, client: ojs.Client
) -> None:
    await client.declare_queue(q)
    group = group_name()
    register_leader_queue(cleanup, group)
    sched = ojs.Scheduler(group)
    sched.add("cron.tick", EVERY_SECOND, args=["hello", 1], queue=q, name=f"{group}.tick")
    rec = Recorder(a=sched)
    received: list[amqp.IncomingMessage] = []
    async with instances((sched, current_url())):
        with anyio.fail_after(WAIT):
            async with (
                raw.channel(confirms=False) as ch,
                ch.consume(ojs.Names("").job_queue(q), prefetch=10) as jobs,
            ):
                async for msg in jobs:
                    await msg.ack()
                    received.append(msg)
                    if len(received) == 3:
                        break
        # A job can reach the consumer before the confirm of its push returns to the
        # scheduler, which counts it as fired only then: wait for the third Fired event.
        await rec.wait_for(lambda: len(rec.fired()) >= 3)
        assert sched.is_leader and sched.statistics().fired >= 3
    keys = [m.properties.headers["x-ojs-idempotency-key"] for m in received]
    ticks = [parse_timestamp(k.split(":", 1)[1]) for k in keys]
    assert all(k.startswith(f"{group}.tick:") for k in keys)
    assert [t - ticks[0] for t in ticks] == [timedelta(seconds=n) for n in range(3)]  # consecutive seconds
    for msg in received:
        job = decode_job(msg.body)
        assert (job.type, job.args, job.queue) == ("cron.tick", ["hello", 1], q)
    fired = {f.idempotency_key: f for f in rec.fired()}
    assert all(
        fired[k].job_id == m.properties.message_id and not fired[k].late
        for k, m in zip(keys, received, strict=True)
    )


class StampPush(ojs.Middleware):
    """Marks every job it sees pushed (its meta) and remembers the job ids."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def around_push(self, job: ojs.Job, call_next: Any) -> ojs.Job:
        self.seen.append(job.id)
        stamped = msgspec.structs.replace(job, meta={**(job.meta or {}), "stamped": True})
        return await call_next(stamped)  # type: ignore[no-any-return]


@pytest.mark.anyio
async def test_a_scheduled_job_passes_through_around_push_middleware(
    q: str, cleanup: Cleanup, raw: amqp.Connection, client: ojs.Client
) -> None:
    """The scheduler pushes through the client's public push path (issue 25): the
    ``around_push`` hooks that docs/job-api.md promises for every PUSH see each tick's job,
    and what they change is what goes out."""
    await client.declare_queue(q)
    group = group_name()
    register_leader_queue(cleanup, group)
    sched = ojs.Scheduler(group)
    sched.add("cron.stamped", EVERY_SECOND, queue=q, name=f"{group}.stamped")
    stamp = StampPush()
    async with anyio.create_task_group() as tg:

        async def run(*, task_status: anyio.abc.TaskStatus[None]) -> None:
            async with ojs.connect(current_url(), recovery=FAST, middleware=[stamp]) as sched_client:
                task_status.started()
                await sched.run(sched_client)

        await tg.start(run)
        with anyio.fail_after(WAIT):
            async with (
                raw.channel(confirms=False) as ch,
                ch.consume(ojs.Names("").job_queue(q), prefetch=10) as jobs,
            ):
                msg = await jobs.__anext__()
                await msg.ack()
        tg.cancel_scope.cancel()
    job = decode_job(msg.body)
    assert job.type == "cron.stamped" and job.meta == {"stamped": True}
    assert job.id in stamp.seen
    assert msg.properties.headers["x-ojs-idempotency-key"].startswith(f"{group}.stamped:")


# ====================================================================== broker: leadership


@pytest.mark.anyio
async def test_one_leader_fires_each_tick_and_the_other_takes_over(
    q: str, cleanup: Cleanup, raw: amqp.Connection
) -> None:
    group = group_name()
    register_leader_queue(cleanup, group)
    a, b = ojs.Scheduler(group, instance_id="a"), ojs.Scheduler(group, instance_id="b")
    for sched in (a, b):
        sched.add("cron.tick", EVERY_SECOND, queue=q, name="tick")
    rec = Recorder(a=a, b=b)
    async with instances((a, current_url()), (b, current_url())) as scopes:
        await rec.wait_for(lambda: len(rec.fired()) >= 3)
        assert a.is_leader != b.is_leader  # exactly one leader
        leader, follower = (a, b) if a.is_leader else (b, a)
        lead, follow = ("a", "b") if leader is a else ("b", "a")
        assert rec.fired(follow) == []
        before = len(rec.fired(lead))
        # Kill the leader: its connection block is cancelled, its connection closed.
        scopes[leader].cancel()
        with anyio.fail_after(5):  # takeover bound: immediate (SAC), plus the next tick
            await rec.wait_for(lambda: len(rec.fired(follow)) >= 1)
        await rec.wait_for(lambda: len(rec.fired(follow)) >= 3)
        assert follower.is_leader and not leader.is_leader
        assert len(rec.fired(lead)) == before
    fired = rec.fired()
    assert unique_ticks(fired), [f.idempotency_key for f in fired]
    old_last = max(f.tick for f in rec.fired(lead))
    assert min(f.tick for f in rec.fired(follow)) > old_last
    # The broker's side: a job for every fired tick, no key twice (a push cut short by the
    # kill may have landed without its Fired event; its tick is still fired only once).
    keys = [
        m.properties.headers["x-ojs-idempotency-key"] for m in await drain(raw, ojs.Names("").job_queue(q))
    ]
    assert len(keys) == len(set(keys))
    assert {f.idempotency_key for f in fired} <= set(keys)


@pytest.mark.anyio
@pytest.mark.rabbitmq_only("cuts the leader's TCP connection with a FaultProxy")
async def test_leader_transport_cut_fails_over_and_the_old_leader_stands_by(
    q: str, cleanup: Cleanup, raw: amqp.Connection
) -> None:
    """The leader's TCP connection is cut (no goodbye): the broker requeues the token to
    the other instance; the old leader notices synchronously, reconnects, and waits."""
    group = group_name()
    register_leader_queue(cleanup, group)
    a, b = ojs.Scheduler(group, instance_id="a"), ojs.Scheduler(group, instance_id="b")
    for sched in (a, b):
        sched.add("cron.tick", EVERY_SECOND, queue=q, name="tick")
    rec = Recorder(a=a, b=b)
    async with FaultProxy() as proxy, anyio.create_task_group() as tg:
        await start_instance(tg, a, proxy.url())
        await rec.wait_for(lambda: len(rec.fired("a")) >= 1)  # a leads (first consumer)
        scope_b = await start_instance(tg, b)
        await rec.wait_for(lambda: len(rec.fired("a")) >= 2)
        assert rec.fired("b") == []
        proxy.cut_all()
        await rec.wait_for(lambda: len(rec.fired("b")) >= 2, timeout=5)
        assert b.is_leader and not a.is_leader
        a_count = len(rec.fired("a"))
        # b stops: a (reconnected, standing by) becomes leader again.
        scope_b.cancel()
        await rec.wait_for(lambda: len(rec.fired("a")) >= a_count + 2, timeout=5)
        assert a.is_leader
        tg.cancel_scope.cancel()
    fired = rec.fired()
    assert unique_ticks(fired), [f.idempotency_key for f in fired]
    # Leadership alternated a -> b -> a, never overlapping in ticks.
    labels = [lb for lb, _ in sorted(rec.fired_by(), key=lambda item: item[1].tick)]
    changes = [x for i, x in enumerate(labels) if i == 0 or labels[i - 1] != x]
    assert changes == ["a", "b", "a"]


# ====================================================================== broker: misfires


async def run_gap(q: str, group: str, misfire: Misfire) -> Recorder:
    """Instance ``a`` fires two ticks and stops; 2.5 s later instance ``b`` starts."""
    a = ojs.Scheduler(group, instance_id="a", misfire=misfire, misfire_grace=timedelta(seconds=30))
    b = ojs.Scheduler(group, instance_id="b", misfire=misfire, misfire_grace=timedelta(seconds=30))
    for sched in (a, b):
        sched.add("cron.tick", EVERY_SECOND, queue=q, name="tick")
    rec = Recorder(a=a, b=b)
    async with instances((a, current_url())):
        await rec.wait_for(lambda: len(rec.fired("a")) >= 2)
    await anyio.sleep(2.5)  # the leadership gap is the behaviour under test
    async with instances((b, current_url())):
        await rec.wait_for(lambda: len(rec.fired("b")) >= 2)
    return rec


@pytest.mark.anyio
async def test_misfire_once_fires_the_latest_missed_tick_once(q: str, cleanup: Cleanup) -> None:
    group = group_name()
    register_leader_queue(cleanup, group)
    rec = await run_gap(q, group, "once")
    last_a = max(f.tick for f in rec.fired("a"))
    first_b, second_b = rec.fired("b")[:2]
    assert first_b.late, first_b
    assert first_b.tick >= last_a + timedelta(seconds=2)  # the older missed ticks were dropped
    assert not second_b.late and second_b.tick == first_b.tick + timedelta(seconds=1)
    assert unique_ticks(rec.fired())


@pytest.mark.anyio
async def test_misfire_skip_drops_missed_ticks(q: str, cleanup: Cleanup) -> None:
    group = group_name()
    register_leader_queue(cleanup, group)
    rec = await run_gap(q, group, "skip")
    last_a = max(f.tick for f in rec.fired("a"))
    became = [
        ev.at for lb, ev in rec.events if lb == "b" and isinstance(ev, ojs.LeadershipChanged) and ev.leader
    ]
    first_b = rec.fired("b")[0]
    assert not first_b.late
    assert first_b.tick >= became[0]  # nothing before b became leader
    assert first_b.tick >= last_a + timedelta(seconds=3)
    assert unique_ticks(rec.fired())


# ====================================================================== broker: the token


async def token_states(conn: amqp.Connection, queue: str) -> list[dict[str, Any]]:
    states = []
    for msg in await drain(conn, queue):
        assert msg.properties.delivery_mode == 2 and msg.properties.type == "ojs.scheduler.token"
        states.append(msgspec.json.decode(msg.body))
    return states


@pytest.mark.anyio
async def test_duplicate_tokens_are_merged_into_one(q: str, cleanup: Cleanup, raw: amqp.Connection) -> None:
    """Several tokens (a creation race, a crash mid-swap): the leader keeps one, with the
    latest record of each schedule."""
    group = group_name()
    leader_q = register_leader_queue(cleanup, group)
    hour_ago = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
    older, newer, ancient = (
        format_timestamp(t) for t in (hour_ago, hour_ago + timedelta(seconds=4), at("2024-01-01T00:00:00"))
    )
    async with raw.channel() as ch:
        await ch.queue_declare(leader_q, durable=True, arguments={"x-single-active-consumer": True})
        for fired in ({"other": older, "ancient": ancient}, {"other": newer}, {}):
            body = msgspec.json.encode({"v": 1, "group": group, "fired": fired})
            await ch.publish(body, routing_key=leader_q, properties=amqp.BasicProperties(delivery_mode=2))
    sched = ojs.Scheduler(group, instance_id="a")
    sched.add("cron.tick", EVERY_SECOND, queue=q, name="tick")
    rec = Recorder(a=sched)
    async with instances((sched, current_url())):
        await rec.wait_for(lambda: len(rec.fired()) >= 2)
        assert sched.statistics().duplicate_tokens == 2
        assert sched.last_fired("other") == parse_timestamp(newer)
    (state,) = await token_states(raw, leader_q)  # one token left, given back when it stopped
    # the later tick won; another deployment's entry older than STATE_RETENTION was pruned
    assert state["fired"] == {"other": newer, "tick": format_timestamp(max(f.tick for f in rec.fired()))}


@pytest.mark.anyio
async def test_stop_returns_and_gives_the_token_back(q: str, cleanup: Cleanup, raw: amqp.Connection) -> None:
    group = group_name()
    leader_q = register_leader_queue(cleanup, group)
    sched = ojs.Scheduler(group, token_refresh=0.2)  # no schedules: it only keeps the token fresh
    rec = Recorder(a=sched)
    with anyio.fail_after(WAIT):
        async with ojs.connect(current_url()) as client, anyio.create_task_group() as tg:
            tg.start_soon(sched.run, client)
            await rec.wait_for(lambda: sched.is_leader)
            await anyio.sleep(1.0)  # time is the behaviour: the token is swapped every 0.2 s
            assert sched.statistics().token_swaps >= 3
            sched.stop()
        # the task group ended: run() returned
    assert not sched.is_leader
    assert len(await token_states(raw, leader_q)) == 1


@pytest.mark.anyio
async def test_cancellation_propagates_and_requeues_the_token(cleanup: Cleanup, raw: amqp.Connection) -> None:
    group = group_name()
    leader_q = register_leader_queue(cleanup, group)
    sched = ojs.Scheduler(group)
    rec = Recorder(a=sched)
    returned = False

    async def run(client: ojs.Client) -> None:
        nonlocal returned
        await sched.run(client)
        returned = True  # must not happen: run() re-raises the cancellation

    async with ojs.connect(current_url()) as client:
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(run, client)
                await rec.wait_for(lambda: sched.is_leader)
                tg.cancel_scope.cancel()
        assert not returned and not sched.is_leader
        # Another run on the same client works: nothing was left behind.
        async with anyio.create_task_group() as tg:
            tg.start_soon(sched.run, client)
            await rec.wait_for(lambda: sched.is_leader)
            sched.stop()
    assert len(await token_states(raw, leader_q)) == 1
    assert sched.statistics().leader_changes == 2


@pytest.mark.anyio
async def test_a_deleted_leadership_queue_is_recreated(
    q: str, cleanup: Cleanup, raw: amqp.Connection
) -> None:
    group = group_name()
    leader_q = register_leader_queue(cleanup, group)
    sched = ojs.Scheduler(group, retry_delay=0.1)
    sched.add("cron.tick", EVERY_SECOND, queue=q, name="tick")
    rec = Recorder(a=sched)
    async with instances((sched, current_url())):
        await rec.wait_for(lambda: len(rec.fired()) >= 1)
        async with raw.channel() as ch:
            await ch.queue_delete(leader_q)
        n = len(rec.fired())
        await rec.wait_for(lambda: len(rec.fired()) >= n + 2)
        assert sched.is_leader
    assert unique_ticks(rec.fired())
    assert len(await token_states(raw, leader_q)) == 1


@pytest.mark.anyio
async def test_stop_before_run_and_add_after_run(cleanup: Cleanup) -> None:
    """``stop()`` before ``run()`` makes it return at once; the scheduler is reusable after."""
    group = group_name()
    register_leader_queue(cleanup, group)
    sched = ojs.Scheduler(group)
    sched.stop()
    async with ojs.connect(current_url()) as client:
        with anyio.fail_after(WAIT):
            await sched.run(client)
    sched.add("cron.tick", "0 3 * * *")  # outside run(): nothing to wake, no event loop needed
    assert not sched.is_leader and [s.name for s in sched.schedules] == ["cron.tick"]


@pytest.mark.parametrize(
    ("last", "tick", "late", "since", "expected"),
    [
        # the next tick: nothing passed over
        ("10:00:00", "10:01:00", False, "09:00:00", None),
        ("10:00:00", "10:01:00", True, "09:00:00", None),
        # never fired: nothing to have missed
        (None, "10:05:00", False, "09:00:00", None),
        # the leader fell behind while leading: coalesced, a WARNING
        ("10:00:00", "10:05:00", False, "09:00:00", (logging.WARNING, "fell behind", "10:01:00")),
        # ticks passed while nobody led: missed, INFO
        ("10:00:00", "10:05:00", False, "10:03:00", (logging.INFO, "while nobody led", "10:01:00")),
        ("10:00:00", "10:05:00", False, None, (logging.INFO, "while nobody led", "10:01:00")),
    ],
)
def test_skipped_ticks_table(
    last: str | None, tick: str, late: bool, since: str | None, expected: tuple[int, str, str] | None
) -> None:
    """Pure: what firing a tick passes over, and at which log level it is reported."""

    def at(hms: str) -> datetime:
        return datetime.fromisoformat(f"2026-03-01T{hms}+00:00")

    schedule = Schedule(name="s", cron="* * * * *", job_type="a.b")
    out = skipped_ticks(
        schedule,
        at(tick),
        last_fired=at(last) if last else None,
        late=late,
        leader_since=at(since) if since else None,
    )
    if expected is None:
        assert out is None
    else:
        level, words, first = expected
        assert out is not None and out[0] == level and words in out[1] and first in out[1]
