"""Fixtures of the interop suite: the foreign client is pika, over TCP, so the tests run on
RabbitMQ only (``broker_url`` is ``rabbitmq_url``, which marks them ``broker``).  The fresh
OJS queues on vhost ``/ojs`` (``spec_queue``, ``new_queue``, ``cleanup``) come from
``support/fixtures.py``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support import brokers


@pytest.fixture
def broker_url(rabbitmq_url: str) -> Iterator[str]:
    """The real RabbitMQ only: pika cannot reach the in-process memory:// broker."""
    brokers._current[0] = rabbitmq_url
    try:
        yield rabbitmq_url
    finally:
        brokers._current[0] = brokers.RABBITMQ_URL
