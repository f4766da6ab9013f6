"""Event-bus middleware (issue 25): ``events.Middleware`` around publishing and handling,
on the chains the job layer's middleware uses (``ojs_anyio._pipeline``).

* ``around_publish`` sees and replaces the outgoing event (a header, a payload field), and
  a raise refuses it; ``publish_many`` and windows pass through it too;
* ``around_handler`` sees the typed payload and the handler's result; a raise is the
  handler's failure: redelivered, then dead-lettered with its reason;
* the first middleware is the outermost, and the bus's wrap a subscription's own;
* a bus without middleware (or with hooks left alone) publishes and handles as before;
* a ``middleware=`` that is not a list of ``events.Middleware`` instances is refused.

RabbitMQ and memory://, asyncio and Trio.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import msgspec
import pytest
from support.waits import Seen

import ojs_anyio as ojs
from ojs_anyio import events

from .bus_support import Names, dead_letter

pytestmark = pytest.mark.anyio

PublishNext = Callable[[events.OutgoingEvent], Awaitable[events.OutgoingEvent]]
FAST = events.RedeliveryPolicy(initial_interval=0.05, multiplier=2.0, max_interval=0.2, max_attempts=2)


@dataclasses.dataclass
class Reading:
    sensor: str
    value: float
    source: str = ""


class Stamp(events.Middleware):
    """Adds a header and a payload field to every outgoing event."""

    async def around_publish(
        self, event: events.OutgoingEvent, call_next: PublishNext
    ) -> events.OutgoingEvent:
        headers = {**(event.headers or {}), "x-origin": "web"}
        payload = {**event.payload, "source": "stamped"}
        return await call_next(msgspec.structs.replace(event, headers=headers, payload=payload))


class Trace(events.Middleware):
    """Records the order in which the hooks run, under ``name``."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name
        self.log = log

    async def around_publish(
        self, event: events.OutgoingEvent, call_next: PublishNext
    ) -> events.OutgoingEvent:
        self.log.append(f"publish>{self.name}")
        sent = await call_next(event)
        self.log.append(f"publish<{self.name}")
        return sent

    async def around_handler(self, ctx: events.EventContext, call_next: Any) -> Any:
        self.log.append(f"handler>{self.name}")
        result = await call_next()
        self.log.append(f"handler<{self.name}")
        return result



async def test_around_publish_adds_a_header_and_a_field_the_handler_sees(names: Names) -> None:
    seen = Seen()

    async def on_reading(reading: Reading, ctx: events.EventContext) -> None:
        seen.add((reading, ctx.headers.get("x-origin"), ctx.headers.get("x-caller")))

    async with (
        events.connect(names.url, middleware=[Stamp()], **names.bus_options()) as bus,
        bus.subscribe(names.sub("readings"), on_reading),
    ):
        mid = await bus.publish("readings", {"sensor": "t1", "value": 20.5}, headers={"x-caller": "test"})
        await seen.wait(1)
    [(reading, origin, caller)] = seen.items
    assert reading == Reading(sensor="t1", value=20.5, source="stamped")
    assert (origin, caller) == ("web", "test")
    assert mid  # the event's id, as the middleware saw it sent


async def test_publish_many_and_windows_pass_through_around_publish(names: Names) -> None:
    seen = Seen()

    async def on_reading(reading: Reading) -> None:
        seen.add(reading.source)

    async with (
        events.connect(names.url, middleware=[Stamp()], **names.bus_options()) as bus,
        bus.subscribe(names.sub("many"), on_reading),
    ):
        await bus.publish_many(
            [("many", {"sensor": "a", "value": 1.0}), ("many", {"sensor": "b", "value": 2.0})]
        )
        window = bus.publish_window()
        handle = await window.publish("many", {"sensor": "c", "value": 3.0})
        assert await window.wait_all() == []
        assert handle.message_id
        await seen.wait(3)
    assert seen.items == ["stamped"] * 3


async def test_a_raise_in_around_publish_refuses_the_event(names: Names) -> None:
    class NoTests(events.Middleware):
        async def around_publish(
            self, event: events.OutgoingEvent, call_next: PublishNext
        ) -> events.OutgoingEvent:
            if event.routing_key.startswith("test."):
                raise PermissionError(f"{event.routing_key} is not published from here")
            return await call_next(event)

    seen = Seen()

    async def handler(payload: dict[str, Any], ctx: events.EventContext) -> None:
        seen.add(ctx.routing_key)

    async with (
        events.connect(names.url, middleware=[NoTests()], **names.bus_options()) as bus,
        bus.subscribe(names.sub("guarded"), handler, bindings=["#"]),
    ):
        with pytest.raises(PermissionError, match=r"test\.x is not published"):
            await bus.publish("test.x", {"n": 1})
        await bus.publish("real.x", {"n": 2})
        await seen.wait(1)
    assert seen.items == ["real.x"]  # the refused event never went out


async def test_around_handler_sees_the_typed_payload_and_the_result(names: Names) -> None:
    seen = Seen()

    class Observe(events.Middleware):
        async def around_handler(self, ctx: events.EventContext, call_next: Any) -> Any:
            payload = ctx.payload
            result = await call_next()
            seen.add((payload, result, ctx.routing_key, ctx.attempt))
            return result

    def on_reading(reading: Reading) -> float:  # a plain def (it runs in a thread), no ctx
        return reading.value * 2

    async with (
        events.connect(names.url, **names.bus_options()) as bus,
        bus.subscribe(names.sub("typed"), on_reading, middleware=[Observe()]) as sub,
    ):
        await bus.publish("typed", {"sensor": "t1", "value": 4.0})
        await seen.wait(1)
    assert seen.items == [(Reading(sensor="t1", value=4.0), 8.0, "typed", 1)]
    assert sub.handled == 1


async def test_a_raise_in_around_handler_is_redelivered_then_dead_lettered_with_its_reason(
    names: Names,
) -> None:
    calls: list[int] = []

    class Gate(events.Middleware):
        async def around_handler(self, ctx: events.EventContext, call_next: Any) -> Any:
            raise PermissionError(f"tenant of {ctx.message_id} is suspended")

    async def handler(payload: dict[str, Any]) -> None:
        calls.append(1)  # never reached: the middleware refuses every attempt

    outcomes = Seen()
    async with (
        events.connect(names.url, middleware=[Gate()], **names.bus_options()) as bus,
        bus.subscribe(names.sub("gated"), handler, redelivery=FAST) as sub,
    ):
        sub.add_listener(lambda outcome, _msg: outcomes.add(outcome))
        mid = await bus.publish("gated", {"n": 1})
        await outcomes.wait(3)
        dead = await dead_letter(names, sub)
    assert calls == []
    assert outcomes.items == ["redelivered", "redelivered", "dead_lettered"]
    headers = dead.properties.headers or {}
    assert headers[events.H_REASON] == "max_attempts"
    assert f"PermissionError: tenant of {mid} is suspended" in headers[events.H_ERROR]
    assert headers[events.H_ATTEMPT] == 3


async def test_dead_letter_raised_in_around_handler_dead_letters_at_once(names: Names) -> None:
    class Reject(events.Middleware):
        async def around_handler(self, ctx: events.EventContext, call_next: Any) -> Any:
            raise events.DeadLetter("no schema for this event")

    async def handler(payload: dict[str, Any]) -> None:
        raise AssertionError("not reached")

    outcomes = Seen()
    async with (
        events.connect(names.url, **names.bus_options()) as bus,
        bus.subscribe(names.sub("rejected"), handler, middleware=[Reject()]) as sub,
    ):
        sub.add_listener(lambda outcome, _msg: outcomes.add(outcome))
        await bus.publish("rejected", {"n": 1})
        await outcomes.wait(1)
        dead = await dead_letter(names, sub)
    assert outcomes.items == ["dead_lettered"]
    headers = dead.properties.headers or {}
    assert headers[events.H_REASON] == "rejected"
    assert "no schema for this event" in headers[events.H_ERROR]


async def test_the_first_middleware_is_the_outermost_and_the_bus_wraps_the_subscription(
    names: Names,
) -> None:
    log: list[str] = []
    done = anyio.Event()

    async def handler(payload: dict[str, Any]) -> None:
        log.append("handler")

    class Done(events.Middleware):
        async def around_handler(self, ctx: events.EventContext, call_next: Any) -> Any:
            try:
                return await call_next()
            finally:
                done.set()

    bus_mw = [Done(), Trace("a", log), Trace("b", log)]
    async with (
        events.connect(names.url, middleware=bus_mw, **names.bus_options()) as bus,
        bus.subscribe(names.sub("ordered"), handler, middleware=[Trace("s", log)]),
    ):
        await bus.publish("ordered", {"n": 1})
        with anyio.fail_after(20):
            await done.wait()
    # The handler may run before the publish's confirm is back: each chain in its own order.
    assert [entry for entry in log if entry.startswith("publish")] == [
        "publish>a", "publish>b", "publish<b", "publish<a",
    ]  # fmt: skip
    assert [entry for entry in log if not entry.startswith("publish")] == [
        "handler>a", "handler>b", "handler>s", "handler", "handler<s", "handler<b", "handler<a",
    ]  # fmt: skip


async def test_no_middleware_or_hooks_left_alone_change_nothing(names: Names) -> None:
    seen = Seen()

    async def handler(payload: dict[str, Any], ctx: events.EventContext) -> None:
        seen.add((payload, dict(ctx.headers), ctx.payload))

    for middleware in (None, [events.Middleware()]):
        async with (
            events.connect(names.url, middleware=middleware, **names.bus_options()) as bus,
            bus.subscribe(names.sub("plain"), handler) as sub,
        ):
            mid = await bus.publish("plain", {"n": 1}, headers={"x-a": 1}, message_id="fixed-id")
            await seen.wait(1)
        assert mid == "fixed-id"
        assert sub.handled == 1
        [(payload, headers, ctx_payload)] = seen.items
        assert payload == ctx_payload == {"n": 1}
        assert headers.get("x-a") == 1
        seen.items.clear()


async def test_middleware_arguments_are_checked(names: Names) -> None:
    with pytest.raises(ojs.ArgumentTypeError, match=r"list of ojs_anyio\.events\.Middleware"):
        events.EventBus(names.url, middleware=events.Middleware())  # type: ignore[arg-type]
    with pytest.raises(ojs.ArgumentTypeError, match=r"\(an instance, not the class\)"):
        events.EventBus(names.url, middleware=[events.Middleware])  # type: ignore[list-item]
    with pytest.raises(ojs.ArgumentTypeError, match=r"ojs_anyio\.events\.Middleware instances"):
        events.EventBus(names.url, middleware=[ojs.Middleware()])  # type: ignore[list-item]

    async def handler(payload: dict[str, Any]) -> None: ...

    async with events.connect(names.url, **names.bus_options()) as bus:
        with pytest.raises(ojs.ArgumentTypeError, match=r"ojs_anyio\.events\.Middleware instances"):
            async with bus.subscribe(names.sub("checked"), handler, middleware=[ojs.Middleware()]):  # type: ignore[list-item]
                pass
