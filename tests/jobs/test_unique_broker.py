"""The envelope's ``unique`` policy, enforced with the broker's lock queues (jobs/_unique.py):
reject and ignore within the period, concurrent pushes, the fingerprint's dimensions.
RabbitMQ and memory://, asyncio and Trio."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import pytest

import ojs_anyio as ojs
from ojs_anyio.jobs._dedup import lock_queue
from ojs_anyio.jobs._unique import KEY_PREFIX, fingerprint

pytestmark = pytest.mark.anyio


def _job(q: str, args: list[Any], policy: ojs.UniquePolicy, **options: Any) -> ojs.Job:
    return ojs.new_job("report.build", args, queue=q, unique=policy, **options)


def _lock(job: ojs.Job) -> str:
    return lock_queue("", KEY_PREFIX + fingerprint(job))


async def test_reject_within_the_period_and_concurrent_pushes_one_wins(
    client: ojs.Client, q: str, cleanup: Any
) -> None:
    policy = ojs.UniquePolicy(keys=("queue", "args"), period="PT1H")
    tag = uuid.uuid4().hex
    first = _job(q, [tag], policy)
    cleanup.queue(_lock(first))
    pushed = await client.push_job(first)
    with pytest.raises(ojs.DuplicateJobError) as caught:
        await client.push_job(_job(q, [tag], policy))
    assert caught.value.code == "DUPLICATE" and caught.value.key.startswith("unique:")
    assert pushed.state == "available"
    # other arguments: another fingerprint
    other = _job(q, [tag, 2], policy)
    cleanup.queue(_lock(other))
    await client.push_job(other)
    results: list[str] = []
    racer = _job(q, [tag, 3], policy)
    cleanup.queue(_lock(racer))

    async def push() -> None:
        try:
            await client.push_job(_job(q, [tag, 3], policy))
            results.append("ok")
        except ojs.DuplicateJobError:
            results.append("duplicate")

    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(push)
    assert sorted(results) == ["duplicate"] * 4 + ["ok"]


async def test_ignore_returns_the_existing_job_even_to_concurrent_pushes(
    client: ojs.Client, raw: Any, q: str, cleanup: Any
) -> None:
    policy = ojs.UniquePolicy(keys=("args",), period="PT1H", on_conflict="ignore")
    tag = uuid.uuid4().hex
    first = _job(q, [tag], policy)
    cleanup.queue(_lock(first))
    cleanup.queue(_lock(first) + ".holder")
    await client.declare_queue(q)
    returned: list[str] = []

    async def push() -> None:
        returned.append((await client.push_job(_job(q, [tag], policy))).id)

    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(push)
    again = await client.push_job(_job(q, [tag], policy))
    async with raw.channel(confirms=False) as ch:
        queued = (await ch.queue_declare(client.names.job_queue(q), passive=True)).message_count
    assert queued == 1 and len(set(returned)) == 1 and again.id == returned[0]


def test_the_fingerprint_follows_the_spec() -> None:
    """Type always; keys select the other dimensions; object keys sorted, strings in NFC."""
    base = ojs.UniquePolicy(keys=("args",), period="PT1M")
    a = ojs.new_job("t.x", [{"b": 1, "a": "é"}], queue="q1", unique=base)
    b = ojs.new_job("t.x", [{"a": "e\u0301", "b": 1}], queue="q2", unique=base)  # NFD, reordered
    assert fingerprint(a) == fingerprint(b)  # queue not in keys
    with_queue = ojs.UniquePolicy(keys=("args", "queue"), period="PT1M")
    assert fingerprint(ojs.new_job("t.x", [1], queue="q1", unique=with_queue)) != fingerprint(
        ojs.new_job("t.x", [1], queue="q2", unique=with_queue)
    )
    assert fingerprint(ojs.new_job("t.x", [1], queue="q1", unique=base)) != fingerprint(
        ojs.new_job("t.y", [1], queue="q1", unique=base)
    )
    by_key = ojs.UniquePolicy(keys=("args",), args_keys=("order",), period="PT1M")
    assert fingerprint(
        ojs.new_job("t.x", [{"order": 7, "note": "a"}], queue="q", unique=by_key)
    ) == fingerprint(ojs.new_job("t.x", [{"order": 7, "note": "b"}], queue="q", unique=by_key))
    with pytest.raises(ojs.UsageError, match="lack"):
        fingerprint(ojs.new_job("t.x", [{"note": "a"}], queue="q", unique=by_key))
