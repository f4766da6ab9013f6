"""Conformance of the declared topology, checked on the real broker (001 §4, §7, §8.2, §13).

AMQP-001/002 exchanges, 003/004/030 job queues, 029 length limits, 031 names and tenant
prefix, 032 quorum queues.  Broker-side truth comes from redeclares (RabbitMQ answers 406
PRECONDITION_FAILED unless every property and argument is equivalent), passive declares
and ``rabbitmqctl``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest

import ojs_anyio as ojs
from ojs_anyio import amqp

from .broker_support import WAIT, Outcomes, bindings_to, both, current_url, queue_facts, running

pytestmark = pytest.mark.anyio

DIRECT, DLX, RETRY = "ojs.exchange.direct", "ojs.exchange.dlx", "ojs.exchange.retry"


def default_args(q: str) -> dict[str, Any]:
    """The job queue's arguments of 001 §15.1 / DECISIONS 12, exactly."""
    return {"x-dead-letter-exchange": DLX, "x-dead-letter-routing-key": q, "x-max-priority": 10}


async def expect_406(conn: amqp.Connection, op: Callable[[amqp.Channel], Any]) -> amqp.PreconditionFailed:
    """Run ``op`` on a fresh channel (a 406 closes it) and return the PRECONDITION_FAILED."""
    with anyio.fail_after(WAIT):
        async with conn.channel(confirms=False) as ch:
            with pytest.raises(amqp.PreconditionFailed) as info:
                await op(ch)
    return info.value


# -------------------------------------------------------------------- AMQP-001 / 002


async def test_amqp_001_002_exchanges_are_durable_direct(
    client: ojs.Client, raw: amqp.Connection, q: str
) -> None:
    """AMQP-001 (ojs.exchange.direct) and AMQP-002 (ojs.exchange.dlx) are durable direct
    exchanges; the retry exchange (001 §8.1) too."""
    with anyio.fail_after(WAIT):
        await client.declare_queue(q)
        async with raw.channel(confirms=False) as ch:
            for name in (DIRECT, DLX, RETRY):
                await ch.exchange_declare(name, "direct", passive=True)
                # A non-passive redeclare succeeds only if type, durable, auto_delete,
                # internal and arguments are all equivalent.
                await ch.exchange_declare(name, "direct", durable=True)
    for name in (DIRECT, DLX, RETRY):
        err = await expect_406(raw, lambda ch, n=name: ch.exchange_declare(n, "fanout", durable=True))
        assert "inequivalent arg 'type'" in err.reply_text
        err = await expect_406(raw, lambda ch, n=name: ch.exchange_declare(n, "direct", durable=False))
        assert "durable" in err.reply_text


# ---------------------------------------------------------------- AMQP-003 / 004 / 030


async def test_amqp_003_004_030_job_queue_properties_and_exact_arguments(
    client: ojs.Client, raw: amqp.Connection, q: str
) -> None:
    """AMQP-003: durable, not exclusive, not auto-delete.  AMQP-004: x-dead-letter-exchange
    (and -routing-key).  AMQP-030: x-max-priority 10.  Nothing else by default."""
    names = client.names
    with anyio.fail_after(WAIT):
        await client.declare_queue(q)
        all_facts, bindings = await both(
            queue_facts(names.job_queue(q), names.dlx_queue(q)),
            bindings_to(names.job_queue(q), names.dlx_queue(q)),
        )
    facts = all_facts[names.job_queue(q)]
    assert facts["durable"] is True
    assert facts["auto_delete"] is False
    assert facts["exclusive"] is False
    assert facts["type"] == "classic"
    assert facts["arguments"] == default_args(q)

    # Equivalence with exactly those arguments, by raw AMQP: succeeds.
    with anyio.fail_after(WAIT):
        async with raw.channel(confirms=False) as ch:
            info = await ch.queue_declare(
                names.job_queue(q),
                durable=True,
                exclusive=False,
                auto_delete=False,
                arguments=default_args(q),
            )
            assert info.message_count == 0
    # ... and its binding: ojs.exchange.direct, routing key = queue name (001 §4.2).
    assert bindings == {names.job_queue(q): {(DIRECT, q)}, names.dlx_queue(q): {(DLX, q)}}

    # Any other argument set: 406.
    other = {**default_args(q), "x-max-priority": 5}
    err = await expect_406(
        raw, lambda ch: ch.queue_declare(names.job_queue(q), durable=True, arguments=other)
    )
    assert "x-max-priority" in err.reply_text
    without_dlx = {"x-max-priority": 10}
    err = await expect_406(
        raw, lambda ch: ch.queue_declare(names.job_queue(q), durable=True, arguments=without_dlx)
    )
    assert "x-dead-letter" in err.reply_text
    err = await expect_406(
        raw, lambda ch: ch.queue_declare(names.job_queue(q), durable=False, arguments=default_args(q))
    )
    assert "durable" in err.reply_text


async def test_topology_conflict_error_names_queue_and_both_argument_sets(
    raw: amqp.Connection, q: str
) -> None:
    """A queue declared elsewhere with other arguments: our declare raises
    TopologyConflictError naming it, with our arguments and the broker's differing value
    (001 §7.3, §10.1: no silent redeclare)."""
    job_queue = ojs.Names().job_queue(q)
    theirs = {**default_args(q), "x-max-priority": 5}
    with anyio.fail_after(WAIT):
        async with raw.channel(confirms=False) as ch:
            await ch.queue_declare(job_queue, durable=True, arguments=theirs)
        async with ojs.connect(current_url()) as client:
            with pytest.raises(ojs.TopologyConflictError) as info:
                await client.declare_queue(q)
            err = info.value
            assert err.queue == job_queue
            assert err.ours == default_args(q)
            text = str(err)
            assert repr(job_queue) in text
            assert repr(default_args(q)) in text  # our full set
            assert "x-max-priority" in text and "'5'" in text and "'10'" in text  # theirs vs ours
            # The client's channel recovers from the 406: the next call works.
            await client.declare_queue(f"{q}-ok")
    async with raw.channel(confirms=False) as ch:
        for name in (f"ojs.queue.{q}-ok", f"ojs.queue.dlx.{q}-ok"):
            await ch.queue_delete(name)


# ------------------------------------------------------------------------ AMQP-029


async def test_amqp_029_length_limits_and_overflow_are_opt_in(raw: amqp.Connection, q: str) -> None:
    """AMQP-029: x-max-length, x-max-length-bytes, x-overflow (and x-message-ttl) appear
    exactly when asked for through QueueOptions."""
    options = ojs.QueueOptions(
        max_length=100, max_length_bytes=1_000_000, overflow="reject-publish", message_ttl_ms=60_000
    )
    expected = {
        **default_args(q),
        "x-max-length": 100,
        "x-max-length-bytes": 1_000_000,
        "x-overflow": "reject-publish",
        "x-message-ttl": 60_000,
    }
    names = ojs.Names()
    with anyio.fail_after(WAIT):
        async with ojs.connect(current_url(), queue_options={q: options}) as client:
            await client.declare_queue(q)
        facts = await queue_facts(names.job_queue(q))
        async with raw.channel(confirms=False) as ch:
            await ch.queue_declare(names.job_queue(q), durable=True, arguments=expected)
    assert facts[names.job_queue(q)]["arguments"] == expected
    # The defaults alone are no longer equivalent: the limits are really on the queue.
    await expect_406(
        raw, lambda ch: ch.queue_declare(names.job_queue(q), durable=True, arguments=default_args(q))
    )


# ------------------------------------------------------------------------ AMQP-031


async def test_amqp_031_names_with_tenant_prefix(raw: amqp.Connection, new_queue: Callable[..., str]) -> None:
    """AMQP-031: every entity follows 001 §4.1; a tenant prefix "tenant1." prefixes them all
    (tenant1.ojs.queue.X), routing keys stay the bare queue name, and nothing lands in the
    unprefixed entities.  Exercised end to end: push, retry, dead letter."""
    prefix = "tenant1."
    q = new_queue(prefix=prefix)
    names = ojs.Names(prefix)
    assert names.job_queue(q) == f"tenant1.ojs.queue.{q}"
    worker = ojs.Worker(queues=[q], retry=ojs.RetryPolicy(initial_interval="PT0.1S", jitter=False))
    outcomes = Outcomes(worker)
    calls = 0

    @worker.handler("tenant.job")
    async def handler(ctx: ojs.JobContext) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("first attempt fails")
        raise ojs.Discard("then dead-lettered")

    async with ojs.connect(current_url(), prefix=prefix) as client, running(worker, client):
        job = await client.push("tenant.job", [], queue=q)
        final = await outcomes.wait_final(job.id)
        assert final.outcome == "dead_lettered"
        with anyio.fail_after(WAIT):
            facts, bindings = await both(
                queue_facts(
                    names.job_queue(q), names.dlx_queue(q), names.retry_queue(q, 100), f"ojs.queue.{q}"
                ),
                bindings_to(names.job_queue(q), names.dlx_queue(q), names.retry_queue(q, 100)),
            )
            assert set(facts) == {
                f"tenant1.ojs.queue.{q}",
                f"tenant1.ojs.queue.dlx.{q}",
                f"tenant1.ojs.queue.retry.{q}.100",
            }
            assert facts[names.job_queue(q)]["arguments"] == {
                "x-dead-letter-exchange": "tenant1.ojs.exchange.dlx",
                "x-dead-letter-routing-key": q,
                "x-max-priority": 10,
            }
            assert facts[names.retry_queue(q, 100)]["arguments"] == {
                "x-dead-letter-exchange": "tenant1.ojs.exchange.direct",
                "x-dead-letter-routing-key": q,
                "x-message-ttl": 100,
            }
            assert bindings == {
                names.job_queue(q): {("tenant1.ojs.exchange.direct", q)},
                names.dlx_queue(q): {("tenant1.ojs.exchange.dlx", q)},
                names.retry_queue(q, 100): {("tenant1.ojs.exchange.retry", f"{q}.100")},
            }
            async with raw.channel(confirms=False) as ch:
                for exchange in ("direct", "dlx", "retry"):
                    await ch.exchange_declare(f"tenant1.ojs.exchange.{exchange}", "direct", durable=True)
                assert (await ch.queue_declare(names.dlx_queue(q), passive=True)).message_count == 1
                msg = await ch.get(names.dlx_queue(q))
                assert msg is not None and msg.properties.message_id == job.id
                await msg.reject(requeue=True)


# ------------------------------------------------------------------------ AMQP-032


async def test_amqp_032_quorum_queues_opt_in(raw: amqp.Connection, q: str) -> None:
    """AMQP-032: quorum queues are opt-in (without priorities); jobs run and dead-letter."""
    options = ojs.QueueOptions(queue_type="quorum", max_priority=None)
    names = ojs.Names()
    worker = ojs.Worker(queues=[q], concurrency=2)
    outcomes = Outcomes(worker)

    @worker.handler("quorum.job")
    async def handler(ctx: ojs.JobContext, ok: bool) -> None:
        if not ok:
            raise ojs.Discard("as asked")

    async with ojs.connect(current_url(), queue_options=options) as client, running(worker, client):
        good = await client.push("quorum.job", [True], queue=q)
        bad = await client.push("quorum.job", [False], queue=q)
        assert (await outcomes.wait_final(good.id)).outcome == "completed"
        assert (await outcomes.wait_final(bad.id)).outcome == "dead_lettered"
        with anyio.fail_after(WAIT):
            facts = await queue_facts(names.job_queue(q), names.dlx_queue(q))
    job_facts = facts[names.job_queue(q)]
    assert job_facts["type"] == "quorum"
    assert job_facts["arguments"] == {
        "x-dead-letter-exchange": DLX,
        "x-dead-letter-routing-key": q,
        "x-queue-type": "quorum",
    }
    assert facts[names.dlx_queue(q)]["type"] == "quorum"


def test_amqp_032_quorum_with_priority_is_refused() -> None:
    """Quorum queues on RabbitMQ 3.10 have no priorities: the combination is refused
    before anything reaches the broker, with an error that says why (DECISIONS 9)."""
    with pytest.raises(ojs.TopologyError, match=r"quorum.*priorit"):
        ojs.QueueOptions(queue_type="quorum")
    with pytest.raises(ojs.TopologyError, match=r"max_priority=None"):
        ojs.QueueOptions(queue_type="quorum", max_priority=5)


async def test_eager_declaration_declares_everything_at_connect_and_dlq_control_are_plain(
    new_queue: Callable[..., str],
) -> None:
    """``connect(declare="eager", queues=[...])`` declares, before it returns and before any
    push, each queue's job queue, dead-letter queue and control queue with their bindings.
    The dead-letter and control queues are durable with no arguments, as the OJS AMQP
    binding declares them (another implementation may declare them first or second)."""
    a, b = new_queue(), new_queue()
    names = ojs.Names()
    async with ojs.connect(current_url(), declare="eager", queues=[a, b]):
        with anyio.fail_after(WAIT):
            wanted = [
                n for q in (a, b) for n in (names.job_queue(q), names.dlx_queue(q), names.control_queue(q))
            ]
            facts, bindings = await both(queue_facts(*wanted), bindings_to(*wanted))
    assert set(facts) == set(wanted)
    for q in (a, b):
        assert facts[names.job_queue(q)]["arguments"] == default_args(q)
        for plain in (names.dlx_queue(q), names.control_queue(q)):
            assert facts[plain]["durable"] is True and facts[plain]["auto_delete"] is False
            assert facts[plain]["arguments"] == {}, plain
        assert bindings[names.dlx_queue(q)] == {(DLX, q)}
        assert bindings[names.control_queue(q)] == {(DIRECT, names.control_queue(q))}
