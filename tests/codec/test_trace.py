"""Replay a recorded RabbitMQ session (``data/rabbitmq_trace.json``, made by
``capture_trace.py`` against a real broker) through the sans-IO protocol, with every
server segment split at every offset: the events and the bytes we answer with must not
depend on how TCP chopped the stream.  No broker needed.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

import ojs_codec

from .capture_trace import TRACE_PROPERTIES, pamqp_method

TRACE = json.loads((Path(__file__).with_name("data") / "rabbitmq_trace.json").read_text())


def _issue(proto: ojs_codec.AMQPConnection, step: dict[str, Any]) -> bytes:
    name = step["client"]
    args = step["args"]
    kwargs = dict(step["kwargs"])
    if name == "send_method":
        cid, method, fields = args
        proto.send_method(cid, pamqp_method(method, fields))
    elif name == "publish":
        cid, exchange, routing_key, body, props = args
        proto.publish(
            cid,
            exchange,
            routing_key,
            bytes.fromhex(body["bytes"]),
            TRACE_PROPERTIES if props else None,
            **kwargs,
        )
    else:
        getattr(proto, name)(*args, **kwargs)
    return proto.data_to_send()


def _summary(events: list[ojs_codec.Event]) -> list[Any]:
    out: list[Any] = []
    for e in events:
        if isinstance(e, ojs_codec.Delivery):
            out.append(("Delivery", e.delivery_tag, e.routing_key, e.properties, e.body))
        elif isinstance(e, ojs_codec.Confirmed):
            returned = {t: (r.reply_code, r.routing_key, r.body) for t, r in (e.returned or {}).items()}
            out.append(("Confirmed", tuple(e.tags), e.ack, returned))
        elif isinstance(e, ojs_codec.MethodReply):
            out.append(("MethodReply", e.method.name))
        else:
            out.append(type(e).__name__)
    return out


def _segments() -> list[tuple[ojs_codec.AMQPConnection, bytes, list[Any], bytes]]:
    """(protocol state before the segment, segment bytes, expected events, expected reply bytes)."""
    proto = ojs_codec.AMQPConnection(ojs_codec.ConnectionParameters(heartbeat=0, frame_max=4096))
    out = []
    for step in TRACE["steps"]:
        if "client" in step:
            _issue(proto, step)
            continue
        data = bytes.fromhex(step["server"])
        before = copy.deepcopy(proto)
        events = proto.receive_data(data)
        assert [type(e).__name__ for e in events] == step["events"]
        out.append((before, data, _summary(events), proto.data_to_send()))
    return out


SEGMENTS = _segments()


def test_trace_replays_whole() -> None:
    kinds = [s["events"] for s in TRACE["steps"] if "server" in s]
    assert ["ConnectionOpened"] in kinds
    assert ["MethodReply", "Delivery", "Delivery", "Delivery"] in kinds
    # The mandatory unroutable publish is reported on its confirm, tied to tag 4.
    confirms = [e for seg in SEGMENTS for e in seg[2] if isinstance(e, tuple) and e[0] == "Confirmed"]
    assert any(4 in e[1] and 4 in e[3] and e[3][4][0] == 312 for e in confirms)
    deliveries = [e for seg in SEGMENTS for e in seg[2] if isinstance(e, tuple) and e[0] == "Delivery"]
    assert [len(d[4]) for d in deliveries] == [21, 10_000, 0]
    assert deliveries[0][3] == TRACE_PROPERTIES


@pytest.mark.parametrize("index", range(len(SEGMENTS)))
def test_trace_split_at_every_offset(index: int) -> None:
    before, data, expected_events, expected_out = SEGMENTS[index]
    for k in range(len(data) + 1):
        proto = copy.deepcopy(before)
        events = proto.receive_data(data[:k]) + proto.receive_data(data[k:])
        assert _summary(events) == expected_events, f"segment {index} split at {k}"
        assert proto.data_to_send() == expected_out, f"segment {index} split at {k}"


def test_trace_byte_by_byte() -> None:
    for before, data, expected_events, expected_out in SEGMENTS:
        proto = copy.deepcopy(before)
        events: list[ojs_codec.Event] = []
        for i in range(len(data)):
            events += proto.receive_data(data[i : i + 1])
        assert _summary(events) == expected_events
        assert proto.data_to_send() == expected_out
