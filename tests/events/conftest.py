"""Fixtures for the event bus tests (``tests/events``): fresh names, cleanup, fresh vhosts.

* ``names``: a fresh exchange and queue tag per test, on the test's broker (``amqp_url``:
  RabbitMQ, then memory://); ``names.sub(name)`` registers a subscription whose queue,
  dead-letter queue and wait queues are deleted after the test (the exchange too).
* ``vhosts(n)``: the URLs of ``n`` RabbitMQ vhosts made for this session (guest has full
  rights), deleted at its end (``rabbitmqctl``: the tests that use it are marked ``broker``).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import anyio
import pytest
from harness.broker import rabbitmqctl_sync
from support.brokers import vhost_url

from .bus_support import Names


@pytest.fixture
async def names(amqp_url: str) -> AsyncIterator[Names]:
    n = Names(amqp_url)
    try:
        yield n
    finally:
        with anyio.CancelScope(shield=True), anyio.fail_after(30):
            await n.cleanup()


@pytest.fixture(scope="session")
def vhosts(rabbitmq_url: str) -> Iterator[Callable[[int], list[str]]]:
    """``vhosts(n)``: the URLs of ``n`` fresh vhosts, made once per session (rabbitmqctl takes
    seconds a call on a loaded machine) and deleted at its end.  Tests on them use their
    own names, or names a rerun may find again (durable, empty queues)."""
    made: list[str] = []

    def make(n: int) -> list[str]:
        while len(made) < n:
            name = f"ojs-test-ev-{uuid.uuid4().hex[:10]}"
            rabbitmqctl_sync("add_vhost", name)
            made.append(name)
            rabbitmqctl_sync("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
        return [vhost_url(name, rabbitmq_url) for name in made[:n]]

    try:
        yield make
    finally:
        for name in made:
            rabbitmqctl_sync("delete_vhost", name)
