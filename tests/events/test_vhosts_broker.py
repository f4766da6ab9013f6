"""Two environments on two vhosts of one broker cannot see each other's events."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from support.waits import Seen, queue_exists

from ojs_anyio import amqp, events

pytestmark = pytest.mark.anyio


async def test_vhosts_isolate_environments(vhosts: Callable[[int], list[str]]) -> None:
    prod_url, qa_url = vhosts(2)
    prod_seen, qa_seen = Seen(), Seen()

    async def prod_handler(event: dict[str, str]) -> None:
        prod_seen.add(event)

    async def qa_handler(event: dict[str, str]) -> None:
        qa_seen.add(event)

    # Same exchange, same tag, same queue name: only the vhost differs.
    token = uuid.uuid4().hex[:8]
    tag = f"prod{token}_"
    options = {"exchange": f"events-{token}", "queue_tag": tag}
    async with (
        events.connect(prod_url, **options) as prod,
        events.connect(qa_url, **options) as qa,
        prod.subscribe("rec.read", prod_handler),
    ):
        await prod.publish("rec.read", {"env": "prod"})
        assert await prod_seen.wait(1) == [{"env": "prod"}]
        assert await queue_exists(prod_url, f"{tag}rec.read")
        assert not await queue_exists(qa_url, f"{tag}rec.read")
        with pytest.raises(amqp.UnroutableError):  # nothing is bound in qa
            await qa.publish("rec.read", {"env": "qa"})
        async with qa.subscribe("rec.read", qa_handler):
            await qa.publish("rec.read", {"env": "qa"})
            assert await qa_seen.wait(1) == [{"env": "qa"}]
    assert prod_seen.items == [{"env": "prod"}] and qa_seen.items == [{"env": "qa"}]
