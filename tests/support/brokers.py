"""The brokers the suite runs on, and the guard that keeps pure tests away from RabbitMQ.

``OJS_AMQP_URL`` (default ``amqp://guest:guest@127.0.0.1:5672/``) is the RabbitMQ broker: every
helper that reaches it (the fixtures, the harness's proxies and ``rabbitmqctl``, the CLI
subprocesses) takes its URL, host or port from here.  ``OJS_TEST_BROKERS`` (default
``rabbitmq,memory``) lists the brokers the ``amqp_url`` fixture runs each test on.

A test reaches RabbitMQ only through a fixture that marks it ``broker``
(``rabbitmq_url``, or ``amqp_url``'s ``rabbitmq`` parameter; see :mod:`support.fixtures`).
While a test without that marker runs, :func:`require_rabbitmq` (called by the harness before
it runs ``rabbitmqctl``) fails it, so ``pytest -m "not broker"`` never touches a broker.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import quote

from ojs_anyio import amqp

__all__ = [
    "OJS_VHOST",
    "OJS_VHOST_URL",
    "RABBITMQ_HOST",
    "RABBITMQ_PORT",
    "RABBITMQ_URL",
    "SECOND_USER",
    "SPEC_RETRY_DELAYS_MS",
    "TEST_BROKERS",
    "current_url",
    "memory_broker",
    "require_rabbitmq",
    "vhost_url",
]

#: The RabbitMQ broker of the suite (vhost ``/``).
RABBITMQ_URL = os.environ.get("OJS_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
RABBITMQ_HOST, RABBITMQ_PORT = amqp.parse_url(RABBITMQ_URL).hosts[0]
#: The brokers the shared suites run against: RabbitMQ and the in-process memory:// broker.
TEST_BROKERS = tuple(b for b in os.environ.get("OJS_TEST_BROKERS", "rabbitmq,memory").split(",") if b)
#: A second user of vhost ``/`` (its validated ``user_id`` travels on its messages).
SECOND_USER = ("ojs-test-alice", "alice-pw")


def vhost_url(vhost: str, base: str = RABBITMQ_URL) -> str:
    """``base`` (RabbitMQ, on vhost ``/``) on virtual host ``vhost``."""
    return base.rstrip("/") + "/" + quote(vhost, safe="")


#: Vhost of 001's examples, and its URL on RabbitMQ.
OJS_VHOST = "/ojs"
OJS_VHOST_URL = vhost_url(OJS_VHOST)
#: The retry delays of the OJS AMQP binding's §15.3 example (its retry queues).
SPEC_RETRY_DELAYS_MS = (1000, 2000, 4000, 8000, 16000, 32000, 60000)

#: The running test's broker: set by the ``broker_url`` fixture (RabbitMQ's URL or a memory:// one).
_current = [RABBITMQ_URL]


def current_url() -> str:
    """The running test's broker URL (its ``broker_url``: RabbitMQ or memory://)."""
    return _current[0]


def memory_broker(url: str) -> Any:
    """The in-process broker behind a ``memory://`` URL."""
    from ojs_anyio.memory import get_broker

    return get_broker(amqp.parse_url(url).host)


#: Whether the running test may reach RabbitMQ (it is marked ``broker``): set by the plugin.
_rabbitmq_allowed = [True]


def require_rabbitmq(what: str) -> None:
    """Fail unless the running test is marked ``broker`` (it uses a RabbitMQ fixture)."""
    if not _rabbitmq_allowed[0]:
        raise AssertionError(
            f"{what} reaches RabbitMQ from a test not marked broker: give the test the "
            "rabbitmq_url fixture (or amqp_url, which runs it on RabbitMQ and memory://)"
        )
