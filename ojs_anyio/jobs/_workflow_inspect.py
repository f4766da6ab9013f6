"""Workflow inspection and cancel (``docs/workflows.md``): a workflow's state, per-job
states and counters, read from its journal queue by any process; and the cancel of a whole
workflow (OJS workflows §8, §11.3)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import msgspec

from .. import amqp
from ._errors import ArgumentTypeError
from ._workflow_model import CANCELLED_CODE, Client, cancel_queue, job_id_for, journal_queue

__all__ = ["WorkflowState", "cancel_workflow", "inspect_workflow"]

log = logging.getLogger("ojs_anyio.workflows")

_decoder = msgspec.json.Decoder()


@dataclass(frozen=True, slots=True)
class WorkflowState:
    """What the broker knows of a workflow (OJS workflows §8, §3.3), from its journal.

    ``jobs`` maps each job's node path (``r.1.0``, ``r.on_complete``) to its state:
    ``waiting``, ``pending``, ``completed``, ``failed`` or ``cancelled`` (a chain step after
    a failed one).  ``pending`` covers ``active``: the journal records outcomes only."""

    id: str
    type: str
    state: str
    job_count: int
    completed_count: int
    failed_count: int
    jobs: dict[str, str]
    errors: list[dict[str, Any]]
    envelope: dict[str, Any]


async def inspect_workflow(client: Client, workflow_id: str) -> WorkflowState:
    """Read workflow ``workflow_id``'s journal (non-destructively) and work out its state.

    Raises :class:`ojs_anyio.amqp.NotFound` when the broker holds no such workflow (never
    started here, or expired)."""
    journal = journal_queue(client.names.prefix, workflow_id)
    envelope: dict[str, Any] | None = None
    records: dict[str, tuple[bool, Any]] = {}
    cancelled = False
    async with client.conn.channel(confirms=False) as ch:
        await ch.queue_declare(journal, passive=True)
        held: list[amqp.IncomingMessage] = []
        try:
            while (msg := await ch.get(journal)) is not None:
                held.append(msg)
                data = _decoder.decode(msg.body)
                if msg.properties.type == "ojs.workflow.envelope":
                    envelope = data
                elif msg.properties.type == "ojs.workflow.cancel":
                    cancelled = True
                else:
                    records.setdefault(str(data["path"]), (bool(data["ok"]), data.get("error")))
        finally:
            with anyio.CancelScope(shield=True):
                for msg in held:
                    await msg.nack(requeue=True)
    if envelope is None:
        raise ArgumentTypeError(f"workflow {workflow_id}'s journal holds no envelope")
    jobs: dict[str, str] = {}
    state = _node_state(envelope, "r", records, jobs, startable=True)
    if cancelled:
        _cancel(jobs, "r")
        if state != "completed" and "failed" not in jobs.values():  # failed before: stays failed
            state = "cancelled"
    errors = [err for ok, err in records.values() if not ok and isinstance(err, dict)]
    return WorkflowState(
        id=workflow_id,
        type=envelope["type"],
        state=state,
        job_count=len(jobs),
        completed_count=sum(s == "completed" for s in jobs.values()),
        failed_count=sum(s == "failed" for s in jobs.values()),
        jobs=jobs,
        errors=errors,
        envelope=envelope,
    )


def _node_state(
    node: dict[str, Any],
    path: str,
    records: dict[str, tuple[bool, Any]],
    jobs: dict[str, str],
    *,
    startable: bool,
) -> str:
    """pending / running / completed / failed of a node; fills ``jobs`` with its leaves."""
    kind = node.get("type")
    if kind == "chain":
        states: list[str] = []
        blocked = False
        for i, child in enumerate(node["steps"]):
            ready = startable and not blocked and (i == 0 or states[-1] == "completed")
            child_state = _node_state(child, f"{path}.{i}", records, jobs, startable=ready)
            if blocked:
                _cancel(jobs, f"{path}.{i}")
            states.append(child_state)
            blocked = blocked or child_state == "failed"
        return _combine(states, ordered=True)
    if kind in ("group", "batch"):
        states = [
            _node_state(child, f"{path}.{i}", records, jobs, startable=startable)
            for i, child in enumerate(node["jobs"])
        ]
        outcome = _combine(states, ordered=False)
        if kind == "group" or outcome not in ("completed", "failed"):
            for name in node.get("callbacks") or {}:
                jobs[f"{path}.{name}"] = "waiting"
            return outcome
        all_ok = outcome == "completed"
        cb_states = []
        for name, cb in node["callbacks"].items():
            if name == "on_complete" or (name == "on_success") == all_ok:
                cb_states.append(_node_state(cb, f"{path}.{name}", records, jobs, startable=True))
            else:
                jobs[f"{path}.{name}"] = "cancelled"
        if not cb_states:
            return "completed"
        done = _combine(cb_states, ordered=False)
        return done if done in ("completed", "failed") else "running"
    record = records.get(path)
    jobs[path] = (
        ("completed" if record[0] else _failed_state(record[1]))
        if record is not None
        else "pending"
        if startable
        else "waiting"
    )
    return jobs[path]


def _failed_state(error: Any) -> str:
    cancelled = isinstance(error, dict) and error.get("code") == CANCELLED_CODE
    return "cancelled" if cancelled else "failed"


def _cancel(jobs: dict[str, str], prefix: str) -> None:
    for key in jobs:
        if (key == prefix or key.startswith(prefix + ".")) and jobs[key] in ("waiting", "pending"):
            jobs[key] = "cancelled"


def _combine(states: list[str], *, ordered: bool) -> str:
    """A chain (``ordered``: fails at its first failure) or a group of child states."""
    states = ["failed" if st == "cancelled" else st for st in states]  # a cancelled job failed
    if ordered and "failed" in states:
        return "failed"
    if all(s == "completed" for s in states):
        return "completed"
    if all(s in ("completed", "failed") for s in states):
        return "failed"
    if all(s in ("pending", "waiting") for s in states):
        return "pending"
    return "running"


async def cancel_workflow(client: Client, workflow_id: str) -> list[str]:
    """Cancel a workflow (OJS workflows §11.3): nothing more of it is pushed, and every job
    of it gets CANCEL (a running handler is cancelled, a queued job is skipped); returns the
    ids CANCEL was sent for.  Raises :class:`ojs_anyio.amqp.NotFound` for an unknown one."""
    state = await inspect_workflow(client, workflow_id)
    ch = await client.channel()
    props = amqp.BasicProperties(delivery_mode=2, type="ojs.workflow.cancel")
    try:
        await ch.publish(
            b"", exchange="", routing_key=cancel_queue(client.names.prefix, workflow_id), properties=props,
            mandatory=True,
        )  # fmt: skip
    except amqp.PublishNackedError:
        pass  # cancelled already
    await ch.publish(
        b"{}", exchange="", routing_key=journal_queue(client.names.prefix, workflow_id), properties=props,
        mandatory=True,
    )  # fmt: skip
    sent: list[str] = []
    for path, queue in _leaf_queues(state.envelope, "r"):
        if state.jobs.get(path) in ("completed", "failed"):
            continue
        job_id = job_id_for(workflow_id, path)
        try:
            await client.cancel(job_id, queue=queue)
        except Exception as exc:  # a queue that does not exist (yet): nothing of it runs
            log.info("workflow %s: CANCEL of %s on %s not sent: %s", workflow_id, job_id, queue, exc)
            continue
        sent.append(job_id)
    return sent


def _leaf_queues(node: Mapping[str, Any], path: str) -> list[tuple[str, str]]:
    kind = node.get("type")
    if kind == "chain":
        return [x for i, c in enumerate(node["steps"]) for x in _leaf_queues(c, f"{path}.{i}")]
    if kind in ("group", "batch"):
        out = [x for i, c in enumerate(node["jobs"]) for x in _leaf_queues(c, f"{path}.{i}")]
        for name, cb in (node.get("callbacks") or {}).items():
            out += _leaf_queues(cb, f"{path}.{name}")
        return out
    return [(path, (node.get("options") or {}).get("queue", "default"))]
