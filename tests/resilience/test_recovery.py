"""Automatic recovery after a cut connection, through the fault-injecting proxy.

Every wait is bounded; the only sleeps are where time itself is the behaviour.
"""

from __future__ import annotations

import functools
import itertools
import random
from collections.abc import Callable

import anyio
import pytest
from harness import FaultProxy
from support.waits import wait_message_count

from ojs_anyio import amqp

from .resilience_helpers import (
    FAST,
    EventLog,
    message_count,
    observer,
    queue_exists,
    wait_queue_exists,
    wait_until,
)

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.rabbitmq_only("fault injection: TCP connection cuts and host lists"),
]

#: Wait until the broker reports at least ``count`` ready messages in a queue.
wait_until_count = functools.partial(wait_message_count, at_least=True, timeout=10.0, interval=0.05)


# ---------------------------------------------------------------------- backoff


def test_backoff_delays_follow_the_policy() -> None:
    policy = amqp.RecoveryPolicy(initial_delay=0.1, multiplier=2.0, max_delay=1.0, jitter=0.0)
    rng = random.Random(1)
    assert [policy.delay(n, rng) for n in range(1, 7)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    jittered = amqp.RecoveryPolicy(initial_delay=0.1, multiplier=2.0, max_delay=1.0, jitter=0.25)
    for n in range(1, 7):
        base = min(0.1 * 2.0 ** (n - 1), 1.0)
        delays = [jittered.delay(n, rng) for _ in range(200)]
        assert all(base * 0.75 <= d <= base * 1.25 for d in delays)
        assert max(delays) - min(delays) > base * 0.2  # really randomised


def test_default_policy_is_the_spec_schedule() -> None:
    """AMQP-025 (OJS AMQP binding §11.3): attempt N waits min(2**(N-1), 60) s, ±25% jitter.

    The default policy (what ``ojs_anyio.connect`` uses) without jitter gives exactly
    1, 2, 4, 8, 16, 32, 60, 60 s; with its jitter every delay stays within ±25% of that and
    spreads over (nearly) the whole band."""
    default = amqp.RecoveryPolicy()
    exact = amqp.RecoveryPolicy(jitter=0.0)
    rng = random.Random(25)
    assert [exact.delay(n, rng) for n in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert exact.delay(50, rng) == 60
    for n in range(1, 9):
        base = min(2 ** (n - 1), 60)
        ratios = [default.delay(n, rng) / base for _ in range(2000)]
        assert 0.75 <= min(ratios) < 0.77 and 1.23 < max(ratios) <= 1.25


async def test_reconnect_loop_waits_the_policy_delays(amqp_url: str) -> None:
    """The delays the reconnect loop announces (and then sleeps) are the policy's, attempt
    after attempt, jitter included: recorded from the Reconnecting events while the broker
    stays unreachable, against the same random sequence, and the time between attempts is
    never shorter than the announced delay.  (Scaled-down policy: the schedule's shape, not
    its minutes, is what the loop must follow.)"""
    policy = amqp.RecoveryPolicy(initial_delay=0.02, multiplier=2.0, max_delay=0.16, jitter=0.25)
    attempts = 7
    async with FaultProxy() as proxy:
        with anyio.fail_after(30):
            async with amqp.connect(proxy.url(), recovery=policy) as conn:
                conn._rng = random.Random(11)
                log = EventLog(conn)
                proxy.refuse_new()
                proxy.cut_all()
                await log.wait_for(amqp.Reconnecting, attempts + 1)
                proxy.refuse_new(False)
                await log.wait_for(amqp.ConnectionRecovered)
    expected_rng = random.Random(11)
    expected = [policy.delay(n, expected_rng) for n in range(1, attempts + 2)]
    announced = log.of(amqp.Reconnecting)[: attempts + 1]
    assert [ev.attempt for ev in announced] == list(range(1, attempts + 2))
    assert [ev.delay for ev in announced] == pytest.approx(expected)
    times = log.times_of(amqp.Reconnecting)[: attempts + 1]
    for (before, after), delay in zip(itertools.pairwise(times), expected, strict=False):
        assert after - before >= delay * 0.99
    assert max(expected) <= 0.16 * 1.25 and expected[-1] >= 0.16 * 0.75  # capped, then jittered


# ---------------------------------------------------------------------- consumer continues


async def test_consumer_continues_after_cut(amqp_url: str, unique: Callable[[str], str]) -> None:
    """Cut mid-stream: the same ``async for`` goes on, nothing is lost, events tell the story."""
    queue = unique("q")
    total = 300
    received: dict[int, bool] = {}  # message number -> redelivered (last seen)
    got_100 = anyio.Event()
    got_all = anyio.Event()
    stale_acks = 0
    async with FaultProxy() as proxy:
        with anyio.fail_after(30):
            async with amqp.connect(proxy.url(), recovery=FAST) as conn:
                log = EventLog(conn)
                async with conn.subscribe() as events, conn.channel() as ch:
                    await ch.queue_declare(queue)

                    async def consume() -> None:
                        nonlocal stale_acks
                        async with ch.consume(queue, prefetch=10) as messages:
                            async for msg in messages:
                                received[int(msg.body)] = msg.redelivered
                                try:
                                    await msg.ack()
                                except amqp.StaleDeliveryError:
                                    stale_acks += 1  # got before the cut: it comes again
                                if len(received) >= 100:
                                    got_100.set()
                                if len(received) == total:
                                    got_all.set()
                                    return

                    async with anyio.create_task_group() as tg:
                        tg.start_soon(consume)
                        for n in range(150):
                            await ch.publish(str(n).encode(), routing_key=queue)
                        await got_100.wait()
                        assert proxy.cut_all() == 1
                        await log.wait_recovered()
                        for n in range(150, total):
                            await ch.publish(str(n).encode(), routing_key=queue)
                        await got_all.wait()
                    assert sorted(received) == list(range(total))

                    # The public subscription saw the whole story, in order.
                    kinds = []
                    while len(kinds) < 4:
                        kinds.append(type(await events.__anext__()))
                assert kinds == [
                    amqp.ConnectionLost,
                    amqp.Reconnecting,
                    amqp.ConsumerRecovered,
                    amqp.ConnectionRecovered,
                ]
                (recovered,) = log.of(amqp.ConsumerRecovered)
                assert recovered.reason == "reconnect" and recovered.queue == queue
                reconnecting = log.of(amqp.Reconnecting)[0]
                assert reconnecting.attempt == 1 and 0 < reconnecting.delay <= 0.011
                assert conn.reconnections == 1
                assert log.of(amqp.ConnectionRecovered)[0].reconnections == 1
                async with conn.channel() as ch:
                    await ch.queue_delete(queue)
        print(f"stale acks after the cut: {stale_acks}")


async def test_consumer_prefetch_is_restored(amqp_url: str, unique: Callable[[str], str]) -> None:
    """After recovery the broker still sends at most ``prefetch`` unacked messages."""
    queue = unique("q")
    async with FaultProxy() as proxy:
        with anyio.fail_after(20):
            async with amqp.connect(proxy.url(), recovery=FAST) as conn:
                log = EventLog(conn)
                async with conn.channel() as ch:
                    await ch.queue_declare(queue)
                    async with ch.consume(queue, prefetch=3) as messages:
                        proxy.cut_all()
                        await log.wait_recovered()
                        for n in range(20):
                            await ch.publish(str(n).encode(), routing_key=queue)
                        held = [await messages.__anext__() for _ in range(3)]
                        # Time is the behaviour here: nothing more may arrive unacked.
                        await anyio.sleep(0.3)
                        assert messages.statistics().current_buffer_used == 0
                        assert messages.unacked == 3
                        for msg in held:
                            await msg.ack()
                        for _ in range(17):
                            await (await messages.__anext__()).ack()
                    await ch.queue_delete(queue)


# ---------------------------------------------------------------------- topology


async def test_topology_redeclared_after_cut(amqp_url: str, unique: Callable[[str], str]) -> None:
    """Auto-delete and exclusive entities vanish with the connection and come back, in
    dependency order: exchanges, the exchange-to-exchange binding, queues, their bindings.
    A server-named queue comes back under a new name, visible through ``QueueInfo.name``."""
    source, dest, auto_q = unique("src"), unique("dst"), unique("ad")
    async with FaultProxy() as proxy:
        with anyio.fail_after(30):
            async with amqp.connect(proxy.url(), recovery=FAST) as conn:
                log = EventLog(conn)
                async with conn.channel() as ch:
                    await ch.exchange_declare(source, "fanout", auto_delete=True)
                    await ch.exchange_declare(dest, "fanout", auto_delete=True)
                    await ch.exchange_bind(dest, source)
                    await ch.queue_declare(auto_q, auto_delete=True)
                    await ch.queue_bind(auto_q, dest)
                    server_named = await ch.queue_declare("", exclusive=True)
                    await ch.queue_bind(server_named.name, dest)
                    old_name = server_named.name

                    async with (
                        ch.consume(auto_q, prefetch=10) as auto_messages,
                        ch.consume(server_named.name, prefetch=10) as named_messages,
                    ):
                        await ch.publish(b"before", exchange=source)
                        assert (await auto_messages.__anext__()).body == b"before"
                        assert (await named_messages.__anext__()).body == b"before"

                        # Hold recovery off until the broker has dropped what was ours.
                        proxy.refuse_new()
                        proxy.cut_all()
                        await log.wait_for(amqp.ConnectionLost)
                        await wait_queue_exists(amqp_url, auto_q, False)
                        await wait_queue_exists(amqp_url, old_name, False)
                        proxy.refuse_new(False)
                        await log.wait_recovered()

                        assert server_named.name != old_name
                        assert server_named.name.startswith("amq.gen-")
                        assert await queue_exists(amqp_url, auto_q)
                        assert not await queue_exists(amqp_url, old_name)
                        # Through the e2e binding into both queues, from another connection.
                        async with observer(amqp_url) as other:
                            await other.publish(b"after", exchange=source)
                        for messages in (auto_messages, named_messages):
                            msg = await messages.__anext__()
                            assert (msg.body, msg.redelivered) == (b"after", False)
                            await msg.ack()
                    assert log.of(amqp.TopologyRecoveryFailed) == []
                    recovered_queues = {ev.queue for ev in log.of(amqp.ConsumerRecovered)}
                    assert recovered_queues == {auto_q, server_named.name}

                    # A second cut: the renamed queue and its binding replay in order again.
                    renamed_once = server_named.name
                    proxy.cut_all()
                    await log.wait_recovered(2)
                    assert server_named.name not in (old_name, renamed_once)
                    assert log.of(amqp.TopologyRecoveryFailed) == []
                    async with ch.consume(server_named.name, prefetch=1) as named_messages:
                        await ch.publish(b"again", exchange=source)
                        assert (await named_messages.__anext__()).body == b"again"


async def test_rotates_across_hosts(amqp_url: str, unique: Callable[[str], str]) -> None:
    """``amqp://h1:p1,h2:p2/``: when the first host refuses, recovery moves on to the next."""
    queue = unique("q")
    async with FaultProxy() as first, FaultProxy() as second:
        url = f"amqp://guest:guest@127.0.0.1:{first.port},127.0.0.1:{second.port}/"
        with anyio.fail_after(20):
            async with amqp.connect(url, recovery=FAST) as conn:
                log = EventLog(conn)
                await first.wait_for_connections(1)
                assert second.active_connections == 0
                async with conn.channel() as ch:
                    await ch.queue_declare(queue, auto_delete=True)
                    first.refuse_new()
                    first.cut_all()
                    await log.wait_recovered()
                    assert (first.active_connections, second.active_connections) == (0, 1)
                    await ch.publish(b"via the second host", routing_key=queue)
                    msg = await ch.get(queue)
                    assert msg is not None and msg.body == b"via the second host"
                    await msg.ack()
                    # And back to the first when the second goes away.
                    first.refuse_new(False)
                    second.refuse_new()
                    second.cut_all()
                    await log.wait_recovered(2)
                    assert (first.active_connections, second.active_connections) == (1, 0)
                    await ch.queue_delete(queue)


async def test_conflicting_redeclaration_is_reported_and_the_rest_recovers(
    amqp_url: str, unique: Callable[[str], str]
) -> None:
    """While we are away, someone re-creates our queue with other arguments and deletes a
    queue we consume from.  Recovery reports both (event + typed error to the consumer)
    and restores everything else, including the other consumer on the same channel."""
    conflicted, healthy, external = unique("conflict"), unique("ok"), unique("ext")
    async with FaultProxy() as proxy, observer(amqp_url) as operator:
        await operator.queue_declare(external)
        with anyio.fail_after(30):
            async with amqp.connect(proxy.url(), recovery=FAST) as conn:
                log = EventLog(conn)
                async with conn.channel() as ch:
                    await ch.queue_declare(conflicted)
                    await ch.queue_declare(healthy)
                    async with (
                        ch.consume(conflicted, prefetch=5) as conflicted_messages,
                        ch.consume(healthy, prefetch=5) as healthy_messages,
                        ch.consume(external, prefetch=5) as external_messages,
                    ):
                        proxy.refuse_new()
                        proxy.cut_all()
                        await log.wait_for(amqp.ConnectionLost)
                        await operator.queue_delete(conflicted)
                        await operator.queue_declare(conflicted, arguments={"x-max-length": 10})
                        await operator.queue_delete(external)
                        proxy.refuse_new(False)
                        await log.wait_recovered()

                        failures = {ev.what: ev.error for ev in log.of(amqp.TopologyRecoveryFailed)}
                        assert isinstance(failures[f"queue {conflicted!r}"], amqp.PreconditionFailed)
                        consumer_failures = {
                            what: err for what, err in failures.items() if what.startswith("consumer")
                        }
                        assert len(consumer_failures) == 2
                        with pytest.raises(amqp.PreconditionFailed):
                            await conflicted_messages.__anext__()
                        with pytest.raises(amqp.NotFound):
                            await external_messages.__anext__()

                        # Everything else is back: the channel publishes, the healthy consumer consumes.
                        await ch.publish(b"still here", routing_key=healthy)
                        msg = await healthy_messages.__anext__()
                        assert msg.body == b"still here"
                        await msg.ack()
                    recovered = [ev.queue for ev in log.of(amqp.ConsumerRecovered)]
                    assert recovered == [healthy]
                    await ch.queue_delete(healthy)
        await operator.queue_delete(conflicted)


# ---------------------------------------------------------------------- publishing


async def test_pending_confirms_fail_fast_at_a_cut(amqp_url: str, unique: Callable[[str], str]) -> None:
    """Publishes the broker took but whose confirms are held back fail with
    PublishOutcomeUnknownError right at the cut, and are never resent."""
    queue = unique("q")
    async with FaultProxy() as proxy:
        with anyio.fail_after(30):
            async with amqp.connect(proxy.url(), recovery=FAST) as conn:
                log = EventLog(conn)
                async with conn.channel() as ch:
                    await ch.queue_declare(queue)
                    proxy.stall("downstream")  # the broker gets the publishes, we get no confirms
                    window = ch.publish_window(max_in_flight=1000)
                    for n in range(100):
                        await window.publish(str(n).encode(), routing_key=queue)
                    await window.flush()
                    single: list[BaseException] = []

                    async def publish_one() -> None:
                        try:
                            await ch.publish(b"single", routing_key=queue)
                        except amqp.PublishError as exc:
                            single.append(exc)

                    async with anyio.create_task_group() as tg:
                        tg.start_soon(publish_one)
                        await wait_until(lambda: ch.unconfirmed == 101)
                        await wait_until_count(amqp_url, queue, 101)
                        cut_at = anyio.current_time()
                        proxy.cut_all()
                        failed = await window.wait_all()
                    failed_after = anyio.current_time() - cut_at
                    assert len(failed) == 100
                    assert all(isinstance(h.error, amqp.PublishOutcomeUnknownError) for h in failed)
                    assert len(single) == 1 and isinstance(single[0], amqp.PublishOutcomeUnknownError)
                    assert failed_after < 1.0
                    assert ch.unconfirmed == 0

                    proxy.unstall("downstream")
                    await log.wait_recovered()
                    # Nothing was resent behind our back.
                    assert await message_count(amqp_url, queue) == 101
                    await ch.publish(b"after", routing_key=queue)
                    assert await message_count(amqp_url, queue) == 102
                    await ch.queue_delete(queue)


async def test_publish_while_disconnected_waits_for_recovery(
    amqp_url: str, unique: Callable[[str], str]
) -> None:
    """A publish issued while down waits for recovery (then is confirmed), bounded by its
    own timeout (then PublishTimeoutError); the connection-wide publish_timeout applies
    when the call gives none."""
    queue = unique("q")
    async with FaultProxy() as proxy:
        with anyio.fail_after(30):
            async with amqp.connect(proxy.url(), recovery=FAST, publish_timeout=0.2) as conn:
                log = EventLog(conn)
                async with conn.channel() as ch:
                    await ch.queue_declare(queue)
                    proxy.refuse_new()
                    proxy.cut_all()
                    await log.wait_for(amqp.ConnectionLost)
                    started = anyio.current_time()
                    with pytest.raises(amqp.PublishTimeoutError, match="not re-established"):
                        await ch.publish(b"default timeout", routing_key=queue)
                    assert 0.15 < anyio.current_time() - started < 1.0
                    with pytest.raises(amqp.PublishTimeoutError):
                        await ch.publish(b"own timeout", routing_key=queue, timeout=0.05)
                    confirmed_at: list[float] = []

                    async def patient() -> None:
                        await ch.publish(b"patient", routing_key=queue, timeout=10)
                        confirmed_at.append(anyio.current_time())

                    async with anyio.create_task_group() as tg:
                        tg.start_soon(patient)
                        await anyio.sleep(0.3)  # longer than publish_timeout: the call's own bound wins
                        assert confirmed_at == []
                        proxy.refuse_new(False)
                        await log.wait_recovered()
                    assert confirmed_at
                    assert await message_count(amqp_url, queue) == 1
                    await ch.queue_delete(queue)


# ---------------------------------------------------------------------- consuming


async def test_stale_delivery_ack_after_reconnect(amqp_url: str, unique: Callable[[str], str]) -> None:
    """Settling a delivery from before the cut raises StaleDeliveryError (nothing is sent),
    and the broker redelivers it with redelivered=True."""
    queue = unique("q")
    async with FaultProxy() as proxy:
        with anyio.fail_after(20):
            async with amqp.connect(proxy.url(), recovery=FAST) as conn:
                log = EventLog(conn)
                async with conn.channel() as ch:
                    await ch.queue_declare(queue)
                    await ch.publish(b"one", routing_key=queue)
                    await ch.publish(b"two", routing_key=queue)
                    async with ch.consume(queue, prefetch=10) as messages:
                        first = await messages.__anext__()
                        second = await messages.__anext__()
                        assert (first.body, first.redelivered) == (b"one", False)
                        proxy.refuse_new()
                        proxy.cut_all()
                        await log.wait_for(amqp.ConnectionLost)
                        with pytest.raises(amqp.StaleDeliveryError):
                            await first.ack()  # while disconnected
                        proxy.refuse_new(False)
                        await log.wait_recovered()
                        with pytest.raises(amqp.StaleDeliveryError):
                            await second.nack()  # after recovery: a different channel now
                        assert not first.settled and not second.settled
                        again = [await messages.__anext__() for _ in range(2)]
                        assert [(m.body, m.redelivered) for m in again] == [(b"one", True), (b"two", True)]
                        for msg in again:
                            await msg.ack()
                        assert messages.unacked == 0
                    assert await message_count(amqp_url, queue) == 0
                    await ch.queue_delete(queue)


async def test_server_cancel_resubscribes_when_queue_returns(
    amqp_url: str, unique: Callable[[str], str]
) -> None:
    """The broker cancels our consumer (queue deleted).  With recovery on, the consumer is
    re-registered once the queue exists again; the ``async for`` never ends."""
    queue = unique("q")
    with anyio.fail_after(20):
        async with (
            observer(amqp_url) as operator,
            amqp.connect(amqp_url, recovery=FAST) as conn,
        ):
            log = EventLog(conn)
            async with conn.channel() as ch:
                await ch.queue_declare(queue)
                bodies: list[bytes] = []
                got = anyio.Event()

                async def consume() -> None:
                    nonlocal got
                    async with ch.consume(queue, prefetch=5) as messages:
                        async for msg in messages:
                            bodies.append(msg.body)
                            await msg.ack()
                            got.set()
                            got = anyio.Event()

                async with anyio.create_task_group() as tg:
                    tg.start_soon(consume)
                    waiting = got
                    await ch.publish(b"before", routing_key=queue)
                    await waiting.wait()

                    await operator.queue_delete(queue)
                    # Time is the behaviour: several resubscribe attempts find no queue,
                    # and none of them may break the channel or end the consumer.
                    await anyio.sleep(0.3)
                    assert log.of(amqp.ConsumerRecovered) == []
                    assert ch.is_open
                    await operator.queue_declare(queue)
                    recovered = await log.wait_for(amqp.ConsumerRecovered)
                    assert (recovered.reason, recovered.queue) == ("broker-cancel", queue)

                    waiting = got
                    await ch.publish(b"after", routing_key=queue)
                    await waiting.wait()
                    tg.cancel_scope.cancel()
                assert bodies == [b"before", b"after"]
                assert log.of(amqp.ConnectionLost) == []
                await ch.queue_delete(queue)


# ---------------------------------------------------------------------- transactions


async def test_transaction_cut_in_half_fails_its_commit(amqp_url: str, unique: Callable[[str], str]) -> None:
    """The broker rolls back a transaction whose connection died: the commit after
    recovery must say so, not report success for publishes that were discarded; the
    recovered channel is transactional again."""
    queue = unique("q")
    async with FaultProxy() as proxy:
        with anyio.fail_after(20):
            async with amqp.connect(proxy.url(), recovery=FAST) as conn:
                log = EventLog(conn)
                async with conn.channel(confirms=False) as ch:
                    await ch.queue_declare(queue)
                    await ch.tx_select()
                    await ch.publish(b"committed", routing_key=queue)
                    await ch.tx_commit()
                    await ch.publish(b"lost", routing_key=queue)
                    proxy.cut_all()
                    await log.wait_recovered()
                    with pytest.raises(amqp.TransactionLostError):
                        await ch.tx_commit()
                    await ch.publish(b"redone", routing_key=queue)
                    assert await message_count(amqp_url, queue) == 1  # uncommitted: not there yet
                    await ch.tx_commit()
                    assert await message_count(amqp_url, queue) == 2
                    bodies = []
                    for _ in range(2):
                        msg = await ch.get(queue, no_ack=True)
                        assert msg is not None
                        bodies.append(msg.body)
                    assert bodies == [b"committed", b"redone"]
                    await ch.tx_commit()
                    await ch.queue_delete(queue)


# ---------------------------------------------------------------------- consume() ending mid-recovery


@pytest.mark.parametrize("gate_on", ["other", "itself"])
async def test_consume_block_ended_during_recovery_leaves_no_broker_consumer(
    amqp_url: str, unique: Callable[[str], str], gate_on: str
) -> None:
    """A ``consume()`` block that ends while recovery is re-registering consumers (before
    or during its own re-registration) must not leave a consumer at the broker that
    nobody reads: the other consumer is restored, this one is not."""
    keep_q, drop_q = unique("keep"), unique("drop")
    async with FaultProxy() as proxy:
        with anyio.fail_after(20):
            async with amqp.connect(proxy.url(), recovery=FAST) as conn:
                log = EventLog(conn)
                async with conn.channel() as ch:
                    await ch.queue_declare(keep_q)
                    await ch.queue_declare(drop_q)
                    # Hold recovery at one consumer's re-registration, to end the drop
                    # consumer's block right there (a deterministic stand-in for the race).
                    reached, release = anyio.Event(), anyio.Event()
                    consuming = ch._consuming  # the channel's consumer part
                    original = consuming.basic_consume

                    async def gated(consumer: amqp.Consumer, *, internal: bool = False) -> None:
                        gate = keep_q if gate_on == "other" else drop_q
                        if internal and consumer.queue == gate:
                            reached.set()
                            await release.wait()
                        await original(consumer, internal=internal)

                    consuming.basic_consume = gated  # type: ignore[method-assign]
                    async with ch.consume(keep_q, prefetch=5) as kept:
                        async with ch.consume(drop_q, prefetch=5):
                            proxy.cut_all()
                            await reached.wait()
                        release.set()
                        await log.wait_recovered()
                        assert (await ch.queue_declare(drop_q, passive=True)).consumer_count == 0
                        assert (await ch.queue_declare(keep_q, passive=True)).consumer_count == 1
                        await ch.publish(b"still here", routing_key=keep_q)
                        msg = await kept.__anext__()
                        assert msg.body == b"still here"
                        await msg.ack()
                    await ch.queue_delete(keep_q)
                    await ch.queue_delete(drop_q)
