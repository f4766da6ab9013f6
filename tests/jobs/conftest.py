"""Fixtures for the job layer's real-broker tests (``tests/jobs/test_*_broker.py``).

* ``new_queue()`` gives a fresh OJS queue name (``t`` + 10 hex digits) and registers it for
  cleanup: after the test its job queue, dead-letter queue, every retry queue of the
  ladder, its delay landing queue and control queue are deleted (``Queue.Delete`` is
  idempotent on RabbitMQ).  ``q`` is one such name.  ``cleanup.queue(name)`` registers any
  other AMQP queue.
* ``client``: ``ojs.connect()`` to the test broker; ``raw``: a plain AMQP connection
  (``ojs_anyio.amqp``) to check broker-side truth.
* ``ojs_vhost``: makes sure vhost ``/ojs`` (001's examples) exists, guest may use it.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import anyio
import pytest
from harness.broker import RabbitmqctlError, rabbitmqctl_sync

import ojs_anyio as ojs
from ojs_anyio import amqp
from ojs_anyio.jobs._retry import RETRY_LADDER_MS

from . import broker_support
from .broker_support import OJS_VHOST, OJS_VHOST_URL, SPEC_RETRY_DELAYS_MS, URL


class Cleanup:
    """Queues a test created, deleted after it (per connection URL)."""

    def __init__(self) -> None:
        self.ojs_queues: list[tuple[str, str, str]] = []  # (url, prefix, OJS queue)
        self.queues: list[tuple[str, str]] = []  # (url, AMQP queue name)

    def ojs(self, queue: str, *, prefix: str = "", url: str | None = None) -> str:
        self.ojs_queues.append((url or broker_support.current_url(), prefix, queue))
        return queue

    def queue(self, name: str, *, url: str | None = None) -> str:
        self.queues.append((url or broker_support.current_url(), name))
        return name

    def _names_by_url(self) -> dict[str, list[str]]:
        by_url: dict[str, list[str]] = {}
        for url, prefix, queue in self.ojs_queues:
            names = ojs.Names(prefix)
            by_url.setdefault(url, []).extend(
                [
                    names.job_queue(queue),
                    names.dlx_queue(queue),
                    names.control_queue(queue),
                    names.redelivered_queue(queue),
                    names.death_notes_queue(queue),
                    names.delay_landing_queue(queue),
                    *(names.retry_queue(queue, ms) for ms in RETRY_LADDER_MS),
                ]
            )
        for url, name in self.queues:
            by_url.setdefault(url, []).append(name)
        return by_url

    async def run(self) -> None:
        for url, names in self._names_by_url().items():
            # Other suites restart the shared broker or close every connection now and
            # then: retry a few times rather than leak the queues.
            for attempt in range(20):
                try:
                    async with amqp.connect(url) as conn, conn.channel(confirms=False) as ch:
                        for name in names:
                            await ch.queue_delete(name)
                    break
                except (amqp.ConnectionLostError, amqp.ConnectionLevelError, amqp.ChannelClosedError):
                    if attempt == 19:
                        raise
                    await anyio.sleep(0.5)


@pytest.fixture
def broker_url(amqp_url: str) -> Iterator[str]:
    """The test's broker (RabbitMQ or memory://, see ``amqp_url``), also as
    ``broker_support.current_url()`` for the helpers and the tests' own connections."""
    broker_support._current[0] = amqp_url
    try:
        yield amqp_url
    finally:
        broker_support._current[0] = URL


@pytest.fixture
async def cleanup(broker_url: str) -> AsyncIterator[Cleanup]:
    done = Cleanup()
    try:
        yield done
    finally:
        with anyio.CancelScope(shield=True), anyio.fail_after(30):
            await done.run()


@pytest.fixture
def new_queue(cleanup: Cleanup, broker_url: str) -> Callable[..., str]:
    """``new_queue(prefix="", url=<the test's broker>)``: a fresh OJS queue name, deleted after the test."""

    def make(*, prefix: str = "", url: str = broker_url) -> str:
        return cleanup.ojs(f"t{uuid.uuid4().hex[:10]}", prefix=prefix, url=url)

    return make


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


@pytest.fixture
def spec_queue(ojs_vhost: str, new_queue: Callable[..., str], cleanup: Cleanup) -> str:
    """A fresh OJS queue on vhost ``/ojs``; its §15.3 retry queues (which a foreign client
    declares) are cleaned up too."""
    q = new_queue(url=ojs_vhost)
    for delay in SPEC_RETRY_DELAYS_MS:
        cleanup.queue(f"ojs.queue.retry.{q}.{delay}", url=ojs_vhost)
    return q


@pytest.fixture
def ojs_vhost(broker_url: str) -> str:
    """Vhost ``/ojs`` with full permissions for guest; returns its URL.  Idempotent."""
    if broker_url.startswith("memory://"):
        from ojs_anyio.memory import get_broker

        broker = get_broker(amqp.parse_url(broker_url).host)
        broker.add_vhost(OJS_VHOST)
        return broker.vhost_url(OJS_VHOST)
    return _rabbitmq_ojs_vhost()


_vhost_ready: list[str] = []


def _rabbitmq_ojs_vhost() -> str:
    if _vhost_ready:
        return _vhost_ready[0]
    vhosts = rabbitmqctl_sync("list_vhosts", "-q").split()
    if OJS_VHOST not in vhosts:
        try:
            rabbitmqctl_sync("add_vhost", OJS_VHOST)
        except RabbitmqctlError as exc:  # created meanwhile by a concurrent run
            if "already exists" not in str(exc) and "vhost_already_exists" not in str(exc):
                raise
    rabbitmqctl_sync("set_permissions", "-p", OJS_VHOST, "guest", ".*", ".*", ".*")
    _vhost_ready.append(OJS_VHOST_URL)
    return OJS_VHOST_URL
