"""The cron scheduler's pure half: schedules, the misfire rule, the leadership table, the
token and its record of fired ticks, and the events.  No I/O, no clock read: time is passed
in.  The I/O half is ``_leader.py`` (the leadership token) and ``_cron.py`` (firing through
``Client.push_job``).

Cron expressions are parsed and iterated by croniter: five fields, or six with *seconds as
the last field* (croniter's default, ``second_at_beginning=False``: ``"* * * * * */5"`` is
every five seconds), plus ``@daily`` and friends and Jenkins-style ``H`` (hashed on the
schedule's name).  Ticks are computed in the schedule's ``timezone`` (DST is croniter's).

Missed ticks (``misfire``)
--------------------------
When a new leader takes over (after a failover, a leadership gap, or a full outage), the
ticks between the last fired one and the moment it became leader were missed.

* ``"skip"`` (default): fire only ticks at or after becoming leader; missed ones are dropped.
* ``"once"``: fire the most recent missed tick once, right away, if it is at most
  ``misfire_grace`` old (1 hour by default); older ones are dropped.  Never for a schedule
  that has never fired (there is nothing it could have missed).

A leader that falls behind while leading (its loop was blocked past several ticks) fires
only the most recent due tick and logs the coalesced ones.

Double fires and idempotency
----------------------------
Each job carries the idempotency key ``{schedule}:{tick}`` (``x-ojs-idempotency-key``,
tick in UTC RFC 3339, e.g. ``reports.daily:2026-02-15T02:00:00.000Z``), the same from any
instance.  Two fires of one tick are possible, only across a leadership change: a leader
whose push was confirmed but whose token swap was not (it died in between) leaves the old
state, and a ``"once"`` successor fires that tick again; a leader the broker declared dead
(missed heartbeats) while it still ran may fire the tick its successor also fires.
Downstream dedupes on the key.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, NamedTuple
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import msgspec
from croniter import CroniterBadDateError, croniter

from ojs_anyio.amqp import UsageError

from ._envelope import format_timestamp
from ._retry import RetryPolicy
from ._topology import Names

__all__ = [
    "skipped_ticks",
    "H_SCHEDULER",
    "MAX_STATE_ENTRIES",
    "MISFIRE_POLICIES",
    "STATE_RETENTION",
    "SWAP_TIMEOUT",
    "TOKEN_TYPE",
    "Fired",
    "Leadership",
    "LeadershipChanged",
    "Misfire",
    "Schedule",
    "SchedulerEvent",
    "SchedulerStatistics",
    "TokenState",
    "check_name",
    "due_tick",
    "leader_queue_name",
    "merge_fired",
    "token_decoder",
    "token_encoder",
]

Misfire = Literal["skip", "once"]
MISFIRE_POLICIES: frozenset[str] = frozenset({"skip", "once"})

#: Entries of schedules this instance doesn't know (another deployment's) are kept in the
#: token for this long after their last fire, and at most this many: the token stays bounded.
STATE_RETENTION = timedelta(days=30)
MAX_STATE_ENTRIES = 10_000
TOKEN_TYPE = "ojs.scheduler.token"
H_SCHEDULER = "x-ojs-scheduler"
#: Bound on a (shielded) token swap: publish, confirm, ack.
SWAP_TIMEOUT = 5.0
_MAX_NAME = 200  # leaves room for the prefix in AMQP's 255-byte queue names


def leader_queue_name(names: Names, group: str) -> str:
    """``{prefix}ojs.queue.scheduler.{group}.leader``: the leadership queue of a group."""
    return f"{names.prefix}ojs.queue.scheduler.{group}.leader"


def check_name(what: str, name: str) -> str:
    if not name or len(name.encode()) > _MAX_NAME or any(c.isspace() for c in name):
        raise UsageError(f"{what} {name!r} must be 1-{_MAX_NAME} bytes without whitespace")
    return name


# ------------------------------------------------------------------ schedules (pure)


@dataclass(frozen=True, slots=True, kw_only=True)
class Schedule:
    """One periodic job: what :meth:`Scheduler.add` registered.  Pure: no I/O, no clock."""

    name: str
    cron: str
    job_type: str
    args: tuple[Any, ...] = ()
    queue: str = "default"
    timezone: str = "UTC"
    misfire: Misfire = "skip"
    misfire_grace: timedelta = timedelta(hours=1)
    priority: int | None = None
    timeout: int | None = None
    retry: RetryPolicy | None = None
    meta: dict[str, Any] | None = None
    _tz: ZoneInfo = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_name("schedule name", self.name)
        if self.misfire not in MISFIRE_POLICIES:
            raise UsageError(f"misfire must be 'skip' or 'once', not {self.misfire!r}")
        if self.misfire_grace < timedelta(0):
            raise UsageError("misfire_grace must not be negative")
        try:
            tz = ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise UsageError(f"unknown timezone {self.timezone!r}") from exc
        object.__setattr__(self, "_tz", tz)
        if not croniter.is_valid(self.cron, hash_id=self.name.encode()):
            raise UsageError(f"invalid cron expression {self.cron!r} for schedule {self.name!r}")
        try:
            self.next_tick(datetime(2000, 1, 1, tzinfo=UTC))
        except CroniterBadDateError as exc:
            raise UsageError(f"cron expression {self.cron!r} never matches a date") from exc

    def _iter(self, start: datetime) -> croniter:
        return croniter(self.cron, start.astimezone(self._tz), hash_id=self.name.encode())

    def next_tick(self, after: datetime) -> datetime:
        """The first tick strictly after ``after`` (an aware datetime), in UTC."""
        return self._iter(after).get_next(datetime).astimezone(UTC)

    def latest_tick(self, now: datetime) -> datetime:
        """The last tick at or before ``now``, in UTC."""
        before = self._iter(now).get_prev(datetime)
        # croniter's get_prev is strict for whole seconds and not for fractions: settle it.
        nxt = self._iter(before).get_next(datetime)
        return (nxt if nxt <= now else before).astimezone(UTC)

    def idempotency_key(self, tick: datetime) -> str:
        """``{name}:{tick in UTC, RFC 3339}``: identical from every instance."""
        return f"{self.name}:{format_timestamp(tick)}"


def due_tick(
    schedule: Schedule, *, last_fired: datetime | None, leader_since: datetime, now: datetime
) -> tuple[datetime | None, bool]:
    """The misfire policy, as a pure function: ``(tick to fire now or None, late)``.

    ``last_fired`` is the schedule's last fired tick (None: never fired), ``leader_since``
    when this instance became leader.  ``late`` is True for a missed tick fired under
    ``misfire="once"``.
    """
    latest = schedule.latest_tick(now)
    if last_fired is not None and latest <= last_fired:
        return None, False
    if latest >= leader_since:
        return latest, False
    if schedule.misfire == "once" and last_fired is not None and now - latest <= schedule.misfire_grace:
        return latest, True
    return None, False


def skipped_ticks(
    schedule: Schedule,
    tick: datetime,
    *,
    last_fired: datetime | None,
    late: bool,
    leader_since: datetime | None,
) -> tuple[int, str] | None:
    """What firing ``tick`` passes over, for the log: ``(level, text)``, or None when
    ``tick`` is the schedule's next one.  A leader that fell behind coalesces the ticks
    since the first due one (WARNING); ticks that passed while nobody led are missed (INFO)."""
    first_due = schedule.next_tick(last_fired) if last_fired is not None and not late else tick
    if first_due >= tick:
        return None
    if leader_since is not None and first_due >= leader_since:
        return logging.WARNING, (
            f"schedule {schedule.name} fell behind; firing {format_timestamp(tick)}, "
            f"coalescing the ticks since {format_timestamp(first_due)}"
        )
    return logging.INFO, (
        f"schedule {schedule.name} missed ticks from {format_timestamp(first_due)} while nobody led "
        f"(misfire={schedule.misfire})"
    )


# ------------------------------------------------------------------ events


@dataclass(frozen=True, slots=True, kw_only=True)
class Fired:
    """A tick this instance fired.  ``error`` is set when the broker refused the push."""

    schedule: str
    tick: datetime
    idempotency_key: str
    job_id: str | None
    late: bool = False
    error: Exception | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LeadershipChanged:
    """This instance became leader (``leader=True``) or stopped being leader."""

    leader: bool
    at: datetime
    reason: str


SchedulerEvent = Fired | LeadershipChanged


class SchedulerStatistics(NamedTuple):
    leader: bool
    leader_since: datetime | None
    fired: int
    failed: int
    leader_changes: int
    duplicate_tokens: int
    token_swaps: int


class TokenState(msgspec.Struct, kw_only=True):
    v: int = 1
    group: str = ""
    fired: dict[str, str] = msgspec.field(default_factory=dict)
    by: str = ""
    at: str = ""


token_encoder = msgspec.json.Encoder()
token_decoder = msgspec.json.Decoder(TokenState)

# ------------------------------------------------------------------ leadership (pure)


@dataclass(slots=True)
class Leadership:
    """Whether this instance leads, as a table of transitions: an input either changes the
    state and returns the :class:`LeadershipChanged` to report, or changes nothing and
    returns None.  The I/O half (``Scheduler``) feeds it what happened on the broker.

    ============  ===================  =========  ====================================
    leading       input                leading    returns
    ============  ===================  =========  ====================================
    no            ``gained(now)``      yes        ``LeadershipChanged(leader=True)``
    yes           ``gained(now)``      yes        None (still leader)
    yes           ``lost(now, why)``   no         ``LeadershipChanged(leader=False)``
    no            ``lost(now, why)``   no         None
    ============  ===================  =========  ====================================
    """

    leading: bool = False
    since: datetime | None = None
    changes: int = 0

    def gained(self, now: datetime) -> LeadershipChanged | None:
        """A token was delivered to us: we are the active consumer."""
        if self.leading:
            return None
        self.leading, self.since = True, now
        self.changes += 1
        return LeadershipChanged(leader=True, at=now, reason="token received")

    def lost(self, now: datetime, reason: str) -> LeadershipChanged | None:
        """The token is gone (connection or channel lost, the queue deleted, a stop)."""
        if not self.leading:
            return None
        self.leading = False
        return LeadershipChanged(leader=False, at=now, reason=reason)


def merge_fired(ours: dict[str, datetime], theirs: Mapping[str, datetime]) -> bool:
    """Merge a token's record of fired ticks into ``ours`` (the later tick wins, per
    schedule); return True when ``ours`` is then ahead of the token (it must be re-saved)."""
    for name, tick in theirs.items():
        mine = ours.get(name)
        if mine is None or tick > mine:
            ours[name] = tick
    return any(theirs.get(name) != tick for name, tick in ours.items())
