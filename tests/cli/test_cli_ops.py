"""``ojs-anyio`` queues, dlq, push, cancel, info, topology, demo: subprocesses against the broker."""

from __future__ import annotations

import json
import signal
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from ojs_anyio import amqp
from ojs_codec import Int32

from .cli_support import (
    declare_raw,
    delete_exchanges,
    delete_queues,
    drain,
    publish_raw,
    queue_count,
    reaped,
    run_cli,
    run_many,
    spawn_cli,
    wait_for,
)


def ok(*args: str, cwd: Path | None = None) -> str:
    r = run_cli(*args, cwd=cwd)
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r.stdout


def dead_letters(q: str, n: int, *, start: int = 0, age: timedelta = timedelta(0)) -> list[str]:
    """Put ``n`` dead jobs in ``ojs.queue.dlx.{q}`` as RabbitMQ leaves them (x-death)."""
    ids = [f"dead-{start + i:05d}-{uuid.uuid4().hex[:6]}" for i in range(n)]
    died = datetime.now(UTC) - age
    msgs = []
    for job_id in ids:
        body = json.dumps(
            {"specversion": "1.0", "id": job_id, "type": "t.work", "queue": q, "args": [0]}
        ).encode()
        props = amqp.BasicProperties(
            message_id=job_id,
            type="t.work",
            content_type="application/openjobspec+json",
            delivery_mode=2,
            headers={
                "x-ojs-attempt": Int32(3),
                "x-ojs-max-attempts": Int32(3),
                "x-ojs-queue": q,
                "x-ojs-error-code": "HANDLER_ERROR",
                "x-ojs-error-message": "boom",
                "x-death": [
                    {
                        "queue": f"ojs.queue.{q}",
                        "reason": "rejected",
                        "count": 1,
                        "exchange": "",
                        "routing-keys": [q],
                        "time": died,
                    }
                ],
                "x-first-death-reason": "rejected",
            },
        )
        msgs.append((body, props))
    publish_raw(f"ojs.queue.dlx.{q}", msgs)
    return ids


def test_push_queues_and_json(q: str) -> None:
    ok("topology", "declare", q)
    job_id = ok("push", "t.work", "--queue", q, "--args", "[1.5]", "--priority", "5", "--retry", "5").strip()
    pushed = json.loads(ok("push", "t.work", "--queue", q, "--args", "[0]", "--json"))
    assert pushed["queue"] == q and pushed["type"] == "t.work"
    later = json.loads(ok("push", "t.work", "--queue", q, "--delay", "1h", "--json"))
    assert later["scheduled_at"] is not None
    report = json.loads(ok("queues", q, "--json"))
    (row,) = report["queues"]
    assert row["queue"] == q and row["ready"] == 2 and row["consumers"] == 0 and row["dead"] == 0
    assert "passive" in report["source"]
    table = ok("queues", q)
    assert table.splitlines()[0].split()[:3] == ["QUEUE", "READY", "CONSUMERS"]
    msgs = drain(f"ojs.queue.{q}")
    assert msgs[0].properties.message_id == job_id
    assert msgs[0].properties.headers is not None
    assert msgs[0].properties.headers["x-ojs-max-attempts"] == 5
    assert json.loads(msgs[0].body)["args"] == [1.5]


def test_dlq_peek_purge_prune(q: str) -> None:
    ok("topology", "declare", q)
    old = dead_letters(q, 3, age=timedelta(days=200))
    new = dead_letters(q, 4, start=3)
    peek = json.loads(ok("dlq", "peek", q, "-n", "5", "--json"))
    assert peek["total"] == 7
    assert [j["id"] for j in peek["jobs"]] == (old + new)[:5]
    first = peek["jobs"][0]
    assert first["type"] == "t.work" and first["attempt"] == 3 and first["reason"] == "HANDLER_ERROR: boom"
    assert first["age_seconds"] > 199 * 86400
    assert queue_count(f"ojs.queue.dlx.{q}") == 7, "peek removes nothing"
    text = ok("dlq", "peek", q)
    assert "JOB ID" in text and "200.0d" in text
    # Destructive without --yes and without a terminal: refused, nothing changed.
    r = run_cli("dlq", "purge", q)
    assert r.returncode == 2 and "--yes" in r.stderr
    assert queue_count(f"ojs.queue.dlx.{q}") == 7
    pruned = json.loads(ok("dlq", "prune", q, "--max-age", "P180D", "--yes", "--json"))
    assert pruned["pruned"] == 3
    assert json.loads(ok("dlq", "prune", q, "--max-count", "2", "--yes", "--json"))["pruned"] == 2
    assert [m.properties.message_id for m in drain(f"ojs.queue.dlx.{q}")] == new[2:]
    dead_letters(q, 2)
    assert json.loads(ok("dlq", "purge", q, "--yes", "--json"))["purged"] == 2
    assert queue_count(f"ojs.queue.dlx.{q}") == 0


def test_dlq_requeue_by_id_keeps_the_others_in_order(q: str) -> None:
    ok("topology", "declare", q)
    ids = dead_letters(q, 5)
    out = json.loads(ok("dlq", "requeue", q, "--id", ids[1], "--id", ids[3], "--json"))
    assert out["requeued"] == 2 and out["not_found"] == []
    moved = drain(f"ojs.queue.{q}")
    assert [m.properties.message_id for m in moved] == [ids[1], ids[3]]
    headers = moved[0].properties.headers or {}
    assert headers["x-ojs-attempt"] == 3, "attempts kept without --reset-attempts"
    assert "x-death" not in headers and "x-ojs-error-code" not in headers
    assert [m.properties.message_id for m in drain(f"ojs.queue.dlx.{q}")] == [ids[0], ids[2], ids[4]]
    ids = dead_letters(q, 2)
    ok("dlq", "requeue", q, "--all", "--reset-attempts", "--yes")
    assert [(m.properties.headers or {})["x-ojs-attempt"] for m in drain(f"ojs.queue.{q}")] == [1, 1]
    r = run_cli("dlq", "requeue", q, "--id", "nope")
    assert r.returncode == 5 and "nope" in r.stderr


def _interrupted(args: list[str], under_way: Callable[[], bool], what: str) -> dict[str, Any]:
    """Run the CLI with ``args``, SIGINT it once ``under_way()`` holds; its --json report
    (after checking it exited with 130)."""
    proc = spawn_cli(*args, capture=True)
    with reaped(proc):
        wait_for(under_way, 60, what, 0.02)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    report: dict[str, Any] = json.loads(out)
    return report


def test_dlq_requeue_interrupted_by_sigint_loses_and_doubles_nothing(q: str, tmp_path: Path) -> None:
    ok("topology", "declare", q)
    ids = dead_letters(q, 4000)
    report = _interrupted(
        ["dlq", "requeue", q, "--all", "--yes", "--json"],
        lambda: (queue_count(f"ojs.queue.{q}") or 0) >= 200,
        "the requeue to be under way",
    )
    assert report["interrupted"] is True and 200 <= report["requeued"] < 4000
    requeued = [str(m.properties.message_id) for m in drain(f"ojs.queue.{q}")]
    remaining = [str(m.properties.message_id) for m in drain(f"ojs.queue.dlx.{q}")]
    assert len(requeued) == report["requeued"]
    assert len(set(requeued)) == len(requeued) and not set(requeued) & set(remaining)
    assert sorted(requeued + remaining) == sorted(ids), "no job lost or doubled"


def test_dlq_prune_interrupted_by_sigint_stops_after_the_current_job(q: str) -> None:
    ok("topology", "declare", q)
    ids = dead_letters(q, 5000)
    report = _interrupted(
        ["dlq", "prune", q, "--max-count", "0", "--yes", "--json"],
        lambda: (queue_count(f"ojs.queue.dlx.{q}") or 5000) <= 4800,
        "the prune to be under way",
    )
    assert report["interrupted"] is True and 200 <= report["pruned"] < 5000
    remaining = [str(m.properties.message_id) for m in drain(f"ojs.queue.dlx.{q}")]
    assert remaining == ids[report["pruned"] :], "the oldest went; the rest is kept, in order"


def test_topology_check_catches_a_hand_made_difference(q: str) -> None:
    r = run_cli("topology", "check", q)
    assert r.returncode == 1 and "missing" in r.stderr
    ok("topology", "declare", q)
    report = json.loads(ok("topology", "check", q, "--json"))
    assert report["ok"] is True
    # Someone else declared the dead-letter queue their own way.
    declare_raw(f"ojs.queue.dlx.{q}", {"x-max-length": 5, "x-overflow": "reject-publish"})
    r = run_cli("topology", "check", q, "--json")
    assert r.returncode == 1
    report = json.loads(r.stdout)
    (bad,) = [e for e in report["entities"] if e["status"] != "ok" and e["status"] != "absent"]
    assert bad["entity"] == f"ojs.queue.dlx.{q}" and bad["status"] == "different"
    assert "inequivalent arg" in bad["detail"]
    # Nothing was changed by the check.
    r = run_cli("topology", "check", q)
    assert r.returncode == 1 and f"ojs.queue.dlx.{q} different" in r.stderr


def test_info_and_cancel_against_a_running_worker(app_dir: Path, q: str) -> None:
    ok("topology", "declare", q)
    job_id = ok("push", "t.work", "--queue", q, "--args", "[60]").strip()
    worker = spawn_cli("worker", "app:worker", "--backend", "trio", cwd=app_dir, log=app_dir / "w.out")
    with reaped(worker):
        wait_for(
            lambda: (
                f"start:{job_id}" in (app_dir / "jobs.log").read_text()
                if (app_dir / "jobs.log").exists()
                else False
            ),
            60,
            "the job to start",
        )
        info = json.loads(ok("info", job_id, "--queue", q, "--json"))
        assert info["state"] == "active" and info["attempt"] == 1 and info["worker_id"].startswith("worker-")
        assert "active" in ok("info", job_id, "--queue", q)
        cancelled = json.loads(ok("cancel", job_id, "--queue", q, "--timeout", "5", "--json"))
        assert cancelled["state"] == "cancelled"
        unknown = "01a2095d-0000-7000-8000-000000000000"  # a job id no worker knows
        r = run_cli("info", unknown, "--queue", q, "--timeout", "0.5")
        assert r.returncode == 5 and unknown in r.stderr
        r = run_cli("cancel", unknown, "--queue", q, "--timeout", "0.5")
        assert r.returncode == 5 and "cancel sent" in r.stderr
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0


def test_errors_are_one_line_with_a_documented_code(q: str) -> None:
    ok("topology", "declare", q)
    cases = [
        (["queues", q, "--url", "amqp://guest:guest@127.0.0.1:1/"], 3, "cannot reach the broker"),
        (["queues", q, "--url", "amqp://guest:s3cr3tpass@127.0.0.1/"], 4, "authentication failed"),
        (["queues", q, "--url", "amqp://guest:guest@127.0.0.1/no-such-vhost"], 4, "no-such-vhost"),
        (["queues", q, "--url", "http://guest:s3cr3tpass@127.0.0.1/"], 2, "invalid AMQP URL"),
        (["queues", "nosuchqueue"], 5, "does not exist"),
        (["dlq", "peek", "nosuchqueue"], 5, "does not exist"),
        (["push", "t.work", "--queue", "nosuchqueue"], 5, "does not exist"),
        (["push", "t.work", "--queue", q, "--args", "{not json"], 2, "--args is not valid JSON"),
        (["push", "t.work", "--queue", q, "--args", '{"a": 1}'], 2, "must be a JSON array"),
        (["push", "t.work", "--queue", q, "--delay", "soon"], 2, "not a duration"),
        (["push", "t.work", "--queue", q, "--at", "2030-01-01T00:00:00"], 2, "no time zone"),
        (["info", "01a2095d-0000-7000-8000-000000000000", "--queue", q, "--timeout", "0.3"], 5, "no worker"),
        (["queues", "Bad Name"], 2, "not an OJS queue name"),
        (["queues"], 2, "name the queues"),
        (["worker", "nosuchapp:worker"], 6, "cannot import"),
    ]
    for (args, code, text), r in zip(cases, run_many([c[0] for c in cases]), strict=True):
        assert r.returncode == code, (args, r.returncode, r.stderr)
        assert text in r.stderr, (args, r.stderr)
        assert r.stderr.startswith("ojs-anyio: ") and r.stderr.count("\n") == 1, (args, r.stderr)
        assert "Traceback" not in r.stderr and "s3cr3tpass" not in r.stderr + r.stdout


def test_help_is_plain_text() -> None:
    cases = [["--help"], ["worker", "--help"], ["dlq", "requeue", "--help"], ["topology", "check", "--help"],
             ["demo", "--help"]]  # fmt: skip
    for r in run_many(cases):
        assert r.returncode == 0
        assert "``" not in r.stdout and "::" not in r.stdout and ":class:" not in r.stdout, r.stdout
    assert "--jobs" in r.stdout


def test_demo_accepts_its_documented_flags(rabbitmq_url: str) -> None:
    r = run_cli("demo", "--jobs", "20", "--url", rabbitmq_url, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "demo OK" in r.stdout


def test_the_demo_prints_a_summary_and_shows_the_logs_of_its_failures_only_with_v(rabbitmq_url: str) -> None:
    # one after the other: each run starts the demo's queues afresh
    quiet = run_cli("demo", "--jobs", "20", "--url", rabbitmq_url, timeout=120)
    verbose = run_cli("demo", "--jobs", "20", "--url", rabbitmq_url, "-v", timeout=120)
    assert quiet.returncode == 0 and verbose.returncode == 0, quiet.stderr + verbose.stderr
    output = quiet.stdout + quiet.stderr
    assert "Traceback" not in output
    assert "completed=20" in output and "dead-lettered=1" in output and "code=HANDLER_ERROR" in output
    assert len(output.splitlines()) <= 8, output
    # -v: each failed attempt of the job that always fails, with its traceback
    assert verbose.stderr.count("Traceback") >= 3, verbose.stderr
    assert "ValueError: this job always fails" in verbose.stderr


def test_prefix_reaches_every_entity(q: str) -> None:
    prefix = f"p{q[-6:]}."
    names = [f"{prefix}ojs.queue.{q}", f"{prefix}ojs.queue.dlx.{q}", f"{prefix}ojs.queue.control.{q}"]
    try:
        ok("topology", "declare", q, "--prefix", prefix)
        assert [queue_count(n) for n in names] == [0, 0, 0]
        assert queue_count(f"ojs.queue.{q}") is None, "nothing outside the prefix"
        ok("push", "t.work", "--queue", q, "--prefix", prefix)
        assert json.loads(ok("queues", q, "--prefix", prefix, "--json"))["queues"][0]["ready"] == 1
        assert json.loads(ok("topology", "check", q, "--prefix", prefix, "--json"))["ok"] is True
    finally:
        delete_queues(names)
        delete_exchanges([f"{prefix}ojs.exchange.{kind}" for kind in ("direct", "dlx", "retry")])
