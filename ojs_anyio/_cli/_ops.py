"""The operator commands: queues, dlq, push, cancel, info, cron, topology."""

from __future__ import annotations

import argparse
import json
import logging
import math
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import anyio
import msgspec

from .. import Client, DeadJob, JobInfo, Scheduler, Worker, amqp
from ..jobs import (
    DELAY_LEVELS,
    RETRY_LADDER_MS,
    SYNC_CANCEL_DETAIL,
    QueueProbe,
    RetryPolicy,
    check_job_id,
    control_queue_arguments,
    delay_landing_queue_arguments,
    delay_level_queue_arguments,
    dlx_queue_arguments,
    exchanges,
    job_queue_arguments,
    retry_queue_arguments,
    return_to_queue,
)
from ._app import load_object
from ._common import (
    EXIT_CONNECT,
    EXIT_DIFFERENT,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_UNINTERRUPTIBLE,
    EXIT_USAGE,
    CLIError,
    broker_where,
    count_arg,
    error_for,
    fail,
    format_age,
    open_client,
    parse_duration,
    print_json,
    print_table,
    resolve_url,
)
from ._progress import Progress
from ._registry import command, group

log = logging.getLogger("ojs_anyio.cli")

T = TypeVar("T")


def _err(text: str) -> None:
    sys.stderr.write(f"ojs-anyio: {text}\n")


# ------------------------------------------------------------------ plumbing


@dataclass
class Interrupt:
    """Set by the first SIGINT/SIGTERM: long operations stop after the current step."""

    requested: bool = False


async def interruptible(fn: Callable[[Interrupt], Awaitable[int]]) -> int:
    """Run ``fn``: a first SIGINT/SIGTERM asks it to stop after the step it is on (it
    checks ``interrupt.requested``); a second one cancels it at once."""
    interrupt = Interrupt()
    hard = False
    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            nonlocal hard
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    if not interrupt.requested:
                        interrupt.requested = True
                        _err("interrupted: finishing the current job, then stopping (again to stop at once)")
                    else:
                        hard = True
                        tg.cancel_scope.cancel()
                        return

        tg.start_soon(watch)
        rc = await fn(interrupt)
        tg.cancel_scope.cancel()
    if hard:
        raise CLIError("interrupted again: stopped at once (the job being moved may be duplicated)", 130)
    return rc


def confirm(question: str, yes: bool) -> None:
    if yes:
        return
    if not sys.stdin.isatty():
        fail(f"{question}: refusing without --yes (standard input is not a terminal)", EXIT_USAGE)
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline().strip().lower()
    if answer not in ("y", "yes"):
        raise CLIError("cancelled: nothing changed", EXIT_USAGE)


async def _need_queue(probe: QueueProbe, name: str, what: str) -> amqp.QueueInfo:
    info = await probe.queue(name)
    if info is None:
        raise CLIError(f"{what} {name!r} does not exist", EXIT_NOT_FOUND)
    return info


async def _dead_letter_total(client: Client, queue: str, *, need_job_queue: bool = False) -> int:
    """How many dead jobs ``queue``'s dead-letter queue holds; exit "not found" when it does
    not exist, nor (with ``need_job_queue``) when the job queue does not."""
    probe = QueueProbe(client)
    try:
        info = await _need_queue(probe, client.names.dlx_queue(queue), "dead-letter queue")
        if need_job_queue:
            await _need_queue(probe, client.names.job_queue(queue), "job queue")
    finally:
        await probe.aclose()
    return info.message_count


# -------------------------------------------------------------------- queues


def _queues_arguments(q: argparse.ArgumentParser) -> None:
    q.add_argument("queue", nargs="*", help="OJS queue names")
    q.add_argument("--app", default=None, metavar="MODULE:WORKER", help="also the queues of this Worker")


@command(
    "queues",
    help="ready jobs, consumers, dead, retrying and scheduled counts per queue",
    description="Show, per OJS queue, ready jobs, consumers, and the depths of its dead-letter and retry "
    "queues, read with AMQP passive declares (nothing beyond a plain broker is needed).",
    arguments=_queues_arguments,
)
async def cmd_queues(args: Any) -> int:
    queues: list[str] = list(args.queue or [])
    if args.app:
        queues += [
            q for q in load_object(args.app, Worker, show_traceback=args.traceback).queues if q not in queues
        ]
    if not queues:
        fail(
            "name the queues (ojs-anyio queues email reports) or give --app module:worker; "
            "AMQP cannot list a broker's queues",
            EXIT_USAGE,
        )
    async with open_client(args.url, args.prefix) as client:
        names = client.names
        for q in queues:
            names.job_queue(q)  # validates the name before anything is sent
        probe = QueueProbe(client)
        try:
            rows: list[dict[str, Any]] = []
            missing: list[str] = []
            for q in queues:
                job = await probe.queue(names.job_queue(q))
                if job is None:
                    missing.append(q)
                    continue
                dlq = await probe.queue(names.dlx_queue(q))
                retry: dict[str, int] = {}
                for ms in RETRY_LADDER_MS:
                    info = await probe.queue(names.retry_queue(q, ms))
                    if info is not None:
                        retry[str(ms)] = info.message_count
                rows.append(
                    {
                        "queue": q,
                        "ready": job.message_count,
                        "consumers": job.consumer_count,
                        "dead": None if dlq is None else dlq.message_count,
                        "retrying": sum(retry.values()),
                        "retry_queues": retry,
                    }
                )
            scheduled = 0
            levels = 0
            for k in range(DELAY_LEVELS):
                info = await probe.queue(names.delay_queue(k))
                if info is not None:
                    levels += 1
                    scheduled += info.message_count
        finally:
            await probe.aclose()
    if args.json:
        print_json(
            {
                "source": "AMQP passive declares (ready = messages ready for delivery; "
                "jobs being run are unacked and not counted)",
                "queues": rows,
                "missing": missing,
                "scheduled_in_delay_levels": scheduled if levels else None,
            }
        )
    elif rows:
        print_table(
            ["QUEUE", "READY", "CONSUMERS", "DEAD", "RETRYING", "RETRY QUEUES"],
            [
                [r["queue"], r["ready"], r["consumers"], r["dead"], r["retrying"], len(r["retry_queues"])]
                for r in rows
            ],
        )
        if levels:
            print(f"scheduled jobs waiting in the shared delay levels (all queues): {scheduled}")
        print(
            "(figures from AMQP passive declares; READY excludes jobs being run, which AMQP does not count)"
        )
    for q in missing:
        _err(f"queue {q!r} does not exist ({client.names.job_queue(q)})")
    return EXIT_NOT_FOUND if missing else EXIT_OK


# ----------------------------------------------------------------------- dlq


def _dead_row(job: DeadJob, now: datetime) -> dict[str, Any]:
    when = job.died_at
    attempt = job.headers.get("x-ojs-attempt")
    return {
        "id": job.id,
        "type": job.type,
        "attempt": attempt if isinstance(attempt, int) else None,
        "reason": job.reason,
        "malformed": job.malformed,
        "died_at": when.isoformat() if when else None,
        "age_seconds": None if when is None else round((now - when).total_seconds(), 3),
    }


group("dlq", help="dead letters: peek, requeue, purge, prune")


def _dlq_queue(p: argparse.ArgumentParser) -> None:
    p.add_argument("queue", help="OJS queue name (its dead letters are in ojs.queue.dlx.QUEUE)")


def _peek_arguments(p: argparse.ArgumentParser) -> None:
    _dlq_queue(p)
    p.add_argument("-n", type=count_arg(0), default=20, metavar="N", help="how many (default 20)")


@command(
    "dlq",
    "peek",
    help="show the oldest dead jobs: id, type, attempt, age, reason (nothing is removed)",
    arguments=_peek_arguments,
)
async def cmd_dlq_peek(args: Any) -> int:
    async with open_client(args.url, args.prefix) as client:
        name = client.names.dlx_queue(args.queue)
        total = await _dead_letter_total(client, args.queue)
        now = datetime.now(UTC)
        # DeadLetters.peek: Basic.Get and put back, joined with the workers' death notes.
        rows = [_dead_row(job, now) for job in await client.dead_letters(args.queue).peek(args.n)]
    if args.json:
        print_json({"queue": args.queue, "total": total, "jobs": rows})
    else:
        print_table(
            ["JOB ID", "TYPE", "ATTEMPT", "AGE", "REASON"],
            [[r["id"], r["type"], r["attempt"], format_age(r["age_seconds"]), r["reason"]] for r in rows],
        )
        print(f"({len(rows)} of {total} dead jobs in {name}, oldest first)")
    return EXIT_OK


def _requeue_arguments(p: argparse.ArgumentParser) -> None:
    _dlq_queue(p)
    p.add_argument("--id", action="append", metavar="ID", help="a job id (repeatable)")
    p.add_argument("--all", action="store_true", help="every dead job of the queue")
    p.add_argument("--reset-attempts", action="store_true", help="start the jobs again at attempt 1")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")


@command(
    "dlq",
    "requeue",
    help="move dead jobs back to their queue (publish, confirm, then ack: never lost; "
    "SIGINT stops after the current job)",
    arguments=_requeue_arguments,
)
async def cmd_dlq_requeue(args: Any) -> int:
    ids: set[str] = set(args.id or [])
    if not ids and not args.all:
        fail("say which jobs: --id ID (repeatable) or --all", EXIT_USAGE)
    if ids and args.all:
        fail("give --id or --all, not both", EXIT_USAGE)

    async def run(interrupt: Interrupt) -> int:
        state = _Requeue()
        try:
            return await requeue(interrupt, state)
        except Exception as exc:
            if state.job_queue is None:
                raise  # nothing was moved yet: the error as it is
            # Also when the connection died: the block was cancelled, and this is its error.
            raise _requeue_stopped(exc, resolve_url(args.url), state) from exc

    async def requeue(interrupt: Interrupt, state: _Requeue) -> int:
        async with open_client(args.url, args.prefix) as client:
            names = client.names
            dlq = names.dlx_queue(args.queue)
            total = await _dead_letter_total(client, args.queue, need_job_queue=True)
            if args.all:
                confirm(
                    f"Requeue all {total} dead jobs of {args.queue!r} to {names.job_queue(args.queue)}?",
                    args.yes,
                )
            scanned = 0
            malformed: list[str] = []
            wanted = set(ids)
            state.job_queue = names.job_queue(args.queue)
            progress = Progress(len(ids) if ids else total, "requeue", enabled=not args.json)
            dead = client.dead_letters(args.queue)
            async with client.conn.channel(confirms=True) as ch:
                held: list[amqp.IncomingMessage] = []
                try:
                    # At most the jobs there at the start: a job that fails again and comes
                    # back is not moved twice in one run.
                    while scanned < total and not interrupt.requested and (args.all or wanted):
                        msg = await ch.get(dlq)
                        state.acked()  # the broker answered after the last ack: it has it
                        progress.update(state.moved)
                        if msg is None:
                            break
                        scanned += 1
                        job_id = amqp.property_text(msg.properties.message_id)
                        if not args.all and job_id not in wanted:
                            held.append(msg)  # not ours: kept unacked, put back at the end
                            continue
                        if msg.malformed is not None:
                            # It cannot be published again as it is, and the worker would
                            # only dead-letter it again: it stays in the DLQ.
                            held.append(msg)
                            malformed.append(job_id or "-")
                            wanted.discard(job_id or "")
                            continue
                        state.in_flight = job_id or f"without an id (delivery {msg.delivery_tag})"
                        try:
                            await dead.republish(ch, msg, reset_attempts=args.reset_attempts)
                        except _NOT_SENT:
                            state.in_flight = None  # refused by the broker, or never sent: not moved
                            held.append(msg)
                            raise
                        except BaseException:
                            held.append(msg)
                            raise
                        # Confirmed by the broker: now the dead copy may go.  An ack has no
                        # reply: until the broker answers the next request on this channel
                        # (the next get, or the channel's close) the job stays "in flight".
                        await msg.ack()
                        wanted.discard(job_id or "")
                finally:
                    progress.close()
                    await return_to_queue(held)
        state.acked()  # the channel closed cleanly: the broker answered after the last ack
        moved = state.moved
        result = {
            "queue": args.queue,
            "requeued": moved,
            "not_found": sorted(wanted),
            "malformed": malformed,
            "interrupted": interrupt.requested,
        }
        if args.json:
            print_json(result)
        else:
            print(f"requeued {moved} dead job(s) to {names.job_queue(args.queue)}")
        if malformed:
            _err(
                f"left {len(malformed)} malformed message(s) in {dlq}, which cannot be published again as "
                f"they are (dlq peek says why; dlq purge or prune removes them): {', '.join(malformed)}"
            )
        if interrupt.requested:
            _err(f"interrupted after {moved} job(s); the rest are still in {dlq}")
            return EXIT_INTERRUPTED
        if wanted:
            _err(f"not in {dlq}: {', '.join(sorted(wanted))}")
            return EXIT_NOT_FOUND
        return EXIT_OK

    return await interruptible(run)


#: What ``DeadLetters.republish`` raises when the copy is not in the job queue: the broker
#: refused it (nack, no route), it was never written, or it cannot be encoded.
_NOT_SENT = (amqp.PublishNackedError, amqp.UnroutableError, amqp.PublishTimeoutError, amqp.UsageError)


@dataclass
class _Requeue:
    """How far a ``dlq requeue`` got, for the error line when it fails part way."""

    job_queue: str | None = None  # set once the moving starts
    moved: int = 0
    #: The job between its publish and the broker's next answer after the ack of its dead
    #: copy (an ack has no reply of its own): if the connection goes then, it may be in both
    #: queues.
    in_flight: str | None = None

    def acked(self) -> None:
        """The broker answered on the channel after the in-flight job's ack: it is moved."""
        if self.in_flight is not None:
            self.in_flight = None
            self.moved += 1


def _requeue_stopped(exc: Exception, url: str, state: _Requeue) -> CLIError:
    """The one line for a requeue that failed part way: how far it got, and the one job
    that may be in both queues."""
    if isinstance(exc, amqp.ConnectionLostError | amqp.ConnectionClosedError | OSError):
        cause = CLIError(f"lost the connection to the broker{broker_where(url)}: {exc}", EXIT_CONNECT)
    else:
        cause = error_for(exc, url)  # re-raises what it does not know
    if state.in_flight is None:
        twice = "no job is in both queues"
    else:
        twice = f"job {state.in_flight} may be in both queues (published; its dead copy's ack not confirmed)"
    progress = f"requeue stopped after moving {state.moved} job(s) to {state.job_queue}"
    return CLIError(f"{progress}; {twice}: {cause}", cause.code)


def _purge_arguments(p: argparse.ArgumentParser) -> None:
    _dlq_queue(p)
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")


@command("dlq", "purge", help="delete every dead job of the queue", arguments=_purge_arguments)
async def cmd_dlq_purge(args: Any) -> int:
    async with open_client(args.url, args.prefix) as client:
        name = client.names.dlx_queue(args.queue)
        total = await _dead_letter_total(client, args.queue)
        confirm(f"Delete all {total} dead jobs in {name}?", args.yes)
        # Queue.Purge is one broker operation: it happens whole or not at all.
        async with client.conn.channel(confirms=False) as ch:
            purged = await ch.queue_purge(name)
    if args.json:
        print_json({"queue": args.queue, "purged": purged})
    else:
        print(f"purged {purged} dead job(s) from {name}")
    return EXIT_OK


def _prune_arguments(p: argparse.ArgumentParser) -> None:
    _dlq_queue(p)
    p.add_argument("--max-age", default=None, metavar="DURATION", help="e.g. P180D, 30d, 12h")
    p.add_argument(
        "--max-count", type=count_arg(0), default=None, metavar="N", help="keep at most the newest N"
    )
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")


@command(
    "dlq",
    "prune",
    help="delete the oldest dead jobs: older than --max-age, or beyond --max-count",
    arguments=_prune_arguments,
)
async def cmd_dlq_prune(args: Any) -> int:
    max_age = prune_max_age(args)

    async def run(interrupt: Interrupt) -> int:
        async with open_client(args.url, args.prefix) as client:
            name = client.names.dlx_queue(args.queue)
            total = await _dead_letter_total(client, args.queue)
            confirm(f"Delete the dead jobs in {name} {prune_rules(args)} (of {total})?", args.yes)
            dead = client.dead_letters(args.queue)
            dropped = await scan(  # at most the jobs there at the start
                args, total, "prune", interrupt,
                lambda moved, stop: dead.prune(
                    max_age, max_jobs=args.max_count, limit=total, on_dropped=moved, stop=stop
                ),
            )  # fmt: skip
        return scanned(
            args, interrupt, args.queue, "pruned", dropped, f"pruned {dropped} dead job(s) from {name}"
        )

    return await interruptible(run)


def prune_max_age(args: Any) -> timedelta | None:
    """``--max-age`` of a prune command (a usage error when neither bound is given)."""
    max_age = parse_duration(args.max_age, "--max-age") if args.max_age else None
    if max_age is None and args.max_count is None:
        fail("give --max-age and/or --max-count", EXIT_USAGE)
    return max_age


def prune_rules(args: Any) -> str:
    """What a prune command will delete, for its confirmation question."""
    rules = [f"older than {args.max_age}"] if args.max_age else []
    if args.max_count is not None:
        rules.append(f"beyond the newest {args.max_count}")
    return " or ".join(rules)


async def scan(
    args: Any,
    total: int,
    label: str,
    interrupt: Interrupt,
    run: Callable[[Callable[[int], object], Callable[[], bool]], Awaitable[int]],
) -> int:
    """A dead-letter scan (requeue, prune) with its progress bar on a terminal, stopped
    after the current message by the first SIGINT: ``run(on_progress, stop)``."""
    progress = Progress(total, label, enabled=not args.json)
    try:
        return await run(progress.update, lambda: interrupt.requested)
    finally:
        progress.close()


def scanned(args: Any, interrupt: Interrupt, queue: str, key: str, count: int, text: str) -> int:
    """A scan's report (``--json`` or ``text``) and exit code (130 when interrupted)."""
    if args.json:
        print_json({"queue": queue, key: count, "interrupted": interrupt.requested})
    else:
        print(text)
    return EXIT_INTERRUPTED if interrupt.requested else EXIT_OK


# -------------------------------------------------------------- push / cancel / info


class _NotJSON(ValueError):
    """A number that Python's json module reads but JSON has not: NaN, Infinity, 1e999."""


def _not_json(text: str) -> float:
    raise _NotJSON(f"{text} is not a JSON number (JSON has no NaN or Infinity)")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _NotJSON(f"{text} is too large for a JSON number (it would arrive as null)")
    return value


def _json_arg(text: str, what: str, kind: type[T]) -> T:
    try:
        value = json.loads(text, parse_constant=_not_json, parse_float=_finite)
    except json.JSONDecodeError as exc:
        raise CLIError(
            f"{what} is not valid JSON: {exc.msg} at character {exc.pos} of {text!r}", EXIT_USAGE
        ) from None
    except _NotJSON as exc:
        raise CLIError(f"{what} is not valid JSON: {exc}", EXIT_USAGE) from None
    if not isinstance(value, kind):
        raise CLIError(
            f"{what} must be a JSON {'array' if kind is list else 'object'}, got {text!r}", EXIT_USAGE
        )
    return value


def _retry_arg(text: str) -> RetryPolicy:
    if text.strip().lstrip("-").isdigit():
        data: dict[str, Any] = {"max_attempts": int(text)}
    else:
        data = _json_arg(text, "--retry", dict)
    try:
        policy = msgspec.convert(data, RetryPolicy)
        if isinstance(policy.max_attempts, int):
            amqp.Int32(policy.max_attempts)  # x-ojs-max-attempts is an int32 on the wire
    except (msgspec.ValidationError, ValueError) as exc:
        raise CLIError(f"--retry: {exc}", EXIT_USAGE) from None
    return policy


def _at_arg(text: str) -> datetime:
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise CLIError(
            f"--at: {text!r} is not an ISO 8601 time (e.g. 2026-05-01T09:00:00Z)", EXIT_USAGE
        ) from None
    if when.tzinfo is None:
        raise CLIError(f"--at: {text!r} has no time zone; add Z or an offset such as +02:00", EXIT_USAGE)
    return when


def _push_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("type", help="job type, e.g. email.send")
    p.add_argument("--queue", required=True)
    p.add_argument("--args", default="[]", metavar="JSON", help="the job's arguments, a JSON array")
    p.add_argument("--meta", default=None, metavar="JSON", help="a JSON object")
    p.add_argument("--delay", default=None, metavar="DURATION", help="run after this long: 30s, 5m, PT1H")
    p.add_argument("--at", default=None, metavar="ISO", help="run at this time: 2026-05-01T09:00:00Z")
    p.add_argument("--priority", type=int, default=None, metavar="P", help="OJS priority")
    p.add_argument("--timeout", default=None, metavar="DURATION", help="the handler's time limit")
    p.add_argument(
        "--retry",
        default=None,
        metavar="N|JSON",
        help='max attempts, or a retry policy: \'{"max_attempts": 5, "initial_interval": "PT2S"}\'',
    )
    p.add_argument("--id", default=None, help="the job id (default: a new UUIDv7)")
    p.add_argument("--declare", action="store_true", help="declare the queue if it does not exist")


@command("push", help="push a job and print its id", arguments=_push_arguments)
async def cmd_push(args: Any) -> int:
    job_args = _json_arg(args.args, "--args", list)
    meta = _json_arg(args.meta, "--meta", dict) if args.meta else None
    retry = _retry_arg(args.retry) if args.retry else None
    if args.delay and args.at:
        fail("give --delay or --at, not both", EXIT_USAGE)
    delay = parse_duration(args.delay, "--delay") if args.delay else None
    at = _at_arg(args.at) if args.at else None
    timeout = None
    if args.timeout:
        # Whole seconds in OJS (0: no timeout of its own); the library refuses a fraction.
        seconds = parse_duration(args.timeout, "--timeout").total_seconds()
        timeout = int(seconds) if seconds.is_integer() else seconds
    async with open_client(args.url, args.prefix) as client:
        if args.declare:
            await client.declare_queue(args.queue)
        else:
            try:
                await client.use_existing_queue(args.queue)
            except amqp.NotFound:
                raise CLIError(
                    f"queue {args.queue!r} does not exist ({client.names.job_queue(args.queue)}); "
                    f"declare it (ojs-anyio topology declare {args.queue}) or pass --declare",
                    EXIT_NOT_FOUND,
                ) from None
        job = await client.push(
            args.type,
            job_args,
            queue=args.queue,
            priority=args.priority,
            timeout=timeout,
            retry=retry,
            meta=meta,
            scheduled_at=at,
            delay=delay,
            id=args.id,
        )
    if args.json:
        print_json(
            {
                "id": job.id,
                "type": job.type,
                "queue": job.queue,
                "scheduled_at": job.scheduled_at if isinstance(job.scheduled_at, str) else None,
            }
        )
    else:
        print(job.id)
    return EXIT_OK


def _info_dict(info: JobInfo) -> dict[str, Any]:
    return {
        "job_id": info.id,
        "state": info.state,
        "attempt": info.attempt,
        "worker_id": info.worker_id,
        "started_at": info.started_at,
        "finished_at": info.finished_at,
        # What a running job's worker says (null for a job no longer running).
        "cancel_requested": info.cancel_requested if info.state == "active" else None,
        "interruptible": info.interruptible,
    }


#: Table rows left out when they say the usual: no cancel asked, the handler can be cancelled.
_USUAL = {"cancel_requested": False, "interruptible": True}


def _print_info(data: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(data)
    else:
        rows = [[k, v] for k, v in data.items() if v is not None and not (k in _USUAL and _USUAL[k] is v)]
        print_table(["FIELD", "VALUE"], rows)


def _ask_args(args: Any) -> float:
    """``info`` and ``cancel``: refuse, before connecting, an id that cannot be a job id
    and a timeout of zero; the timeout in seconds."""
    check_job_id(args.job_id, "job id")
    timeout = parse_duration(args.timeout, "--timeout").total_seconds()
    if timeout <= 0:
        fail(f"--timeout: give the workers some time to answer, got {args.timeout!r}", EXIT_USAGE)
    return timeout


def _control_arguments(c: argparse.ArgumentParser) -> None:
    c.add_argument("job_id")
    c.add_argument("--queue", required=True)
    c.add_argument("--timeout", default="2", metavar="DURATION", help="how long to wait for an answer (2s)")


@command("info", help="ask the workers of a queue about a job", arguments=_control_arguments)
async def cmd_info(args: Any) -> int:
    timeout = _ask_args(args)
    async with open_client(args.url, args.prefix) as client:
        info = await client.info(args.job_id, queue=args.queue, timeout=timeout)
    if info.state == "unknown":
        raise CLIError(
            f"job {args.job_id}: no worker of queue {args.queue!r} answered within {timeout:g}s "
            "(it is not running, and no live worker finished it recently)",
            EXIT_NOT_FOUND,
        )
    _print_info(_info_dict(info), args.json)
    return EXIT_OK


@command("cancel", help="ask the workers of a queue to cancel a job", arguments=_control_arguments)
async def cmd_cancel(args: Any) -> int:
    timeout = _ask_args(args)
    async with open_client(args.url, args.prefix) as client:
        await client.cancel(args.job_id, queue=args.queue)
        info = None
        with anyio.move_on_after(timeout):
            while True:
                info = await client.info(args.job_id, queue=args.queue, timeout=timeout)
                if info.state != "active" or _runs_on(info):
                    break
                await anyio.sleep(0.1)  # the handler is being cancelled: ask again shortly
    if info is None or info.state == "unknown":
        raise CLIError(
            f"cancel sent, but no worker of queue {args.queue!r} reported job {args.job_id} within "
            f"{timeout:g}s; the workers skip it if it arrives within the next hour",
            EXIT_NOT_FOUND,
        )
    _print_info(_info_dict(info), args.json)
    if _runs_on(info):
        _err(f"job {args.job_id}: {info.detail or SYNC_CANCEL_DETAIL}")
        return EXIT_UNINTERRUPTIBLE
    return EXIT_OK


def _runs_on(info: JobInfo) -> bool:
    """The worker running the job got the CANCEL, and its handler cannot be interrupted."""
    return info.state == "active" and info.cancel_requested and info.interruptible is False


# ----------------------------------------------------------------------- cron


def _cron_arguments(cr: argparse.ArgumentParser) -> None:
    cr.add_argument("scheduler", help="module:attribute of an ojs_anyio.Scheduler")
    cr.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    cr.add_argument("--log-level", default="INFO")
    cr.add_argument("--log-format", choices=["text", "json"], default="text")


@command(
    "cron",
    help="run a Scheduler (one leader among all instances fires each tick)",
    arguments=_cron_arguments,
    logging="service",
)
async def cmd_cron(args: Any) -> int:
    scheduler = load_object(args.scheduler, Scheduler, show_traceback=args.traceback)
    stopping = False
    async with open_client(args.url, args.prefix, recovery=True) as client, anyio.create_task_group() as tg:

        async def watch() -> None:
            nonlocal stopping
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for signum in signals:
                    name = signal.Signals(signum).name
                    if not stopping:
                        stopping = True
                        log.warning("received %s: stopping the scheduler (again to stop at once)", name)
                        scheduler.stop()
                    else:
                        tg.cancel_scope.cancel()
                        return

        tg.start_soon(watch)
        log.info(
            "scheduler %r: %d schedule(s), broker %s",
            scheduler.name,
            len(scheduler.schedules),
            client.conn.url.redacted(),
        )
        await scheduler.run(client)
        tg.cancel_scope.cancel()
    return EXIT_OK


# ------------------------------------------------------------------- topology


group("topology", help="declare or check the AMQP entities of queues")


def _topology_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("queue", nargs="+")


@command(
    "topology",
    "declare",
    help="declare the exchanges, queue, dead-letter and control queues",
    description="Declare (idempotently) the exchanges, job queue, dead-letter queue "
    "and control queue of each QUEUE, and their bindings.",
    arguments=_topology_arguments,
)
async def cmd_topology_declare(args: Any) -> int:
    async with open_client(args.url, args.prefix) as client:
        for q in args.queue:
            await client.declare_queue(q)
            await client.declare_control_queue(q)
        names = client.names
    declared = [
        {"queue": q, "entities": [names.job_queue(q), names.dlx_queue(q), names.control_queue(q)]}
        for q in args.queue
    ]
    if args.json:
        print_json({"declared": declared})
    else:
        for d in declared:
            print(f"{d['queue']}: declared {', '.join(d['entities'])} and their bindings")
    return EXIT_OK


@dataclass
class _Check:
    entity: str
    kind: str
    status: str  # ok | missing | different | absent
    detail: str = ""


async def _check_queue(
    client: Client, probe: QueueProbe, name: str, arguments: dict[str, Any], required: bool
) -> _Check:
    if await probe.queue(name) is None:
        return _absent(name, "queue", required)
    # Redeclare-equivalence: a declare with the spec's properties changes nothing when the
    # queue is equivalent, and is refused (406, channel closed) when it is not.
    try:
        async with client.conn.channel(confirms=False) as ch:
            await ch.queue_declare(name, durable=True, arguments=arguments or None)
    except (amqp.PreconditionFailed, amqp.ResourceLocked) as exc:
        return _Check(name, "queue", "different", str(getattr(exc, "reply_text", exc)))
    return _Check(
        name, "queue", "ok", f"durable, arguments {arguments}" if arguments else "durable, no arguments"
    )


def _absent(name: str, kind: str, required: bool) -> _Check:
    """The check of an entity the broker does not have: an error when the topology needs
    it now, else only not declared yet."""
    if required:
        return _Check(name, kind, "missing", "")
    return _Check(name, kind, "absent", "not declared yet (declared on first use)")


async def _check_exchange(client: Client, probe: QueueProbe, name: str, kind: str, required: bool) -> _Check:
    if not await probe.exchange(name):
        return _absent(name, "exchange", required)
    try:
        async with client.conn.channel(confirms=False) as ch:
            await ch.exchange_declare(name, kind, durable=True)
    except amqp.PreconditionFailed as exc:
        return _Check(name, "exchange", "different", str(exc.reply_text))
    return _Check(name, "exchange", "ok", f"{kind}, durable")


def _summarise_levels(prefix: str, shared: list[_Check]) -> list[_Check]:
    """The 33 delay exchanges and 32 delay queues (shared by every queue) as two lines when
    they are all fine; each one that is not, on its own line."""
    out = [c for c in shared if c.status != "ok"]
    for kind, pattern in (("exchange", "ojs.exchange.delay.*"), ("queue", "ojs.queue.delay.00-31")):
        good = [c for c in shared if c.kind == kind and c.status == "ok"]
        if good:
            out.append(
                _Check(f"{prefix}{pattern}", kind, "ok", f"{len(good)} scheduling delay {kind}s, shared")
            )
    return out


@command(
    "topology",
    "check",
    help="compare the broker with the OJS declarations; exit 1 on a difference",
    description="Compare the entities on the broker with the OJS AMQP binding's "
    "declarations (passive declares, then a redeclare that the broker "
    "accepts only when equivalent).  Changes nothing.",
    arguments=_topology_arguments,
)
async def cmd_topology_check(args: Any) -> int:
    checks: list[_Check] = []
    async with open_client(args.url, args.prefix) as client:
        names = client.names
        for q in args.queue:
            names.job_queue(q)
        probe = QueueProbe(client)
        try:
            specs = exchanges(names)
            for spec in specs[:3]:
                checks.append(await _check_exchange(client, probe, spec.name, spec.type, True))
            for q in args.queue:
                checks.append(
                    await _check_queue(client, probe, names.job_queue(q), job_queue_arguments(names, q), True)
                )
                checks.append(
                    await _check_queue(client, probe, names.dlx_queue(q), dlx_queue_arguments(names, q), True)
                )
                checks.append(
                    await _check_queue(
                        client, probe, names.control_queue(q), control_queue_arguments(), False
                    )
                )
                for ms in RETRY_LADDER_MS:
                    if await probe.queue(names.retry_queue(q, ms)) is not None:
                        checks.append(
                            await _check_queue(
                                client,
                                probe,
                                names.retry_queue(q, ms),
                                retry_queue_arguments(names, q, ms),
                                False,
                            )
                        )
                if await probe.queue(names.delay_landing_queue(q)) is not None:
                    checks.append(
                        await _check_queue(
                            client,
                            probe,
                            names.delay_landing_queue(q),
                            delay_landing_queue_arguments(names, q),
                            False,
                        )
                    )
            if await probe.exchange(names.delay_entry_exchange):
                shared: list[_Check] = []
                for spec in specs[3:]:
                    shared.append(await _check_exchange(client, probe, spec.name, spec.type, False))
                for k in range(DELAY_LEVELS):
                    args_k = delay_level_queue_arguments(names, k)
                    shared.append(await _check_queue(client, probe, names.delay_queue(k), args_k, False))
                checks += _summarise_levels(names.prefix, shared)
        finally:
            await probe.aclose()
    bad = [c for c in checks if c.status in ("missing", "different")]
    if args.json:
        print_json({"ok": not bad, "bindings_checked": False, "entities": [c.__dict__ for c in checks]})
    else:
        print_table(
            ["ENTITY", "KIND", "STATUS", "DETAIL"], [[c.entity, c.kind, c.status, c.detail] for c in checks]
        )
        print("(bindings are not checked: AMQP cannot read them without creating missing ones)")
    if bad:
        _err(
            f"{len(bad)} difference(s) from the OJS declarations: "
            + "; ".join(f"{c.entity} {c.status}" for c in bad)
        )
        return EXIT_DIFFERENT
    return EXIT_OK
