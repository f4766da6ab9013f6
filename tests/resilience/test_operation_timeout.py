"""Waiting for a recovering connection times out with the right error: a synchronous call
raises OperationTimeoutError (not a publish error), a publish PublishTimeoutError (which
is an OperationTimeoutError too)."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest
from harness import FaultProxy

from ojs_anyio import amqp

from .resilience_helpers import FAST, EventLog

pytestmark = pytest.mark.anyio


@pytest.mark.usefixtures("rabbitmq_url")
async def test_a_call_times_out_as_an_operation_not_a_publish(
    amqp_url: str, unique: Callable[[str], str]
) -> None:
    queue = unique("q")
    async with FaultProxy() as proxy, amqp.connect(proxy.url(), recovery=FAST, publish_timeout=0.2) as conn:
        log = EventLog(conn)
        with anyio.fail_after(30):
            async with conn.channel() as ch:
                await ch.queue_declare(queue, auto_delete=True)
                proxy.refuse_new()
                proxy.cut_all()
                await log.wait_for(amqp.ConnectionLost)
                # A synchronous call: an operation timeout, not a publish error.
                with pytest.raises(amqp.OperationTimeoutError, match="not re-established") as info:
                    await ch.queue_declare(queue, passive=True)
                assert isinstance(info.value, TimeoutError)
                assert not isinstance(info.value, amqp.PublishError)
                # A publish: PublishTimeoutError, which is an operation timeout too.
                with pytest.raises(amqp.PublishTimeoutError, match="not re-established") as pub:
                    await ch.publish(b"x", routing_key=queue)
                assert isinstance(pub.value, amqp.OperationTimeoutError)
                with pytest.raises(amqp.OperationTimeoutError):
                    await conn.wait_connected(timeout=0.05)
                proxy.refuse_new(False)
                await log.wait_recovered()
                await ch.queue_declare(queue, passive=True)  # usable again
