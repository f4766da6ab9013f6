"""Workflow descriptions and names (``docs/workflows.md``): the values a workflow is built
from (:class:`Step`, :class:`Chain`, :class:`Group`, :class:`Batch`), the OJS workflow
envelope they become (``to_dict``) and come back from (:func:`workflow_from_dict`), the
deterministic job ids of its nodes, and the names and arguments of its broker entities.
No I/O."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import msgspec

from .. import amqp
from .._common import new_id
from ._envelope import Job
from ._errors import ArgumentTypeError
from ._retry import RetryPolicy
from ._topology import Names, QueueOptions

__all__ = [
    "CANCELLED_CODE",
    "FAN_IN_LOCK_WAIT",
    "MAX_NESTING_DEPTH",
    "MAX_WORKFLOW_JOBS",
    "WORKFLOW_EXPIRES_MS",
    "Batch",
    "Chain",
    "Client",
    "FanInBusyError",
    "Group",
    "Node",
    "Step",
    "Workflow",
    "batch",
    "cancel_queue",
    "chain",
    "entity_arguments",
    "fan_in_queues",
    "group",
    "job_id_for",
    "journal_queue",
    "permit_queue",
    "step",
    "workflow_from_dict",
    "workflow_queues",
]

#: Nesting levels a workflow may have (OJS workflows §10.2 asks for at least 3).
MAX_NESTING_DEPTH: Final = 8
#: Jobs (leaves) one workflow may hold.
MAX_WORKFLOW_JOBS: Final = 100_000
#: How long a workflow's queues outlive their last use (``x-expires``): 7 days.
WORKFLOW_EXPIRES_MS: Final = 7 * 86_400_000
#: The code a workflow job cancelled (running, or before it started) is recorded with.
CANCELLED_CODE: Final = "CANCELLED"
#: How long a job waits for a guard (a fan-in's lock, a chain step's permit) that another
#: attempt holds before it gives up with :class:`FanInBusyError`.
FAN_IN_LOCK_WAIT: Final = 60.0


class FanInBusyError(Exception):
    """A workflow guard (a fan-in's lock, a chain step's permit) stayed taken for
    :data:`FAN_IN_LOCK_WAIT` seconds: the job fails this attempt (retried by its policy;
    the step is tried again then)."""


class _Pushed(Protocol):
    @property
    def error(self) -> Exception | None: ...


class Client(Protocol):
    """What workflows use of a :class:`ojs_anyio.Client` (named so: the client module
    starts workflows, and the workflow modules must not import it back)."""

    names: Names
    conn: amqp.Connection

    async def channel(self) -> amqp.Channel: ...

    async def cancel(self, job_id: str, *, queue: str = ...) -> None: ...

    async def declare_queue(self, queue: str) -> None: ...

    def queue_options(self, queue: str) -> QueueOptions | None: ...

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


def _prefix(prefix: str, wf: str, path: str) -> str:
    return f"{prefix}ojs.workflow.{wf}.{path}"


def fan_in_queues(prefix: str, wf: str, path: str) -> tuple[str, str, str]:
    """The token, record and lock queues of group or batch node ``path``."""
    base = _prefix(prefix, wf, path)
    return f"{base}.tokens", f"{base}.results", f"{base}.lock"


def permit_queue(prefix: str, wf: str, path: str) -> str:
    """The permit of chain step ``path``: one message, ``free`` until the step's successor
    was pushed (in the same transaction), ``used`` after."""
    return _prefix(prefix, wf, path) + ".permit"


def journal_queue(prefix: str, workflow_id: str) -> str:
    """The workflow's journal: its envelope, then one record per job's final outcome."""
    return f"{prefix}ojs.workflow.{workflow_id}.journal"


def cancel_queue(prefix: str, workflow_id: str) -> str:
    """Holds one message once the workflow was cancelled (declared empty at its start)."""
    return f"{prefix}ojs.workflow.{workflow_id}.cancelled"


def entity_arguments(max_length: int | None, *, quorum: bool) -> dict[str, Any]:
    """``Queue.Declare`` arguments of a workflow queue: ``x-expires`` always; a length
    bound with ``reject-publish``; a quorum queue when the workflow's job queues are."""
    args: dict[str, Any] = {"x-expires": WORKFLOW_EXPIRES_MS}
    if max_length is not None:
        args["x-max-length"] = max_length
        args["x-overflow"] = "reject-publish"
    if quorum:
        args["x-queue-type"] = "quorum"
    return args


def workflow_queues(prefix: str, envelope: Mapping[str, Any]) -> list[str]:
    """Every queue a workflow may declare (fan-in tokens, records and locks, chain permits,
    its journal and cancel mark), by name: they expire on their own; this lists them for an
    operator or a test to delete."""
    wf = envelope["id"]
    out: list[str] = []

    def walk(node: Mapping[str, Any], path: str) -> None:
        kind = node.get("type")
        if kind == "chain":
            for i, child in enumerate(node["steps"]):
                walk(child, f"{path}.{i}")
                out.append(permit_queue(prefix, wf, f"{path}.{i}"))
        elif kind in ("group", "batch"):
            out.extend(fan_in_queues(prefix, wf, path))
            for i, child in enumerate(node["jobs"]):
                walk(child, f"{path}.{i}")
            if kind == "batch":
                out.extend(fan_in_queues(prefix, wf, f"{path}.cb"))

    walk(envelope, "r")
    out += [journal_queue(prefix, wf), cancel_queue(prefix, wf)]
    return out
