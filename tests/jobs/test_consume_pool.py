"""The consume pool that the job worker and the event bus share (``ojs_anyio/_consume_pool.py``):
N x M pull tasks, and the graceful stop (stop fetching, a grace period for the running work,
then abandon the rest).  Pure: plain anyio tasks stand in for the pull loops, on asyncio
and Trio.  The worker's and the bus's own graceful-stop tests (test_worker_broker.py,
tests/events/test_bus_broker.py) cover the pool through the layers."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from ojs_anyio._consume_pool import ConsumePool

pytestmark = pytest.mark.anyio


class Pulls:
    """Pull tasks that each take one piece of work, then return once fetching stopped, or
    run until cancelled (``forever``).  Records what happened to them."""

    def __init__(self) -> None:
        self.started = 0
        self.all_started = anyio.Event()
        self.expected = 0
        self.fetching = True
        self.finish = anyio.Event()  # lets the running work finish
        self.finished = 0
        self.cancelled = 0
        self.stop_calls = 0

    def stop_fetching(self) -> None:
        self.stop_calls += 1
        self.fetching = False

    async def work(self) -> None:
        self.started += 1
        if self.started == self.expected:
            self.all_started.set()
        try:
            await self.finish.wait()
        except anyio.get_cancelled_exc_class():
            self.cancelled += 1
            raise
        self.finished += 1

    async def forever(self) -> None:
        self.started += 1
        if self.started == self.expected:
            self.all_started.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            self.cancelled += 1
            raise


async def test_n_consumers_times_m_tasks_run_and_a_normal_exit_lets_the_running_work_finish() -> None:
    pulls = Pulls()
    pulls.expected = 2 * 3

    async def stop_consumers() -> None:  # asynchronous, as the bus's Basic.Cancel is
        pulls.stop_fetching()
        pulls.finish.set()  # the running handlers finish meanwhile

    pool = ConsumePool(grace_period=30, stop_fetching=stop_consumers)
    for _ in range(2):  # two consumers, three pull tasks each
        pool.add(3, pulls.work)
    with anyio.fail_after(10):
        async with pool:
            await pulls.all_started.wait()
            assert pulls.started == 6
        # Leaving the block normally stopped the fetching and waited for the work.
    assert (pulls.finished, pulls.cancelled, pulls.stop_calls) == (6, 0, 1)


async def test_past_the_grace_period_the_tasks_left_are_cancelled() -> None:
    pulls = Pulls()
    pulls.expected = 4
    pool = ConsumePool(grace_period=0.05, stop_fetching=pulls.stop_fetching)
    pool.add(4, pulls.forever)
    with anyio.fail_after(10):
        async with pool:
            await pulls.all_started.wait()
    assert (pulls.cancelled, pulls.stop_calls) == (4, 1)


async def test_a_layer_s_own_abandon_replaces_the_cancellation() -> None:
    # The worker's: it cancels the handlers and lets each pull task settle its job.
    pulls = Pulls()
    pulls.expected = 3
    abandoned = []

    def abandon() -> None:
        abandoned.append(pulls.started - pulls.finished)  # still running
        pulls.finish.set()

    pool = ConsumePool(grace_period=0.05, stop_fetching=pulls.stop_fetching, abandon=abandon)
    pool.add(3, pulls.work)
    with anyio.fail_after(10):
        async with pool:
            await pulls.all_started.wait()
    assert abandoned == [3]
    assert (pulls.finished, pulls.cancelled) == (3, 0)


async def test_stop_stops_the_fetching_at_once_and_the_grace_period_runs_in_the_pool() -> None:
    pulls = Pulls()
    pulls.expected = 2
    pool = ConsumePool(grace_period=30, stop_fetching=pulls.stop_fetching)
    pool.add(2, pulls.work)
    with anyio.fail_after(10):
        async with pool:
            await pulls.all_started.wait()
            pool.stop()
            # Synchronous: no pull task can take one more delivery after stop() returns.
            assert pulls.stop_calls == 1
            pool.stop()  # once
            await anyio.lowlevel.checkpoint()
            assert pulls.finished == pulls.cancelled == 0  # the running work has the grace period
            pulls.finish.set()
            await pool.wait()
            assert pulls.finished == 2
    assert (pulls.cancelled, pulls.stop_calls) == (0, 1)


async def test_a_stop_before_the_pool_is_entered_begins_as_it_is_entered() -> None:
    pulls = Pulls()
    pulls.expected = 2
    pool = ConsumePool(grace_period=0.05, stop_fetching=pulls.stop_fetching)
    pool.add(2, pulls.forever)
    pool.stop()
    assert pulls.stop_calls == 0  # nothing to stop yet
    with anyio.fail_after(10):
        async with pool:
            await pool.wait()  # the grace period ran out: cancelled
    assert (pulls.stop_calls, pulls.cancelled) == (1, 2)


async def test_an_error_in_the_block_cancels_the_tasks_at_once() -> None:
    pulls = Pulls()
    pulls.expected = 3
    pool = ConsumePool(grace_period=30, stop_fetching=pulls.stop_fetching)
    pool.add(3, pulls.forever)
    with anyio.fail_after(10), pytest.raises(ExceptionGroup) as caught:  # the task group's
        async with pool:
            await pulls.all_started.wait()
            raise LookupError("the block failed")
    assert caught.group_contains(LookupError, match="the block failed")
    assert (pulls.cancelled, pulls.stop_calls) == (3, 0)  # no graceful stop, no grace period


async def test_tasks_that_end_on_their_own_end_the_pool_without_a_stop() -> None:
    # A worker's consumers ended (the queue's serve_queue returns): nothing is stopped.
    pulls = Pulls()
    ran = []

    async def one_shot() -> None:
        ran.append(1)

    pool = ConsumePool(grace_period=30, stop_fetching=pulls.stop_fetching)
    pool.add(2, one_shot)
    with anyio.fail_after(10):
        async with pool:
            await pool.wait()
    assert (len(ran), pulls.stop_calls) == (2, 0)
