"""OJS workflows (chain, group, batch) with no store but the broker: ``docs/workflows.md``.

* **Descriptions** (:class:`Step`, :class:`Chain`, :class:`Group`, :class:`Batch`) are
  frozen values that become the OJS workflow envelope (:meth:`to_dict`) and come back from
  it (:func:`workflow_from_dict`).
* **Starting** (:func:`start_workflow`, ``client.chain/group/batch``) pushes the first
  jobs.  Each job carries its place in the workflow in ``meta["ojs.workflow"]``: the
  workflow id, its ``parent_results`` and its *continuation* (what to do when it is done:
  the rest of a chain, or a fan-in), so a chain's next step travels with the current one.
* **Progress** (:class:`WorkflowMiddleware`, a worker middleware) runs after a workflow
  job's handler returned or failed for good, and before the job is acknowledged: it pushes
  the successor, or records the outcome and takes a fan-in token.  A crash in between
  leaves the job unacknowledged: it runs again and repeats the step, and the successor's
  deterministic id, claimed with the library's idempotency keys, keeps a repeat from firing
  twice.
* **Fan-in** of a group or batch: two per-node queues, ``{prefix}ojs.workflow.{id}.{node}.
  tokens`` (N tokens) and ``….results`` (one record per finished job).  A finished job
  publishes its record (confirmed), then takes a token with ``basic.get``; whoever finds
  the token queue empty after its take tries to fire: it reads the records and fires only
  when all N job indexes are there (then every job has finished).  The token is acked only
  after the firing pushes were confirmed.
"""

from __future__ import annotations

import hashlib
import logging
import random
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol

import anyio
import msgspec

from .. import amqp
from .._common import new_id
from ._context import WORKFLOW_META_KEY, JobContext
from ._decide import decide
from ._dedup import DuplicateJobError, lock_queue
from ._dedup import claim as claim_key
from ._envelope import Job
from ._errors import ArgumentTypeError, ErrorCode
from ._middleware import Middleware
from ._retry import RetryPolicy
from ._topology import Names


class _Pushed(Protocol):
    @property
    def error(self) -> Exception | None: ...


class Client(Protocol):
    """What workflows use of a :class:`ojs_anyio.Client` (named so: the client module
    starts workflows, and this module must not import it back)."""

    names: Names
    conn: amqp.Connection

    async def channel(self) -> amqp.Channel: ...

    async def cancel(self, job_id: str, *, queue: str = ...) -> None: ...

    def build(
        self,
        type: str,
        args: Sequence[Any] = (),
        *,
        queue: str = ...,
        priority: int | None = ...,
        timeout: int | None = ...,
        retry: RetryPolicy | None = ...,
        meta: dict[str, Any] | None = ...,
        id: str | None = ...,
    ) -> Job: ...

    async def push_batch(self, jobs: Iterable[Job], *, max_in_flight: int = ...) -> Sequence[_Pushed]: ...

    async def push_job(
        self, job: Job, *, idempotency_key: str | None = None, idempotency_window: float | None = ...
    ) -> Job: ...


__all__ = [
    "MAX_NESTING_DEPTH",
    "FanInBusyError",
    "WORKFLOW_EXPIRES_MS",
    "Batch",
    "Chain",
    "Group",
    "Step",
    "WorkflowHandle",
    "WorkflowMiddleware",
    "WorkflowState",
    "cancel_workflow",
    "inspect_workflow",
    "journal_queue",
    "batch",
    "chain",
    "group",
    "start_workflow",
    "step",
    "workflow_from_dict",
    "workflow_queues",
]

log = logging.getLogger("ojs_anyio.workflows")

#: Nesting levels a workflow may have (OJS workflows §10.2 asks for at least 3).
MAX_NESTING_DEPTH: Final = 8
#: Jobs (leaves) one workflow may hold.
MAX_WORKFLOW_JOBS: Final = 100_000
#: How long a workflow's fan-in queues outlive their last use (``x-expires``): 7 days.
WORKFLOW_EXPIRES_MS: Final = 7 * 86_400_000
#: The code a workflow job cancelled while it ran is recorded with (its state: cancelled).
CANCELLED_CODE: Final = "CANCELLED"
#: How long a job that emptied a fan-in's token queue waits for the fan-in's lock (held by
#: another job reading the records) before it gives up with :class:`FanInBusyError`.
FAN_IN_LOCK_WAIT: Final = 60.0


class FanInBusyError(Exception):
    """The fan-in's lock stayed taken for :data:`FAN_IN_LOCK_WAIT` seconds: the job fails
    this attempt (retried by its policy; the fan-in is tried again then)."""


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()

# ------------------------------------------------------------------ descriptions


@dataclass(frozen=True, slots=True)
class Step:
    """One job of a workflow (OJS workflows §3.2): ``type``, ``args`` and job options."""

    type: str
    args: tuple[Any, ...] = ()
    queue: str = "default"
    priority: int | None = None
    timeout: int | None = None
    retry: RetryPolicy | None = None

    def to_dict(self) -> dict[str, Any]:
        options: dict[str, Any] = {"queue": self.queue}
        if self.priority is not None:
            options["priority"] = self.priority
        if self.timeout is not None:
            options["timeout"] = self.timeout
        if self.retry is not None:
            options["retry"] = msgspec.to_builtins(self.retry)
        return {"type": self.type, "args": list(self.args), "options": options}


@dataclass(frozen=True, slots=True)
class Chain:
    """Steps run one after another; step N's result reaches step N+1 (OJS workflows §4)."""

    steps: tuple[Node, ...]
    name: str | None = None
    id: str = field(default_factory=lambda: _uuid7())

    def to_dict(self) -> dict[str, Any]:
        return _with_name(
            {"type": "chain", "id": self.id, "steps": [s.to_dict() for s in self.steps]}, self.name
        )


@dataclass(frozen=True, slots=True)
class Group:
    """Jobs run in parallel; the group fails if any fails for good (OJS workflows §5)."""

    jobs: tuple[Node, ...]
    name: str | None = None
    id: str = field(default_factory=lambda: _uuid7())

    def to_dict(self) -> dict[str, Any]:
        return _with_name(
            {"type": "group", "id": self.id, "jobs": [j.to_dict() for j in self.jobs]}, self.name
        )


@dataclass(frozen=True, slots=True)
class Batch:
    """A group with callbacks fired once all its jobs are done (OJS workflows §6)."""

    jobs: tuple[Node, ...]
    on_complete: Step | None = None
    on_success: Step | None = None
    on_failure: Step | None = None
    name: str | None = None
    id: str = field(default_factory=lambda: _uuid7())

    def callbacks(self) -> dict[str, Step]:
        found = {
            "on_complete": self.on_complete,
            "on_success": self.on_success,
            "on_failure": self.on_failure,
        }
        return {k: v for k, v in found.items() if v is not None}

    def to_dict(self) -> dict[str, Any]:
        out = {
            "type": "batch",
            "id": self.id,
            "jobs": [j.to_dict() for j in self.jobs],
            "callbacks": {k: v.to_dict() for k, v in self.callbacks().items()},
        }
        return _with_name(out, self.name)


Node = Step | Chain | Group | Batch
Workflow = Chain | Group | Batch


def _with_name(out: dict[str, Any], name: str | None) -> dict[str, Any]:
    if name is not None:
        out["name"] = name
    return out


def step(
    type: str,
    args: Sequence[Any] = (),
    *,
    queue: str = "default",
    priority: int | None = None,
    timeout: int | None = None,
    retry: RetryPolicy | None = None,
) -> Step:
    """One job of a workflow: ``ojs.step("email.send", ["a@example.com"], queue="email")``."""
    if not isinstance(type, str) or not type:
        raise ArgumentTypeError(f"a workflow step's type must be a non-empty str, got {type!r}")
    if isinstance(args, str | bytes) or not isinstance(args, Sequence):
        raise ArgumentTypeError(f"a workflow step's args must be a list, got {args!r}")
    if retry is not None and retry.carries_classes():
        raise ArgumentTypeError("a workflow step's retry policy travels in messages: name errors as strings")
    return Step(type, tuple(args), queue, priority, timeout, retry)


def _nodes(items: Sequence[Any], what: str) -> tuple[Node, ...]:
    if not items:
        raise ArgumentTypeError(f"a {what} needs at least one job (OJS workflows §4.2, §5.2)")
    for item in items:
        if not isinstance(item, Step | Chain | Group | Batch):
            raise ArgumentTypeError(
                f"a {what} holds ojs.step(...), ojs.chain(...), ojs.group(...) or ojs.batch(...), "
                f"not {item!r}"
            )
    return tuple(items)


def chain(*steps: Node, name: str | None = None, id: str | None = None) -> Chain:
    """``ojs.chain(ojs.step("a"), ojs.group(...), ojs.step("b"))``."""
    return Chain(_nodes(steps, "chain"), name, id or _uuid7())


def group(*jobs: Node, name: str | None = None, id: str | None = None) -> Group:
    """``ojs.group(ojs.step("a"), ojs.chain(...))``."""
    return Group(_nodes(jobs, "group"), name, id or _uuid7())


def batch(
    jobs: Sequence[Node],
    *,
    on_complete: Step | None = None,
    on_success: Step | None = None,
    on_failure: Step | None = None,
    name: str | None = None,
    id: str | None = None,
) -> Batch:
    """``ojs.batch([...], on_complete=ojs.step("report"), on_failure=ojs.step("alert"))``."""
    if on_complete is None and on_success is None and on_failure is None:
        raise ArgumentTypeError("a batch needs at least one callback (OJS workflows §6.2); else use a group")
    for cb in (on_complete, on_success, on_failure):
        if cb is not None and not isinstance(cb, Step):
            raise ArgumentTypeError(f"a batch callback is an ojs.step(...), not {cb!r}")
    return Batch(_nodes(list(jobs), "batch"), on_complete, on_success, on_failure, name, id or _uuid7())


def _step_from_dict(data: Mapping[str, Any]) -> Step:
    options = data.get("options") or {}
    retry = options.get("retry")
    return step(
        data["type"],
        data.get("args", []),
        queue=options.get("queue", "default"),
        priority=options.get("priority"),
        timeout=options.get("timeout"),
        retry=None if retry is None else msgspec.convert(retry, RetryPolicy),
    )


def node_from_dict(data: Mapping[str, Any]) -> Node:
    """A node of the OJS workflow envelope: a job envelope, or a nested chain/group/batch."""
    kind = data.get("type")
    if kind == "chain":
        return chain(*(node_from_dict(s) for s in data["steps"]), name=data.get("name"), id=data.get("id"))
    if kind == "group":
        return group(*(node_from_dict(j) for j in data["jobs"]), name=data.get("name"), id=data.get("id"))
    if kind == "batch":
        cbs = {k: _step_from_dict(v) for k, v in (data.get("callbacks") or {}).items()}
        return batch(
            [node_from_dict(j) for j in data["jobs"]], name=data.get("name"), id=data.get("id"), **cbs
        )
    return _step_from_dict(data)


def workflow_from_dict(data: Mapping[str, Any]) -> Workflow:
    """An OJS workflow envelope (``{"type": "chain", "id": ..., "steps": [...]}``) as a value."""
    node = node_from_dict(data)
    if isinstance(node, Step):
        raise ArgumentTypeError(f"a workflow's type is chain, group or batch, not {data.get('type')!r}")
    return node


def _depth(node: Node) -> int:
    if isinstance(node, Step):
        return 0
    children = node.steps if isinstance(node, Chain) else node.jobs
    return 1 + max(_depth(c) for c in children)


def _leaves(node: Node) -> int:
    if isinstance(node, Step):
        return 1
    children = node.steps if isinstance(node, Chain) else node.jobs
    extra = len(node.callbacks()) if isinstance(node, Batch) else 0
    return extra + sum(_leaves(c) for c in children)


# ------------------------------------------------------------------ ids and names


def _uuid7() -> str:
    return new_id()


def job_id_for(workflow_id: str, path: str) -> str:
    """The deterministic job id of node ``path`` of a workflow: a UUIDv7 with the
    workflow's timestamp and 74 bits of SHA-256 of (workflow id, path)."""
    digest = int.from_bytes(hashlib.sha256(f"{workflow_id}/{path}".encode()).digest()[:10])
    try:
        millis = uuid.UUID(workflow_id).int >> 80
    except ValueError:
        millis = 0
    value = (millis & (2**48 - 1)) << 80
    value |= 0x7 << 76 | ((digest >> 62) & 0xFFF) << 64 | 0b10 << 62 | (digest & (2**62 - 1))
    return str(uuid.UUID(int=value))


def _lock_name(tokens: str) -> str:
    return tokens.removesuffix(".tokens") + ".lock"


def fan_in_queues(client: Client, workflow_id: str, path: str) -> tuple[str, str]:
    """The token and result queues of a group or batch node."""
    base = f"{client.names.prefix}ojs.workflow.{workflow_id}.{path}"
    return f"{base}.tokens", f"{base}.results"


def _leaf_key(job_id: str) -> str:
    return f"ojs.workflow/{job_id}"


def _tokens_key(wf: str, path: str) -> str:
    return f"{wf}/{path}/tokens"


def workflow_queues(prefix: str, envelope: Mapping[str, Any]) -> list[str]:
    """Every queue a workflow may declare (fan-in tokens and records, idempotency locks),
    by name: they expire on their own; this lists them for an operator or a test to delete."""
    wf = envelope["id"]
    out: list[str] = []

    def lock(key: str) -> str:
        return lock_queue(prefix, key, WORKFLOW_EXPIRES_MS)

    def fan_in(path: str) -> None:
        base = f"{prefix}ojs.workflow.{wf}.{path}"
        out.extend([f"{base}.tokens", f"{base}.results", f"{base}.lock", lock(_tokens_key(wf, path))])

    def walk(node: Mapping[str, Any], path: str) -> None:
        kind = node.get("type")
        if kind == "chain":
            for i, child in enumerate(node["steps"]):
                walk(child, f"{path}.{i}")
        elif kind in ("group", "batch"):
            fan_in(path)
            for i, child in enumerate(node["jobs"]):
                walk(child, f"{path}.{i}")
            if kind == "batch":
                fan_in(f"{path}.cb")
                for name in node["callbacks"]:
                    out.append(lock(_leaf_key(job_id_for(wf, f"{path}.{name}"))))
        else:
            out.append(lock(_leaf_key(job_id_for(wf, path))))

    walk(envelope, "r")
    out += [journal_queue(prefix, wf), cancel_queue(prefix, wf)]
    return out


def cancel_queue(prefix: str, workflow_id: str) -> str:
    """Holds one message once the workflow was cancelled (declared empty at its start)."""
    return f"{prefix}ojs.workflow.{workflow_id}.cancelled"


async def _is_cancelled(client: Client, wf: str) -> bool:
    try:
        info = await (await client.channel()).queue_declare(
            cancel_queue(client.names.prefix, wf), passive=True
        )
    except amqp.NotFound:  # expired (or started by an older version): not cancelled
        return False
    return info.message_count > 0


def journal_queue(prefix: str, workflow_id: str) -> str:
    """The workflow's journal: its envelope, then one record per job's final outcome."""
    return f"{prefix}ojs.workflow.{workflow_id}.journal"


async def _journal(client: Client, wf: str, path: Any, outcome: Outcome) -> None:
    """Record a job's final outcome for inspection (a side channel: a refusal is logged)."""
    ok, value = outcome
    body = _encoder.encode({"path": path, "ok": ok, "error": None if ok else value})
    props = amqp.BasicProperties(delivery_mode=2, type="ojs.workflow.record")
    try:
        await (await client.channel()).publish(
            body,
            exchange="",
            routing_key=journal_queue(client.names.prefix, wf),
            properties=props,
            mandatory=True,
        )
    except (amqp.PublishNackedError, amqp.UnroutableError) as exc:
        log.warning(
            "workflow %s: the journal record of %s was refused (%s); inspection misses it", wf, path, exc
        )


def _queue_arguments(max_length: int) -> dict[str, Any]:
    return {"x-expires": WORKFLOW_EXPIRES_MS, "x-max-length": max_length, "x-overflow": "reject-publish"}


# ------------------------------------------------------------------ starting


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
    if _leaves(workflow) > MAX_WORKFLOW_JOBS:
        raise ArgumentTypeError(f"workflow {workflow.id} holds more than {MAX_WORKFLOW_JOBS} jobs")
    envelope = workflow.to_dict()
    kind: Literal["chain", "group", "batch"] = envelope["type"]
    # The client's first pushes cannot be repeats (the workflow id is new): they go out
    # together, unclaimed, with pipelined confirms.
    journal = journal_queue(client.names.prefix, workflow.id)
    ch = await client.channel()
    await ch.queue_declare(journal, durable=True, arguments=_queue_arguments(2 * _leaves(workflow) + 64))
    await ch.queue_declare(
        cancel_queue(client.names.prefix, workflow.id), durable=True, arguments=_queue_arguments(1)
    )
    props = amqp.BasicProperties(delivery_mode=2, type="ojs.workflow.envelope")
    await ch.publish(
        _encoder.encode(envelope), exchange="", routing_key=journal, properties=props, mandatory=True
    )
    first: list[Job] = []
    await _start(client, workflow.id, envelope, "r", {}, None, first=first)
    for pushed in await client.push_batch(first):
        if pushed.error is not None:
            raise pushed.error
    return WorkflowHandle(workflow.id, kind, envelope, tuple(job.id for job in first))


async def _start(
    client: Client,
    wf: str,
    node: dict[str, Any],
    path: str,
    parent_results: dict[str, Any],
    then: dict[str, Any] | None,
    *,
    first: list[Job] | None = None,
) -> None:
    """Push what starts ``node`` (a job envelope, or a nested workflow).

    From a worker, every push is claimed under the job's deterministic id, so starting
    twice pushes once; the client's first start collects its jobs in ``first`` instead."""
    kind = node.get("type")
    if kind == "chain":
        cont = {
            "kind": "chain",
            "path": path,
            "steps": node["steps"],
            "index": 0,
            "results": {},
            "then": then,
        }
        await _start(client, wf, node["steps"][0], f"{path}.0", parent_results, cont, first=first)
        return
    if kind in ("group", "batch"):
        jobs = node["jobs"]
        tokens, results = fan_in_queues(client, wf, path)
        await _fill(client, wf, path, len(jobs), tokens, results, claim=first is None)
        fan_in = {
            "kind": "fan_in", "path": path, "n": len(jobs), "tokens": tokens, "results": results,
            "callbacks": node.get("callbacks") if kind == "batch" else None, "then": then,
        }  # fmt: skip
        for i, child in enumerate(jobs):
            await _start(
                client, wf, child, f"{path}.{i}", parent_results, {**fan_in, "index": i}, first=first
            )
        return
    job = _build_leaf(client, wf, node, path, parent_results, then)
    if first is not None:
        first.append(job)
        return
    try:
        await client.push_job(
            job, idempotency_key=_leaf_key(job.id), idempotency_window=WORKFLOW_EXPIRES_MS / 1000
        )
    except DuplicateJobError:
        log.info("workflow %s: job %s (%s) was pushed already; not again", wf, job.id, path)


async def _fill(
    client: Client, wf: str, path: str, n: int, tokens: str, results: str, *, claim: bool
) -> None:
    """Declare a fan-in's queues and put its N tokens in (once: a started node is claimed)."""
    ch = await client.channel()
    await ch.queue_declare(tokens, durable=True, arguments=_queue_arguments(n))
    await ch.queue_declare(results, durable=True, arguments=_queue_arguments(2 * n + 16))
    lock = _lock_name(tokens)
    await ch.queue_declare(lock, durable=True, arguments=_queue_arguments(1))
    if claim:
        # A worker starting a nested group: a repeat of the step (after a crash) must not
        # put tokens back that finished jobs already took.
        key = _tokens_key(wf, path)
        window = WORKFLOW_EXPIRES_MS
        try:
            await claim_key(
                client.conn,
                lock_queue(client.names.prefix, key, window),
                window,
                key=key,
                job_id=wf,
                queue="",
            )
        except DuplicateJobError:
            return
    props = amqp.BasicProperties(delivery_mode=2, type="ojs.workflow.token")
    try:
        await ch.publish(b"", exchange="", routing_key=lock, properties=props, mandatory=True)
    except amqp.PublishNackedError:  # already there (x-max-length 1): a repeat
        pass
    for _ in range(n):
        try:
            await ch.publish(b"", exchange="", routing_key=tokens, properties=props, mandatory=True)
        except amqp.PublishNackedError:  # already full (x-max-length N): a repeat
            break


def _build_leaf(
    client: Client,
    wf: str,
    node: dict[str, Any],
    path: str,
    parent_results: dict[str, Any],
    then: dict[str, Any] | None,
) -> Job:
    options = node.get("options") or {}
    retry = options.get("retry")
    job_id = job_id_for(wf, path)
    place = {"id": wf, "path": path, "parent_results": parent_results, "then": then}
    return client.build(
        node["type"],
        node.get("args", []),
        queue=options.get("queue", "default"),
        priority=options.get("priority"),
        timeout=options.get("timeout"),
        retry=None if retry is None else msgspec.convert(retry, RetryPolicy),
        meta={WORKFLOW_META_KEY: place},
        id=job_id,
    )


# ------------------------------------------------------------------ progress


Outcome = tuple[bool, Any]  # (succeeded, the result or the error object)


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

    async def _done(self, place: dict[str, Any], outcome: Outcome) -> None:
        await _journal(self.client, place["id"], place.get("path"), outcome)
        await advance(self.client, place["id"], place.get("then"), outcome)


async def advance(client: Client, wf: str, then: dict[str, Any] | None, outcome: Outcome) -> None:
    """A node of workflow ``wf`` finished with ``outcome``: do its continuation ``then``."""
    if then is None:
        return  # the workflow's root is done
    if await _is_cancelled(client, wf):
        log.info("workflow %s was cancelled: nothing more is pushed", wf)
        return
    if then["kind"] == "chain":
        await _chain_next(client, wf, then, outcome)
    else:
        await _fan_in(client, wf, then, outcome)


async def _chain_next(client: Client, wf: str, then: dict[str, Any], outcome: Outcome) -> None:
    ok, value = outcome
    index, steps = then["index"], then["steps"]
    if not ok:  # a chain stops (OJS workflows §9.2): the failure goes up
        await advance(client, wf, then["then"], outcome)
        return
    results = {**then["results"], str(index): value}
    if index + 1 == len(steps):
        await advance(client, wf, then["then"], (True, value))
        return
    cont = {**then, "index": index + 1, "results": results}
    await _start(client, wf, steps[index + 1], f"{then['path']}.{index + 1}", results, cont)


async def _fan_in(client: Client, wf: str, then: dict[str, Any], outcome: Outcome) -> None:
    """Record this job's outcome, take a token; the one that empties the queue fires."""
    ok, value = outcome
    record = _encoder.encode({"index": then["index"], "ok": ok, "value": value})
    props = amqp.BasicProperties(delivery_mode=2, type="ojs.workflow.result")
    async with client.conn.channel(confirms=True) as ch:
        await ch.publish(record, exchange="", routing_key=then["results"], properties=props, mandatory=True)
        token = await ch.get(then["tokens"])
        if token is not None and token.message_count > 0:
            await token.ack()
            return
        # The queue is empty after this take: every other job took its token, so every
        # other job published its record first, unless a repeat took a second token.  Read
        # the records under the fan-in's lock (one reader at a time sees them all).
        lock = await _acquire(ch, _lock_name(then["tokens"]))
        try:
            records = await _read_records(ch, then["results"], then["n"])
            if records is not None:
                await _fire(client, wf, then, records)
            # else: a job has not recorded yet; it will find the queue empty and fire.
        finally:
            with anyio.CancelScope(shield=True):
                await lock.nack(requeue=True)  # released (a crash releases it too)
        if token is not None:
            await token.ack()


async def _acquire(ch: amqp.Channel, lock: str) -> amqp.IncomingMessage:
    """Take the fan-in's one lock message (``basic.get``), waiting while another holds it."""
    with anyio.move_on_after(FAN_IN_LOCK_WAIT):
        while True:
            msg = await ch.get(lock)
            if msg is not None:
                return msg
            await anyio.sleep(random.uniform(0.002, 0.02))  # held: its holder reads N records
    raise FanInBusyError(f"the fan-in lock {lock} stayed taken for {FAN_IN_LOCK_WAIT:g} s")


async def _read_records(ch: amqp.Channel, queue: str, n: int) -> dict[int, tuple[bool, Any]] | None:
    """All N records of a fan-in (read, then put back for inspection), or None when some are
    missing: a job has not recorded yet (it will fire).  Called under the fan-in's lock."""
    held: list[amqp.IncomingMessage] = []
    found: dict[int, tuple[bool, Any]] = {}
    try:
        while len(held) < 4 * n + 64:
            msg = await ch.get(queue)
            if msg is None:
                break
            held.append(msg)
            data = _decoder.decode(msg.body)
            found.setdefault(int(data["index"]), (bool(data["ok"]), data.get("value")))
    finally:
        with anyio.CancelScope(shield=True):
            for msg in held:  # one by one: ``multiple`` would put the caller's token back too
                await msg.nack(requeue=True)
    return found if len(found) >= n else None


async def _fire(client: Client, wf: str, then: dict[str, Any], records: dict[int, tuple[bool, Any]]) -> None:
    n = then["n"]
    all_ok = all(records[i][0] for i in range(n))
    values = {str(i): records[i][1] if records[i][0] else None for i in range(n)}
    callbacks = then.get("callbacks")
    path = then["path"]
    if not callbacks:  # a group: its outcome goes up
        errors = [records[i][1] for i in range(n) if not records[i][0]]
        await advance(client, wf, then["then"], (True, values) if all_ok else (False, {"errors": errors}))
        return
    fired = {
        name: cb for name, cb in callbacks.items()
        if name == "on_complete" or (name == "on_success") == all_ok
    }  # fmt: skip
    names = sorted(fired)
    if then["then"] is None:  # nothing waits for the batch: the callbacks end the workflow
        for name in names:
            await _start(client, wf, fired[name], f"{path}.{name}", values, None)
        return
    if not names:  # none triggered (§8.3: the batch is done)
        await advance(client, wf, then["then"], (True, values))
        return
    # A nested batch is done once its callbacks are (§6.4.7): they fan in to its continuation.
    cb_tokens, cb_results = fan_in_queues(client, wf, f"{path}.cb")
    await _fill(client, wf, f"{path}.cb", len(names), cb_tokens, cb_results, claim=True)
    cb_fan_in = {
        "kind": "fan_in", "path": f"{path}.cb", "n": len(names), "tokens": cb_tokens, "results": cb_results,
        "callbacks": None, "then": then["then"],
    }  # fmt: skip
    for i, name in enumerate(names):
        await _start(client, wf, fired[name], f"{path}.{name}", values, {**cb_fan_in, "index": i})


# ------------------------------------------------------------------ inspection


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


# ------------------------------------------------------------------ cancel


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
