"""docs/events.md, "Middleware": a tenant travels with every event.

``around_publish`` stamps the current tenant on each outgoing event as a header;
``around_handler`` restores it around the handler (and refuses an event without one: the
refusal is the handler's failure, so the event ends in the dead-letter queue with the
reason).  Run it: ``python docs/examples/events_middleware.py [URL]`` (default memory://).
"""

from __future__ import annotations

import contextvars
import sys
import time
from typing import Any

import anyio
import msgspec

from ojs_anyio import events

tenant: contextvars.ContextVar[str | None] = contextvars.ContextVar("tenant", default=None)


class TenantMiddleware(events.Middleware):
    def __init__(self) -> None:
        self.timings: list[tuple[str, float]] = []

    async def around_publish(self, event: Any, call_next: Any) -> Any:
        current = tenant.get()
        if current is not None:
            event = msgspec.structs.replace(event, headers={**(event.headers or {}), "x-tenant": current})
        return await call_next(event)

    async def around_handler(self, ctx: events.EventContext, call_next: Any) -> Any:
        name = ctx.headers.get("x-tenant")
        if name is None:
            raise PermissionError("event without a tenant")
        token = tenant.set(name)
        started = time.perf_counter()
        try:
            return await call_next()
        finally:
            tenant.reset(token)
            self.timings.append((ctx.routing_key, time.perf_counter() - started))


class Invoice(msgspec.Struct):
    number: int
    total: float


async def main(url: str = "memory://", exchange: str = "shop", queue_tag: str = "") -> dict[str, Any]:
    seen: list[tuple[int, str | None]] = []
    done = anyio.Event()

    async def on_invoice(invoice: Invoice) -> None:
        seen.append((invoice.number, tenant.get()))  # the publisher's tenant, restored
        if len(seen) == 2:
            done.set()

    middleware = TenantMiddleware()
    policy = events.RedeliveryPolicy(initial_interval=0.05, max_interval=0.05, max_attempts=1)
    async with (
        events.connect(url, exchange=exchange, queue_tag=queue_tag, middleware=[middleware]) as bus,
        bus.subscribe("invoice.issued", on_invoice, redelivery=policy) as sub,
    ):
        dead_lettered = anyio.Event()
        sub.add_listener(lambda outcome, _msg: dead_lettered.set() if outcome == "dead_lettered" else None)
        for number, name in ((1, "acme"), (2, "globex")):
            token = tenant.set(name)
            try:
                await bus.publish("invoice.issued", Invoice(number=number, total=9.5))
            finally:
                tenant.reset(token)
        await bus.publish("invoice.issued", Invoice(number=3, total=1.0))  # no tenant: refused
        with anyio.fail_after(20):
            await done.wait()
            await dead_lettered.wait()  # the refused event: two attempts, then the DLQ
        dead = await bus.dead_letters("invoice.issued").peek()
        await bus.dead_letters("invoice.issued").purge()
    return {
        "seen": sorted(seen),
        "timed": len(middleware.timings),
        "dead_error": dead[0].error,
        "handled": sub.handled,
    }


if __name__ == "__main__":
    print(anyio.run(main, *sys.argv[1:2]))
