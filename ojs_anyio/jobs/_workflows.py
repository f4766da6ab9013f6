"""OJS workflows (chain, group, batch) with no store but the broker: ``docs/workflows.md``.

The modules: ``_workflow_model`` (the descriptions, the OJS envelope, ids and entity
names), ``_workflow_progress`` (starting a node, moving a workflow on: guards and fan-in),
``_workflow_inspect`` (state and cancel), and this one: starting a workflow from a client
(:func:`start_workflow`) and moving it on from a worker (:class:`WorkflowMiddleware`, which
runs after a workflow job's handler returned or failed for good, before the job is
acknowledged).
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import anyio
import msgspec

from .. import amqp
from ._context import WORKFLOW_META_KEY, JobContext
from ._decide import decide
from ._envelope import Job
from ._errors import ArgumentTypeError, ErrorCode
from ._middleware import Middleware
from ._workflow_inspect import WorkflowState, cancel_workflow, inspect_workflow
from ._workflow_model import (
    CANCELLED_CODE,
    FAN_IN_LOCK_WAIT,
    MAX_NESTING_DEPTH,
    MAX_WORKFLOW_JOBS,
    WORKFLOW_EXPIRES_MS,
    Batch,
    Chain,
    Client,
    FanInBusyError,
    Group,
    Step,
    Workflow,
    batch,
    cancel_queue,
    chain,
    entity_arguments,
    group,
    job_id_for,
    journal_queue,
    step,
    workflow_from_dict,
    workflow_queues,
)
from ._workflow_progress import Effects, Flow, Outcome, finish, record, start_node

__all__ = [
    "MAX_NESTING_DEPTH",
    "WORKFLOW_EXPIRES_MS",
    "Batch",
    "Chain",
    "FanInBusyError",
    "Group",
    "Step",
    "WorkflowHandle",
    "WorkflowMiddleware",
    "WorkflowState",
    "batch",
    "cancel_workflow",
    "chain",
    "group",
    "inspect_workflow",
    "job_id_for",
    "journal_queue",
    "start_workflow",
    "step",
    "workflow_from_dict",
    "workflow_queues",
]


@dataclass(frozen=True, slots=True)
class WorkflowHandle:
    """A started workflow: its id, its envelope and the ids of the jobs pushed first."""

    id: str
    type: Literal["chain", "group", "batch"]
    envelope: dict[str, Any]
    job_ids: tuple[str, ...]


async def start_workflow(client: Client, workflow: Workflow) -> WorkflowHandle:
    """Push the first jobs of ``workflow``; return once the broker confirmed them."""
    if not isinstance(workflow, Chain | Group | Batch):
        raise ArgumentTypeError(f"start_workflow takes ojs.chain/group/batch(...), not {workflow!r}")
    if _depth(workflow) > MAX_NESTING_DEPTH:
        raise ArgumentTypeError(f"workflow {workflow.id} nests deeper than {MAX_NESTING_DEPTH} levels")
    leaves = _leaves(workflow)
    if leaves > MAX_WORKFLOW_JOBS:
        raise ArgumentTypeError(f"workflow {workflow.id} holds more than {MAX_WORKFLOW_JOBS} jobs")
    envelope = workflow.to_dict()
    kind: Literal["chain", "group", "batch"] = envelope["type"]
    flow = Flow(client, workflow.id, quorum=_quorum(client, envelope))
    prefix = client.names.prefix
    ch = await client.channel()
    journal = journal_queue(prefix, workflow.id)
    await ch.queue_declare(
        journal, durable=True, arguments=entity_arguments(2 * leaves + 64, quorum=flow.quorum)
    )
    await ch.queue_declare(
        cancel_queue(prefix, workflow.id), durable=True, arguments=entity_arguments(1, quorum=flow.quorum)
    )
    props = amqp.BasicProperties(delivery_mode=2, type="ojs.workflow.envelope")
    await ch.publish(
        msgspec.json.encode(envelope), exchange="", routing_key=journal, properties=props, mandatory=True
    )
    # The first pushes cannot be repeats (the workflow id is new): the guards go first, then
    # the jobs together, with pipelined confirms.
    effects = Effects()
    start_node(flow, envelope, "r", {}, None, effects)
    for name, args in effects.queues.items():
        await ch.queue_declare(name, durable=True, arguments=args)
    for queue, body, message_props in effects.messages:
        await ch.publish(body, exchange="", routing_key=queue, properties=message_props, mandatory=True)
    for pushed in await client.push_batch(effects.jobs):
        if pushed.error is not None:
            raise pushed.error
    return WorkflowHandle(workflow.id, kind, envelope, tuple(job.id for job in effects.jobs))


def _quorum(client: Client, envelope: Mapping[str, Any]) -> bool:
    """Whether a workflow's own queues are quorum queues: when one of its job queues is."""
    queues: set[str] = set()

    def walk(node: Mapping[str, Any]) -> None:
        kind = node.get("type")
        if kind in ("chain", "group", "batch"):
            for child in node.get("steps") or node.get("jobs") or ():
                walk(child)
            for cb in (node.get("callbacks") or {}).values():
                walk(cb)
        else:
            queues.add((node.get("options") or {}).get("queue", "default"))

    walk(envelope)
    return any(getattr(client.queue_options(q), "queue_type", None) == "quorum" for q in queues)


def _depth(node: Step | Workflow) -> int:
    if isinstance(node, Step):
        return 0
    children = node.steps if isinstance(node, Chain) else node.jobs
    return 1 + max(_depth(c) for c in children)


def _leaves(node: Step | Workflow) -> int:
    if isinstance(node, Step):
        return 1
    children = node.steps if isinstance(node, Chain) else node.jobs
    extra = len(node.callbacks()) if isinstance(node, Batch) else 0
    return extra + sum(_leaves(c) for c in children)


class WorkflowMiddleware(Middleware):
    """Moves workflows on: add it to every worker that runs workflow jobs.

    ``Worker(queues=[...], middleware=[ojs.WorkflowMiddleware(client)])``, with the client
    the worker runs on (``worker.run(client)``)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self._rng = random.Random()

    async def around_handler(self, ctx: JobContext, call_next: Callable[[], Awaitable[Any]]) -> Any:
        place = ctx.job.effective_meta().get(WORKFLOW_META_KEY)
        if not isinstance(place, dict) or not isinstance(place.get("id"), str):
            return await call_next()
        try:
            result = await call_next()
        except anyio.get_cancelled_exc_class():
            code = None
            if ctx.cancel_requested and not ctx.abandoned:
                # A CANCEL of this job: it ends cancelled, which its workflow counts as a
                # failure (a chain stops, a group fails); after a cancel of the whole
                # workflow, advance() pushes nothing.
                code, message = CANCELLED_CODE, "cancelled"
            elif self._timed_out(ctx):  # the handler's own timeout, not a stop
                code, message = self._final_code(ctx, None, timed_out=True), "handler timeout"
            if code is not None:
                error = {"job_id": ctx.id, "code": code, "message": message, "attempt": ctx.attempt}
                # The job's scope is cancelled: record it shielded, bounded.
                with anyio.CancelScope(shield=True) as shield:
                    shield.deadline = anyio.current_time() + FAN_IN_LOCK_WAIT
                    await self._done(place, (False, error))
            raise
        except Exception as exc:
            code = self._final_code(ctx, exc)
            if code is not None:
                error = {"job_id": ctx.id, "code": code, "message": str(exc)[:1000], "attempt": ctx.attempt}
                await self._done(place, (False, error))
            raise
        await self._done(place, (True, result))
        return result

    @staticmethod
    def _timed_out(ctx: JobContext) -> bool:
        return (
            ctx.deadline is not None
            and not ctx.cancel_requested
            and not ctx.abandoned
            and anyio.current_time() >= ctx.deadline
        )

    def _final_code(
        self, ctx: JobContext, exc: BaseException | None, *, timed_out: bool = False
    ) -> str | None:
        """The OJS error code when the worker will dead-letter this attempt (the same
        decision it makes), None when it will be retried."""
        if ctx.policy is None:
            return str(ErrorCode.HANDLER_ERROR) if ctx.attempt >= ctx.max_attempts else None
        verdict = decide(
            exc, cancelled_caught=timed_out, cancel_requested=False, abandoned=False, timeout=0.0,
            policy=ctx.policy, attempt=ctx.attempt, max_attempts=ctx.max_attempts, rng=self._rng,
        )  # fmt: skip
        return str(verdict.code) if verdict.action == "dead_letter" else None

    async def on_skipped(self, job: Job) -> None:
        """A job CANCELled before it started is skipped by the worker: its workflow counts
        it as cancelled (a failure: a chain stops, a group fails, a batch fires
        ``on_failure``), so nothing waits for it."""
        place = job.effective_meta().get(WORKFLOW_META_KEY)
        if isinstance(place, dict) and isinstance(place.get("id"), str):
            error = {
                "job_id": job.id,
                "code": CANCELLED_CODE,
                "message": "cancelled before it started",
                "attempt": 1,
            }
            await self._done(place, (False, error))

    async def _done(self, place: dict[str, Any], outcome: Outcome) -> None:
        flow = Flow(self.client, place["id"], quorum=bool(place.get("quorum")))
        await record(flow, place.get("path"), outcome)
        await finish(flow, str(place.get("path")), place.get("then"), outcome)
