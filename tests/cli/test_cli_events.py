"""``ojs-anyio events dlq peek|requeue|purge|prune`` and ``events asyncapi``:
subprocesses against the broker, with the job DLQ commands' guarantees."""

from __future__ import annotations

import json
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from ojs_anyio import amqp, events

from .cli_support import (
    delete_exchanges,
    delete_queues,
    drain,
    publish_raw,
    queue_count,
    reaped,
    run_cli,
    spawn_cli,
    wait_for,
)


class Sub:
    """A subscription's names on the test's own exchange and tag."""

    def __init__(self) -> None:
        token = uuid.uuid4().hex[:10]
        self.exchange, self.tag, self.name = f"ojs-test-cli-ev-{token}", f"t{token}_", "orders"
        self.queue = f"{self.tag}{self.name}"
        self.dlq = f"{self.queue}.dlq"

    def options(self) -> list[str]:
        return ["--exchange", self.exchange, "--queue-tag", self.tag]


@pytest.fixture
def sub(rabbitmq_url: str) -> Iterator[Sub]:
    s = Sub()

    async def declare() -> None:
        async def handle(event: object) -> None:
            pass

        async with (
            events.connect(rabbitmq_url, exchange=s.exchange, queue_tag=s.tag) as bus,
            bus.subscribe(s.name, handle),
        ):
            pass

    anyio.run(declare)
    try:
        yield s
    finally:
        delete_queues([s.queue, s.dlq])
        delete_exchanges([s.exchange])


def _dead_events(s: Sub, n: int) -> list[str]:
    ids = [f"ev-{i:05d}-{uuid.uuid4().hex[:6]}" for i in range(n)]
    headers = {
        events.H_REASON: "rejected",
        events.H_ERROR: "ValueError: bad order",
        events.H_ATTEMPT: 1,
        events.H_ROUTING_KEY: "orders.created",
        events.H_QUEUE: s.queue,
        events.H_DEAD_LETTERED_AT: "2026-11-25T08:00:00.000+00:00",
    }
    props = [
        amqp.BasicProperties(message_id=i, content_type="application/json", headers=headers, delivery_mode=2)
        for i in ids
    ]
    publish_raw(s.dlq, [(b'{"n":1}', p) for p in props])
    return ids


def _ok(*args: str) -> str:
    r = run_cli(*args)
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r.stdout


def test_peek_requeue_prune_purge(sub: Sub) -> None:
    ids = _dead_events(sub, 5)
    peek = json.loads(_ok("events", "dlq", "peek", sub.name, *sub.options(), "--json"))
    assert peek["total"] == 5 and [e["message_id"] for e in peek["events"]] == ids
    first = peek["events"][0]
    assert first["reason"] == "rejected" and first["error"] == "ValueError: bad order"
    assert first["routing_key"] == "orders.created" and first["attempt"] == 1
    table = _ok("events", "dlq", "peek", sub.name, *sub.options())
    assert ids[0] in table and "rejected" in table
    moved = json.loads(_ok("events", "dlq", "requeue", sub.name, *sub.options(), "--id", ids[1], "--json"))
    assert moved["requeued"] == 1
    [back] = drain(sub.queue)
    assert back.properties.message_id == ids[1]
    assert (back.properties.headers or {})[events.H_ROUTING_KEY] == "orders.created"
    pruned = json.loads(
        _ok("events", "dlq", "prune", sub.name, *sub.options(), "--max-count", "1", "--yes", "--json")
    )
    assert pruned["pruned"] == 3
    purged = json.loads(_ok("events", "dlq", "purge", sub.name, *sub.options(), "--yes", "--json"))
    assert purged["purged"] == 1 and queue_count(sub.dlq) == 0


def test_requeue_interrupted_by_sigint_loses_and_doubles_nothing(sub: Sub) -> None:
    ids = _dead_events(sub, 3000)
    proc = spawn_cli(
        "events", "dlq", "requeue", sub.name, *sub.options(), "--all", "--yes", "--json", capture=True
    )
    with reaped(proc):
        wait_for(lambda: (queue_count(sub.queue) or 0) >= 200, 60, "the requeue to be under way", 0.02)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    report = json.loads(out)
    assert report["interrupted"] is True and 200 <= report["requeued"] < 3000
    requeued = [str(m.properties.message_id) for m in drain(sub.queue)]
    remaining = [str(m.properties.message_id) for m in drain(sub.dlq)]
    assert len(set(requeued)) == len(requeued) and not set(requeued) & set(remaining)
    assert sorted(requeued + remaining) == sorted(ids), "no event lost or doubled"


def test_changes_ask_first_and_a_missing_subscription_is_one_clear_error(sub: Sub) -> None:
    _dead_events(sub, 2)
    r = run_cli("events", "dlq", "purge", sub.name, *sub.options())
    assert r.returncode == 2 and "refusing without --yes" in r.stderr and queue_count(sub.dlq) == 2
    r = run_cli("events", "dlq", "peek", "nosuch", *sub.options())
    assert r.returncode == 5 and r.stderr.startswith("ojs-anyio: ") and r.stderr.count("\n") == 1, r.stderr
    r = run_cli("events", "dlq", "requeue", sub.name, *sub.options())
    assert r.returncode == 2 and "--id" in r.stderr


def test_asyncapi_writes_the_catalogs_document(tmp_path: Path) -> None:
    out = tmp_path / "beds.json"
    r = run_cli(
        "events",
        "asyncapi",
        "docs.examples.events_beds:CATALOG",
        "--url",
        "amqp://u:s3cret@rabbit/prod",
        "-o",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    document = json.loads(out.read_text())
    assert document["asyncapi"] == "3.0.0" and "s3cret" not in out.read_text()
    assert "prod_rec.read" in {c["address"] for c in document["channels"].values()}
    r = run_cli("events", "asyncapi", "docs.examples.events_beds:EXCHANGE")
    assert (r.returncode == 6 and "not an ojs_anyio.Catalog" in r.stderr) or "Catalog" in r.stderr
