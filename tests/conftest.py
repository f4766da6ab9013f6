"""Shared fixtures for the whole test suite.

``tests/`` is on ``sys.path`` (pytest inserts a rootdir conftest's directory), so test modules
import the harness as ``from harness import FaultProxy``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from harness.private_node import PrivateNode, PrivateNodeError
from harness.tls import TLSMaterial, make_ca_and_cert

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


# ---------------------------------------------------------------------- TLS material


@pytest.fixture(scope="session")
def tls_material(tmp_path_factory: pytest.TempPathFactory) -> TLSMaterial:
    """A CA, a server cert (localhost, 127.0.0.1) and a client cert, written to a temp dir."""
    directory: Path = tmp_path_factory.mktemp("tls")
    return make_ca_and_cert("localhost", directory)


# ---------------------------------------------------------------------- AMQP broker (tests/amqp)
# The real RabbitMQ the suite runs against, and unique names so tests never share entities.

AMQP_URL = os.environ.get("OJS_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
#: The brokers the shared suites run against: RabbitMQ and the in-process memory:// broker.
TEST_BROKERS = tuple(b for b in os.environ.get("OJS_TEST_BROKERS", "rabbitmq,memory").split(",") if b)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test that uses ``amqp_url`` runs once per broker (ids ``rabbitmq``, ``memory``),
    with the same assertions; ``@pytest.mark.rabbitmq_only("why")`` keeps one on RabbitMQ."""
    if "amqp_url" not in metafunc.fixturenames:
        return
    only_rabbitmq = metafunc.definition.get_closest_marker("rabbitmq_only") is not None
    brokers = [b for b in TEST_BROKERS if b == "rabbitmq" or not only_rabbitmq]
    metafunc.parametrize("amqp_url", brokers, indirect=True)


@pytest.fixture
def amqp_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """URL of the test broker: ``OJS_AMQP_URL`` (default the local RabbitMQ as guest), or a
    fresh private ``memory://`` broker that is dropped after the test."""
    if getattr(request, "param", "rabbitmq") == "rabbitmq":
        yield AMQP_URL
        return
    from ojs_anyio.memory import get_broker

    broker = get_broker(f"test-{uuid.uuid4().hex[:12]}")
    try:
        yield broker.url
    finally:
        broker.close()


#: A second user of vhost ``/`` (its validated ``user_id`` travels on its messages).
SECOND_USER = ("ojs-test-alice", "alice-pw")


@pytest.fixture
def second_user_url(amqp_url: str) -> Iterator[str]:
    """``amqp_url`` as another user (``SECOND_USER``), with full rights on vhost ``/``:
    messages it publishes carry a ``user_id`` the test's own connections do not own."""
    user, password = SECOND_USER
    if amqp_url.startswith("memory://"):
        from ojs_anyio import amqp
        from ojs_anyio.memory import get_broker

        host = amqp.parse_url(amqp_url).host
        get_broker(host).add_user(user, password)
        yield f"memory://{user}:{password}@{host}/"
        return
    from harness.broker import RabbitmqctlError, rabbitmqctl_sync

    with contextlib.suppress(RabbitmqctlError):  # left over by an interrupted run
        rabbitmqctl_sync("add_user", user, password)
    rabbitmqctl_sync("set_permissions", "-p", "/", user, ".*", ".*", ".*")
    yield AMQP_URL.replace("guest:guest@", f"{user}:{password}@", 1)


@pytest.fixture(scope="session")
def private_node() -> Iterator[PrivateNode]:
    """The suite's own RabbitMQ node, the only broker the disruptive tests stop, block or
    cut (``harness/private_node.py``): started the first time a test asks for it, stopped
    and removed at the end of the session.  Tests that use it are marked ``disruptive``."""
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


@pytest.fixture
def unique(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """``unique("q")`` -> ``"ojs-test-q-<test name>-<uuid>"``: a fresh queue/exchange name."""
    test = request.node.name.split("[")[0][:40]

    def make(kind: str = "q") -> str:
        return f"ojs-test-{kind}-{test}-{uuid.uuid4().hex[:12]}"

    return make


# ---------------------------------------------------------------------- markers
# Every test in these folders talks to RabbitMQ unless its module says ``BROKER = False``,
# so ``pytest -m "not broker"`` runs the codec and pure tests with no broker at all.  A test
# that uses the private node (it stops, blocks or cuts it) is marked ``disruptive``.

_BROKER_FOLDERS = {"amqp", "jobs", "resilience", "harness"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(__file__).parent
    for item in items:
        path = Path(str(item.path))
        try:
            folder = path.relative_to(root).parts[0]
        except ValueError:
            continue
        module = getattr(item, "module", None)
        if folder in _BROKER_FOLDERS and getattr(module, "BROKER", True):
            item.add_marker(pytest.mark.broker)
        if "private_node" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.disruptive)
