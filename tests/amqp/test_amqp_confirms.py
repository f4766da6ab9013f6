"""Publisher confirms: many in flight, per-publish outcomes, failures that never hang."""

from __future__ import annotations

import copy
import hashlib
import os
import time
from collections.abc import Callable

import anyio
import anyio.abc
import anyio.lowlevel
import pytest
from harness import FaultProxy

from ojs_anyio import amqp

from .amqp_helpers import scratch_channel

pytestmark = pytest.mark.anyio


async def _count(ch: amqp.Channel, queue: str) -> int:
    return (await ch.queue_declare(queue, passive=True)).message_count


async def test_many_concurrent_publishes_are_all_confirmed(amqp_url: str) -> None:
    tasks, per_task = 20, 100
    with anyio.fail_after(30):
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
            queue = (await ch.queue_declare("", exclusive=True)).name
            done = 0

            async def publisher(n: int) -> None:
                nonlocal done
                for i in range(per_task):
                    await ch.publish(b"%d-%d" % (n, i), routing_key=queue)
                    done += 1

            async with anyio.create_task_group() as tg:
                for n in range(tasks):
                    tg.start_soon(publisher, n)
            assert done == tasks * per_task
            assert ch.unconfirmed == 0
            assert await _count(ch, queue) == tasks * per_task


async def test_publish_window_of_10000(amqp_url: str) -> None:
    total, limit = 10_000, 512
    with anyio.fail_after(60):
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
            queue = (await ch.queue_declare("", exclusive=True)).name
            window = ch.publish_window(max_in_flight=limit)
            handles = []
            for i in range(total):
                handles.append(await window.publish(b"%d" % i, routing_key=queue))
                assert window.in_flight <= limit
            assert await window.wait_all() == []
            assert window.in_flight == 0
            assert all(h.done and h.error is None for h in handles)
            assert [h.tag for h in handles] == list(range(1, total + 1))
            assert await _count(ch, queue) == total
            first = await ch.get(queue, no_ack=True)
            assert first is not None and first.body == b"0"  # order is kept


async def test_publish_window_with_tiny_limits(amqp_url: str) -> None:
    """Every publish waits for room: a confirm that lands while the window flushes must
    still wake it (this hung on Trio before the wakeup was armed ahead of the flush)."""
    with anyio.fail_after(30):
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
            queue = (await ch.queue_declare("", exclusive=True)).name
            for limit in (1, 2, 7):
                window = ch.publish_window(max_in_flight=limit)
                for i in range(300):
                    await window.publish(b"%d" % i, routing_key=queue)
                    assert window.in_flight <= limit
                assert await window.wait_all() == []
            assert await _count(ch, queue) == 900


async def test_unroutable_fails_exactly_that_publish(amqp_url: str) -> None:
    with anyio.fail_after(20):
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
            queue = (await ch.queue_declare("", exclusive=True)).name
            await ch.queue_bind(queue, "amq.direct", "routed")
            window = ch.publish_window(max_in_flight=64)
            handles = []
            for i in range(30):
                key = "nobody-home" if i in (10, 20) else "routed"
                handles.append(
                    await window.publish(b"%d" % i, exchange="amq.direct", routing_key=key, mandatory=True)
                )
            failed = await window.wait_all()
            assert failed == [handles[10], handles[20]]
            for i, handle in enumerate(handles):
                if i in (10, 20):
                    err = handle.error
                    assert isinstance(err, amqp.UnroutableError)
                    assert err.reply_code == 312 and err.reply_text == "NO_ROUTE"
                    assert (err.exchange, err.routing_key) == ("amq.direct", "nobody-home")
                    with pytest.raises(amqp.UnroutableError):
                        await handle.wait()
                else:
                    assert handle.error is None
                    await handle.wait()
            assert await _count(ch, queue) == 28

            # The plain path too, and the channel stays usable.
            with pytest.raises(amqp.UnroutableError) as info:
                await ch.publish(b"x", exchange="amq.direct", routing_key="nobody-home", mandatory=True)
            assert isinstance(info.value, amqp.PublishError)
            await ch.publish(b"y", exchange="amq.direct", routing_key="routed", mandatory=True)
            # Without mandatory, an unroutable message is silently dropped and confirmed.
            await ch.publish(b"z", exchange="amq.direct", routing_key="nobody-home")
            assert ch.is_open


async def test_unroutable_mixed_with_routable_of_other_keys_concurrently(amqp_url: str) -> None:
    """Returns are tied to the right publish even with many tasks interleaving."""
    outcomes: dict[int, str] = {}
    with anyio.fail_after(20):
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
            queue = (await ch.queue_declare("", exclusive=True)).name

            async def one(i: int) -> None:
                key = queue if i % 3 else f"nowhere-{i}"
                try:
                    await ch.publish(b"%d" % i, routing_key=key, mandatory=True)
                    outcomes[i] = "ok"
                except amqp.UnroutableError as exc:
                    assert exc.routing_key == key
                    outcomes[i] = "returned"

            async with anyio.create_task_group() as tg:
                for i in range(300):
                    tg.start_soon(one, i)
            assert outcomes == {i: "ok" if i % 3 else "returned" for i in range(300)}
            assert await _count(ch, queue) == 200


async def test_returns_are_tied_to_their_publish_on_a_headers_exchange(
    amqp_url: str, unique: Callable[[str], str]
) -> None:
    """Same exchange, same routing key, routed or not by headers: each Basic.Return fails
    the publish it belongs to, not the earliest one with that key still awaiting its confirm."""
    exchange = unique("headers")
    with anyio.fail_after(20):
        async with scratch_channel(amqp_url, exchanges=[exchange]) as ch:
            await ch.exchange_declare(exchange, "headers")
            queue = (await ch.queue_declare("", exclusive=True)).name
            await ch.queue_bind(queue, exchange, arguments={"x-match": "all", "kind": "email"})
            window = ch.publish_window(max_in_flight=1000)
            handles = []
            for i in range(200):
                props = amqp.BasicProperties(
                    message_id=str(i), headers={"kind": "sms" if i % 4 == 3 else "email"}
                )
                handles.append(
                    await window.publish(b"%d" % i, exchange=exchange, properties=props, mandatory=True)
                )
            failed = await window.wait_all()
            assert failed == [h for i, h in enumerate(handles) if i % 4 == 3]
            for i, handle in enumerate(handles):
                if i % 4 == 3:
                    assert isinstance(handle.error, amqp.UnroutableError)
                    assert handle.error.properties is not None
                    assert handle.error.properties.message_id == str(i)
            assert await _count(ch, queue) == 150


async def test_queue_deleted_mid_stream_fails_exactly_the_unrouted_publishes(amqp_url: str) -> None:
    with anyio.fail_after(20):
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch, conn.channel() as admin:
            queue = (await ch.queue_declare("", exclusive=True)).name
            window = ch.publish_window(max_in_flight=2000)
            handles = []
            for i in range(1000):
                if i == 300:
                    await admin.queue_delete(queue)
                props = amqp.BasicProperties(message_id=str(i))
                handles.append(
                    await window.publish(b"same body", routing_key=queue, properties=props, mandatory=True)
                )
            failed = await window.wait_all()
            # Publishes are routed in order: once the queue is gone, every later one fails.
            first = handles.index(failed[0])
            assert first <= 300
            assert failed == handles[first:]
            for i in range(first, 1000):
                err = handles[i].error
                assert isinstance(err, amqp.UnroutableError)
                assert err.properties is not None and err.properties.message_id == str(i)


async def test_nack_from_a_full_queue(amqp_url: str) -> None:
    with anyio.fail_after(20):
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
            args = {"x-max-length": 1, "x-overflow": "reject-publish"}
            queue = (await ch.queue_declare("", exclusive=True, arguments=args)).name
            await ch.publish(b"fits", routing_key=queue)
            with pytest.raises(amqp.PublishNackedError) as info:
                await ch.publish(b"full", routing_key=queue)
            assert info.value.routing_key == queue
            assert isinstance(info.value, amqp.PublishError)

            window = ch.publish_window()
            handles = [await window.publish(b"%d" % i, routing_key=queue) for i in range(5)]
            failed = await window.wait_all()
            assert failed == handles
            assert all(isinstance(h.error, amqp.PublishNackedError) for h in handles)

            # Room again: publishes go through.
            await ch.queue_purge(queue)
            await ch.publish(b"fits again", routing_key=queue)
            assert ch.is_open and await _count(ch, queue) == 1


@pytest.mark.usefixtures("rabbitmq_url")
async def test_closing_the_channel_fails_pending_confirms() -> None:
    async with FaultProxy() as proxy:
        with anyio.fail_after(20):
            async with amqp.connect(proxy.url(), close_timeout=0.5) as conn, conn.channel() as ch:
                queue = (await ch.queue_declare("", exclusive=True)).name
                proxy.stall("downstream")  # no confirm can come back
                window = ch.publish_window()
                handles = [await window.publish(b"%d" % i, routing_key=queue) for i in range(100)]
                await window.flush()
                errors: list[BaseException] = []

                async def plain_publish() -> None:
                    try:
                        await ch.publish(b"plain", routing_key=queue)
                    except amqp.PublishError as exc:
                        errors.append(exc)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(plain_publish)
                    while ch.unconfirmed < 101:
                        await anyio.lowlevel.checkpoint()
                    started = anyio.current_time()
                    await ch.aclose()
                assert anyio.current_time() - started < 1.5  # bounded by close_timeout
                assert len(errors) == 1 and isinstance(errors[0], amqp.PublishOutcomeUnknownError)
                assert all(isinstance(h.error, amqp.PublishOutcomeUnknownError) for h in handles)
                assert await window.wait_all() == handles
                assert ch.unconfirmed == 0
                proxy.unstall("downstream")


@pytest.mark.usefixtures("rabbitmq_url")
async def test_confirm_timeout_gives_up_waiting_and_a_late_confirm_is_ignored() -> None:
    """``publish(confirm_timeout=…)`` and ``wait_all(timeout=…)`` stop waiting for confirms
    that do not come (a broker gone silent): "outcome unknown", and the channel goes on."""
    async with FaultProxy() as proxy:
        with anyio.fail_after(20):
            async with amqp.connect(proxy.url()) as conn, conn.channel() as ch:
                queue = (await ch.queue_declare("", exclusive=True)).name
                proxy.stall("downstream")  # the broker gets the messages; its confirms wait
                started = anyio.current_time()
                with pytest.raises(amqp.PublishOutcomeUnknownError, match=r"not confirmed within 0\.2s"):
                    await ch.publish(b"single", routing_key=queue, confirm_timeout=0.2)
                assert anyio.current_time() - started < 2.0
                window = ch.publish_window()
                handles = [await window.publish(b"%d" % i, routing_key=queue) for i in range(5)]
                failed = await window.wait_all(timeout=0.2)
                assert failed == handles
                assert all(isinstance(h.error, amqp.PublishOutcomeUnknownError) for h in handles)
                assert window.in_flight == 0 and ch.unconfirmed == 0
                proxy.unstall("downstream")
                # The late confirms find nothing to resolve; the channel keeps working.
                await ch.publish(b"after", routing_key=queue, confirm_timeout=5)
                assert await _count(ch, queue) == 7  # "unknown": they were routed after all


@pytest.mark.usefixtures("rabbitmq_url")
async def test_many_concurrent_publishes_time_out_in_publish_order_each_at_its_own_deadline() -> None:
    """One watcher per connection bounds every ``confirm_timeout`` (no timer per publish):
    publishes waiting together each fail "outcome unknown" at their own deadline, so in
    publish order, and a later publish with a shorter timeout fails before them."""
    timeout, count = 1.0, 20
    short = 0.0  # set once the others are sent: half the time the first has left
    sent: dict[int, float] = {}
    failed: dict[int, float] = {}
    async with FaultProxy() as proxy:
        with anyio.fail_after(20):
            async with amqp.connect(proxy.url()) as conn, conn.channel() as ch:
                queue = (await ch.queue_declare("", exclusive=True)).name
                proxy.stall("downstream")  # the broker gets the messages; its confirms wait

                async def publish(i: int, limit: float, *, task_status: anyio.abc.TaskStatus[None]) -> None:
                    sent[i] = time.monotonic()
                    task_status.started()  # the publish is written before the next one starts
                    with pytest.raises(
                        amqp.PublishOutcomeUnknownError, match=rf"not confirmed within {limit:.3g}s"
                    ):
                        await ch.publish(b"%d" % i, routing_key=queue, confirm_timeout=limit)
                    failed[i] = time.monotonic()

                async with anyio.create_task_group() as tg:
                    for i in range(count):
                        await tg.start(publish, i, timeout)
                        await anyio.sleep(0.01)  # spreads the deadlines over several checks
                    # The last publish's deadline falls halfway between now and the first's:
                    # a margin of a quarter second or more, whatever the loop above took (a
                    # fixed short limit flaked on a loaded machine, when the loop took so
                    # long that both deadlines passed before the watcher woke).
                    left = sent[0] + timeout - time.monotonic()
                    assert left > 0.5, f"sending the first {count} publishes took {timeout - left:.2f}s"
                    short = left / 2
                    await tg.start(publish, count, short)
                    assert ch.unconfirmed == count + 1
                assert ch.unconfirmed == 0
                for i in range(count + 1):
                    waited = failed[i] - sent[i]
                    limit = short if i == count else timeout
                    assert limit <= waited < limit + 2.0, (i, waited)
                assert failed[count] < failed[0]  # the shorter deadline woke the watcher early
                # In publish order (those given up in one check wake in any order, at once).
                assert all(failed[i] <= failed[i + 1] + 0.05 for i in range(count - 1)), failed
                proxy.unstall("downstream")
                await ch.publish(b"after", routing_key=queue, confirm_timeout=5)
                assert await _count(ch, queue) == count + 2


@pytest.mark.usefixtures("rabbitmq_url")
async def test_cutting_the_connection_fails_pending_confirms_promptly() -> None:
    errors: list[BaseException] = []
    async with FaultProxy() as proxy:
        with anyio.fail_after(20):
            with pytest.raises(amqp.ConnectionLostError):
                async with amqp.connect(proxy.url()) as conn, conn.channel() as ch:
                    queue = (await ch.queue_declare("", exclusive=True)).name
                    proxy.stall("downstream")
                    window = ch.publish_window(max_in_flight=10_000)
                    handles = [await window.publish(b"%d" % i, routing_key=queue) for i in range(1000)]
                    await window.flush()

                    async def plain_publish(i: int) -> None:
                        try:
                            await ch.publish(b"plain", routing_key=queue)
                        except amqp.PublishError as exc:
                            errors.append(exc)

                    async with anyio.create_task_group() as tg:
                        for i in range(10):
                            tg.start_soon(plain_publish, i)
                        while ch.unconfirmed < 1010:
                            await anyio.lowlevel.checkpoint()
                        cut_at = anyio.current_time()
                        assert proxy.cut_all() == 1
                        await window.wait_all()
                        assert anyio.current_time() - cut_at < 1.0
                        assert all(isinstance(h.error, amqp.PublishOutcomeUnknownError) for h in handles)
                    pytest.fail("the block should end with ConnectionLostError")
    assert len(errors) == 10
    assert all(isinstance(e, amqp.PublishOutcomeUnknownError) for e in errors)


async def test_properties_are_not_mutated(amqp_url: str) -> None:
    headers = {"x-attempt": 1, "nested": {"a": [1, 2]}}
    props = amqp.BasicProperties(content_type="text/plain", headers=headers, delivery_mode=2)
    snapshot = copy.deepcopy(props)
    with anyio.fail_after(10):
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
            queue = (await ch.queue_declare("", exclusive=True)).name
            await ch.publish(b"a", routing_key=queue, properties=props)
            with pytest.raises(amqp.UnroutableError):
                await ch.publish(b"b", routing_key="nowhere", properties=props, mandatory=True)
            window = ch.publish_window()
            for _ in range(10):
                await window.publish(b"c", routing_key=queue, properties=props)
            assert await window.wait_all() == []
            msg = await ch.get(queue, no_ack=True)
            assert msg is not None and msg.properties.headers == headers
    assert props == snapshot
    assert props.headers is headers
    assert headers == {"x-attempt": 1, "nested": {"a": [1, 2]}}


async def test_large_body_round_trips(amqp_url: str) -> None:
    body = os.urandom(5 * 1024 * 1024)
    with anyio.fail_after(30):
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
            assert conn.negotiated is not None and conn.negotiated.frame_max < len(body)
            queue = (await ch.queue_declare("", exclusive=True)).name
            await ch.publish(body, routing_key=queue)
            async with ch.consume(queue, prefetch=1) as messages:
                msg = await messages.__anext__()
                assert len(msg.body) == len(body)
                assert msg.body == body
                await msg.ack()


async def test_large_bodies_from_many_channels_do_not_interleave(amqp_url: str) -> None:
    """Frames of one message are never interleaved with another channel's frames."""
    bodies = {n: os.urandom(300_000 + n) for n in range(8)}
    with anyio.fail_after(30):
        async with amqp.connect(amqp_url, frame_max=4096) as conn, conn.channel() as ch:
            queue = (await ch.queue_declare("", exclusive=True)).name

            async def publisher(n: int) -> None:
                async with conn.channel() as own:
                    await own.publish(bodies[n], routing_key=queue)
                    await ch.publish(bodies[n], routing_key=queue)  # a shared channel as well

            async with anyio.create_task_group() as tg:
                for n in bodies:
                    tg.start_soon(publisher, n)
            seen = []
            while (msg := await ch.get(queue, no_ack=True)) is not None:
                seen.append(hashlib.sha256(msg.body).hexdigest())
            expected = [hashlib.sha256(b).hexdigest() for b in bodies.values()]
            assert sorted(seen) == sorted(expected * 2)


async def test_channel_without_confirms_returns_at_once(amqp_url: str) -> None:
    with anyio.fail_after(10):
        async with amqp.connect(amqp_url) as conn, conn.channel(confirms=False) as ch:
            queue = (await ch.queue_declare("", exclusive=True)).name
            window = ch.publish_window()
            handle = await window.publish(b"x", routing_key=queue)
            assert handle.done and handle.tag == 0
            await ch.publish(b"y", routing_key=queue)
            assert ch.unconfirmed == 0
            await ch.confirm_select()
            await ch.publish(b"z", routing_key=queue)  # now confirmed
            assert await _count(ch, queue) == 3
