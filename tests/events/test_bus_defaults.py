"""Seed 004's default (no URL: the in-memory broker, loudly), reserved names refused before
the broker sees them, and named connections in both layers.  Asyncio and Trio."""

from __future__ import annotations

import logging
import os

import anyio
import pytest
from amqp.amqp_helpers import broker_connection_names
from support.waits import Seen

import ojs_anyio as ojs
from ojs_anyio import amqp, events
from ojs_anyio.memory import get_broker

pytestmark = pytest.mark.anyio


async def test_no_url_means_the_in_memory_broker_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("OJS_AMQP_URL", raising=False)
    seen = Seen()

    async def on_event(event: dict[str, int]) -> None:
        seen.add(event["n"])

    with caplog.at_level(logging.WARNING, logger="ojs_anyio.events"):
        async with events.connect(exchange="dev.events") as bus, bus.subscribe("dev.seen", on_event):
            await bus.publish("dev.seen", {"n": 1})
            await seen.wait(1)
            assert bus.url == "memory://"
            # the process's default in-memory broker holds the queue: not RabbitMQ
            assert "dev.seen" in get_broker().queues("/")
    warnings = [r for r in caplog.records if r.name == "ojs_anyio.events" and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "memory://" in warnings[0].getMessage()
    assert "development" in warnings[0].getMessage()


async def test_a_url_or_the_environment_is_used_without_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OJS_AMQP_URL", "memory://from-env/")
    with caplog.at_level(logging.WARNING, logger="ojs_anyio.events"):
        async with events.connect() as bus:
            assert bus.url == "memory://from-env/"
        async with events.connect("memory://given/") as bus:
            assert bus.url == "memory://given/"
    assert not [r for r in caplog.records if r.name == "ojs_anyio.events"]


@pytest.mark.usefixtures("rabbitmq_url")  # the default is RabbitMQ on 127.0.0.1:5672
async def test_the_job_layer_keeps_its_rabbitmq_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OJS_AMQP_URL", raising=False)
    async with ojs.connect() as client:
        assert client.conn.url.scheme == "amqp" and client.conn.url.hosts[0][1] == 5672


@pytest.mark.parametrize(
    ("options", "subscription", "refused"),
    [
        ({"exchange": "amq.topic"}, None, "exchange 'amq.topic'"),
        ({"exchange": "ojs.exchange.jobs"}, None, "exchange 'ojs.exchange.jobs'"),
        ({"exchange": "app.events", "queue_tag": "ojs."}, "rec.read", "queue 'ojs.rec.read'"),
        ({"exchange": "app.events"}, "amq.gen-x", "queue 'amq.gen-x'"),
    ],
)
async def test_reserved_names_are_refused_before_the_broker_sees_them(
    options: dict[str, str], subscription: str | None, refused: str
) -> None:
    async def on_event(event: object) -> None:
        pass

    url = "memory://reserved-names/"
    with pytest.raises(amqp.UsageError, match=rf"{refused}.*reserved") as caught:
        async with events.connect(url, **options) as bus:
            assert subscription is not None
            async with bus.subscribe(subscription, on_event):
                pass
    assert "reserved for" in str(caught.value)


async def test_every_connection_of_both_layers_is_named(rabbitmq_url: str) -> None:
    """An operator tells them apart in ``rabbitmqctl list_connections client_properties``."""
    url = rabbitmq_url

    async def on_event(event: object) -> None:
        pass

    async with (
        ojs.connect(url) as client,
        events.connect(url, exchange=f"named.{os.getpid()}", connection_name="billing-events") as bus,
        bus.subscribe(f"named.{os.getpid()}.q", on_event),
    ):
        del client
        await bus.publish("named", {"n": 1}, mandatory=False)  # opens the publisher connection
        wanted = {f"ojs-jobs pid={os.getpid()}", "billing-events-pub", "billing-events-sub-1"}
        with anyio.fail_after(30):
            # the broker's connection list: state outside our control, nothing to wait on
            while not wanted <= await broker_connection_names():  # noqa: ASYNC110
                await anyio.sleep(0.2)
