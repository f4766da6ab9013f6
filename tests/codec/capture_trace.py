"""Record a real AMQP session with RabbitMQ as a test fixture (run by hand, not by pytest).

``python tests/codec/capture_trace.py [host] [port]`` writes ``data/rabbitmq_trace.json``:
a list of steps, each either a client command we issued (re-issued by the replay test) or
the exact bytes the broker sent in answer, up to the event we waited for.

The session: handshake (PLAIN), open a channel, Confirm.Select, declare a server-named
exclusive queue, publish 3 messages (one of 10 KB, split over three 4 KB body frames, one
empty), one mandatory unroutable publish (Basic.Return, then its ack), Basic.Qos,
Basic.Consume, three deliveries, three acks, Basic.Cancel, Channel.Close,
Connection.Close.
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from typing import Any

from pamqp import commands

import ojs_codec

OUT = Path(__file__).with_name("data") / "rabbitmq_trace.json"


def main() -> None:
    host = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1"
    port = int(sys.argv[2]) if len(sys.argv) > 2 else 5672
    proto = ojs_codec.AMQPConnection(ojs_codec.ConnectionParameters(heartbeat=0, frame_max=4096))
    steps: list[dict[str, Any]] = []
    sock = socket.create_connection((host, port), timeout=10)

    def act(name: str, *args: Any, **kwargs: Any) -> Any:
        steps.append({"client": name, "args": _jsonable(args), "kwargs": _jsonable(kwargs)})
        result = getattr(proto, name)(*args, **kwargs)
        sock.sendall(proto.data_to_send())
        return result

    proto_events: list[ojs_codec.Event] = []

    def until(predicate: Any) -> list[ojs_codec.Event]:
        received = b""
        seen: list[ojs_codec.Event] = []
        proto_events.clear()
        while not any(predicate(e) for e in seen):
            chunk = sock.recv(65536)
            if not chunk:
                raise SystemExit("broker closed the socket")
            received += chunk
            new = proto.receive_data(chunk)
            seen += new
            proto_events.extend(new)
            sock.sendall(proto.data_to_send())
        steps.append({"server": received.hex(), "events": [type(e).__name__ for e in seen]})
        return seen

    def send(cid: int, method: str, **fields: Any) -> None:
        steps.append({"client": "send_method", "args": [cid, method, _jsonable(fields)], "kwargs": {}})
        proto.send_method(cid, pamqp_method(method, fields))
        sock.sendall(proto.data_to_send())

    act("initiate")
    until(lambda e: isinstance(e, ojs_codec.ConnectionOpened))
    cid = act("open_channel")
    until(lambda e: isinstance(e, ojs_codec.ChannelOpened))
    send(cid, "Confirm.Select")
    until(lambda e: isinstance(e, ojs_codec.MethodReply))
    send(cid, "Queue.Declare", exclusive=True)
    events = until(lambda e: isinstance(e, ojs_codec.MethodReply))
    queue = next(e for e in events if isinstance(e, ojs_codec.MethodReply)).method.queue
    props = TRACE_PROPERTIES
    for body in (b'{"type":"email.send"}', b"x" * 10_000, b""):
        act("publish", cid, "", queue, body, props)
    until(lambda e: isinstance(e, ojs_codec.Confirmed) and 3 in e.tags)
    act("publish", cid, "", "no-such-queue-for-trace", b"lost", None, mandatory=True)
    until(lambda e: isinstance(e, ojs_codec.Confirmed) and 4 in e.tags)
    send(cid, "Basic.Qos", prefetch_count=10)
    until(lambda e: isinstance(e, ojs_codec.MethodReply))
    send(cid, "Basic.Consume", queue=queue, consumer_tag="trace")
    events = until(lambda e: sum(isinstance(x, ojs_codec.Delivery) for x in proto_events) >= 3)
    for d in [e for e in events if isinstance(e, ojs_codec.Delivery)]:
        act("ack", cid, d.delivery_tag)
    send(cid, "Basic.Cancel", consumer_tag="trace")
    until(lambda e: isinstance(e, ojs_codec.MethodReply))
    act("close_channel", cid)
    until(lambda e: isinstance(e, ojs_codec.ChannelCloseOk))
    act("close")
    until(lambda e: isinstance(e, ojs_codec.ConnectionCloseOk))
    sock.close()
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps({"broker": f"{host}:{port}", "queue": queue, "steps": steps}, indent=1))
    print(f"wrote {OUT} ({sum(len(s.get('server', '')) // 2 for s in steps)} bytes from the broker)")


def pamqp_method(name: str, fields: dict[str, Any]) -> Any:
    """``"Queue.Declare", {...}`` -> the pamqp command instance."""
    class_name, method_name = name.split(".")
    return getattr(getattr(commands, class_name), method_name)(**fields)


TRACE_PROPERTIES = ojs_codec.BasicProperties(
    content_type="application/openjobspec+json",
    delivery_mode=2,
    message_id="019414d4-8b2e-7c3a-b5d1-f0e2a3b4c5d6",
    headers={"x-ojs-queue": "email", "x-ojs-attempt": 1, "nested": {"a": [1, "two", None]}},
)


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    if isinstance(value, ojs_codec.BasicProperties):
        return {"properties": True}
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


if __name__ == "__main__":
    main()
