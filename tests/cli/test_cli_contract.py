"""The CLI's contract for every input (issue 24, points 4 and 5): one line on stderr, a
documented exit code, no password shown, nothing destructive from a bad number.  Each
test runs the real ``ojs-anyio`` as a subprocess against the real broker."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import anyio.from_thread
import pytest
from anyio.from_thread import BlockingPortal
from harness import FaultProxy

from ojs_anyio import amqp
from ojs_anyio.jobs._envelope import _uuid7

from .cli_support import drain, publish_raw, queue_count, reaped, run_cli, run_many, spawn_cli, wait_for
from .test_cli_ops import dead_letters, ok

NO_JOB = "01a2095d-0000-7000-8000-000000000000"  # a job id no worker knows


def one_line(r: subprocess.CompletedProcess[str], code: int, *texts: str) -> None:
    """``r`` exited with ``code`` and wrote one ``ojs-anyio:`` line holding ``texts`` on stderr."""
    err = r.stderr
    assert r.returncode == code, (r.args, r.returncode, err)
    assert err.startswith("ojs-anyio: ") and err.count("\n") == 1, (r.args, err)
    assert "Traceback" not in err
    for text in texts:
        assert text in err, (r.args, err)


def test_info_and_cancel_of_a_queue_that_does_not_exist_say_so_and_declare_nothing(q: str) -> None:
    typo = f"{q}x"
    cases = [["info", NO_JOB, "--queue", typo], ["cancel", NO_JOB, "--queue", typo]]
    for r in run_many(cases):
        one_line(r, 5, f"queue {typo!r} does not exist (ojs.queue.{typo})")
        assert "sent" not in r.stderr
    assert queue_count(f"ojs.queue.control.{typo}") is None, "no control queue for a typo"
    assert queue_count(f"ojs.queue.{typo}") is None


def test_bad_input_is_one_line_with_its_code_and_changes_nothing(q: str) -> None:
    ok("topology", "declare", q)
    dead = dead_letters(q, 3)
    url = "amqp://ops:2024/s3cretpw@127.0.0.1"  # an unencoded '/' in the password
    cases: list[tuple[list[str], int, str]] = [
        # The password is refused with the hint to percent-encode, and never shown.
        (["queues", q, "--url", url], 2, "%2F"),
        (["queues", q, "--url", url + "/"], 2, "%2F"),
        (["dlq", "peek", q, "--url", url + ":5672/prod"], 2, "%2F"),
        # Numbers: a negative or nonsensical one is refused before anything is touched.
        (["dlq", "prune", q, "--max-count", "-5", "--yes"], 2, "--max-count: must be 0 or more, got -5"),
        (["dlq", "prune", q, "--max-count", "all", "--yes"], 2, "--max-count: expected a whole number"),
        (["dlq", "prune", q, "--max-age", "9" * 30, "--yes"], 2, "--max-age"),
        (["dlq", "peek", q, "-n", "-1"], 2, "-n: must be 0 or more"),
        (["worker", "app:worker", "--concurrency", "0"], 2, "--concurrency: must be 1 or more"),
        (["worker", "app:worker", "--processes", "-2"], 2, "--processes: must be 1 or more"),
        (["push", "t.work", "--queue", q, "--retry", "-1"], 2, "--retry"),
        (["push", "t.work", "--queue", q, "--retry", "99999999999"], 2, "--retry"),
        (["push", "t.work", "--queue", q, "--delay", "9" * 30], 2, "--delay"),
        (["push", "t.work", "--queue", q, "--delay", "9999999d"], 2, "longest delay"),
        (["push", "t.work", "--queue", q, "--timeout", "1.5"], 2, "whole seconds"),
        (["push", "t.work", "--queue", q, "--priority", "high"], 2, "--priority"),
        (["info", NO_JOB, "--queue", q, "--timeout", "0"], 2, "--timeout"),
        # JSON options: NaN, Infinity and numbers JSON cannot hold are not JSON.
        (["push", "t.work", "--queue", q, "--args", "[NaN]"], 2, "--args is not valid JSON: NaN"),
        (["push", "t.work", "--queue", q, "--args", "[1, -Infinity]"], 2, "--args is not valid JSON"),
        (["push", "t.work", "--queue", q, "--args", "[1e999]"], 2, "--args is not valid JSON: 1e999"),
        (["push", "t.work", "--queue", q, "--meta", '{"a": NaN}'], 2, "--meta is not valid JSON: NaN"),
        (
            ["push", "t.work", "--queue", q, "--retry", '{"max_attempts": NaN}'],
            2,
            "--retry is not valid JSON",
        ),
        # An id that cannot be a job id: refused at once, not after the timeout.
        (["info", "not-a-uuid", "--queue", q, "--timeout", "600"], 2, "cannot be a job id"),
        (["cancel", str(uuid.uuid4()), "--queue", q, "--timeout", "600"], 2, "UUIDv7"),
        # memory:// dies with the process: refused wherever another process must see it.
        (["push", "t.work", "--queue", q, "--url", "memory://x", "--declare"], 2, "in-process memory broker"),
        (["worker", "app:worker", "--url", "memory://"], 2, "in-process memory broker"),
        (["queues", q, "--url", "memory://x"], 2, "in-process memory broker"),
        (["cron", "app:sched", "--url", "memory://x"], 2, "in-process memory broker"),
    ]
    for (args, code, text), r in zip(cases, run_many([c[0] for c in cases]), strict=True):
        one_line(r, code, text)
        assert "s3cretpw" not in r.stderr + r.stdout, (args, r.stderr)
    assert queue_count(f"ojs.queue.{q}") == 0, "nothing was pushed"
    assert [m.properties.message_id for m in drain(f"ojs.queue.dlx.{q}")] == dead, "no dead job was touched"


def test_dlq_peek_and_prune_with_an_impossible_death_time(q: str) -> None:
    """A leap second in year 9999 is no time: shown as unknown (or RabbitMQ's x-death time
    when the job has one), and prune never drops a job for an age it does not know."""
    ok("topology", "declare", q)
    dlq = f"ojs.queue.dlx.{q}"
    ids = [_uuid7(), _uuid7()]
    stamp = {"x-ojs-dead-lettered-at": "9999-12-31T23:59:60Z", "x-ojs-error-code": "HANDLER_ERROR"}
    death = {"reason": "expired", "queue": f"ojs.queue.{q}", "time": datetime.now(UTC) - timedelta(days=200)}
    created = datetime.now(UTC) - timedelta(days=400)
    publish_raw(
        dlq,
        [
            (
                b"{}",
                amqp.BasicProperties(
                    message_id=ids[0], timestamp=created, headers={**stamp, "x-death": [death]}
                ),
            ),
            (b"{}", amqp.BasicProperties(message_id=ids[1], timestamp=created, headers=stamp)),
        ],
    )
    peek = json.loads(ok("dlq", "peek", q, "--json"))
    fallback, unknown = peek["jobs"]
    assert [fallback["id"], unknown["id"]] == ids
    assert 199 * 86400 < fallback["age_seconds"] < 201 * 86400, "RabbitMQ's x-death time"
    assert unknown["died_at"] is None and unknown["age_seconds"] is None
    table = ok("dlq", "peek", q).splitlines()
    assert table[2].split()[:4] == [ids[1], "-", "-", "-"], table
    pruned = json.loads(ok("dlq", "prune", q, "--max-age", "P180D", "--yes", "--json"))
    assert pruned["pruned"] == 1
    assert queue_count(dlq) == 1
    assert json.loads(ok("dlq", "prune", q, "--max-count", "0", "--yes", "--json"))["pruned"] == 1


@pytest.fixture
def proxy(rabbitmq_url: str) -> Iterator[tuple[FaultProxy, BlockingPortal]]:
    """A TCP proxy to the broker, run by an event loop in a thread (steered through the portal)."""
    with anyio.from_thread.start_blocking_portal() as portal:
        fault = FaultProxy()
        with portal.wrap_async_context_manager(fault):
            yield fault, portal


STOPPED = re.compile(
    r"requeue stopped after moving (\d+) job\(s\) to ojs\.queue\.\S+; (.*?): lost the connection"
)
MAYBE_TWICE = re.compile(r"job (\S+) may be in both queues \(published; its dead copy's ack not confirmed\)")


def test_requeue_cut_off_says_how_many_moved_and_names_the_possible_duplicate(
    q: str, proxy: tuple[FaultProxy, BlockingPortal]
) -> None:
    fault, portal = proxy
    ok("topology", "declare", q)
    ids = dead_letters(q, 4000)
    proc = spawn_cli("dlq", "requeue", q, "--all", "--yes", "--url", fault.url(), capture=True)
    with reaped(proc):
        wait_for(lambda: (queue_count(f"ojs.queue.{q}") or 0) >= 200, 60, "the requeue to be under way", 0.02)
        assert portal.call(fault.cut_all) == 1
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    assert err.startswith("ojs-anyio: ") and err.count("\n") == 1 and "Traceback" not in err, err
    match = STOPPED.search(err)
    assert match is not None, err
    moved = int(match.group(1))
    named = MAYBE_TWICE.fullmatch(match.group(2))
    maybe_twice = named.group(1) if named else None
    if named is None:
        assert match.group(2) == "no job is in both queues", err
    requeued = [str(m.properties.message_id) for m in drain(f"ojs.queue.{q}")]
    remaining = [str(m.properties.message_id) for m in drain(f"ojs.queue.dlx.{q}")]
    assert sorted(set(requeued) | set(remaining)) == sorted(ids), "no job lost"
    assert set(requeued) & set(remaining) <= {maybe_twice}, "only the named job may be in both"
    assert len([i for i in requeued if i != maybe_twice]) == moved, "the count is right"
    assert len(requeued) == len(set(requeued))
    assert 200 <= moved < 4000


def test_cancel_of_a_running_sync_handler_says_it_runs_to_completion(app_dir: Path, q: str) -> None:
    ok("topology", "declare", q)
    release = app_dir / "release"
    job_id = ok("push", "t.sync", "--queue", q, "--args", json.dumps([str(release)])).strip()
    log = app_dir / "jobs.log"
    worker = spawn_cli("worker", "app:worker", cwd=app_dir, log=app_dir / "w.out")
    with reaped(worker):
        wait_for(lambda: log.exists() and f"start:{job_id}" in log.read_text(), 60, "the job to start")
        r = run_cli("cancel", job_id, "--queue", q, "--timeout", "30", "--json")
        one_line(
            r, 9, f"job {job_id}: cancel requested; the handler is synchronous and cannot be interrupted"
        )
        answer = json.loads(r.stdout)
        assert answer["state"] == "active" and answer["cancel_requested"] is True
        assert answer["interruptible"] is False
        table = run_cli("info", job_id, "--queue", q)
        assert table.returncode == 0 and re.search(r"interruptible\s+False", table.stdout), table.stdout
        release.touch()
        wait_for(lambda: f"done:{job_id}" in log.read_text(), 60, "the job to run to completion")
        assert json.loads(ok("info", job_id, "--queue", q, "--json"))["state"] == "completed"
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
