"""The sans-IO state machines of ``codec._protocol``: handshake, tuning, close in both
directions, channels, one synchronous method at a time, content assembly, confirm
numbering, Basic.Return correlation, heartbeats, and illegal input.  No broker: the
broker's side is built with pamqp (``Peer``)."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands

import ojs_codec as codec
from ojs_codec import BasicProperties

from .codec_strategies import SETTINGS, split_at


class Peer:
    """Builds the broker's frames."""

    @staticmethod
    def method(channel: int, method: Any) -> bytes:
        return codec.encode_method_frame(channel, method)

    @staticmethod
    def content(
        channel: int, body: bytes, props: BasicProperties | None = None, frame_max: int = 131072
    ) -> bytes:
        return codec.encode_content(channel, 60, props or BasicProperties(), body, frame_max)

    @classmethod
    def start(cls, mechanisms: str = "PLAIN AMQPLAIN EXTERNAL") -> bytes:
        return cls.method(
            0,
            commands.Connection.Start(
                version_major=0,
                version_minor=9,
                server_properties={"product": "RabbitMQ"},
                mechanisms=mechanisms,
                locales="en_US",
            ),
        )

    @classmethod
    def tune(cls, channel_max: int = 2047, frame_max: int = 131072, heartbeat: int = 60) -> bytes:
        return cls.method(
            0, commands.Connection.Tune(channel_max=channel_max, frame_max=frame_max, heartbeat=heartbeat)
        )

    @classmethod
    def deliver(
        cls, channel: int, tag: int, body: bytes, consumer_tag: str = "c1", routing_key: str = "q"
    ) -> bytes:
        return cls.method(
            channel,
            commands.Basic.Deliver(
                consumer_tag=consumer_tag, delivery_tag=tag, exchange="", routing_key=routing_key
            ),
        ) + cls.content(channel, body)

    @classmethod
    def ack(cls, channel: int, tag: int, multiple: bool = False) -> bytes:
        return cls.method(channel, commands.Basic.Ack(delivery_tag=tag, multiple=multiple))

    @classmethod
    def nack(cls, channel: int, tag: int, multiple: bool = False) -> bytes:
        return cls.method(channel, commands.Basic.Nack(delivery_tag=tag, multiple=multiple))

    @classmethod
    def returned(cls, channel: int, routing_key: str, body: bytes = b"r") -> bytes:
        return cls.method(
            channel,
            commands.Basic.Return(
                reply_code=312, reply_text="NO_ROUTE", exchange="", routing_key=routing_key
            ),
        ) + cls.content(channel, body)


def sent_methods(data: bytes) -> list[Any]:
    """Decode the method frames among bytes the client sent."""
    reader = codec.FrameReader()
    if data.startswith(codec.PROTOCOL_HEADER):
        data = data[len(codec.PROTOCOL_HEADER) :]
    return [codec.decode_method(p) for t, _, p in reader.frames(data) if t == codec.FRAME_METHOD]


def open_connection(
    heartbeat: int = 60, mechanism: str = "PLAIN", server_heartbeat: int = 60
) -> codec.AMQPConnection:
    proto = codec.AMQPConnection(
        codec.ConnectionParameters(
            heartbeat=heartbeat,
            credentials=codec.Credentials(username="u", password="p", mechanism=mechanism),
        )
    )
    proto.initiate()
    proto.data_to_send()
    proto.receive_data(Peer.start())
    proto.receive_data(Peer.tune(heartbeat=server_heartbeat))
    events = proto.receive_data(Peer.method(0, commands.Connection.OpenOk()))
    assert isinstance(events[0], codec.ConnectionOpened)
    proto.data_to_send()
    return proto


def open_channel(proto: codec.AMQPConnection, confirms: bool = False) -> int:
    cid = proto.open_channel()
    assert proto.receive_data(Peer.method(cid, commands.Channel.OpenOk())) == [
        codec.ChannelOpened(channel_id=cid)
    ]
    if confirms:
        proto.send_method(cid, commands.Confirm.Select())
        proto.receive_data(Peer.method(cid, commands.Confirm.SelectOk()))
    proto.data_to_send()
    return cid


# --------------------------------------------------------------------------- handshake


def test_handshake_sends_header_start_ok_tune_ok_open() -> None:
    proto = codec.AMQPConnection(codec.ConnectionParameters(virtual_host="/ojs"))
    proto.initiate()
    assert proto.data_to_send() == b"AMQP\x00\x00\x09\x01"
    assert proto.receive_data(Peer.start()) == []
    (start_ok,) = sent_methods(proto.data_to_send())
    assert start_ok.name == "Connection.StartOk"
    assert start_ok.mechanism == "PLAIN"
    caps = start_ok.client_properties["capabilities"]
    for cap in (
        "publisher_confirms",
        "consumer_cancel_notify",
        "connection.blocked",
        "basic.nack",
        "exchange_exchange_bindings",
        "authentication_failure_close",
        "per_consumer_qos",
    ):
        assert caps[cap] is True
    proto.receive_data(Peer.tune(channel_max=100, frame_max=65536, heartbeat=30))
    tune_ok, open_ = sent_methods(proto.data_to_send())
    assert (tune_ok.channel_max, tune_ok.frame_max, tune_ok.heartbeat) == (100, 65536, 30)
    assert open_.virtual_host == "/ojs"
    (opened,) = proto.receive_data(Peer.method(0, commands.Connection.OpenOk()))
    assert isinstance(opened, codec.ConnectionOpened)
    assert (opened.channel_max, opened.frame_max, opened.heartbeat) == (100, 65536, 30)
    assert proto.state is codec.ConnectionState.OPEN


@pytest.mark.parametrize(
    ("client", "server", "expected"),
    [(60, 60, 60), (60, 30, 30), (10, 600, 10), (0, 60, 60), (60, 0, 60), (0, 0, 0)],
)
def test_negotiation_rule(client: int, server: int, expected: int) -> None:
    """RabbitMQ's rule: if either side offers 0 the larger wins, otherwise the smaller."""
    assert codec.negotiate(client, server) == expected
    proto = codec.AMQPConnection(codec.ConnectionParameters(heartbeat=client))
    proto.initiate()
    proto.receive_data(Peer.start())
    proto.receive_data(Peer.tune(heartbeat=server))
    assert proto.heartbeat == expected


def _response(mechanism: str) -> bytes:
    proto = codec.AMQPConnection(
        codec.ConnectionParameters(
            credentials=codec.Credentials(username="u", password="p", mechanism=mechanism)
        )
    )
    proto.initiate()
    proto.data_to_send()
    proto.receive_data(Peer.start())
    payload = codec.FrameReader().frames(proto.data_to_send())[0][2]
    # class, method, client-properties table, mechanism shortstr, response longstr
    table_len = struct.unpack_from(">I", payload, 4)[0]
    pos = 8 + table_len
    pos += 1 + payload[pos]
    (length,) = struct.unpack_from(">I", payload, pos)
    return bytes(payload[pos + 4 : pos + 4 + length])


def test_auth_responses() -> None:
    assert _response("PLAIN") == b"\x00u\x00p"
    assert _response("EXTERNAL") == b""
    table, _ = codec.decode_table(struct.pack(">I", len(_response("AMQPLAIN"))) + _response("AMQPLAIN"), 0)
    assert table == {"LOGIN": "u", "PASSWORD": "p"}


def test_password_never_in_repr() -> None:
    creds = codec.Credentials(username="u", password="hunter2")
    assert "hunter2" not in repr(creds)
    assert "hunter2" not in repr(codec.ConnectionParameters(credentials=creds))


def test_mechanism_not_offered_is_an_authentication_error() -> None:
    proto = codec.AMQPConnection(
        codec.ConnectionParameters(credentials=codec.Credentials(mechanism="EXTERNAL"))
    )
    proto.initiate()
    with pytest.raises(codec.AuthenticationError, match="EXTERNAL"):
        proto.receive_data(Peer.start(mechanisms="PLAIN AMQPLAIN"))
    assert proto.state is codec.ConnectionState.ERROR


def test_refused_login_is_authentication_error() -> None:
    proto = codec.AMQPConnection()
    proto.initiate()
    proto.receive_data(Peer.start())
    proto.data_to_send()
    (ev,) = proto.receive_data(
        Peer.method(
            0,
            commands.Connection.Close(
                reply_code=403, reply_text="ACCESS_REFUSED - Login was refused", class_id=0, method_id=0
            ),
        )
    )
    assert isinstance(ev, codec.ConnectionClosed)
    assert isinstance(ev.error, codec.AuthenticationError)
    assert sent_methods(proto.data_to_send())[0].name == "Connection.CloseOk"


def test_version_mismatch_header() -> None:
    proto = codec.AMQPConnection()
    proto.initiate()
    with pytest.raises(codec.ProtocolVersionMismatch):
        proto.receive_data(b"AMQP\x00\x00\x09\x00")


# --------------------------------------------------------------------------- close


def test_client_close_handshake() -> None:
    proto = open_connection()
    proto.close(200, "bye")
    (close,) = sent_methods(proto.data_to_send())
    assert (close.name, close.reply_code, close.reply_text) == ("Connection.Close", 200, "bye")
    assert proto.state is codec.ConnectionState.CLOSING
    # frames still in flight are dropped while closing
    assert proto.receive_data(Peer.method(0, commands.Connection.Blocked(reason="x"))) == []
    assert proto.receive_data(Peer.method(0, commands.Connection.CloseOk())) == [codec.ConnectionCloseOk()]
    assert proto.state is codec.ConnectionState.CLOSED
    proto.close()  # idempotent
    assert proto.data_to_send() == b""


def test_broker_close_maps_reply_code() -> None:
    proto = open_connection()
    (ev,) = proto.receive_data(
        Peer.method(
            0,
            commands.Connection.Close(
                reply_code=320, reply_text="CONNECTION_FORCED - shutdown", class_id=0, method_id=0
            ),
        )
    )
    assert isinstance(ev, codec.ConnectionClosed)
    assert isinstance(ev.error, codec.ConnectionForced)
    assert ev.error.code == 320 and ev.error.remote
    assert sent_methods(proto.data_to_send())[0].name == "Connection.CloseOk"
    assert proto.state is codec.ConnectionState.CLOSED


def test_simultaneous_close() -> None:
    proto = open_connection()
    proto.close()
    proto.data_to_send()
    events = proto.receive_data(
        Peer.method(0, commands.Connection.Close(reply_code=320, reply_text="x", class_id=0, method_id=0))
    )
    assert events == [codec.ConnectionCloseOk()]
    assert sent_methods(proto.data_to_send())[0].name == "Connection.CloseOk"


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (320, codec.ConnectionForced),
        (402, codec.InvalidPath),
        (501, codec.FrameError),
        (502, codec.ProtocolSyntaxError),
        (503, codec.CommandInvalid),
        (504, codec.ChannelProtocolError),
        (505, codec.UnexpectedFrame),
        (506, codec.ResourceError),
        (530, codec.NotAllowed),
        (540, codec.NotImplementedByPeer),
        (541, codec.InternalError),
    ],
)
def test_every_connection_reply_code_has_a_class(code: int, cls: type[Exception]) -> None:
    err = codec.connection_error_for(code, "text", 50, 10)
    assert type(err) is cls
    assert err.code == code and err.method_name == "Queue.Declare"
    assert "text" in str(err)


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (311, codec.ContentTooLarge),
        (312, codec.NoRoute),
        (313, codec.NoConsumers),
        (403, codec.AccessRefused),
        (404, codec.NotFound),
        (405, codec.ResourceLocked),
        (406, codec.PreconditionFailed),
    ],
)
def test_every_channel_reply_code_has_a_class(code: int, cls: type[Exception]) -> None:
    err = codec.channel_error_for(code, "text", 60, 40, channel_id=3)
    assert type(err) is cls
    assert isinstance(err, codec.ChannelLevelError) and not isinstance(err, codec.ConnectionLevelError)
    assert err.channel_id == 3 and err.method_name == "Basic.Publish"


# --------------------------------------------------------------------------- channels


def test_channel_ids_allocated_and_reused() -> None:
    proto = open_connection()
    a, b = open_channel(proto), open_channel(proto)
    assert (a, b) == (1, 2)
    proto.close_channel(a)
    assert sent_methods(proto.data_to_send())[0].name == "Channel.Close"
    assert proto.receive_data(Peer.method(a, commands.Channel.CloseOk())) == [
        codec.ChannelCloseOk(channel_id=a)
    ]
    assert open_channel(proto) == 1


def test_channel_max_is_enforced() -> None:
    proto = codec.AMQPConnection(codec.ConnectionParameters(channel_max=2))
    proto.initiate()
    proto.receive_data(Peer.start())
    proto.receive_data(Peer.tune(channel_max=0))
    proto.receive_data(Peer.method(0, commands.Connection.OpenOk()))
    open_channel(proto)
    open_channel(proto)
    with pytest.raises(codec.UsageError, match="channel_max"):
        proto.open_channel()


def test_broker_channel_close_is_typed_and_frees_the_id() -> None:
    proto = open_connection()
    cid = open_channel(proto)
    proto.send_method(cid, commands.Queue.Declare(queue="q", passive=True))
    proto.data_to_send()
    (ev,) = proto.receive_data(
        Peer.method(
            cid,
            commands.Channel.Close(
                reply_code=404, reply_text="NOT_FOUND - no queue", class_id=50, method_id=10
            ),
        )
    )
    assert isinstance(ev, codec.ChannelClosed)
    assert isinstance(ev.error, codec.NotFound)
    assert ev.error.method_name == "Queue.Declare"
    assert sent_methods(proto.data_to_send())[0].name == "Channel.CloseOk"
    assert proto.channel_state(cid) is codec.ChannelState.CLOSED
    assert open_channel(proto) == cid
    assert proto.state is codec.ConnectionState.OPEN


def test_one_synchronous_method_at_a_time() -> None:
    proto = open_connection()
    cid = open_channel(proto)
    assert proto.send_method(cid, commands.Queue.Declare(queue="a")) is True
    with pytest.raises(codec.UsageError, match="one synchronous method at a time"):
        proto.send_method(cid, commands.Queue.Declare(queue="b"))
    # nowait methods and asynchronous ones are fine meanwhile
    assert proto.send_method(cid, commands.Basic.Ack(delivery_tag=1)) is False
    (reply,) = proto.receive_data(
        Peer.method(cid, commands.Queue.DeclareOk(queue="a", message_count=0, consumer_count=0))
    )
    assert isinstance(reply, codec.MethodReply) and reply.method.queue == "a"
    assert proto.send_method(cid, commands.Queue.Declare(queue="b")) is True


def test_unexpected_reply_is_command_invalid_and_closes() -> None:
    proto = open_connection()
    cid = open_channel(proto)
    with pytest.raises(codec.CommandInvalid) as info:
        proto.receive_data(
            Peer.method(cid, commands.Queue.DeclareOk(queue="x", message_count=0, consumer_count=0))
        )
    assert info.value.code == 503 and not info.value.remote
    assert proto.state is codec.ConnectionState.ERROR
    (close,) = sent_methods(proto.data_to_send())
    assert (close.name, close.reply_code) == ("Connection.Close", 503)
    assert proto.receive_data(Peer.ack(cid, 1)) == []  # dead machine ignores input


@pytest.mark.parametrize("stream", [Peer.ack(7, 1), Peer.deliver(7, 1, b"whole delivery")])
def test_frame_on_unopened_channel(stream: bytes) -> None:
    proto = open_connection()
    with pytest.raises(codec.ChannelProtocolError):
        proto.receive_data(stream)


# --------------------------------------------------------------------------- content


def test_content_assembly_interleaved_across_channels() -> None:
    proto = open_connection()
    a, b = open_channel(proto), open_channel(proto)
    big = bytes(range(256)) * 40  # 10,240 bytes: three body frames at frame_max 4096
    frames_a = codec.FrameReader().frames(Peer.deliver(a, 1, big, routing_key="ra"))
    frames_b = codec.FrameReader().frames(Peer.deliver(b, 1, b"hello", routing_key="rb"))
    assert len(frames_a) == 3  # method, header, one 10 KB body frame at the default frame_max
    # Re-split a's body at 4088 bytes to get several body frames, then interleave with b.
    body_frames = [codec.encode_frame(3, a, big[i : i + 4088]) for i in range(0, len(big), 4088)]
    a_bytes = [codec.encode_frame(t, c, p) for t, c, p in frames_a[:2]] + body_frames
    b_bytes = [codec.encode_frame(t, c, p) for t, c, p in frames_b]
    stream = (
        a_bytes[0] + b_bytes[0] + a_bytes[1] + b_bytes[1] + a_bytes[2] + b_bytes[2] + b"".join(a_bytes[3:])
    )
    events = proto.receive_data(stream)
    assert [(e.channel_id, e.routing_key, e.body) for e in events if isinstance(e, codec.Delivery)] == [
        (b, "rb", b"hello"),
        (a, "ra", big),
    ]


def test_empty_body_completes_at_header() -> None:
    proto = open_connection()
    cid = open_channel(proto)
    (ev,) = proto.receive_data(Peer.deliver(cid, 1, b""))
    assert isinstance(ev, codec.Delivery) and ev.body == b""


def _delivery_frames(cid: int, tag: int, body: bytes, props: BasicProperties, body_frame: int) -> list[bytes]:
    """A delivery's frames, its body cut into frames of at most ``body_frame`` bytes."""
    deliver = commands.Basic.Deliver(f"c{cid}", tag, False, "ex", f"k{tag}")
    method = Peer.method(cid, deliver)
    head = codec.encode_content(cid, 60, props, b"", 131072)  # the header frame alone
    size = struct.pack(">Q", len(body))
    head = head[:11] + size + head[19:]  # announce the real body size
    bodies = [codec.encode_frame(3, cid, body[i : i + body_frame]) for i in range(0, len(body), body_frame)]
    return [method, head, *bodies]


def _seen(events: list[Any]) -> list[tuple[Any, ...]]:
    return [
        (type(e).__name__, e.channel_id, e.delivery_tag, e.routing_key, e.consumer_tag, e.properties, e.body)
        if isinstance(e, codec.Delivery)
        else (type(e).__name__,)
        for e in events
    ]


@given(
    items=st.lists(
        st.tuples(
            st.sampled_from([0, 1]),  # which channel
            st.binary(max_size=40),  # body (empty bodies complete at the header)
            st.sampled_from([7, 16, 1000]),  # body frame size: one frame, or several
            st.booleans(),  # properties or none
        ),
        min_size=1,
        max_size=12,
    ),
    interleave=st.randoms(use_true_random=False),
    cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=6),
    heartbeats=st.booleans(),
)
@settings(SETTINGS, max_examples=200)
def test_deliveries_are_the_same_however_the_bytes_arrive(
    items: list[tuple[int, bytes, int, bool]], interleave: Any, cuts: list[int], heartbeats: bool
) -> None:
    """A read holding whole deliveries takes a shortcut past the channel state machine;
    it must give exactly the events the frame-by-frame path gives, for any mix of
    channels, body sizes and body frames, content interleaved across channels, and any
    cut of the stream into reads."""
    props = BasicProperties(content_type="application/json", message_id="m", headers={"a": 1})
    per_channel: list[list[bytes]] = [[], []]
    for tag, (which, body, body_frame, with_props) in enumerate(items, start=1):
        sent_props = props if with_props else BasicProperties()
        per_channel[which].extend(_delivery_frames(which + 1, tag, body, sent_props, body_frame))
    # Interleave the two channels' frames, each channel's in order (content frames of
    # different channels may interleave; a channel's own may not).
    stream: list[bytes] = []
    queues = [list(per_channel[0]), list(per_channel[1])]
    while queues[0] or queues[1]:
        which = interleave.choice([i for i in (0, 1) if queues[i]])
        stream.append(queues[which].pop(0))
        if heartbeats and interleave.random() < 0.2:
            stream.append(codec.encode_frame(8, 0, b""))
    data = b"".join(stream)

    def run(reads: list[bytes]) -> list[tuple[Any, ...]]:
        proto = open_connection()
        assert (open_channel(proto), open_channel(proto)) == (1, 2)
        events: list[Any] = []
        for read in reads:
            events += proto.receive_data(read)
        assert proto.state is codec.ConnectionState.OPEN
        return _seen(events)

    byte_by_byte = run([data[i : i + 1] for i in range(len(data))])  # never a whole frame at once
    # Every delivery, each channel's in the order sent, with its own body and properties.
    for which in (0, 1):
        sent = [
            (tag, body, props if with_props else BasicProperties())
            for tag, (ch, body, _, with_props) in enumerate(items, start=1)
            if ch == which
        ]
        assert [(e[2], e[6], e[5]) for e in byte_by_byte if e[1] == which + 1] == sent
    assert run([data]) == byte_by_byte
    assert run(split_at(data, cuts)) == byte_by_byte


@pytest.mark.parametrize(
    ("stream", "error"),
    [
        # a method frame where the content header was expected
        (
            lambda c: (
                Peer.method(c, commands.Basic.Deliver(consumer_tag="c", delivery_tag=1, routing_key="q"))
                + Peer.ack(c, 1)
            ),
            codec.UnexpectedFrame,
        ),
        # a whole delivery where the previous one's content header was expected
        (
            lambda c: (
                Peer.method(c, commands.Basic.Deliver(consumer_tag="c", delivery_tag=1, routing_key="q"))
                + Peer.deliver(c, 2, b"whole")
            ),
            codec.UnexpectedFrame,
        ),
        # a body frame without a header
        (lambda c: codec.encode_frame(3, c, b"x"), codec.UnexpectedFrame),
        # a header without a content method
        (lambda c: codec.encode_content(c, 60, BasicProperties(), b"", 131072), codec.UnexpectedFrame),
        # more body than announced
        (
            lambda c: (
                Peer.method(c, commands.Basic.Deliver(consumer_tag="c", delivery_tag=1, routing_key="q"))
                + codec.encode_content(c, 60, BasicProperties(), b"ab", 131072)[:-11]
                + codec.encode_frame(3, c, b"abc")
            ),
            codec.FrameError,
        ),
        # a heartbeat frame must be on channel 0 (spec: 501 FRAME_ERROR)
        (lambda c: codec.encode_frame(8, c, b""), codec.FrameError),
    ],
)
def test_illegal_content_sequences(stream: Any, error: type[Exception]) -> None:
    proto = open_connection()
    cid = open_channel(proto)
    with pytest.raises(error):
        proto.receive_data(stream(cid))
    assert proto.state is codec.ConnectionState.ERROR


def _header(channel: int, size: int) -> bytes:
    """A content header frame announcing ``size`` body bytes."""
    head = codec.encode_content(channel, 60, BasicProperties(), b"", 131072)
    return head[:11] + struct.pack(">Q", size) + head[19:]


def _body(channel: int, data: bytes) -> bytes:
    return codec.encode_frame(3, channel, data)


def _deliver(channel: int, tag: int = 1) -> bytes:
    return Peer.method(channel, commands.Basic.Deliver(consumer_tag="c", delivery_tag=tag, routing_key="q"))


@pytest.mark.parametrize(
    "stream",
    [
        # the header that follows is another channel's, which expects no content
        lambda a, b: _deliver(a) + _header(b, 3) + _body(a, b"abc"),
        # the body that follows is another channel's
        lambda a, b: _deliver(a) + _header(a, 3) + _body(b, b"abc"),
        # a method frame where the body was expected (its payload as long as announced)
        lambda a, b: _deliver(a) + _header(a, len(Peer.ack(a, 1)) - 8) + Peer.ack(a, 1),
        # an empty body frame after a header that announced none (the content was complete)
        lambda a, b: _deliver(a) + _header(a, 0) + _body(a, b""),
        # a body frame carrying a header's bytes where the header was expected
        lambda a, b: _deliver(a) + codec.encode_frame(3, a, _header(a, 3)[7:-1]) + _body(a, b"abc"),
    ],
)
def test_frames_that_only_look_like_a_delivery(stream: Any) -> None:
    """Three frames in one read that resemble Deliver, header and body but break the
    content rules are refused like frame by frame, never taken as a delivery."""
    proto = open_connection()
    a, b = open_channel(proto), open_channel(proto)
    with pytest.raises(codec.UnexpectedFrame):
        proto.receive_data(stream(a, b))
    assert proto.state is codec.ConnectionState.ERROR


def test_whole_delivery_on_a_closing_channel_is_dropped() -> None:
    """After the client asked to close a channel, a delivery already in flight (here,
    whole in one read with the next channel's) is dropped, not handed out."""
    proto = open_connection()
    a, b = open_channel(proto), open_channel(proto)
    proto.close_channel(a)
    events = proto.receive_data(Peer.deliver(a, 1, b"late") + Peer.deliver(b, 1, b"live"))
    assert [(e.channel_id, e.body) for e in events if isinstance(e, codec.Delivery)] == [(b, b"live")]
    assert proto.channel_state(a) is codec.ChannelState.CLOSING


def test_oversized_message_is_frame_error_not_memory() -> None:
    proto = codec.AMQPConnection(codec.ConnectionParameters(max_message_size=1000))
    proto.initiate()
    proto.receive_data(Peer.start())
    proto.receive_data(Peer.tune())
    proto.receive_data(Peer.method(0, commands.Connection.OpenOk()))
    cid = open_channel(proto)
    with pytest.raises(codec.FrameError, match="max_message_size"):
        proto.receive_data(Peer.deliver(cid, 1, b"x" * 1001))


# --------------------------------------------------------------------------- confirms


def _publish(
    proto: codec.AMQPConnection, cid: int, n: int, routing_key: str = "q", mandatory: bool = False
) -> list[int]:
    tags = [proto.publish(cid, "", routing_key, b"m", mandatory=mandatory) for _ in range(n)]
    proto.data_to_send()
    return tags


def test_publish_tags_only_in_confirm_mode() -> None:
    proto = open_connection()
    cid = open_channel(proto)
    assert _publish(proto, cid, 2) == [0, 0]
    with pytest.raises(codec.CommandInvalid):
        proto.receive_data(Peer.ack(cid, 1))


def test_multiple_ack_expands_to_covered_tags_in_order() -> None:
    proto = open_connection()
    cid = open_channel(proto, confirms=True)
    assert _publish(proto, cid, 6) == [1, 2, 3, 4, 5, 6]
    (ev,) = proto.receive_data(Peer.ack(cid, 2))
    assert isinstance(ev, codec.Confirmed) and (ev.tags, ev.ack) == ([2], True)
    (ev,) = proto.receive_data(Peer.ack(cid, 4, multiple=True))
    assert ev.tags == [1, 3, 4]  # 2 was already confirmed
    (ev,) = proto.receive_data(Peer.nack(cid, 6, multiple=True))
    assert (ev.tags, ev.ack) == ([5, 6], False)
    assert proto.unconfirmed_tags(cid) == []
    with pytest.raises(codec.CommandInvalid, match="unknown publish tag"):
        proto.receive_data(Peer.ack(cid, 9))


def test_return_is_tied_to_the_publish_it_belongs_to() -> None:
    proto = open_connection()
    cid = open_channel(proto, confirms=True)
    _publish(proto, cid, 1, routing_key="a", mandatory=True)  # 1
    _publish(proto, cid, 1, routing_key="b", mandatory=True)  # 2
    _publish(proto, cid, 1, routing_key="a", mandatory=True)  # 3
    _publish(proto, cid, 1, routing_key="a")  # 4: not mandatory, can't be returned
    # RabbitMQ: Return for the unroutable one (3 — say 1 was routed), then its ack.
    assert proto.receive_data(Peer.ack(cid, 1)) != []
    assert proto.receive_data(Peer.returned(cid, "a", b"body-3")) == []
    (ev,) = proto.receive_data(Peer.ack(cid, 3, multiple=True))
    assert ev.tags == [2, 3]
    assert ev.returned is not None and set(ev.returned) == {3}
    assert ev.returned[3].body == b"body-3" and ev.returned[3].reply_code == 312
    (ev,) = proto.receive_data(Peer.ack(cid, 4))
    assert ev.returned is None


def test_return_without_confirms_is_its_own_event() -> None:
    proto = open_connection()
    cid = open_channel(proto)
    (ev,) = proto.receive_data(Peer.returned(cid, "x"))
    assert isinstance(ev, codec.Returned) and ev.routing_key == "x"


# --------------------------------------------------------------------------- heartbeats


def test_heartbeat_sent_after_half_interval_of_silence() -> None:
    proto = open_connection(heartbeat=10, server_heartbeat=10)
    assert proto.heartbeat_tick(100.0) == 105.0
    assert proto.data_to_send() == b""
    proto.heartbeat_tick(104.0)
    assert proto.data_to_send() == b""
    proto.heartbeat_tick(105.0)
    assert proto.data_to_send() == codec.HEARTBEAT_FRAME
    # writing resets the timer
    proto.ack(open_channel(proto), 1)
    proto.data_to_send()
    proto.heartbeat_tick(110.0)
    assert proto.data_to_send() == b""


def test_peer_silent_for_two_intervals_is_dead() -> None:
    proto = open_connection(heartbeat=10, server_heartbeat=10)
    proto.heartbeat_tick(0.0)
    proto.heartbeat_tick(15.0)
    proto.receive_data(codec.HEARTBEAT_FRAME)  # the broker is alive at 15
    proto.heartbeat_tick(20.0)
    proto.heartbeat_tick(39.0)
    with pytest.raises(codec.ConnectionLevelError, match="missed heartbeats"):
        proto.heartbeat_tick(40.0)
    assert proto.state is codec.ConnectionState.ERROR


def test_heartbeat_off() -> None:
    proto = open_connection(heartbeat=0, server_heartbeat=0)
    assert proto.heartbeat_tick(1e9) is None


# --------------------------------------------------------------------------- (state, input)

SERVER_METHODS: list[Any] = [
    commands.Connection.Start(version_major=0, version_minor=9, mechanisms="PLAIN", locales="en_US"),
    commands.Connection.Tune(channel_max=10, frame_max=131072, heartbeat=60),
    commands.Connection.OpenOk(),
    commands.Connection.Close(reply_code=320, reply_text="x", class_id=0, method_id=0),
    commands.Connection.CloseOk(),
    commands.Connection.Blocked(reason="mem"),
    commands.Connection.Unblocked(),
    commands.Connection.Secure(challenge="c"),
    commands.Channel.OpenOk(),
    commands.Channel.Close(reply_code=404, reply_text="x", class_id=0, method_id=0),
    commands.Channel.CloseOk(),
    commands.Channel.Flow(active=False),
    commands.Queue.DeclareOk(queue="q", message_count=0, consumer_count=0),
    commands.Basic.ConsumeOk(consumer_tag="c"),
    commands.Basic.Cancel(consumer_tag="c"),
    commands.Basic.GetEmpty(),
    commands.Basic.Ack(delivery_tag=1),
    commands.Basic.Nack(delivery_tag=1, multiple=True),
    commands.Basic.Deliver(consumer_tag="c", delivery_tag=1, routing_key="q"),
    commands.Confirm.SelectOk(),
]


@settings(max_examples=400, deadline=None)
@given(
    setup=st.integers(0, 3),
    inputs=st.lists(st.tuples(st.sampled_from(range(len(SERVER_METHODS))), st.integers(0, 2)), max_size=8),
)
def test_every_state_input_pair_yields_events_or_a_protocol_error(
    setup: int, inputs: list[tuple[int, int]]
) -> None:
    """Whatever the broker sends in whatever state, the machine returns events or raises a
    ProtocolError (and is then in ERROR, ignoring further input) — nothing else."""
    proto = codec.AMQPConnection()
    proto.initiate()
    if setup >= 1:
        proto.receive_data(Peer.start())
    if setup >= 2:
        proto.receive_data(Peer.tune())
        proto.receive_data(Peer.method(0, commands.Connection.OpenOk()))
    if setup >= 3:
        open_channel(proto, confirms=True)
        _publish(proto, 1, 1)
    for index, channel in inputs:
        data = Peer.method(channel, SERVER_METHODS[index])
        try:
            events = proto.receive_data(data)
        except codec.ProtocolError as exc:
            assert proto.state is codec.ConnectionState.ERROR
            assert 500 <= exc.code < 600 or exc.code in (403, 530)
            assert proto.receive_data(data) == []
            return
        except codec.ConnectionLevelError:
            assert proto.state is codec.ConnectionState.ERROR  # e.g. Secure: authentication error
            return
        assert all(isinstance(e, codec.Event) for e in events)
        proto.data_to_send()


def test_crossed_channel_close_keeps_the_id_until_the_brokers_close_ok() -> None:
    """Both sides send Channel.Close: we answer the broker's, report our close done, and
    swallow the Close-Ok the broker still sends for ours (RabbitMQ does) instead of
    treating it as a frame on an unopened channel."""
    proto = open_connection()
    cid = open_channel(proto)
    proto.close_channel(cid)
    proto.data_to_send()
    events = proto.receive_data(
        Peer.method(cid, commands.Channel.Close(reply_code=406, reply_text="x", class_id=0, method_id=0))
    )
    assert events == [codec.ChannelCloseOk(channel_id=cid)]
    assert sent_methods(proto.data_to_send())[0].name == "Channel.CloseOk"
    assert proto.open_channel() != cid  # still reserved
    assert proto.receive_data(Peer.method(cid, commands.Channel.CloseOk())) == []
    assert proto.state is codec.ConnectionState.OPEN
    assert proto.channel_state(cid) is codec.ChannelState.CLOSED


# ------------------------------------------------------------------ folding acks


def _acks(data: bytes) -> list[tuple[int, bool]]:
    """(delivery tag, multiple) of each Basic.Ack among bytes the client sent."""
    return [(m.delivery_tag, m.multiple) for m in sent_methods(data) if isinstance(m, commands.Basic.Ack)]


def test_an_ack_folds_into_the_ack_queued_before_it() -> None:
    """With ``fold`` (every delivery up to the tag is settled), consecutive acks of a
    channel become one ``multiple=True`` ack of the highest tag: one frame, the same
    deliveries settled."""
    proto = open_connection()
    cid = open_channel(proto)
    proto.ack(cid, 1, fold=True)
    for tag in range(2, 6):
        proto.ack(cid, tag, fold=True)
    assert _acks(proto.data_to_send()) == [(5, True)]


def test_an_ack_does_not_fold_when_it_may_not() -> None:
    proto = open_connection()
    cid = open_channel(proto)
    other = open_channel(proto)
    proto.ack(cid, 1)
    proto.ack(cid, 2)  # not told that every earlier delivery is settled
    proto.ack(other, 3, fold=True)  # another channel's tags
    proto.ack(cid, 4, fold=True)
    proto.ack(cid, 3, fold=True)  # lower than the ack before it: it would un-settle 4
    proto.reject(cid, 5)
    proto.ack(cid, 6, fold=True)  # the frame before it is not an ack
    sent = _acks(proto.data_to_send())
    assert sent == [(1, False), (2, False), (3, False), (4, False), (3, False), (6, False)]
    proto.ack(cid, 7, fold=True)  # the ack before it has left: nothing to fold into
    proto.ack(cid, 8, fold=True)
    assert _acks(proto.data_to_send()) == [(8, True)]
    proto.ack(cid, 9, fold=True)
    proto.send_method(cid, commands.Basic.Qos(prefetch_count=5))
    proto.ack(cid, 10, fold=True)  # the method between keeps its place after ack 9
    sent = proto.data_to_send()
    assert [type(m).__name__ for m in sent_methods(sent)] == ["Ack", "Qos", "Ack"]
    assert _acks(sent) == [(9, False), (10, False)]
