"""Fixtures of the interop suite: fresh OJS queues on vhost ``/ojs`` (001's examples' vhost),
each deleted after its test with every entity either side may have declared for it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from jobs.broker_support import URL
from jobs.conftest import Cleanup, cleanup, new_queue, ojs_vhost

from .foreign import SPEC_RETRY_DELAYS_MS

__all__ = ["broker_url", "cleanup", "new_queue", "ojs_vhost", "shared_queue"]


@pytest.fixture
def broker_url() -> str:
    """The real RabbitMQ only: the foreign client is pika, over TCP."""
    return URL


@pytest.fixture
def shared_queue(ojs_vhost: str, new_queue: Callable[..., str], cleanup: Cleanup) -> str:
    """A fresh OJS queue on ``/ojs`` (its §15.3 retry queues are cleaned up too)."""
    q = new_queue(url=ojs_vhost)
    for delay in SPEC_RETRY_DELAYS_MS:
        cleanup.queue(f"ojs.queue.retry.{q}.{delay}", url=ojs_vhost)
    return q
