"""The event bus's commands: ``events dlq peek|requeue|purge|prune`` and ``events asyncapi``.

The dead-letter commands work on a subscription's ``{queue_tag}{name}.dlq`` with
:meth:`ojs_anyio.events.EventBus.dead_letters`, with the guarantees of the job DLQ
commands: a requeue publishes each event with a confirm before its dead copy is acked (an
interrupted one loses nothing), a first SIGINT stops after the current event, progress is
shown on a terminal, and every change asks for confirmation unless ``--yes``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .. import amqp, events
from ._app import load_object
from ._common import (
    EXIT_OK,
    EXIT_USAGE,
    count_arg,
    fail,
    format_age,
    print_json,
    print_table,
)
from ._common import resolve_url as _resolve_url
from ._ops import Interrupt, confirm, interruptible, prune_max_age, prune_rules, scan, scanned
from ._registry import command, group, sync_command

__all__ = [
    "cmd_events_asyncapi",
    "cmd_events_dlq_peek",
    "cmd_events_dlq_prune",
    "cmd_events_dlq_purge",
    "cmd_events_dlq_requeue",
]


@asynccontextmanager
async def _open_bus(args: Any) -> AsyncIterator[events.EventBus]:
    """A bus for administration: no recovery (fail fast), named for list_connections."""
    async with events.connect(
        _resolve_url(args.url),
        exchange=args.exchange,
        queue_tag=args.queue_tag,
        recovery=amqp.RecoveryPolicy(enabled=False),
        connection_name="ojs-anyio events",
        connection_timeout=10.0,
    ) as bus:
        yield bus


group("events", help="the event bus: a subscription's dead letters, the AsyncAPI document")
group("events", "dlq", help="a subscription's dead events: peek, requeue, purge, prune")


def _bus_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", help="the subscription's name (its dead letters are in {QUEUE_TAG}{NAME}.dlq)")
    p.add_argument("--exchange", default="events", help="the bus's topic exchange (default: events)")
    p.add_argument("--queue-tag", default="", help="the bus's queue tag, e.g. prod_")


def _peek_arguments(p: argparse.ArgumentParser) -> None:
    _bus_arguments(p)
    p.add_argument("-n", type=count_arg(0), default=20, metavar="N", help="how many (default 20)")


def _requeue_arguments(p: argparse.ArgumentParser) -> None:
    _bus_arguments(p)
    p.add_argument("--id", action="append", metavar="ID", help="an event's message id (repeatable)")
    p.add_argument("--all", action="store_true", help="every dead event of the subscription")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")


def _purge_arguments(p: argparse.ArgumentParser) -> None:
    _bus_arguments(p)
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")


def _prune_arguments(p: argparse.ArgumentParser) -> None:
    _purge_arguments(p)
    p.add_argument("--max-age", default=None, metavar="DURATION", help="e.g. P7D, 30d, 12h")
    p.add_argument(
        "--max-count", type=count_arg(0), default=None, metavar="N", help="keep at most the newest N"
    )


def _asyncapi_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "catalog", metavar="MODULE:CATALOG", help="an ojs_anyio.events.Catalog (or a function returning one)"
    )
    p.add_argument(
        "--url", default=None, help="the broker shown as the document's server (no password is written)"
    )
    p.add_argument(
        "--output", "-o", default=None, metavar="FILE", help="write the document here (default: stdout)"
    )


@command(
    "events",
    "dlq",
    "peek",
    help="show a subscription's oldest dead events: id, key, attempt, age, reason (nothing is removed)",
    arguments=_peek_arguments,
)
async def cmd_events_dlq_peek(args: Any) -> int:
    async with _open_bus(args) as bus:
        dlq = bus.dead_letters(args.name)
        dead = await dlq.peek(args.n)
        total = await dlq.count()
    now = datetime.now(UTC)
    if args.json:
        print_json(
            {
                "queue": dlq.name,
                "total": total,
                "events": [
                    {
                        "message_id": d.message_id,
                        "routing_key": d.routing_key,
                        "reason": d.reason,
                        "error": d.error,
                        "attempt": d.attempt,
                        "died_at": d.died_at.isoformat() if d.died_at else None,
                        "age_seconds": (now - d.died_at).total_seconds() if d.died_at else None,
                        "content_type": d.content_type,
                        "size": len(d.body),
                        "malformed": d.malformed,
                    }
                    for d in dead
                ],
            }
        )
        return EXIT_OK
    print(f"{dlq.name}: {total} dead event(s)")
    rows = [
        (
            d.message_id,
            d.routing_key,
            d.attempt,
            format_age((now - d.died_at).total_seconds()) if d.died_at else None,
            d.reason if d.malformed is None else f"malformed: {d.malformed}",
            d.error,
        )
        for d in dead
    ]
    print_table(["ID", "ROUTING KEY", "ATTEMPT", "AGE", "REASON", "ERROR"], rows)
    return EXIT_OK


@command(
    "events",
    "dlq",
    "requeue",
    help="move dead events back to their subscription's queue (publish, confirm, then ack: never lost; "
    "SIGINT stops after the current event)",
    arguments=_requeue_arguments,
)
async def cmd_events_dlq_requeue(args: Any) -> int:
    if not args.all and not args.id:
        fail("give --id ID (repeatable) or --all", EXIT_USAGE)

    async def run(interrupt: Interrupt) -> int:
        async with _open_bus(args) as bus:
            dlq = bus.dead_letters(args.name)
            total = await dlq.count()
            if args.all:
                confirm(f"Move all {total} dead events of {dlq.name} back to {dlq.queue}?", args.yes)
            ids = None if args.all else args.id
            moved = await scan(
                args, len(args.id) if args.id else total, "requeue", interrupt,
                lambda on_moved, stop: dlq.requeue(limit=total, ids=ids, on_moved=on_moved, stop=stop),
            )  # fmt: skip
        return scanned(
            args, interrupt, dlq.name, "requeued", moved, f"requeued {moved} dead event(s) to {dlq.queue}"
        )

    return await interruptible(run)


@command(
    "events", "dlq", "purge", help="delete every dead event of a subscription", arguments=_purge_arguments
)
async def cmd_events_dlq_purge(args: Any) -> int:
    async with _open_bus(args) as bus:
        dlq = bus.dead_letters(args.name)
        total = await dlq.count()
        confirm(f"Delete all {total} dead events in {dlq.name}?", args.yes)
        purged = await dlq.purge()
    if args.json:
        print_json({"queue": dlq.name, "purged": purged})
    else:
        print(f"purged {purged} dead event(s) from {dlq.name}")
    return EXIT_OK


@command(
    "events",
    "dlq",
    "prune",
    help="delete a subscription's oldest dead events: older than --max-age, or beyond --max-count",
    arguments=_prune_arguments,
)
async def cmd_events_dlq_prune(args: Any) -> int:
    max_age = prune_max_age(args)

    async def run(interrupt: Interrupt) -> int:
        async with _open_bus(args) as bus:
            dlq = bus.dead_letters(args.name)
            total = await dlq.count()
            confirm(f"Delete the dead events in {dlq.name} {prune_rules(args)} (of {total})?", args.yes)
            dropped = await scan(
                args, total, "prune", interrupt,
                lambda on_dropped, stop: dlq.prune(
                    max_age, max_events=args.max_count, limit=total, on_dropped=on_dropped, stop=stop
                ),
            )  # fmt: skip
        return scanned(
            args, interrupt, dlq.name, "pruned", dropped, f"pruned {dropped} dead event(s) from {dlq.name}"
        )

    return await interruptible(run)


@sync_command(
    "events",
    "asyncapi",
    help="write the AsyncAPI 3.0 document of an event Catalog (no broker needed)",
    arguments=_asyncapi_arguments,
    broker=False,
)
def cmd_events_asyncapi(args: Any) -> int:
    """Write the AsyncAPI 3.0 document of a :class:`~ojs_anyio.events.Catalog` (no broker)."""
    catalog = load_object(args.catalog, events.Catalog)
    document = catalog.asyncapi(args.url)
    text = json.dumps(document, indent=2, sort_keys=False) + "\n"
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
        sys.stderr.write(
            f"wrote the AsyncAPI {document['asyncapi']} document of {catalog.title!r} to {args.output}\n"
        )
    else:
        sys.stdout.write(text)
    return EXIT_OK
