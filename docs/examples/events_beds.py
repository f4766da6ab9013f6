"""BEDS's event topology on ojs_anyio.events: one topic exchange, nine routing keys,
``{queue_tag}{routing_key}`` queues declared by the services that consume them, and two
environments on two vhosts of one broker.

    python docs/examples/events_beds.py [amqp://guest:guest@localhost:5672] [prod] [qa]

The vhosts must exist (``rabbitmqctl add_vhost prod``; ``set_permissions -p prod guest
".*" ".*" ".*"``).  Each environment starts its services, publishes one event per routing
key, and checks that its services received exactly its own events.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from contextlib import AsyncExitStack
from urllib.parse import quote

import anyio
import msgspec

import ojs_anyio as ojs
from ojs_anyio import events

EXCHANGE = "beds.events"
#: ``{store_type}.{operation}``, plus the log, admin and migration keys.
ROUTING_KEYS = (
    "rec.read", "rec.write", "rec.obj",
    "rel.read", "rel.write", "rel.obj",
    "log", "adm", "mig",
)  # fmt: skip
#: Each service ("broker" in BEDS) and the queues it consumes, named after their routing key.
SERVICES = {
    "rBroker": ("rec.read", "rel.read"),  # one service bound to both read keys
    "wBroker": ("rec.write", "rel.write"),
    "mBroker": ("rec.obj", "rel.obj"),
    "adminBrokerIn": ("adm",),
    "adminLogsBroker": ("log",),  # the log consumer: only the admin node persists logs
    "whBroker": ("mig",),
}


#: BEDS sizes its log queue generously and relies on "nothing is lost until the queue
#: fills": a million events, and then the publisher is refused (events.QueueFullError)
#: instead of the oldest logs being dropped.
LOG_QUEUE = ojs.QueueOptions(max_length=1_000_000, overflow="reject-publish", max_priority=None)


class DataEvent(msgspec.Struct):
    env: str
    routing_key: str
    record: dict[str, str] = {}


def catalog(tag: str = "prod_") -> events.Catalog:
    """The environment's event API, for its AsyncAPI document
    (``ojs-anyio events asyncapi docs.examples.events_beds:CATALOG``)."""
    api = events.Catalog(
        "BEDS data events",
        version="1.0.0",
        exchange=EXCHANGE,
        queue_tag=tag,
        description="Store operations, logs, admin and migration events of one BEDS environment.",
    )
    for key in ROUTING_KEYS:
        api.publishes(key, DataEvent, summary=f"A {key} event")
    for name, keys in SERVICES.items():
        for key in keys:
            api.subscribes(key, DataEvent, summary=f"{name} consumes {key}")
    return api


CATALOG = catalog()


async def run_environment(url: str, tag: str) -> dict[str, list[DataEvent]]:
    """Start the services of one environment, publish one event per key, return who got what."""
    received: dict[str, list[DataEvent]] = defaultdict(list)
    all_in = anyio.Event()

    def service(name: str) -> events.Handler:
        async def handle(event: DataEvent, ctx: events.EventContext) -> None:
            received[name].append(event)
            if sum(map(len, received.values())) == len(ROUTING_KEYS):
                all_in.set()

        return handle

    async with events.connect(url, exchange=EXCHANGE, queue_tag=tag) as bus, AsyncExitStack() as stack:
        # Each service declares its own queues as it starts: a queue's presence = "service ready".
        for name, keys in SERVICES.items():
            for key in keys:
                options = LOG_QUEUE if key == "log" else None
                await stack.enter_async_context(bus.subscribe(key, service(name), queue=options))
        env = tag.rstrip("_")
        await bus.publish_many((key, DataEvent(env, key)) for key in ROUTING_KEYS)
        with anyio.fail_after(30):
            await all_in.wait()
        print(f"{env}: queues " + ", ".join(bus.queue_name(k) for k in ROUTING_KEYS))
    return dict(received)


async def main(base_url: str, prod_vhost: str, qa_vhost: str) -> dict[str, dict[str, list[DataEvent]]]:
    urls = {"prod_": f"{base_url.rstrip('/')}/{quote(prod_vhost, safe='')}",
            "qa_": f"{base_url.rstrip('/')}/{quote(qa_vhost, safe='')}"}  # fmt: skip
    results: dict[str, dict[str, list[DataEvent]]] = {}

    async def one(tag: str) -> None:
        results[tag] = await run_environment(urls[tag], tag)

    async with anyio.create_task_group() as tg:  # both environments at once, one broker
        for tag in urls:
            tg.start_soon(one, tag)
    for tag, by_service in results.items():
        envs = {e.env for got in by_service.values() for e in got}
        for name, got in sorted(by_service.items()):
            print(f"  {tag}{name}: {sorted(e.routing_key for e in got)}")
        print(f"{tag}: {sum(map(len, by_service.values()))} events, environments seen: {sorted(envs)}")
    return results


if __name__ == "__main__":
    defaults = ["amqp://guest:guest@localhost:5672", "prod", "qa"]
    base, prod, qa = (sys.argv[1:] + defaults[len(sys.argv) - 1 :])[:3]
    anyio.run(main, base, prod, qa)
