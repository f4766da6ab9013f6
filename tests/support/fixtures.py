"""The suite's fixtures plugin (``pytest_plugins`` of ``tests/conftest.py``).

Markers come from fixtures, not folders:

* ``amqp_url`` runs its test once per broker of ``OJS_TEST_BROKERS`` (ids ``rabbitmq`` and
  ``memory``); only the ``rabbitmq`` parameter is marked ``broker``.
  ``@pytest.mark.rabbitmq_only("why")`` keeps a test on RabbitMQ.
* ``rabbitmq_url`` (RabbitMQ only) marks every test that uses it, directly or through another
  fixture, ``broker``: the CLI subprocesses, ``rabbitmqctl`` helpers and the harness's
  proxies in front of RabbitMQ take it.
* ``private_node`` (the suite's own RabbitMQ node) marks its tests ``broker`` and ``disruptive``;
  ``cluster`` (tests/cluster) marks them ``broker`` too.

So ``pytest -m "not broker"`` runs every test that needs no RabbitMQ, memory:// parameters
included; while such a test runs, :func:`support.brokers.require_rabbitmq` refuses
``rabbitmqctl``.
"""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import anyio
import pytest
from harness.private_node import PrivateNode, PrivateNodeError
from harness.tls import TLSMaterial, make_ca_and_cert

from ojs_anyio import amqp

from . import brokers
from .brokers import OJS_VHOST, OJS_VHOST_URL, RABBITMQ_URL, SECOND_USER, SPEC_RETRY_DELAYS_MS, TEST_BROKERS
from .cleanup import Cleanup

#: The fixtures that reach RabbitMQ: a test that uses one (directly or through another
#: fixture) is marked ``broker``.  ``cluster`` is tests/cluster's 3-node cluster.
RABBITMQ_FIXTURES = frozenset({"rabbitmq_url", "private_node", "cluster"})

# ---------------------------------------------------------------------- async backends
# Every @pytest.mark.anyio test runs on asyncio (in debug mode) and on Trio.


@pytest.fixture(
    params=[
        pytest.param(("asyncio", {"debug": True}), id="asyncio"),
        pytest.param("trio", id="trio"),
    ]
)
def anyio_backend(request: pytest.FixtureRequest) -> object:
    return request.param


# ---------------------------------------------------------------------- markers


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test that uses ``amqp_url`` runs once per broker (ids ``rabbitmq``, ``memory``),
    with the same assertions; only the RabbitMQ run is marked ``broker``."""
    if "amqp_url" not in metafunc.fixturenames:
        return
    only_rabbitmq = metafunc.definition.get_closest_marker("rabbitmq_only") is not None
    params = [
        pytest.param(b, id=b, marks=[pytest.mark.broker] if b == "rabbitmq" else [])
        for b in TEST_BROKERS
        if b == "rabbitmq" or not only_rabbitmq
    ]
    metafunc.parametrize("amqp_url", params, indirect=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & RABBITMQ_FIXTURES:
            item.add_marker(pytest.mark.broker)
        if "private_node" in used:
            item.add_marker(pytest.mark.disruptive)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    brokers._rabbitmq_allowed[0] = item.get_closest_marker("broker") is not None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    brokers._rabbitmq_allowed[0] = True  # session fixtures made by broker tests clean up here


# ---------------------------------------------------------------------- brokers


@pytest.fixture(scope="session")
def rabbitmq_url() -> str:
    """The RabbitMQ broker's URL (``OJS_AMQP_URL``), for a test that cannot run on memory://
    (a subprocess, ``rabbitmqctl``, a foreign client over TCP): marks the test ``broker``."""
    return RABBITMQ_URL


@pytest.fixture
def amqp_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """URL of the test broker: ``OJS_AMQP_URL`` (default the local RabbitMQ as guest), or a
    fresh private ``memory://`` broker that is dropped after the test."""
    if getattr(request, "param", "rabbitmq") == "rabbitmq":
        yield RABBITMQ_URL
        return
    from ojs_anyio.memory import get_broker

    broker = get_broker(f"test-{uuid.uuid4().hex[:12]}")
    try:
        yield broker.url
    finally:
        broker.close()


@pytest.fixture
def broker_url(amqp_url: str) -> Iterator[str]:
    """The test's broker (RabbitMQ or memory://, see ``amqp_url``), also as
    ``support.brokers.current_url()`` for the helpers and the tests' own connections."""
    brokers._current[0] = amqp_url
    try:
        yield amqp_url
    finally:
        brokers._current[0] = RABBITMQ_URL


@pytest.fixture
def second_user_url(amqp_url: str) -> Iterator[str]:
    """``amqp_url`` as another user (``SECOND_USER``), with full rights on vhost ``/``:
    messages it publishes carry a ``user_id`` the test's own connections do not own."""
    user, password = SECOND_USER
    if amqp_url.startswith("memory://"):
        host = amqp.parse_url(amqp_url).host
        brokers.memory_broker(amqp_url).add_user(user, password)
        yield f"memory://{user}:{password}@{host}/"
        return
    from harness.broker import RabbitmqctlError, rabbitmqctl_sync

    with contextlib.suppress(RabbitmqctlError):  # left over by an interrupted run
        rabbitmqctl_sync("add_user", user, password)
    rabbitmqctl_sync("set_permissions", "-p", "/", user, ".*", ".*", ".*")
    yield RABBITMQ_URL.replace("guest:guest@", f"{user}:{password}@", 1)


@pytest.fixture(scope="session")
def private_node() -> Iterator[PrivateNode]:
    """The suite's own RabbitMQ node, the only broker the disruptive tests stop, block or
    cut (``harness/private_node.py``): started the first time a test asks for it, stopped
    and removed at the end of the session.  Tests that use it are marked ``broker`` and
    ``disruptive``."""
    node = PrivateNode.create()
    try:
        node.start()
    except (PrivateNodeError, subprocess.TimeoutExpired) as exc:
        node.stop()
        pytest.fail(f"the private RabbitMQ node for the disruptive tests did not start: {exc}")
    try:
        yield node
    finally:
        node.stop()


# ---------------------------------------------------------------------- names and cleanup


@pytest.fixture
def unique(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """``unique("q")`` -> ``"ojs-test-q-<test name>-<uuid>"``: a fresh queue/exchange name."""
    test = request.node.name.split("[")[0][:40]

    def make(kind: str = "q") -> str:
        return f"ojs-test-{kind}-{test}-{uuid.uuid4().hex[:12]}"

    return make


@pytest.fixture
async def cleanup(broker_url: str) -> AsyncIterator[Cleanup]:
    """Queues registered with ``cleanup.ojs(q)`` / ``cleanup.queue(name)`` are deleted after the test."""
    done = Cleanup()
    try:
        yield done
    finally:
        with anyio.CancelScope(shield=True), anyio.fail_after(30):
            await done.run()


@pytest.fixture
def new_queue(cleanup: Cleanup, broker_url: str) -> Callable[..., str]:
    """``new_queue(prefix="", url=<the test's broker>)``: a fresh OJS queue name (``t`` + 10 hex
    digits) whose job, dead-letter, retry, delay landing and control queues are deleted after the test."""

    def make(*, prefix: str = "", url: str = broker_url) -> str:
        return cleanup.ojs(f"t{uuid.uuid4().hex[:10]}", prefix=prefix, url=url)

    return make


@pytest.fixture
def ojs_vhost(broker_url: str) -> str:
    """Vhost ``/ojs`` (001's examples) with full permissions for guest; returns its URL.  Idempotent."""
    if broker_url.startswith("memory://"):
        broker = brokers.memory_broker(broker_url)
        broker.add_vhost(OJS_VHOST)
        url: str = broker.vhost_url(OJS_VHOST)
        return url
    return _rabbitmq_ojs_vhost()


@pytest.fixture
def spec_queue(ojs_vhost: str, new_queue: Callable[..., str], cleanup: Cleanup) -> str:
    """A fresh OJS queue on vhost ``/ojs``; its §15.3 retry queues (which a foreign client
    declares) are cleaned up too."""
    q = new_queue(url=ojs_vhost)
    for delay in SPEC_RETRY_DELAYS_MS:
        cleanup.queue(f"ojs.queue.retry.{q}.{delay}", url=ojs_vhost)
    return q


_vhost_ready: list[str] = []


def _rabbitmq_ojs_vhost() -> str:
    from harness.broker import RabbitmqctlError, rabbitmqctl_sync

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


# ---------------------------------------------------------------------- TLS material


@pytest.fixture(scope="session")
def tls_material(tmp_path_factory: pytest.TempPathFactory) -> TLSMaterial:
    """A CA, a server cert (localhost, 127.0.0.1) and a client cert, written to a temp dir."""
    directory: Path = tmp_path_factory.mktemp("tls")
    return make_ca_and_cert("localhost", directory)
