"""What an event API publishes and consumes, declared once: :class:`Catalog`, and its AsyncAPI
3.0 document.

::

    catalog = events.Catalog("BEDS events", version="1.0.0", exchange="beds.events", queue_tag="prod_")
    catalog.publishes("rec.read", RecordRead, summary="A record was read")

    @catalog.subscriber("rec.audit", bindings=["rec.*", "rel.*"])
    async def audit(event: RecordRead) -> None: ...

    async with events.connect(url, **catalog.bus_options()) as bus, catalog.serve(bus):
        ...                                       # every registered subscriber consumes

    document = catalog.asyncapi(url)              # or: ojs-anyio events asyncapi app:catalog

The document follows AsyncAPI 3.0.0 with the AMQP bindings 0.3.0: one channel per routing
key the API publishes (on the topic exchange) and one per subscription queue (with the
patterns it binds), a ``send`` operation per published key, a ``receive`` operation per
subscription, and the payload schemas msgspec derives from the types (Structs,
dataclasses, TypedDicts...).  No I/O: building the document touches no broker.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Any

import msgspec

from .. import amqp
from .._misuse import ArgumentTypeError
from ._wire import CONTENT_BYTES, CONTENT_JSON

if TYPE_CHECKING:
    from ._bus import EventBus
    from ._subscriber import Handler

__all__ = ["ASYNCAPI_VERSION", "Catalog"]

ASYNCAPI_VERSION = "3.0.0"
_AMQP_BINDING = "0.3.0"
#: AsyncAPI's pattern for component and map keys.
_KEY = re.compile(r"[^A-Za-z0-9._-]")


class _Published(msgspec.Struct, frozen=True):
    routing_key: str
    payload: Any
    summary: str | None


class _Subscribed(msgspec.Struct, frozen=True):
    name: str
    bindings: tuple[str, ...]
    payload: Any
    summary: str | None
    handler: Any  # Handler | None
    options: dict[str, Any]


def _payload_of(handler: Callable[..., Any]) -> Any:
    """The annotation of the handler's first parameter (the payload), or None."""
    try:
        first = next(iter(inspect.signature(handler).parameters))
        return typing.get_type_hints(handler).get(first)
    except Exception:  # no parameters, or annotations that do not resolve
        return None


def _key(text: str) -> str:
    return _KEY.sub("_", text) or "_"


def _camel(text: str) -> str:
    parts = [p for p in re.split(r"[^A-Za-z0-9]+", text) if p]
    return "".join(p[:1].upper() + p[1:] for p in parts) or "Event"


class Catalog:
    """An event API: its exchange, the events it publishes and the subscriptions it runs.

    ``exchange`` and ``queue_tag`` are the bus's (:meth:`bus_options` hands them to
    ``events.connect``).  Payload types are whatever msgspec can describe (Structs,
    dataclasses, TypedDicts, ``list[int]``...); ``bytes`` is an opaque binary payload and
    ``None`` any JSON.
    """

    def __init__(
        self,
        title: str,
        *,
        version: str = "1.0.0",
        exchange: str = "events",
        queue_tag: str = "",
        description: str | None = None,
    ) -> None:
        from ._bus import check_bus_name

        check_bus_name("exchange", exchange)
        self.title = title
        self.version = version
        self.exchange = exchange
        self.queue_tag = queue_tag
        self.description = description
        self._published: dict[str, _Published] = {}
        self._subscribed: dict[str, _Subscribed] = {}

    def __repr__(self) -> str:
        return f"<Catalog {self.title!r} exchange={self.exchange!r} queue_tag={self.queue_tag!r}>"

    # ------------------------------------------------------------------ declaring

    def publishes(self, routing_key: str, payload: Any = None, *, summary: str | None = None) -> None:
        """The API publishes events with ``routing_key`` carrying ``payload``."""
        if not routing_key or "*" in routing_key or "#" in routing_key:
            raise amqp.UsageError(f"a published routing key is literal (no wildcards): {routing_key!r}")
        if routing_key in self._published:
            raise amqp.UsageError(f"routing key {routing_key!r} is already in the catalog")
        self._published[routing_key] = _Published(routing_key, payload, summary)

    def subscribes(
        self,
        name: str,
        payload: Any = None,
        *,
        bindings: Iterable[str] | None = None,
        summary: str | None = None,
        handler: Handler | None = None,
        **subscribe_options: Any,
    ) -> None:
        """The API consumes subscription ``name`` (queue ``{queue_tag}{name}``, bound with
        ``bindings``, default ``[name]``); with a ``handler``, :meth:`serve` runs it with
        ``subscribe_options`` (``concurrency``, ``redelivery``...)."""
        from ._bus import check_bus_name

        check_bus_name("queue", f"{self.queue_tag}{name}")
        if isinstance(bindings, str):
            raise ArgumentTypeError("bindings is a list of patterns, not one string")
        if name in self._subscribed:
            raise amqp.UsageError(f"subscription {name!r} is already in the catalog")
        patterns = (name,) if bindings is None else tuple(bindings)
        self._subscribed[name] = _Subscribed(name, patterns, payload, summary, handler, subscribe_options)

    def subscriber(
        self, name: str, *, bindings: Iterable[str] | None = None, summary: str | None = None, **options: Any
    ) -> Callable[[Handler], Handler]:
        """Decorator: :meth:`subscribes` with this handler; its first parameter's annotation
        is the payload type (``summary`` defaults to its docstring's first line)."""

        def register(handler: Handler) -> Handler:
            doc = inspect.getdoc(handler)
            self.subscribes(
                name,
                _payload_of(handler),
                bindings=bindings,
                summary=summary or (doc.splitlines()[0] if doc else None),
                handler=handler,
                **options,
            )
            return handler

        return register

    # ------------------------------------------------------------------ running

    def bus_options(self) -> dict[str, Any]:
        """``events.connect(url, **catalog.bus_options())``: the exchange and queue tag."""
        return {"exchange": self.exchange, "queue_tag": self.queue_tag}

    @asynccontextmanager
    async def serve(self, bus: EventBus) -> AsyncIterator[None]:
        """Subscribe every subscription registered with a handler, for the block."""
        if (bus.exchange, bus.queue_tag) != (self.exchange, self.queue_tag):
            raise amqp.UsageError(
                f"the bus ({bus.exchange!r}, tag {bus.queue_tag!r}) is not the catalog's "
                f"({self.exchange!r}, tag {self.queue_tag!r}): connect with **catalog.bus_options()"
            )
        async with AsyncExitStack() as stack:
            for sub in self._subscribed.values():
                if sub.handler is not None:
                    await stack.enter_async_context(
                        bus.subscribe(sub.name, sub.handler, bindings=list(sub.bindings), **sub.options)
                    )
            yield

    # ------------------------------------------------------------------ AsyncAPI

    def asyncapi(self, url: str | None = None) -> dict[str, Any]:
        """The AsyncAPI 3.0.0 document of this API (a dict, ready for ``json.dumps``).
        ``url``: the broker, shown as the server (no password); default localhost."""
        parsed = amqp.parse_url(url or "amqp://localhost:5672/")
        vhost = parsed.virtual_host
        types = [p.payload for p in self._published.values()] + [s.payload for s in self._subscribed.values()]
        messages, schemas = _messages(types)
        channels: dict[str, Any] = {}
        operations: dict[str, Any] = {}
        exchange = {
            "name": self.exchange, "type": "topic", "durable": True, "autoDelete": False, "vhost": vhost,
        }  # fmt: skip
        for pub in self._published.values():
            key, message = _key(pub.routing_key), messages[id(pub.payload)]
            channels[key] = {
                "address": pub.routing_key,
                "messages": {message: {"$ref": f"#/components/messages/{message}"}},
                "bindings": {
                    "amqp": {"is": "routingKey", "exchange": exchange, "bindingVersion": _AMQP_BINDING}
                },
            }
            operations[f"publish{_camel(pub.routing_key)}"] = {
                "action": "send",
                "channel": {"$ref": f"#/channels/{key}"},
                "messages": [{"$ref": f"#/channels/{key}/messages/{message}"}],
                **({"summary": pub.summary} if pub.summary else {}),
                "bindings": {
                    "amqp": {
                        "deliveryMode": 2,
                        "mandatory": True,
                        "timestamp": True,
                        "bindingVersion": _AMQP_BINDING,
                    }
                },
            }
        for sub in self._subscribed.values():
            queue = f"{self.queue_tag}{sub.name}"
            key, message = _key(queue), messages[id(sub.payload)]
            channels[key] = {
                "address": queue,
                "description": (
                    f"Queue {queue}, bound to exchange {self.exchange} with "
                    f"{', '.join(sub.bindings)}; dead letters in {queue}.dlq."
                ),
                "messages": {message: {"$ref": f"#/components/messages/{message}"}},
                "bindings": {
                    "amqp": {
                        "is": "queue",
                        "queue": {
                            "name": queue,
                            "durable": True,
                            "exclusive": False,
                            "autoDelete": False,
                            "vhost": vhost,
                        },
                        "bindingVersion": _AMQP_BINDING,
                    }
                },
            }
            operations[f"receive{_camel(sub.name)}"] = {
                "action": "receive",
                "channel": {"$ref": f"#/channels/{key}"},
                "messages": [{"$ref": f"#/channels/{key}/messages/{message}"}],
                **({"summary": sub.summary} if sub.summary else {}),
                "bindings": {"amqp": {"ack": True, "bindingVersion": _AMQP_BINDING}},
            }
        info: dict[str, Any] = {"title": self.title, "version": self.version}
        if self.description:
            info["description"] = self.description
        return {
            "asyncapi": ASYNCAPI_VERSION,
            "info": info,
            "defaultContentType": CONTENT_JSON,
            "servers": {
                "broker": {
                    "host": f"{parsed.host}:{parsed.port}",
                    "protocol": "amqps" if parsed.scheme == "amqps" else "amqp",
                    "protocolVersion": "0.9.1",
                    "pathname": "/" + vhost.lstrip("/") if vhost != "/" else "/",
                }
            },
            "channels": channels,
            "operations": operations,
            "components": {"messages": dict(_message_bodies(types, messages, schemas)), "schemas": schemas},
        }


def _type_name(payload: Any) -> str:
    if payload is None:
        return "JsonEvent"
    if payload is bytes:
        return "BinaryEvent"
    if typing.get_origin(payload) is not None:  # list[int], dict[str, Order]...
        return _camel(repr(payload).replace("typing.", ""))
    return _key(getattr(payload, "__name__", None) or _camel(repr(payload)))


def _messages(types: Sequence[Any]) -> tuple[dict[int, str], dict[str, Any]]:
    """A message name per payload type (by identity) and the JSON schemas of the types."""
    names: dict[int, str] = {}
    taken: dict[str, int] = {}
    typed = []
    for payload in types:
        if id(payload) in names:
            continue
        base = _type_name(payload)
        name, n = base, 2
        while name in taken and taken[name] != id(payload):
            name, n = f"{base}{n}", n + 1
        taken[name] = id(payload)
        names[id(payload)] = name
        if payload is not None and payload is not bytes:
            typed.append(payload)
    schemas: dict[str, Any] = {}
    if typed:
        refs, components = msgspec.json.schema_components(typed, ref_template="#/components/schemas/{name}")
        schemas.update(components)
        for payload, ref in zip(typed, refs, strict=True):
            if "$ref" not in ref:  # not a named component (list[int], dict...): name it here
                schemas[f"{names[id(payload)]}Payload"] = ref
    return names, schemas


def _message_bodies(
    types: Sequence[Any], names: dict[int, str], schemas: dict[str, Any]
) -> Iterable[tuple[str, dict[str, Any]]]:
    seen: set[str] = set()
    for payload in types:
        name = names[id(payload)]
        if name in seen:
            continue
        seen.add(name)
        body: dict[str, Any] = {"name": name}
        if payload is bytes:
            body |= {"contentType": CONTENT_BYTES, "payload": {"type": "string", "format": "binary"}}
        elif payload is None:
            body |= {"contentType": CONTENT_JSON, "payload": {}}
        else:
            component = None if typing.get_origin(payload) is not None else getattr(payload, "__name__", None)
            if component in schemas:
                body |= {
                    "contentType": CONTENT_JSON,
                    "payload": {"$ref": f"#/components/schemas/{component}"},
                }
            else:
                body |= {
                    "contentType": CONTENT_JSON,
                    "payload": {"$ref": f"#/components/schemas/{name}Payload"},
                }
        yield name, body
