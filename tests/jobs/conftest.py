"""Fixtures of the job layer's tests (the shared ones, ``cleanup``, ``new_queue``,
``ojs_vhost``, ``spec_queue`` and ``broker_url``, are in ``support/fixtures.py``).

* ``q``: a fresh OJS queue name (``new_queue()``), deleted with all its queues after the test.
* ``client``: ``ojs.connect()`` to the test broker; ``raw``: a plain AMQP connection
  (``ojs_anyio.amqp``) to check broker-side truth.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

import ojs_anyio as ojs
from ojs_anyio import amqp


@pytest.fixture
def q(new_queue: Callable[..., str]) -> str:
    return new_queue()


@pytest.fixture
async def client(broker_url: str) -> AsyncIterator[ojs.Client]:
    async with ojs.connect(broker_url) as c:
        yield c


@pytest.fixture
async def raw(broker_url: str) -> AsyncIterator[amqp.Connection]:
    async with amqp.connect(broker_url) as conn:
        yield conn
