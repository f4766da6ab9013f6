"""The channel's pure parts, without a broker: its state's transitions and the confirms
tracker (which returns what to resolve and resolves nothing itself)."""

from __future__ import annotations

import random

import pytest

from ojs_anyio.amqp import PublishNackedError, PublishOutcomeUnknownError, UnroutableError
from ojs_anyio.amqp._channel_state import ABOVE_MAX, ChannelState, Settle, Waiter
from ojs_anyio.amqp._confirms import ConfirmTracker
from ojs_anyio.amqp._publish import PublishHandle
from ojs_codec import BasicProperties, Confirmed, Returned

pytestmark = pytest.mark.anyio


async def test_every_transition_moves_the_generation_and_resets_settling() -> None:
    state = ChannelState()
    state.opened(3)
    assert (state.cid, state.generation, state.openings) == (3, 1, 1)
    first = state.generation
    assert state.settle(5, first, multiple=True) == Settle.OK
    assert state.settle(4, first, multiple=False) == Settle.ALREADY  # covered by the multiple ack
    state.get_unacked["q"] = 2
    state.recovered()  # Basic.Recover: earlier tags are void
    assert state.settle(6, first, multiple=False) == Settle.STALE
    assert state.settled_upto == 0 and state.get_unacked == {"q": 2}
    state.lost()
    assert (state.cid, state.get_unacked) == (0, {})
    assert state.settle(1, state.generation, multiple=False) == Settle.STALE  # not open
    state.opened(7)
    assert state.openings == 2 and not state.is_stale(state.generation)
    error = RuntimeError("gone")
    assert state.closed_for_good(error) == 7
    assert state.closed and state.closed_error is error and state.cid == 0
    assert state.closed_for_good(RuntimeError("again")) == -1  # idempotent
    assert state.closed_error is error


async def test_the_settled_floor_passes_only_settled_deliveries() -> None:
    """``floor``: every delivery up to it is settled, so an ack up to it may fold the ack
    queued before it (a multiple ack).  A delivery still held keeps it below."""
    state = ChannelState()
    state.opened(1)
    gen = state.generation
    for tag in (2, 3, 5):
        assert state.settle(tag, gen, multiple=False) == Settle.OK
    assert state.floor == 0  # delivery 1 is still held
    state.settled_tag(1)  # taken with no_ack, say
    assert state.floor == 3  # 1, 2, 3; 4 is held
    assert state.settle(4, gen, multiple=False) == Settle.OK
    assert state.floor == 5
    assert state.settle(9, gen, multiple=True) == Settle.OK  # a multiple ack settles 6-8 too
    assert state.floor == 9 and not state.above
    for tag in (11, 12, 20):
        assert state.settle(tag, gen, multiple=False) == Settle.OK
    assert state.settle(15, gen, multiple=True) == Settle.OK  # 10-15 settled: the run 11-12 goes
    assert (state.floor, state.above) == (15, [[20, 20]])
    state.recovered()
    assert (state.floor, state.above) == (0, [])  # a new generation's tags start again


async def test_a_long_held_delivery_costs_one_run_of_settled_tags() -> None:
    """While delivery 1 is held, 100,000 later ones settle in order: they wait above the
    floor as one run, and the floor passes them all once delivery 1 is settled."""
    state = ChannelState()
    state.opened(1)
    for tag in range(2, 100_002):
        state.settled_tag(tag)
    assert state.floor == 0 and state.above == [[2, 100_001]]
    for tag in (100_005, 100_003, 100_004):  # out of order, then the gap fills
        state.settled_tag(tag)
    assert state.above == [[2, 100_001], [100_003, 100_005]]
    state.settled_tag(100_002)
    assert state.above == [[2, 100_005]]
    state.settled_tag(1)
    assert (state.floor, state.above) == (100_005, [])


@pytest.mark.parametrize("seed", range(20))
def test_the_settled_floor_is_the_highest_tag_with_every_tag_below_settled(seed: int) -> None:
    """Any order of settles, some of them multiple: after each, ``floor`` is the highest tag
    up to which every delivery is settled, and ``above`` holds the settled tags over it."""
    rng = random.Random(seed)
    state = ChannelState()
    state.opened(1)
    gen = state.generation
    tags = list(range(1, 300))
    rng.shuffle(tags)
    settled: set[int] = set()
    for tag in tags:
        if tag in settled:
            continue
        multiple = rng.random() < 0.05
        assert state.settle(tag, gen, multiple=multiple) == Settle.OK
        settled |= set(range(1, tag + 1)) if multiple else {tag}
        floor = 0
        while floor + 1 in settled:
            floor += 1
        assert state.floor == floor
        assert {t for first, last in state.above for t in range(first, last + 1)} == {
            t for t in settled if t > floor
        }


async def test_the_settled_floor_stops_tracking_past_its_bound() -> None:
    state = ChannelState()
    state.opened(1)
    for tag in range(3, 2 * ABOVE_MAX + 10, 2):  # every other tag: a run each
        state.settled_tag(tag)
    assert len(state.above) == ABOVE_MAX  # runs past the bound are not kept...
    first_lost = 2 * ABOVE_MAX + 3
    for tag in range(2, 2 * ABOVE_MAX + 10, 2):
        state.settled_tag(tag)
    state.settled_tag(1)
    assert state.floor == first_lost - 1  # ...so the floor stops below them: no fold, never a wrong one


async def test_a_waiter_is_taken_once() -> None:
    state = ChannelState()
    waiter = state.waiter = Waiter()
    error = RuntimeError("no reply")
    state.fail_waiter(error)
    assert waiter.error is error and waiter.event.is_set() and state.waiter is None
    state.fail_waiter(RuntimeError("nobody waits"))  # nothing to fail: no error
    state.waiter = second = Waiter()
    assert state.take_waiter() is second and state.take_waiter() is None


def test_confirms_tracker_returns_what_to_resolve() -> None:
    tracker = ConfirmTracker()
    handles = {tag: PublishHandle(tag, "ex", f"rk{tag}", None) for tag in (1, 2, 3, 4)}
    for tag, handle in handles.items():
        tracker.track(tag, handle)
    returned = Returned(1, 312, "NO_ROUTE", "ex", "rk2", BasicProperties(), b"")
    acked, failed = tracker.confirmed(Confirmed(1, [1, 2], True, {2: returned}))
    assert acked == [handles[1]]
    assert len(failed) == 1 and failed[0][0] is handles[2] and isinstance(failed[0][1], UnroutableError)
    assert not any(h.done for h in handles.values())  # resolving is the channel's job
    acked, [(handle, outcome)] = tracker.confirmed(Confirmed(1, [3], False, None))
    assert acked == [] and handle is handles[3] and isinstance(outcome, PublishNackedError)
    assert tracker.confirmed(Confirmed(1, [3], True, None)) == ([], [])  # already resolved: ignored
    (handle, outcome), = tracker.fail_all(RuntimeError("lost"))
    assert handle is handles[4] and isinstance(outcome, PublishOutcomeUnknownError)
    assert len(tracker) == 0
    tracker.track(9, late := PublishHandle(9, "", "q", None))
    (handle, outcome), = tracker.give_up([late], 1.5)
    assert handle is late and "within 1.5s" in str(outcome) and len(tracker) == 0


def test_the_confirm_tracker_gives_up_on_what_is_overdue_and_names_the_next_deadline() -> None:
    """``overdue(now)``: pure, like the rest of the tracker (the watcher resolves)."""
    tracker = ConfirmTracker()
    handles = {tag: PublishHandle(tag, "", "q", None) for tag in (1, 2, 3, 4)}
    for tag, handle in handles.items():
        tracker.track(tag, handle)
    for tag, (at, timeout) in {1: (10.0, 5.0), 2: (12.0, 5.0), 3: (11.0, 0.5)}.items():
        handles[tag].confirm_by, handles[tag].confirm_timeout = at, timeout  # 4: no deadline
    assert tracker.overdue(9.0) == ([], 10.0)
    late, earliest = tracker.overdue(11.0)
    assert [h for h, _ in late] == [handles[1], handles[3]] and earliest == 12.0
    assert "within 5s" in str(late[0][1]) and "within 0.5s" in str(late[1][1])
    assert isinstance(late[0][1], PublishOutcomeUnknownError)
    assert not any(h.done for h in handles.values())
    assert sorted(tracker.pending) == [2, 4]
    assert [h for h, _ in tracker.overdue(12.0)[0]] == [handles[2]]
    assert tracker.overdue(99.0) == ([], None) and sorted(tracker.pending) == [4]
