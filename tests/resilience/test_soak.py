"""Soak: confirmed publishing and acking consumption while the proxy cuts every connection
about every 500 ms.  At-least-once means zero loss; duplicates are expected and reported.

``OJS_SOAK_MESSAGES`` sets how many messages (default 20,000).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable

import anyio
import pytest
from harness import FaultProxy

from ojs_anyio import amqp

from .resilience_helpers import FAST, EventLog, observer

pytestmark = pytest.mark.anyio

MESSAGES = int(os.environ.get("OJS_SOAK_MESSAGES", "20000"))
CUT_EVERY = 0.5
#: Bound on the whole run: generous for asyncio in debug mode, the slowest backend here
#: (consuming with one ack per message: about 500 messages/s under cuts).
TIME_BOUND = 20.0 + MESSAGES / 200


async def test_soak_no_loss_under_repeated_cuts(amqp_url: str, unique: Callable[[str], str]) -> None:
    queue = unique("soak")
    seen: Counter[int] = Counter()
    missing = set(range(MESSAGES))
    all_seen = anyio.Event()
    retried = stale_acks = lost_acks = 0

    async with FaultProxy() as proxy, observer(amqp_url) as operator:
        await operator.queue_declare(queue)
        with anyio.fail_after(TIME_BOUND + 10):
            async with (
                amqp.connect(proxy.url(), recovery=FAST, name="soak-producer") as producer,
                amqp.connect(proxy.url(), recovery=FAST, name="soak-consumer") as consumer,
            ):
                producer_log, consumer_log = EventLog(producer), EventLog(consumer)

                async def produce() -> None:
                    """Publish everything with confirms (bulk window); re-publish what has
                    no confirm, until every message is confirmed once."""
                    nonlocal retried
                    todo = list(range(MESSAGES))
                    async with producer.channel() as ch:
                        while todo:
                            window = ch.publish_window(max_in_flight=1000)
                            sent = [
                                (await window.publish(str(n).encode(), routing_key=queue), n) for n in todo
                            ]
                            await window.wait_all()
                            for handle, _ in sent:
                                assert handle.done
                                if handle.error is not None:
                                    assert isinstance(handle.error, amqp.PublishOutcomeUnknownError)
                            todo = [n for handle, n in sent if handle.error is not None]
                            retried += len(todo)

                async def consume() -> None:
                    nonlocal stale_acks, lost_acks
                    async with (
                        consumer.channel(confirms=False) as ch,
                        ch.consume(queue, prefetch=500) as messages,
                    ):
                        async for msg in messages:
                            n = int(msg.body)
                            seen[n] += 1
                            missing.discard(n)
                            try:
                                await msg.ack()
                            except amqp.StaleDeliveryError:
                                stale_acks += 1  # received before a cut: it comes again
                            except amqp.ConnectionLostError:
                                lost_acks += 1  # the cut came as the ack was written
                            if not missing:
                                all_seen.set()

                started = anyio.current_time()
                async with proxy.cutting_every(CUT_EVERY), anyio.create_task_group() as tg:
                    tg.start_soon(consume)
                    await produce()
                    confirmed_after = anyio.current_time() - started
                    # Missing messages show as an assertion below, not as a timeout here.
                    with anyio.move_on_after(started + TIME_BOUND - anyio.current_time()):
                        await all_seen.wait()
                    tg.cancel_scope.cancel()
                elapsed = anyio.current_time() - started

        duplicates = sum(count - 1 for count in seen.values())
        print(
            f"\nsoak: {MESSAGES} messages in {elapsed:.1f}s (all confirmed after {confirmed_after:.1f}s); "
            f"cuts {proxy.connections_cut}; recoveries producer {len(producer_log.of(amqp.ConnectionRecovered))}"
            f" consumer {len(consumer_log.of(amqp.ConnectionRecovered))}; "
            f"publishes retried {retried}; duplicates received {duplicates}; "
            f"stale acks {stale_acks}; acks lost in a cut {lost_acks}"
        )
        assert not missing, f"{len(missing)} messages lost, e.g. {sorted(missing)[:20]}"
        assert elapsed < TIME_BOUND
        assert proxy.connections_cut >= int(elapsed / CUT_EVERY) - 1  # it really was cut, often
        assert producer_log.of(amqp.ConnectionRecovered) and consumer_log.of(amqp.ConnectionRecovered)
        await operator.queue_delete(queue)
