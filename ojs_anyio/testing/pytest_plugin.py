"""pytest fixtures for testing jobs on memory:// (with the anyio pytest plugin).

Enable them in your ``conftest.py``: ``pytest_plugins = ["ojs_anyio.testing.pytest_plugin"]``,
and define an ``ojs_worker`` fixture that returns your app's :class:`ojs_anyio.Worker` (the
worker is optional: without it, ``drain()`` needs one passed in).

* ``job_tester``: a :class:`~ojs_anyio.testing.JobTester` on a private memory broker with a
  virtual clock (the module-level ``assert_enqueued``/``drain``/``advance`` use it too);
* ``ojs_client``: its client; ``memory_broker``: its broker.

Each test gets its own broker: nothing leaks between tests.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from .. import Client, Worker
from .._misuse import ArgumentTypeError
from ..memory import MemoryBroker
from . import JobTester
from . import job_tester as _job_tester

__all__ = ["job_tester", "memory_broker", "ojs_client"]


def _optional_worker(request: pytest.FixtureRequest) -> Worker | None:
    try:
        worker = request.getfixturevalue("ojs_worker")
    except pytest.FixtureLookupError:
        return None
    if not isinstance(worker, Worker):
        raise ArgumentTypeError(f"the ojs_worker fixture must return a Worker, not {type(worker).__name__}")
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
