"""The redelivery policy and the wait ladder, the payload encoding, the message ids (no broker)."""

from __future__ import annotations

import re

import msgspec
import pytest

from ojs_anyio import events
from ojs_anyio.events._wire import encode_payload


def test_orb_example_delays() -> None:
    # Orb's documentation: initial 2 s, multiplier 1.5 -> immediate, then 3 s, then 4.5 s.
    policy = events.RedeliveryPolicy(initial_interval=2.0, multiplier=1.5, max_interval=60.0, max_attempts=5)
    assert [policy.exact_delay(n) for n in (1, 2, 3, 4)] == pytest.approx([0.0, 3.0, 4.5, 6.75])
    assert policy.wait_ms(1) == 0  # the first redelivery is immediate: no wait queue
    assert [policy.wait_ms(n) for n in (2, 3, 4)] == [3150, 5000, 6300]  # 4.5 s is halfway: ties go up


def test_max_interval_caps_and_max_attempts_counts_redeliveries() -> None:
    policy = events.RedeliveryPolicy(initial_interval=1.0, multiplier=10.0, max_interval=5.0, max_attempts=2)
    assert policy.exact_delay(3) == 5.0
    assert policy.wait_ms(3) <= 5000
    assert policy.exact_delay(10_000) == 5.0  # no float overflow
    assert not policy.exhausted(1) and not policy.exhausted(2)
    assert policy.exhausted(3)  # the handler ran 3 times: the third rejection dead-letters
    assert events.RedeliveryPolicy(max_attempts=0).exhausted(1)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"initial_interval": 0},
        {"multiplier": 0.5},
        {"initial_interval": 5.0, "max_interval": 1.0},
        {"max_attempts": -1},
        {"max_attempts": True},
    ],
)
def test_bad_policies_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        events.RedeliveryPolicy(**kwargs)  # type: ignore[arg-type]


def test_ladder_is_bounded_monotone_and_close() -> None:
    ladder = events.WAIT_LADDER_MS
    assert list(ladder) == sorted(set(ladder)) and events.MAX_WAIT_QUEUES == len(ladder) <= 64
    assert ladder[0] == 100 and ladder[-1] == 86_400_000
    previous = 0
    for ms in range(1, 200_000, 37):
        rung = events.ladder_ms(ms)
        assert rung in ladder and rung >= previous
        previous = rung
        if ms >= 100:
            assert abs(rung - ms) / ms <= 0.125  # at most 12.5 % off
    assert events.ladder_ms(0) == 0
    assert events.ladder_ms(10**12) == 86_400_000
    assert events.ladder_ms(40_000, max_ms=30_000) <= 30_000
    with pytest.raises(ValueError):
        events.ladder_ms(-1)


class Point(msgspec.Struct):
    x: int


def test_payload_encoding() -> None:
    assert encode_payload(Point(1)) == (b'{"x":1}', "application/json")
    assert encode_payload({"a": [1]}) == (b'{"a":[1]}', "application/json")
    assert encode_payload(b"\x00raw") == (b"\x00raw", "application/octet-stream")
    with pytest.raises(TypeError, match="cannot encode an event payload of type object"):
        encode_payload(object())


def test_message_ids_are_unique_uuid7_strings() -> None:
    ids = [events.new_message_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    pattern = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
    assert all(pattern.match(i) for i in ids)
    assert ids == sorted(ids)  # time first, then a counter: ordered within a process
