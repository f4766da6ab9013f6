"""``events.Catalog``: an event API declared once, served on a bus, and its AsyncAPI 3.0
document validated against the official JSON Schema (scripts/ensure-asyncapi-schema)."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import json
import os
from pathlib import Path
from typing import Any

import msgspec
import pytest
from support.waits import Seen

from ojs_anyio import amqp, events

from .bus_support import Names

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = Path(os.environ.get("OJS_ASYNCAPI_SCHEMA", Path.home() / ".cache/ojs-anyio/asyncapi-3.0.0.json"))


@pytest.fixture(scope="module")
def validator() -> Any:
    jsonschema = pytest.importorskip("jsonschema")
    if not SCHEMA.is_file():
        pytest.skip(
            f"no AsyncAPI 3.0.0 schema at {SCHEMA}: scripts/ensure-asyncapi-schema could not fetch it"
        )
    return jsonschema.Draft7Validator(json.loads(SCHEMA.read_text()))


class RecordRead(msgspec.Struct):
    store: str
    id: int


@dataclasses.dataclass
class Deleted:
    id: int
    reason: str = ""


def _errors(validator: Any, document: dict[str, Any]) -> list[str]:
    return [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(document)]


def test_the_beds_recipe_document_is_valid_asyncapi_3(validator: Any) -> None:
    beds = importlib.import_module("docs.examples.events_beds")
    document = beds.CATALOG.asyncapi("amqp://guest:s3cret@rabbit.internal:5672/prod")
    assert _errors(validator, document) == []
    assert document["asyncapi"] == "3.0.0"
    assert "s3cret" not in json.dumps(document)
    assert document["servers"]["broker"] | {} == {
        "host": "rabbit.internal:5672", "protocol": "amqp", "protocolVersion": "0.9.1", "pathname": "/prod",
    }  # fmt: skip
    channels, operations = document["channels"], document["operations"]
    # one channel per published key (on the exchange) and one per consumed queue
    assert {c["address"] for c in channels.values()} >= {*beds.ROUTING_KEYS, "prod_rec.read", "prod_mig"}
    assert channels["rec.read"]["bindings"]["amqp"]["exchange"]["name"] == "beds.events"
    assert channels["prod_rec.read"]["bindings"]["amqp"]["queue"]["name"] == "prod_rec.read"
    assert {op["action"] for op in operations.values()} == {"send", "receive"}
    payload = document["components"]["schemas"]["DataEvent"]
    assert set(payload["properties"]) == {"env", "routing_key", "record"}


def test_payload_types_of_every_kind_and_a_broken_document_fails(validator: Any) -> None:
    catalog = events.Catalog("Orders", exchange="orders.events", queue_tag="t_")
    catalog.publishes("order.read", RecordRead, summary="A read")
    catalog.publishes("order.deleted", Deleted)
    catalog.publishes("order.blob", bytes)
    catalog.publishes("order.any")

    @catalog.subscriber("audit", bindings=["order.*"])
    async def audit(event: RecordRead) -> None:
        """Audit every order event."""

    catalog.subscribes("counts", list[int], bindings=["order.count"])
    document = catalog.asyncapi()
    assert _errors(validator, document) == []
    messages = document["components"]["messages"]
    assert set(messages) == {"RecordRead", "Deleted", "BinaryEvent", "JsonEvent", "ListInt"}
    assert document["components"]["schemas"]["ListIntPayload"] == {
        "type": "array",
        "items": {"type": "integer"},
    }
    assert messages["BinaryEvent"]["contentType"] == "application/octet-stream"
    assert document["components"]["schemas"]["Deleted"]["required"] == ["id"]
    assert document["operations"]["receiveAudit"]["summary"] == "Audit every order event."
    broken = copy.deepcopy(document)
    broken["operations"]["receiveAudit"]["action"] = "consume"
    assert _errors(validator, broken)


def test_misuse_gets_one_clear_error() -> None:
    catalog = events.Catalog("x")
    with pytest.raises(amqp.UsageError, match="no wildcards"):
        catalog.publishes("order.*", RecordRead)
    catalog.publishes("order.read", RecordRead)
    with pytest.raises(amqp.UsageError, match="already in the catalog"):
        catalog.publishes("order.read", RecordRead)
    with pytest.raises(amqp.UsageError, match="not one string"):
        catalog.subscribes("q", bindings="order.*")
    with pytest.raises(amqp.UsageError, match="reserved"):
        events.Catalog("x", exchange="amq.topic")
    with pytest.raises(amqp.UsageError, match="reserved"):
        events.Catalog("x", queue_tag="ojs.").subscribes("q")


@pytest.mark.anyio
async def test_serve_runs_every_registered_subscriber(names: Names) -> None:
    url = names.url
    catalog = events.Catalog("Orders", exchange=names.exchange, queue_tag=names.tag)
    seen = Seen()

    @catalog.subscriber(names.sub("audit"), bindings=["order.*"])
    async def audit(event: RecordRead, ctx: events.EventContext) -> None:
        seen.add((ctx.routing_key, event.id))

    async with events.connect(url, **catalog.bus_options()) as bus, catalog.serve(bus):
        await bus.publish("order.read", RecordRead("mongo", 7))
        await seen.wait(1)
    with pytest.raises(amqp.UsageError, match="not the catalog's"):
        async with events.connect(url, exchange=names.exchange) as bus, catalog.serve(bus):
            pass
    assert seen.items == [("order.read", 7)]
