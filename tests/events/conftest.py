"""Fixtures for the event bus tests (``tests/events``): fresh names, cleanup, fresh vhosts.

* ``names``: a fresh exchange and queue tag per test; ``names.sub(name)`` registers a
  subscription whose queue, dead-letter queue and wait queues are deleted after the test
  (the exchange too).
* ``vhosts(n)``: ``n`` fresh vhosts (guest has full rights), deleted after the test; returns
  their URLs.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import anyio
import pytest
from harness.broker import rabbitmqctl_sync

from .support import Names, vhost_url


@pytest.fixture
async def names() -> AsyncIterator[Names]:
    n = Names()
    try:
        yield n
    finally:
        with anyio.CancelScope(shield=True), anyio.fail_after(30):
            await n.cleanup()


@pytest.fixture
def vhosts() -> Iterator[Callable[[int], list[str]]]:
    made: list[str] = []

    def make(n: int) -> list[str]:
        urls = []
        for _ in range(n):
            name = f"ojs-test-ev-{uuid.uuid4().hex[:10]}"
            rabbitmqctl_sync("add_vhost", name)
            made.append(name)
            rabbitmqctl_sync("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
            urls.append(vhost_url(name))
        return urls

    try:
        yield make
    finally:
        for name in made:
            rabbitmqctl_sync("delete_vhost", name)
