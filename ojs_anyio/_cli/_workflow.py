"""``ojs-anyio workflow show ID``: a workflow's state from its journal (docs/workflows.md)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from .. import amqp
from ._common import EXIT_NOT_FOUND, EXIT_OK, CLIError, open_client
from ._registry import command, group

group("workflow", help="workflows: show one's state, counters and jobs (docs/workflows.md)")


def _show_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workflow_id", help="the workflow's id (WorkflowHandle.id)")


@command("workflow", "show", help="a workflow's state, counters and jobs", arguments=_show_arguments)
async def cmd_workflow_show(args: Any) -> int:
    async with open_client(args.url, args.prefix) as client:
        try:
            state = await client.workflow(args.workflow_id)
        except amqp.NotFound:
            raise CLIError(
                f"workflow {args.workflow_id}: not on this broker (never started, or expired)", EXIT_NOT_FOUND
            ) from None
    data = {
        "id": state.id,
        "type": state.type,
        "name": state.envelope.get("name"),
        "state": state.state,
        "metadata": {
            "job_count": state.job_count,
            "completed_count": state.completed_count,
            "failed_count": state.failed_count,
        },
        "jobs": state.jobs,
        "errors": state.errors,
    }
    if args.json:
        print(json.dumps(data, indent=2))
        return EXIT_OK
    print(f"workflow {state.id} ({state.type}{', ' + data['name'] if data['name'] else ''}): {state.state}")
    print(f"jobs {state.job_count}, completed {state.completed_count}, failed {state.failed_count}")
    for path, job_state in state.jobs.items():
        print(f"  {path:<24} {job_state}")
    for error in state.errors:
        print(f"  error: job {error.get('job_id')} {error.get('code')}: {error.get('message')}")
    return EXIT_OK
