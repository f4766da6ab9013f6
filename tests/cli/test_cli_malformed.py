"""``ojs-anyio dlq`` with malformed messages in the dead-letter queue (a content header the
codec flags: ``IncomingMessage.malformed``).  ``peek`` lists them with their reason;
``requeue`` leaves them in the DLQ (they cannot be published again as they are, and a
worker would only dead-letter them again), says so, and moves every other job.

Before, the first such message closed the CLI's connection: peek and requeue failed with
a protocol error and moved nothing.
"""

from __future__ import annotations

import json

from harness.hostile import HOSTILE, publish, with_frame_max

from .cli_support import URL, drain, queue_count, run_cli
from .test_cli_ops import dead_letters

SMALL = with_frame_max(URL)  # below the large-header case's header


def test_dlq_peek_lists_malformed_messages_and_requeue_leaves_them(q: str) -> None:
    r = run_cli("topology", "declare", q)
    assert r.returncode == 0, r.stderr
    dlq = f"ojs.queue.dlx.{q}"
    first = dead_letters(q, 1)
    publish(
        URL,
        [("", dlq, b"{}", h.pika_properties(message_id=f"bad-{h.name}", type="t.work")) for h in HOSTILE],
    )
    last = dead_letters(q, 1, start=1)
    r = run_cli("dlq", "peek", q, "-n", "20", "--json", "--url", SMALL)
    assert r.returncode == 0, r.stderr
    peek = json.loads(r.stdout)
    assert peek["total"] == len(HOSTILE) + 2
    rows = peek["jobs"]
    assert [row["id"] for row in rows] == [
        first[0],
        *("\\xff\\xfeid" if h.name == "message-id" else f"bad-{h.name}" for h in HOSTILE),
        last[0],
    ]
    assert rows[0]["malformed"] is None and rows[0]["reason"] == "HANDLER_ERROR: boom"
    for case, row in zip(HOSTILE, rows[1:-1], strict=True):
        assert case.reason in row["malformed"], case.name
        assert row["reason"] == f"malformed message: {row['malformed']}"
    text = run_cli("dlq", "peek", q, "-n", "20", "--url", SMALL)
    assert text.returncode == 0 and "malformed message: message_id is not UTF-8" in text.stdout
    assert queue_count(dlq) == len(HOSTILE) + 2, "peek removes nothing"

    r = run_cli("dlq", "requeue", q, "--all", "--yes", "--json", "--url", SMALL)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["requeued"] == 2 and len(out["malformed"]) == len(HOSTILE)
    assert f"left {len(HOSTILE)} malformed message(s) in {dlq}" in r.stderr
    assert [m.properties.message_id for m in drain(f"ojs.queue.{q}")] == [first[0], last[0]]
    # The malformed ones stay, in their order.
    left = drain(dlq)
    assert len(left) == len(HOSTILE) and all(m.malformed is not None for m in left[:-1])
    assert [m.properties.message_id for m in left][1:] == [f"bad-{h.name}" for h in HOSTILE[1:]]
