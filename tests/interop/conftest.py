"""Fixtures of the interop suite: fresh OJS queues on vhost ``/ojs`` (001's examples' vhost),
each deleted after its test with every entity either side may have declared for it."""

from __future__ import annotations

import pytest
from jobs.broker_support import URL
from jobs.conftest import cleanup, new_queue, ojs_vhost, spec_queue

__all__ = ["broker_url", "cleanup", "new_queue", "ojs_vhost", "spec_queue"]


@pytest.fixture
def broker_url() -> str:
    """The real RabbitMQ only: the foreign client is pika, over TCP."""
    return URL
