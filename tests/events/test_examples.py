"""The recipes of docs/events.md run as documented, each on fresh vhosts."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from urllib.parse import unquote, urlsplit

import pytest

from .bus_support import Names, take

pytestmark = pytest.mark.anyio

EXAMPLES = Path(__file__).parents[2] / "docs" / "examples"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def vhost_of(url: str) -> str:
    return unquote(urlsplit(url).path[1:])


async def test_beds_recipe(
    rabbitmq_url: str, vhosts: Callable[[int], list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    beds = load("events_beds")
    prod, qa = vhosts(2)
    results = await beds.main(rabbitmq_url, vhost_of(prod), vhost_of(qa))
    for tag, env in (("prod_", "prod"), ("qa_", "qa")):
        by_service = results[tag]
        got = {name: sorted(e.routing_key for e in evs) for name, evs in by_service.items()}
        assert got == {name: sorted(keys) for name, keys in beds.SERVICES.items()}
        assert {e.env for evs in by_service.values() for e in evs} == {env}  # no cross-talk
    out = capsys.readouterr().out
    assert "prod: queues prod_rec.read, prod_rec.write" in out and "qa_: 9 events" in out


async def test_orb_recipe(vhosts: Callable[[int], list[str]]) -> None:
    orb = load("events_orb")
    url = vhosts(3)[2]
    summary = await orb.main(url, fast=True)
    assert summary["connections"] == 2  # 18 subscribers, at most 10 per connection
    assert summary["observed"] == 50
    assert summary["redelivered"] >= 5 + 3  # the transient failures, and the poison's redeliveries
    assert summary["poison_tries"] == orb.REDELIVERY.max_attempts + 1
    assert summary["dead_lettered"] == 1
    (dead,) = await take(url, "orb.operation.dlq", 1)
    assert (dead.properties.headers or {})["x-event-dead-letter-reason"] == "max_attempts"


async def test_middleware_example(names: Names) -> None:
    example = load("events_middleware")
    name = names.sub("invoice.issued")
    result = await example.main(names.url, names.exchange, names.tag)
    assert name == "invoice.issued"
    assert result == {
        "seen": [(1, "acme"), (2, "globex")],  # each handler ran under its publisher's tenant
        "timed": 2,
        "dead_error": "PermissionError: event without a tenant (after 1 redeliveries)",
        "handled": 2,
    }
