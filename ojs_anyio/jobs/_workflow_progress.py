"""How a workflow moves on (``docs/workflows.md``): what starts a node, and what a finished
node does next, with each successor pushed exactly once per workflow.

* **Starting a node** (:func:`start_node`) is pure: it collects into :class:`Effects` the
  jobs to push and the guard queues to create (a group's tokens and lock, a chain step's
  permit).  The client's start publishes them with confirms; a worker publishes them in one
  AMQP transaction with the guard it holds.
* **A guard** is a single message taken with ``basic.get`` on a transactional channel: a
  chain step's *permit* (``free``/``used``), a fan-in's *lock* (``free``/``fired``).  Whoever
  takes a free one publishes the successor's jobs, a ``used`` (``fired``) replacement and
  the ack of the taken one in **one commit**: a process that dies before the commit gives
  the guard back with its channel, with nothing of the successor published; after it, the
  guard says so to every repeat.
* **Fan-in** of a group or batch (:func:`fan_in`): the finished job commits its record, then
  takes a token; whoever finds the token queue empty takes the lock, reads the records, and
  fires only when all N are there.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import anyio
import msgspec

from .. import amqp
from ._context import WORKFLOW_META_KEY
from ._envelope import Job
from ._push import enqueued_message
from ._retry import RetryPolicy
from ._route import route
from ._workflow_model import (
    FAN_IN_LOCK_WAIT,
    Client,
    FanInBusyError,
    cancel_queue,
    entity_arguments,
    fan_in_queues,
    job_id_for,
    journal_queue,
    permit_queue,
)

__all__ = ["Effects", "Flow", "Outcome", "advance", "finish", "is_cancelled", "record", "start_node"]

log = logging.getLogger("ojs_anyio.workflows")

Outcome = tuple[bool, Any]  # (succeeded, the result or the error object)

FREE: Final = b"free"
#: A guard whose successor was pushed (a permit ``used``, a lock ``fired``).
SPENT: Final = b"spent"

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()
_GUARD = amqp.BasicProperties(delivery_mode=2, type="ojs.workflow.guard")
_TOKEN = amqp.BasicProperties(delivery_mode=2, type="ojs.workflow.token")
_RECORD = amqp.BasicProperties(delivery_mode=2, type="ojs.workflow.result")

#: A test hook: awaited with a point's name: ``"fire"`` (a guard taken, the successor's
#: messages published in the transaction, not committed yet) and ``"fired"`` (committed,
#: the job not acknowledged yet).  None in production.
crash_point: Any = None


@dataclass(frozen=True, slots=True)
class Flow:
    """One workflow, as seen from a process moving it on."""

    client: Client
    wf: str
    #: Whether its guard and fan-in queues are quorum queues (its job queues are).
    quorum: bool = False


@dataclass(slots=True)
class Effects:
    """What one step of progress publishes: jobs, and guard queues with their messages."""

    jobs: list[Job] = field(default_factory=list)
    #: queue name -> declare arguments
    queues: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: (queue, body, properties) published to the default exchange
    messages: list[tuple[str, bytes, amqp.BasicProperties]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.jobs or self.messages)


# ------------------------------------------------------------------ starting a node


def start_node(
    flow: Flow,
    node: dict[str, Any],
    path: str,
    parent_results: dict[str, Any],
    then: dict[str, Any] | None,
    *,
    effects: Effects,
) -> None:
    """Collect in ``effects`` what starts ``node`` (a job envelope, or a nested workflow)."""
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
        start_node(flow, node["steps"][0], f"{path}.0", parent_results, cont, effects=effects)
        return
    if kind in ("group", "batch"):
        jobs = node["jobs"]
        tokens, results, _ = fan_in_queues(flow.client.names.prefix, flow.wf, path)
        _fill(flow, path, len(jobs), effects)
        fan_in_cont = {
            "kind": "fan_in", "path": path, "n": len(jobs), "tokens": tokens, "results": results,
            "callbacks": node.get("callbacks") if kind == "batch" else None, "then": then,
        }  # fmt: skip
        for i, child in enumerate(jobs):
            cont_i = {**fan_in_cont, "index": i}
            start_node(flow, child, f"{path}.{i}", parent_results, cont_i, effects=effects)
        return
    if then is not None and then["kind"] == "chain":  # its successor is pushed under a permit
        permit = permit_queue(flow.client.names.prefix, flow.wf, path)
        effects.queues[permit] = entity_arguments(None, quorum=flow.quorum)
        effects.messages.append((permit, FREE, _GUARD))
    effects.jobs.append(_build_leaf(flow, node, path, parent_results, then))


def _fill(flow: Flow, path: str, n: int, effects: Effects) -> None:
    """A fan-in's queues, its N tokens and its free lock."""
    tokens, results, lock = fan_in_queues(flow.client.names.prefix, flow.wf, path)
    effects.queues[tokens] = entity_arguments(n, quorum=flow.quorum)
    effects.queues[results] = entity_arguments(4 * n + 64, quorum=flow.quorum)
    effects.queues[lock] = entity_arguments(None, quorum=flow.quorum)
    effects.messages.append((lock, FREE, _GUARD))
    effects.messages.extend((tokens, b"", _TOKEN) for _ in range(n))


def _build_leaf(
    flow: Flow, node: dict[str, Any], path: str, parent_results: dict[str, Any], then: dict[str, Any] | None
) -> Job:
    options = node.get("options") or {}
    retry = options.get("retry")
    place: dict[str, Any] = {"id": flow.wf, "path": path, "parent_results": parent_results, "then": then}
    if flow.quorum:
        place["quorum"] = True
    return flow.client.build(
        node["type"],
        node.get("args", []),
        queue=options.get("queue", "default"),
        priority=options.get("priority"),
        timeout=options.get("timeout"),
        retry=None if retry is None else msgspec.convert(retry, RetryPolicy),
        meta={WORKFLOW_META_KEY: place},
        id=job_id_for(flow.wf, path),
    )


async def _publish_in(flow: Flow, ch: amqp.Channel, effects: Effects) -> None:
    """Publish ``effects`` on transactional channel ``ch`` (the caller commits)."""
    for name, args in effects.queues.items():
        await ch.queue_declare(name, durable=True, arguments=args)
    for queue in {job.queue for job in effects.jobs}:
        await flow.client.declare_queue(queue)
    for queue, body, props in effects.messages:
        await ch.publish(body, exchange="", routing_key=queue, properties=props)
    now = datetime.now(UTC)
    for job in effects.jobs:
        found = route(job, now, "levels", flow.client.names)
        _pushed, props, body = enqueued_message(job, found, now, trace_headers=None)
        await ch.publish(body, exchange=found.exchange, routing_key=found.routing_key, properties=props)


# ------------------------------------------------------------------ a node finished


async def finish(flow: Flow, path: str, then: dict[str, Any] | None, outcome: Outcome) -> None:
    """Leaf ``path`` of the workflow finished with ``outcome``: move the workflow on."""
    if then is None:
        return  # the workflow's root is done
    if await is_cancelled(flow):
        log.info("workflow %s was cancelled: nothing more is pushed", flow.wf)
        return
    effects = Effects()
    await advance(flow, then, outcome, effects)
    if effects:  # a chain's next step: pushed under this step's permit
        await _guarded(flow, permit_queue(flow.client.names.prefix, flow.wf, path), effects)


async def advance(flow: Flow, then: dict[str, Any] | None, outcome: Outcome, effects: Effects) -> None:
    """A node finished with ``outcome``: collect its successor in ``effects``, or, when it
    is one of a fan-in's N, record it there (at once, on its own channel)."""
    if then is None:
        return
    ok, value = outcome
    if then["kind"] != "chain":
        await fan_in(flow, then, outcome)
        return
    index, steps = then["index"], then["steps"]
    if not ok:  # a chain stops (OJS workflows §9.2): the failure goes up
        await advance(flow, then["then"], outcome, effects)
        return
    if index + 1 == len(steps):
        await advance(flow, then["then"], (True, value), effects)
        return
    results = {**then["results"], str(index): value}
    cont = {**then, "index": index + 1, "results": results}
    start_node(flow, steps[index + 1], f"{then['path']}.{index + 1}", results, cont, effects=effects)


async def _guarded(flow: Flow, guard: str, effects: Effects) -> None:
    """Publish ``effects`` once per workflow, under the one message of queue ``guard``."""
    async with flow.client.conn.channel(confirms=False) as ch:
        await ch.tx_select()
        taken = await _acquire(ch, guard)
        fired = taken.body != SPENT
        if fired:
            await _publish_in(flow, ch, effects)
            await _spend(ch, guard, taken)
        else:  # a repeat: the successor was pushed
            await taken.nack(requeue=True)
        await ch.tx_commit()
    if fired and crash_point is not None:
        await crash_point("fired")


async def _spend(ch: amqp.Channel, guard: str, taken: amqp.IncomingMessage) -> None:
    if crash_point is not None:
        await crash_point("fire")
    await ch.publish(SPENT, exchange="", routing_key=guard, properties=_GUARD)
    await taken.ack()


async def _acquire(ch: amqp.Channel, queue: str) -> amqp.IncomingMessage:
    """Take a guard's one message (``basic.get``), waiting while another attempt holds it."""
    with anyio.move_on_after(FAN_IN_LOCK_WAIT):
        while True:
            msg = await ch.get(queue)
            if msg is not None:
                return msg
            await anyio.sleep(random.uniform(0.002, 0.02))  # held: its holder commits soon
    raise FanInBusyError(f"the workflow guard {queue} stayed taken for {FAN_IN_LOCK_WAIT:g} s")


# ------------------------------------------------------------------ fan-in


async def fan_in(flow: Flow, then: dict[str, Any], outcome: Outcome) -> None:
    """Record this job's outcome, take a token; the one that empties the queue fires."""
    ok, value = outcome
    body = _encoder.encode({"index": then["index"], "ok": ok, "value": value})
    lock = fan_in_queues(flow.client.names.prefix, flow.wf, then["path"])[2]
    async with flow.client.conn.channel(confirms=False) as ch:
        await ch.tx_select()
        await ch.publish(body, exchange="", routing_key=then["results"], properties=_RECORD)
        await ch.tx_commit()  # the record is in its queue before the token is taken
        token = await ch.get(then["tokens"])
        fired = False
        if token is None or token.message_count == 0:
            # The queue is empty after this take: every other job took its token, so every
            # other job recorded first, unless a repeat took a second token.  Under the lock,
            # fold the records that came since the last reader into the lock's own state.
            taken = await _acquire(ch, lock)
            if taken.body == SPENT:  # fired already (this is a repeat)
                await taken.nack(requeue=True)
            else:
                records = await _fold_records(ch, then["results"], then["n"], _lock_state(taken.body))
                if len(records) < then["n"]:  # a job has not recorded yet: it will come here
                    await ch.publish(_encode_state(records), exchange="", routing_key=lock, properties=_GUARD)
                    await taken.ack()
                else:
                    effects = Effects()
                    await _fire(flow, then, records, effects)
                    await _publish_in(flow, ch, effects)
                    await _spend(ch, lock, taken)
                    fired = True
        if token is not None:
            await token.ack()
        await ch.tx_commit()
    if fired and crash_point is not None:
        await crash_point("fired")


def _lock_state(body: bytes) -> dict[int, tuple[bool, Any]]:
    """The records a fan-in's free lock carries (folded in by earlier readers)."""
    if body == FREE or not body:
        return {}
    return {int(k): (bool(v[0]), v[1]) for k, v in _decoder.decode(body)["records"].items()}


def _encode_state(records: dict[int, tuple[bool, Any]]) -> bytes:
    return _encoder.encode({"records": {str(k): [ok, value] for k, (ok, value) in records.items()}})


async def _fold_records(
    ch: amqp.Channel, queue: str, n: int, found: dict[int, tuple[bool, Any]]
) -> dict[int, tuple[bool, Any]]:
    """``found`` with the records now in the fan-in's record queue added (a repeat's record
    of an index counts once).  Each is taken and acked: the acks, like the lock's new state,
    wait for the caller's commit, so a crash before it puts them all back."""
    for _ in range(4 * n + 64):
        msg = await ch.get(queue)
        if msg is None:
            break
        data = _decoder.decode(msg.body)
        found.setdefault(int(data["index"]), (bool(data["ok"]), data.get("value")))
        await msg.ack()
    return found


async def _fire(
    flow: Flow, then: dict[str, Any], records: dict[int, tuple[bool, Any]], effects: Effects
) -> None:
    n = then["n"]
    all_ok = all(records[i][0] for i in range(n))
    values = {str(i): records[i][1] if records[i][0] else None for i in range(n)}
    callbacks = then.get("callbacks")
    path = then["path"]
    if await is_cancelled(flow):
        return  # nothing more is pushed (the lock is spent all the same)
    if not callbacks:  # a group: its outcome goes up
        errors = [records[i][1] for i in range(n) if not records[i][0]]
        await advance(flow, then["then"], (True, values) if all_ok else (False, {"errors": errors}), effects)
        return
    fired = {
        name: cb for name, cb in callbacks.items()
        if name == "on_complete" or (name == "on_success") == all_ok
    }  # fmt: skip
    names = sorted(fired)
    if then["then"] is None:  # nothing waits for the batch: the callbacks end the workflow
        for name in names:
            start_node(flow, fired[name], f"{path}.{name}", values, None, effects=effects)
        return
    if not names:  # none triggered (§8.3: the batch is done)
        await advance(flow, then["then"], (True, values), effects)
        return
    # A nested batch is done once its callbacks are (§6.4.7): they fan in to its continuation.
    cb_path = f"{path}.cb"
    cb_tokens, cb_results, _ = fan_in_queues(flow.client.names.prefix, flow.wf, cb_path)
    _fill(flow, cb_path, len(names), effects)
    cb_fan_in = {
        "kind": "fan_in", "path": cb_path, "n": len(names), "tokens": cb_tokens, "results": cb_results,
        "callbacks": None, "then": then["then"],
    }  # fmt: skip
    for i, name in enumerate(names):
        start_node(flow, fired[name], f"{path}.{name}", values, {**cb_fan_in, "index": i}, effects=effects)


# ------------------------------------------------------------------ journal and cancel mark


async def is_cancelled(flow: Flow) -> bool:
    client = flow.client
    try:
        info = await (await client.channel()).queue_declare(
            cancel_queue(client.names.prefix, flow.wf), passive=True
        )
    except amqp.NotFound:  # expired (or started by an older version): not cancelled
        return False
    return info.message_count > 0


async def record(flow: Flow, path: Any, outcome: Outcome) -> None:
    """Record a job's final outcome for inspection (a side channel: a refusal is logged)."""
    client = flow.client
    ok, value = outcome
    body = _encoder.encode({"path": path, "ok": ok, "error": None if ok else value})
    props = amqp.BasicProperties(delivery_mode=2, type="ojs.workflow.record")
    try:
        await (await client.channel()).publish(
            body, exchange="", routing_key=journal_queue(client.names.prefix, flow.wf), properties=props,
            mandatory=True,
        )  # fmt: skip
    except (amqp.PublishNackedError, amqp.UnroutableError) as exc:
        log.warning(
            "workflow %s: the journal record of %s was refused (%s); inspection misses it", flow.wf, path, exc
        )
