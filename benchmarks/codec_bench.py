"""Micro-benchmarks of the codec's hot path against pamqp 4.0.1.

For a 256-byte body and a realistic OJS property set, times:

* ``encode_publish``: Basic.Publish + content header + body frame, encoded;
* ``decode_deliver``: Basic.Deliver + content header + body frame, parsed from bytes
  (frame split, method decode, header decode, body);
* ``encode_ack``: one Basic.Ack frame;
* ``receive_data`` (ours only: pamqp has no connection state machine): one read of
  ``READ_DELIVERIES`` such deliveries fed to an open ``AMQPConnection``, per delivery.

``fast`` is the codec as imported: the C extension ``ojs_codec._speedups`` when it is loaded
(``ojs_codec.SPEEDUPS``), else pure Python (also with ``OJS_CODEC_PURE=1``).  The first line
says which; with the C extension the pure-Python figures follow, for comparison.

Usage: ``python3 benchmarks/codec_bench.py [--json] [--smoke]``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pamqp import body as pamqp_body
from pamqp import commands, frame, header

import ojs_codec
from ojs_codec import _fast, _frames

FRAME_MAX = 131072
BODY = bytes(range(256))
EXCHANGE = "ojs"
ROUTING_KEY = "ojs.queue.default"
CONSUMER_TAG = "ctag-1.2c3f4e5d6b7a8c9d"
TIMESTAMP = datetime.datetime(2024, 5, 17, 12, 30, 45, tzinfo=datetime.UTC)
HEADERS: dict[str, Any] = {
    "x-ojs-queue": "default",
    "x-ojs-attempt": 1,
    "x-ojs-max-attempts": 25,
    "x-ojs-created-at": "2024-05-17T12:30:45.123456Z",
    "x-ojs-enqueued-at": "2024-05-17T12:30:45.234567Z",
    "x-ojs-tags": "billing,email,priority",
}
PROPS = ojs_codec.BasicProperties(
    content_type="application/openjobspec+json",
    content_encoding="utf-8",
    delivery_mode=2,
    message_id="018f86a4-3c2b-7a51-9d3e-4b5c6d7e8f90",
    type="email.send",
    timestamp=TIMESTAMP,
    app_id="ojs",
    headers=HEADERS,
)
PAMQP_PROPS = ojs_codec.to_pamqp(PROPS)


# --- the operations ------------------------------------------------------------------


def fast_encode_publish() -> bytes:
    return ojs_codec.encode_publish(1, EXCHANGE, ROUTING_KEY, PROPS, BODY, FRAME_MAX)


def pamqp_encode_publish() -> bytes:
    return b"".join(
        (
            frame.marshal(commands.Basic.Publish(exchange=EXCHANGE, routing_key=ROUTING_KEY), 1),
            frame.marshal(header.ContentHeader(0, len(BODY), PAMQP_PROPS), 1),
            frame.marshal(pamqp_body.ContentBody(BODY), 1),
        )
    )


DELIVERY = b"".join(
    (
        frame.marshal(
            commands.Basic.Deliver(
                consumer_tag=CONSUMER_TAG,
                delivery_tag=42,
                redelivered=False,
                exchange=EXCHANGE,
                routing_key=ROUTING_KEY,
            ),
            1,
        ),
        frame.marshal(header.ContentHeader(0, len(BODY), PAMQP_PROPS), 1),
        frame.marshal(pamqp_body.ContentBody(BODY), 1),
    )
)
_READER = ojs_codec.FrameReader(FRAME_MAX)


def fast_decode_deliver() -> tuple[Any, ...]:
    method, head, content = _READER.frames(DELIVERY)
    fields = ojs_codec.decode_deliver(method[2])
    _class_id, _size, props = ojs_codec.decode_content_header(head[2])
    return fields, props, content[2]


_PURE_READER = ojs_codec.FrameReader(FRAME_MAX)
_PURE_READER._split = _frames._split_frames_py


def pure_encode_publish() -> bytes:
    return _fast.encode_publish(1, EXCHANGE, ROUTING_KEY, PROPS, BODY, FRAME_MAX)


def pure_decode_deliver() -> tuple[Any, ...]:
    method, head, content = _PURE_READER.frames(DELIVERY)
    fields = _fast.decode_deliver(method[2])
    _class_id, _size, props = _fast.decode_content_header(head[2])
    return fields, props, content[2]


def pamqp_decode_deliver() -> tuple[Any, ...]:
    data = DELIVERY
    used, _ch, method = frame.unmarshal(data)
    data = data[used:]
    used, _ch, head = frame.unmarshal(data)
    data = data[used:]
    used, _ch, content = frame.unmarshal(data)
    return method, head, content


def fast_encode_ack() -> bytes:
    return ojs_codec.encode_ack(1, 42)


def pamqp_encode_ack() -> bytes:
    return frame.marshal(commands.Basic.Ack(delivery_tag=42), 1)


READ_DELIVERIES = 64


def open_protocol() -> ojs_codec.AMQPConnection:
    """An ``AMQPConnection`` past the handshake with channel 1 open, fed by hand."""
    proto = ojs_codec.AMQPConnection(ojs_codec.ConnectionParameters())
    proto.initiate()
    for method in (
        commands.Connection.Start(server_properties={}, mechanisms="PLAIN", locales="en_US"),
        commands.Connection.Tune(channel_max=2047, frame_max=FRAME_MAX, heartbeat=0),
        commands.Connection.OpenOk(),
    ):
        proto.receive_data(ojs_codec.encode_method_frame(0, method))
    channel = proto.open_channel()
    proto.receive_data(ojs_codec.encode_method_frame(channel, commands.Channel.OpenOk()))
    proto.data_to_send()
    return proto


_PROTO = open_protocol()
_READ = DELIVERY * READ_DELIVERIES


def receive_deliveries() -> list[Any]:
    return _PROTO.receive_data(_READ)


# name, the codec as imported, pure Python (None: the same code either way), pamqp
OPS: list[tuple[str, Callable[[], Any], Callable[[], Any] | None, Callable[[], Any]]] = [
    ("encode_publish", fast_encode_publish, pure_encode_publish, pamqp_encode_publish),
    ("decode_deliver", fast_decode_deliver, pure_decode_deliver, pamqp_decode_deliver),
    ("encode_ack", fast_encode_ack, None, pamqp_encode_ack),
]


def _check_equivalence() -> None:
    """Both sides must do the same work, or the numbers mean nothing."""
    assert fast_encode_publish() == pure_encode_publish() == pamqp_encode_publish()
    assert fast_encode_ack() == pamqp_encode_ack()
    assert fast_decode_deliver() == pure_decode_deliver()
    fields, props, body = fast_decode_deliver()
    method, head, content = pamqp_decode_deliver()
    assert fields == (
        method.consumer_tag,
        method.delivery_tag,
        method.redelivered,
        method.exchange,
        method.routing_key,
    )
    assert props == ojs_codec.from_pamqp(head.properties)
    assert body == content.value == BODY
    events = receive_deliveries()
    assert len(events) == READ_DELIVERIES and events[-1].body == BODY and events[-1].properties == PROPS


def receive_us(repeat: int, number: int) -> float:
    """Best time per delivery of ``receive_data`` on one read of ``READ_DELIVERIES``."""
    return best_us([(receive_deliveries, number)], repeat)[0] / READ_DELIVERIES


def _mean_us(fn: Callable[[], Any], number: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(number):
        fn()
    return (time.perf_counter_ns() - start) / number / 1000.0


def best_us(fns: list[tuple[Callable[[], Any], int]], repeat: int) -> list[float]:
    """Best mean time per call, in microseconds, of each ``(function, calls per run)``
    over ``repeat`` runs.

    The functions are timed in turn within each repeat, so that on a busy machine all
    see the same load; short runs and the best of many keep scheduler noise out of the
    result.
    """
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, (fn, number) in enumerate(fns):
            best[i] = min(best[i], _mean_us(fn, number))
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--smoke", action="store_true", help="tiny iteration counts (a quick check)")
    parser.add_argument("--number", type=int, default=None, help="calls per repeat")
    parser.add_argument("--repeat", type=int, default=None, help="repeats (the best is kept)")
    args = parser.parse_args(argv)
    number = args.number or (200 if args.smoke else 2000)
    repeat = args.repeat or (2 if args.smoke else 40)

    _check_equivalence()
    implementation = "c" if ojs_codec.SPEEDUPS else "pure"
    slow_number = max(1, number // 5)
    results: dict[str, dict[str, float]] = {}
    for name, fast, pure, slow in OPS:
        fns = [(fast, number), (slow, slow_number)]
        if ojs_codec.SPEEDUPS and pure is not None:
            fns.append((pure, slow_number))
        times = best_us(fns, repeat)
        results[name] = {
            "fast_us": round(times[0], 3),
            "pamqp_us": round(times[1], 3),
            "speedup": round(times[1] / times[0], 1),
        }
        if len(times) == 3:
            results[name]["pure_us"] = round(times[2], 3)
            results[name]["pure_speedup"] = round(times[1] / times[2], 1)
    receive = round(receive_us(repeat, max(1, number // READ_DELIVERIES)), 3)
    if args.json:
        print(
            json.dumps(
                {
                    "implementation": implementation,
                    "body_bytes": len(BODY),
                    "number": number,
                    "repeat": repeat,
                    "ops": results,
                    "receive_data_us_per_delivery": receive,
                }
            )
        )
        return 0
    print(f"implementation: {'C extension (ojs_codec._speedups)' if ojs_codec.SPEEDUPS else 'pure Python'}")
    for name, r in results.items():
        print(f"{name} fast_us={r['fast_us']:.3f} pamqp_us={r['pamqp_us']:.3f} speedup={r['speedup']:.1f}")
    print(f"receive_data us_per_delivery={receive:.3f} ({READ_DELIVERIES} deliveries per read, open channel)")
    pure_rows = [(name, r) for name, r in results.items() if "pure_us" in r]
    if pure_rows:
        print("pure Python, for comparison:")
        for name, r in pure_rows:
            print(f"  {name} pure_us={r['pure_us']:.3f} speedup={r['pure_speedup']:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
