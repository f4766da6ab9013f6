"""``ojs-anyio workflow show ID`` (with ``--json``) against the real broker."""

from __future__ import annotations

import json
import uuid

import anyio
import pytest
from cli.cli_support import run_cli
from support.brokers import RABBITMQ_URL as URL

import ojs_anyio as ojs
from ojs_anyio import amqp
from ojs_anyio.jobs._workflows import workflow_queues

pytestmark = pytest.mark.usefixtures("rabbitmq_url")


def test_workflow_show_prints_state_and_says_when_there_is_none() -> None:
    q = f"tcli{uuid.uuid4().hex[:10]}"

    async def start() -> ojs.WorkflowHandle:
        async with ojs.connect(URL) as client:
            handle: ojs.WorkflowHandle = await client.chain(
                ojs.step("a", queue=q), ojs.group(ojs.step("b", queue=q), ojs.step("c", queue=q)), name="etl"
            )
            return handle

    handle = anyio.run(start)
    try:
        shown = run_cli("workflow", "show", handle.id, "--json")
        assert shown.returncode == 0, shown.stderr
        data = json.loads(shown.stdout)
        assert (data["id"], data["type"], data["name"], data["state"]) == (
            handle.id,
            "chain",
            "etl",
            "pending",
        )
        assert data["metadata"] == {"job_count": 3, "completed_count": 0, "failed_count": 0}
        assert data["jobs"] == {"r.0": "pending", "r.1.0": "waiting", "r.1.1": "waiting"}
        table = run_cli("workflow", "show", handle.id)
        assert table.returncode == 0 and f"workflow {handle.id} (chain, etl): pending" in table.stdout
        missing = run_cli("workflow", "show", "01a2095d-0000-7000-8000-000000000000")
        assert missing.returncode == 5 and "not on this broker" in missing.stderr, missing.stderr
    finally:

        async def cleanup() -> None:
            names = ojs.Names()
            async with amqp.connect(URL) as conn, conn.channel(confirms=False) as ch:
                for name in [names.job_queue(q), names.dlx_queue(q), *workflow_queues("", handle.envelope)]:
                    await ch.queue_delete(name)

        anyio.run(cleanup)
