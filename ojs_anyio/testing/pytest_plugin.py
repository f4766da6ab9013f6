"""pytest fixtures for testing jobs on memory://, under the anyio plugin or pytest-asyncio.

Enable them in your ``conftest.py``: ``pytest_plugins = ["ojs_anyio.testing.pytest_plugin"]``,
and define an ``ojs_worker`` fixture that returns your app's :class:`ojs_anyio.Worker` (the
worker is optional: without it, ``drain()`` needs one passed in).

* ``job_tester``: a :class:`~ojs_anyio.testing.JobTester` on a private memory broker with a
  virtual clock (the module-level ``assert_enqueued``/``drain``/``advance`` use it too);
* ``ojs_client``: its client; ``memory_broker``: its broker.

Each test gets its own broker: nothing leaks between tests.

The fixtures are async, so the test's runner must run them in the test's own event loop:

* with anyio's plugin (installed with anyio), mark the tests ``@pytest.mark.anyio``; they
  then run on every backend of the ``anyio_backend`` fixture (asyncio and Trio);
* with pytest-asyncio, mark them ``@pytest.mark.asyncio``, or set ``asyncio_mode = auto``.
  In strict mode pytest-asyncio runs only fixtures declared with its own decorator; these
  fixtures are handed to it for asyncio tests (the hook below), so nothing else is needed.

A test that neither runner claims gets one error that says which of the two to use.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator
from typing import Any, cast

import pytest

from .. import Client, Worker
from ..memory import MemoryBroker
from . import JobTester
from . import job_tester as _job_tester

__all__ = ["job_tester", "memory_broker", "ojs_client"]

_RUNNER_HINT = (
    "the ojs_anyio.testing fixtures are async and need a test runner: mark the test "
    "@pytest.mark.anyio (anyio's pytest plugin: asyncio and Trio), or install pytest-asyncio "
    "and mark it @pytest.mark.asyncio (or set asyncio_mode = auto)"
)


def _optional_worker(request: pytest.FixtureRequest) -> Worker | None:
    try:
        worker = request.getfixturevalue("ojs_worker")
    except pytest.FixtureLookupError:
        return None
    if not isinstance(worker, Worker):
        pytest.fail(
            f"the ojs_worker fixture must return an ojs_anyio.Worker, not {type(worker).__name__}",
            pytrace=False,
        )
    return worker


@pytest.fixture
async def job_tester(request: pytest.FixtureRequest) -> AsyncIterator[JobTester]:
    """A client (and your ``ojs_worker``, if defined) on a private memory broker, virtual clock."""
    async with _job_tester(worker=_optional_worker(request)) as tester:
        yield tester


@pytest.fixture
def ojs_client(job_tester: JobTester) -> Client:
    return job_tester.client


@pytest.fixture
def memory_broker(job_tester: JobTester) -> MemoryBroker:
    return job_tester.broker


_ASYNC_FIXTURES = {"job_tester"}


def _claimed_by_pytest_asyncio(request: pytest.FixtureRequest) -> bool:
    """Whether pytest-asyncio runs this test (its marker, or its auto mode)."""
    if not request.config.pluginmanager.hasplugin("asyncio"):
        return False
    node = request.node
    if node.get_closest_marker("asyncio") is not None:
        return True
    try:
        mode = request.config.getoption("asyncio_mode") or request.config.getini("asyncio_mode")
    except ValueError:
        return False
    return str(mode) == "auto"


def _for_pytest_asyncio(func: Callable[..., AsyncGenerator[Any, None]]) -> Callable[..., Any]:
    """``func`` as a pytest-asyncio fixture, hosted in one task from setup to teardown.

    pytest-asyncio runs a fixture's setup and its teardown as two tasks, but a task group
    (the client's, the worker's) must be left in the task that entered it.  So one task of
    the test's loop enters ``func`` and stays there until the teardown tells it to leave, as
    anyio's own plugin does.
    """

    @functools.wraps(func)
    async def hosted(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        ready: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        finish = asyncio.Event()

        async def host() -> None:
            generator = func(*args, **kwargs)
            try:
                value = await generator.__anext__()
            except BaseException as exc:
                ready.set_exception(exc)
                return
            ready.set_result(value)
            await finish.wait()
            await generator.aclose()

        task = asyncio.get_running_loop().create_task(host())
        try:
            value = await ready
        except BaseException:
            await task
            raise
        try:
            yield value
        finally:
            finish.set()
            await task

    hosted._force_asyncio_fixture = True  # type: ignore[attr-defined]  # pytest-asyncio's mark
    hosted._loop_scope = None  # type: ignore[attr-defined]  # the test's own loop
    return hosted


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_fixture_setup(
    fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
) -> Generator[None, None, None]:
    """Hand this module's async fixtures to the runner of the test that asks for them.

    anyio's plugin claims them by itself when the test uses ``anyio_backend``.  For a test that
    pytest-asyncio runs, they are marked as pytest-asyncio fixtures for this setup only.  For a
    test neither claims, pytest would hand the test an un-run async generator: fail instead.
    """
    if fixturedef.argname not in _ASYNC_FIXTURES or fixturedef.func.__module__ != __name__:
        yield
        return
    if "anyio_backend" in request.fixturenames:
        yield
        return
    if not _claimed_by_pytest_asyncio(request):
        pytest.fail(_RUNNER_HINT, pytrace=False)
    hosted = _for_pytest_asyncio(cast("Callable[..., AsyncGenerator[Any, None]]", fixturedef.func))
    with pytest.MonkeyPatch.context() as patch:  # for this setup only
        patch.setattr(fixturedef, "func", hosted)
        yield
