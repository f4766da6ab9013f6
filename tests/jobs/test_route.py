"""``route(job, now, scheduler, names) -> Route``: where a job is published, what its
message carries besides the job, and what must exist first.  Pure: table tests, the clock
passed in."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import ojs_anyio as ojs
from ojs_anyio.jobs._delay_levels import delay_routing_key
from ojs_anyio.jobs._route import H_DELAY, DelayedBinding, JobQueue, Landing, Route, delay_ms, route
from ojs_anyio.jobs._topology import MAX_DELAY_MS

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
NAMES = ojs.Names("tenant1.")


def job(scheduled: timedelta | None = None, queue: str = "email") -> ojs.Job:
    at = ojs.jobs.format_timestamp(NOW + scheduled) if scheduled is not None else None
    return ojs.new_job("email.send", [], queue=queue, scheduled_at=at)


CASES: list[tuple[str, timedelta | None, str, Route]] = [
    ("due now", None, "levels",
     Route("tenant1.ojs.exchange.direct", "email", {}, (JobQueue("email"),))),
    ("due now, plugin", None, "plugin",
     Route("tenant1.ojs.exchange.direct", "email", {}, (JobQueue("email"),))),
    ("scheduled in the past", timedelta(seconds=-5), "levels",
     Route("tenant1.ojs.exchange.direct", "email", {}, (JobQueue("email"),))),
    ("scheduled exactly now", timedelta(0), "plugin",
     Route("tenant1.ojs.exchange.direct", "email", {}, (JobQueue("email"),))),
    ("in 90 s, levels", timedelta(seconds=90), "levels",
     Route(NAMES.delay_entry_exchange, delay_routing_key(90_000, "email"), {},
           (JobQueue("email"), Landing("email")), delay_ms=90_000)),
    ("in 1 ms, levels", timedelta(milliseconds=1), "levels",
     Route(NAMES.delay_entry_exchange, delay_routing_key(1, "email"), {},
           (JobQueue("email"), Landing("email")), delay_ms=1)),
    ("in 90 s, plugin", timedelta(seconds=90), "plugin",
     Route("tenant1.ojs.exchange.delayed", "email", {H_DELAY: 90_000},
           (JobQueue("email"), DelayedBinding("email")), mandatory=False, delay_ms=90_000)),
    ("at the longest delay", timedelta(milliseconds=MAX_DELAY_MS), "plugin",
     Route("tenant1.ojs.exchange.delayed", "email", {H_DELAY: MAX_DELAY_MS},
           (JobQueue("email"), DelayedBinding("email")), mandatory=False, delay_ms=MAX_DELAY_MS)),
]  # fmt: skip


@pytest.mark.parametrize(("case", "scheduled", "scheduler", "expected"), CASES, ids=[c[0] for c in CASES])
def test_route_table(case: str, scheduled: timedelta | None, scheduler: Any, expected: Route) -> None:
    assert route(job(scheduled), NOW, scheduler, NAMES) == expected


def test_a_sub_millisecond_wait_rounds_up_so_a_job_never_runs_early() -> None:
    assert delay_ms(NOW + timedelta(microseconds=10), NOW) == 1
    assert delay_ms(NOW + timedelta(milliseconds=2), NOW) == 2
    assert delay_ms(NOW - timedelta(milliseconds=2), NOW) == -2


@pytest.mark.parametrize("scheduler", ["levels", "plugin"])
def test_beyond_the_longest_delay_is_refused_before_anything_is_sent(scheduler: Any) -> None:
    with pytest.raises(ojs.DelayOutOfRangeError, match="nothing was published"):
        route(job(timedelta(milliseconds=MAX_DELAY_MS + 1)), NOW, scheduler, NAMES)


def test_the_route_depends_on_the_clock_passed_in_only() -> None:
    scheduled = job(timedelta(seconds=10))
    later = route(scheduled, NOW + timedelta(seconds=4), "levels", NAMES)
    assert later.delay_ms == 6_000 and later.routing_key == delay_routing_key(6_000, "email")
    assert route(scheduled, NOW + timedelta(seconds=11), "levels", NAMES).exchange == NAMES.direct_exchange


def test_a_job_due_now_is_routed_by_its_own_names_and_queue() -> None:
    # The route of a job due now is made once per (names, queue) and reused: another
    # prefix or another queue must never get a route made for the first.
    plain, tenant = ojs.Names(), ojs.Names("tenant2.")
    for _ in range(2):
        assert route(job(), NOW, "levels", plain).exchange == "ojs.exchange.direct"
        assert route(job(), NOW, "levels", tenant).exchange == "tenant2.ojs.exchange.direct"
        assert route(job(queue="sms"), NOW, "levels", tenant).routing_key == "sms"
        assert route(job(queue="sms"), NOW, "levels", tenant).needs == (JobQueue("sms"),)
        assert route(job(), NOW, "levels", tenant).needs == (JobQueue("email"),)
