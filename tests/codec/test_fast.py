"""The hot path: differential tests against pamqp 4.0.1, in both directions."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import body as pbody
from pamqp import commands, frame, header

import ojs_codec as codec
from ojs_codec import BasicProperties, ProtocolSyntaxError, UsageError

from .codec_impls import IMPLS, Impl
from .codec_strategies import (
    OJS_PROPERTIES,
    SETTINGS,
    assert_same,
    assert_same_properties,
    exchange_names,
    expected_properties,
    pamqp_properties,
    plain,
    short_text,
)

delivery_tags = st.integers(0, 2**63 - 1)  # pamqp packs longlong signed
frame_maxes = st.one_of(st.integers(4096, 70000), st.sampled_from([4096, 4097, 131072]))
bodies = st.one_of(
    st.binary(max_size=300), st.integers(0, 200_000).map(lambda n: bytes(n % 251 for n in range(n)))
)


def pamqp_content(channel: int, props: Any, body: bytes, frame_max: int) -> bytes:
    chunk = frame_max - 8
    parts = [frame.marshal(header.ContentHeader(0, len(body), props), channel)]
    parts += [
        frame.marshal(pbody.ContentBody(body[i : i + chunk]), channel) for i in range(0, len(body), chunk)
    ]
    return b"".join(parts)


def payload_of(frame_bytes: bytes) -> bytes:
    """The payload of a single complete frame."""
    return frame_bytes[7:-1]


def _marshal(method: Any) -> bytes:
    return frame.marshal(method, 1)


# --- encode_publish -----------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
@SETTINGS
@given(
    channel=st.integers(0, 65535),
    exchange=exchange_names,
    routing_key=short_text,
    props=st.none() | pamqp_properties,
    body=bodies,
    frame_max=frame_maxes,
    mandatory=st.booleans(),
    immediate=st.booleans(),
)
def test_encode_publish_matches_pamqp(
    impl: Impl,
    channel: int,
    exchange: str,
    routing_key: str,
    props: BasicProperties | None,
    body: bytes,
    frame_max: int,
    mandatory: bool,
    immediate: bool,
) -> None:
    ours = impl.encode_publish(channel, exchange, routing_key, props, body, frame_max, mandatory, immediate)
    method = commands.Basic.Publish(
        exchange=exchange, routing_key=routing_key, mandatory=mandatory, immediate=immediate
    )
    theirs = frame.marshal(method, channel) + pamqp_content(channel, codec.to_pamqp(props), body, frame_max)
    assert ours == theirs
    # and the slow path agrees
    assert (
        codec.encode_method_frame(channel, method) + codec.encode_content(channel, 60, props, body, frame_max)
        == theirs
    )


@pytest.mark.parametrize("impl", IMPLS)
@SETTINGS
@given(body=bodies, frame_max=frame_maxes)
def test_publish_frames_parse_back(impl: Impl, body: bytes, frame_max: int) -> None:
    data = impl.encode_publish(3, "ex", "rk", OJS_PROPERTIES, body, frame_max)
    frames = impl.reader(frame_max).frames(data)
    assert [f[0] for f in frames] == [1, 2] + [3] * (-(-len(body) // (frame_max - 8)))
    assert all(f[1] == 3 for f in frames)
    assert all(len(f[2]) <= frame_max - 8 for f in frames)
    assert codec.decode_method(frames[0][2]).routing_key == "rk"
    class_id, size, props = impl.decode_content_header(frames[1][2])
    assert (class_id, size, props) == (60, len(body), OJS_PROPERTIES)
    assert b"".join(f[2] for f in frames[2:]) == body


@pytest.mark.parametrize("impl", IMPLS)
def test_encode_publish_frame_max_zero_means_no_limit(impl: Impl) -> None:
    body = b"x" * 300_000
    frames = impl.reader(0).frames(impl.encode_publish(1, "", "q", None, body, 0))
    assert [f[0] for f in frames] == [1, 2, 3]


@pytest.mark.parametrize("impl", IMPLS)
def test_encode_publish_errors(impl: Impl) -> None:
    with pytest.raises(UsageError, match="255 bytes"):
        impl.encode_publish(1, "", "r" * 256, None, b"", 4096)
    with pytest.raises(UsageError, match="255 bytes"):
        impl.encode_publish(1, "é" * 128, "", None, b"", 4096)
    with pytest.raises(UsageError):
        impl.encode_publish(70000, "", "", None, b"", 4096)
    with pytest.raises(UsageError):
        impl.encode_publish(-1, "", "", None, b"", 4096)
    with pytest.raises(UsageError, match="frame_max"):
        impl.encode_publish(1, "", "", None, b"", 4095)
    with pytest.raises(UsageError):
        impl.encode_publish(1, "", "", BasicProperties(delivery_mode=300), b"", 4096)
    big_headers = BasicProperties(headers={"k": "v" * 5000})
    with pytest.raises(UsageError, match="content header"):
        impl.encode_publish(1, "", "", big_headers, b"", 4096)
    assert impl.encode_publish(1, "", "", big_headers, b"", 8192)


# --- ack / nack / reject ----------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
@SETTINGS
@given(channel=st.integers(0, 65535), tag=delivery_tags, multiple=st.booleans(), requeue=st.booleans())
def test_ack_nack_reject_both_directions(
    impl: Impl, channel: int, tag: int, multiple: bool, requeue: bool
) -> None:
    cases = [
        (codec.encode_ack(channel, tag, multiple), commands.Basic.Ack(tag, multiple), impl.decode_ack,
         (tag, multiple)),
        (codec.encode_nack(channel, tag, multiple, requeue), commands.Basic.Nack(tag, multiple, requeue),
         impl.decode_nack, (tag, multiple, requeue)),
        (codec.encode_reject(channel, tag, requeue), commands.Basic.Reject(tag, requeue), impl.decode_reject,
         (tag, requeue)),
    ]  # fmt: skip
    for ours, method, decoder, fields in cases:
        theirs = frame.marshal(method, channel)
        assert ours == theirs
        assert decoder(payload_of(theirs)) == fields
        _, ch, decoded = frame.unmarshal(ours)
        assert ch == channel
        assert [getattr(decoded, k) for k in method.__slots__] == list(fields)


@pytest.mark.parametrize("impl", IMPLS)
def test_ack_defaults_and_large_tags(impl: Impl) -> None:
    assert impl.decode_nack(payload_of(codec.encode_nack(1, 5))) == (5, False, True)
    assert impl.decode_reject(payload_of(codec.encode_reject(1, 5))) == (5, True)
    assert impl.decode_ack(payload_of(codec.encode_ack(1, 2**64 - 1))) == (2**64 - 1, False)
    with pytest.raises(UsageError, match="unsigned 64-bit"):
        codec.encode_ack(1, 2**64)
    with pytest.raises(UsageError, match="unsigned 64-bit"):
        codec.encode_nack(1, -1)
    with pytest.raises(UsageError):
        codec.encode_reject(65536, 1)


# --- table-driven method -> bytes -------------------------------------------------------------


def hexb(text: str) -> bytes:
    return bytes.fromhex(text)


METHOD_CASES: list[tuple[str, Callable[[Impl], bytes], bytes]] = [
    ("ack", lambda impl: codec.encode_ack(1, 1), hexb("01 0001 0000000d 003c0050 0000000000000001 00 ce")),
    ("ack many", lambda impl: codec.encode_ack(2, 258, True),
     hexb("01 0002 0000000d 003c0050 0000000000000102 01 ce")),
    ("nack", lambda impl: codec.encode_nack(1, 1), hexb("01 0001 0000000d 003c0078 0000000000000001 02 ce")),
    ("nack many", lambda impl: codec.encode_nack(1, 1, True, False), hexb(
        "01 0001 0000000d 003c0078 0000000000000001 01 ce")),
    ("reject", lambda impl: codec.encode_reject(1, 7),
     hexb("01 0001 0000000d 003c005a 0000000000000007 01 ce")),
    ("reject no", lambda impl: codec.encode_reject(1, 7, False),
     hexb("01 0001 0000000d 003c005a 0000000000000007 00 ce")),
    ("publish", lambda impl: impl.encode_publish(1, "ex", "rk", None, b"hi", 4096),
     hexb("01 0001 0000000d 003c0028 0000 02 6578 02 726b 00 ce")
     + hexb("02 0001 0000000e 003c 0000 0000000000000002 0000 ce")
     + hexb("03 0001 00000002 6869 ce")),
    ("publish mandatory, empty body",
     lambda impl: impl.encode_publish(5, "", "q", BasicProperties(delivery_mode=2), b"", 4096,
                                      mandatory=True),
     hexb("01 0005 0000000a 003c0028 0000 00 01 71 01 ce")
     + hexb("02 0005 0000000f 003c 0000 0000000000000000 1000 02 ce")),
    ("publish immediate", lambda impl: impl.encode_publish(1, "", "", None, b"", 4096, immediate=True)[:17],
     hexb("01 0001 00000009 003c0028 0000 00 00 02 ce")),
    ("heartbeat", lambda impl: codec.HEARTBEAT_FRAME, hexb("08 0000 00000000 ce")),
    ("protocol header", lambda impl: codec.PROTOCOL_HEADER, b"AMQP\x00\x00\x09\x01"),
]  # fmt: skip


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("name", "make", "wire"), METHOD_CASES, ids=[c[0] for c in METHOD_CASES])
def test_method_bytes(impl: Impl, name: str, make: Callable[[Impl], bytes], wire: bytes) -> None:
    assert make(impl) == wire


# --- decoders ------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
@SETTINGS
@given(consumer_tag=short_text, tag=delivery_tags, redelivered=st.booleans(), exchange=exchange_names,
       routing_key=short_text)  # fmt: skip
def test_decode_deliver_both_directions(
    impl: Impl, consumer_tag: str, tag: int, redelivered: bool, exchange: str, routing_key: str
) -> None:
    method = commands.Basic.Deliver(consumer_tag, tag, redelivered, exchange, routing_key)
    theirs = frame.marshal(method, 1)
    expected = (consumer_tag, tag, redelivered, exchange, routing_key)
    assert impl.decode_deliver(payload_of(theirs)) == expected
    ours = codec.encode_method_frame(1, method)
    assert ours == theirs
    _, _, back = frame.unmarshal(ours)
    assert (
        back.consumer_tag,
        back.delivery_tag,
        back.redelivered,
        back.exchange,
        back.routing_key,
    ) == expected
    slow = codec.decode_method(payload_of(theirs))
    assert [getattr(slow, k) for k in method.__slots__] == list(expected)


@pytest.mark.parametrize("impl", IMPLS)
@SETTINGS
@given(
    reply_code=st.integers(0, 65535), reply_text=short_text, exchange=exchange_names, routing_key=short_text
)
def test_decode_return_both_directions(
    impl: Impl, reply_code: int, reply_text: str, exchange: str, routing_key: str
) -> None:
    method = commands.Basic.Return(reply_code, reply_text, exchange, routing_key)
    theirs = frame.marshal(method, 1)
    expected = (reply_code, reply_text, exchange, routing_key)
    assert impl.decode_return(payload_of(theirs)) == expected
    assert codec.encode_method_frame(1, method) == theirs
    slow = codec.decode_method(payload_of(theirs))
    assert [getattr(slow, k) for k in method.__slots__] == list(expected)


@pytest.mark.parametrize("impl", IMPLS)
@SETTINGS
@given(tag=delivery_tags, redelivered=st.booleans(), exchange=exchange_names, routing_key=short_text,
       count=st.integers(0, 2**32 - 1))  # fmt: skip
def test_decode_get_ok_both_directions(
    impl: Impl, tag: int, redelivered: bool, exchange: str, routing_key: str, count: int
) -> None:
    method = commands.Basic.GetOk(tag, redelivered, exchange, routing_key, count)
    theirs = frame.marshal(method, 1)
    expected = (tag, redelivered, exchange, routing_key, count)
    assert impl.decode_get_ok(payload_of(theirs)) == expected
    assert codec.encode_method_frame(1, method) == theirs
    slow = codec.decode_method(payload_of(theirs))
    assert [getattr(slow, k) for k in method.__slots__] == list(expected)


@pytest.mark.parametrize("impl", IMPLS)
@SETTINGS
@given(props=pamqp_properties, size=st.integers(0, 2**63 - 1))
def test_decode_content_header_matches_pamqp(impl: Impl, props: BasicProperties, size: int) -> None:
    theirs = frame.marshal(header.ContentHeader(0, size, codec.to_pamqp(props)), 1)
    class_id, body_size, ours = impl.decode_content_header(payload_of(theirs))
    _, _, content = frame.unmarshal(theirs)
    assert (class_id, body_size) == (content.class_id, content.body_size) == (60, size)
    assert_same_properties(ours, codec.from_pamqp(content.properties))


@pytest.mark.parametrize("impl", IMPLS)
@SETTINGS
@given(props=st.none() | pamqp_properties, body=bodies, frame_max=frame_maxes, tag=delivery_tags)
def test_decode_whole_delivery(
    impl: Impl, props: BasicProperties | None, body: bytes, frame_max: int, tag: int
) -> None:
    wire = frame.marshal(commands.Basic.Deliver("ctag", tag, False, "ex", "rk"), 9) + pamqp_content(
        9, codec.to_pamqp(props), body, frame_max
    )
    frames = impl.reader(frame_max).frames(wire)
    assert codec.method_key(frames[0][2]) == codec.BASIC_DELIVER
    assert impl.decode_deliver(frames[0][2]) == ("ctag", tag, False, "ex", "rk")
    _, size, decoded = impl.decode_content_header(frames[1][2])
    assert size == len(body)
    assert_same_properties(decoded, expected_properties(props) if props else BasicProperties())
    assert b"".join(f[2] for f in frames[2:]) == body


def test_method_keys() -> None:
    for key, method in [
        (codec.BASIC_PUBLISH, commands.Basic.Publish),
        (codec.BASIC_RETURN, commands.Basic.Return),
        (codec.BASIC_DELIVER, commands.Basic.Deliver),
        (codec.BASIC_GET_OK, commands.Basic.GetOk),
        (codec.BASIC_GET_EMPTY, commands.Basic.GetEmpty),
        (codec.BASIC_ACK, commands.Basic.Ack),
        (codec.BASIC_NACK, commands.Basic.Nack),
        (codec.BASIC_REJECT, commands.Basic.Reject),
        (codec.BASIC_CANCEL, commands.Basic.Cancel),
        (codec.BASIC_CANCEL_OK, commands.Basic.CancelOk),
        (codec.CHANNEL_CLOSE, commands.Channel.Close),
        (codec.CONNECTION_CLOSE, commands.Connection.Close),
    ]:
        assert key == method.index
    assert codec.method_key(payload_of(codec.encode_ack(1, 1))) == codec.BASIC_ACK
    with pytest.raises(ProtocolSyntaxError):
        codec.method_key(b"\x00\x3c\x00")


# --- malformed payloads --------------------------------------------------------------------

VALID_PAYLOADS: list[tuple[str, str, bytes]] = [
    ("deliver", "decode_deliver", payload_of(_marshal(commands.Basic.Deliver("c", 1, True, "e", "r")))),
    ("return", "decode_return", payload_of(_marshal(commands.Basic.Return(312, "NO", "e", "r")))),
    ("get_ok", "decode_get_ok", payload_of(_marshal(commands.Basic.GetOk(1, False, "e", "r", 3)))),
    ("ack", "decode_ack", payload_of(codec.encode_ack(1, 1))),
    ("nack", "decode_nack", payload_of(codec.encode_nack(1, 1))),
    ("reject", "decode_reject", payload_of(codec.encode_reject(1, 1))),
    ("content header", "decode_content_header",
     payload_of(frame.marshal(header.ContentHeader(0, 5, codec.to_pamqp(OJS_PROPERTIES)), 1))),
]  # fmt: skip


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("name", "decoder", "payload"), VALID_PAYLOADS, ids=[c[0] for c in VALID_PAYLOADS])
def test_truncated_and_padded_payloads(impl: Impl, name: str, decoder: str, payload: bytes) -> None:
    decode = getattr(impl, decoder)
    decode(payload)  # the valid one decodes
    for size in range(len(payload)):
        with pytest.raises(ProtocolSyntaxError):
            decode(payload[:size])
    with pytest.raises(ProtocolSyntaxError):
        decode(payload + b"\x00")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    ("name", "decoder", "payload"), VALID_PAYLOADS[:6], ids=[c[0] for c in VALID_PAYLOADS[:6]]
)
def test_decoder_checks_the_method_id(impl: Impl, name: str, decoder: str, payload: bytes) -> None:
    other = payload_of(frame.marshal(commands.Basic.Qos(), 1))
    with pytest.raises(ProtocolSyntaxError):
        getattr(impl, decoder)(other[:4] + payload[4:])


@pytest.mark.parametrize("impl", IMPLS)
def test_non_utf8_short_strings(impl: Impl) -> None:
    payload = bytearray(VALID_PAYLOADS[0][2])
    payload[5] = 0xFF  # the consumer tag "c"
    with pytest.raises(ProtocolSyntaxError, match="UTF-8"):
        impl.decode_deliver(bytes(payload))
    payload = bytearray(VALID_PAYLOADS[1][2])
    payload[-1] = 0xFF  # the routing key "r"
    with pytest.raises(ProtocolSyntaxError, match="UTF-8"):
        impl.decode_return(bytes(payload))


# --- the slow path, every pamqp method ---------------------------------------------------------


def _sample(cls: type[Any]) -> Any:
    """A pamqp method object with a value in every field."""
    method = cls()
    for name in cls.__slots__:
        kind = cls.amqp_type(name)
        value: Any = {
            "bit": True,
            "octet": 7,
            "short": 0 if name == "ticket" else 258,
            "long": 70000,
            "longlong": 2**40,
            "shortstr": "" if name == "cluster_id" else "q.name",
            "longstr": "long string",
            "table": {"a": 1, "b": [True, "x"], "c": {"d": None}},
        }[kind]
        setattr(method, name, value)
    return method


ALL_METHODS = sorted(commands.INDEX_MAPPING.items())


@pytest.mark.parametrize(("index", "cls"), ALL_METHODS, ids=[c.name for _, c in ALL_METHODS])
def test_slow_path_matches_pamqp_for_every_method(index: int, cls: type[Any]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # pamqp warns on Basic.RecoverAsync()
        methods = (_sample(cls), cls())
    for method in methods:
        try:
            theirs = frame.marshal(method, 4)
        except (TypeError, ValueError):
            continue  # a default pamqp itself cannot marshal (a None string)
        assert codec.encode_method_frame(4, method) == theirs
        decoded = codec.decode_method(payload_of(theirs))  # must not warn
        assert type(decoded) is cls
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            _, _, reference = frame.unmarshal(theirs)
        for name in cls.__slots__:
            assert_same(getattr(decoded, name), plain(getattr(reference, name)), name)


def test_decode_method_errors() -> None:
    with pytest.raises(codec.CommandInvalid) as info:
        codec.decode_method(b"\x00\x3c\x00\x01")
    assert (info.value.class_id, info.value.method_id, info.value.code) == (60, 1, 503)
    with pytest.raises(ProtocolSyntaxError):
        codec.decode_method(b"\x00\x3c")
    qos = payload_of(frame.marshal(commands.Basic.Qos(0, 10, False), 1))
    with pytest.raises(ProtocolSyntaxError, match=r"Basic\.Qos"):
        codec.decode_method(qos[:-1])
    with pytest.raises(ProtocolSyntaxError, match="trailing"):
        codec.decode_method(qos + b"\x00")


def test_encode_method_frame_errors() -> None:
    declare = commands.Queue.Declare(queue="q")
    declare.queue = "bad name!"  # pamqp's validate() runs again before encoding
    with pytest.raises(UsageError, match="Invalid value for queue"):
        codec.encode_method_frame(1, declare)
    with pytest.raises(UsageError):
        codec.encode_method_frame(1, commands.Basic.Qos(prefetch_count=70000))
    with pytest.raises(UsageError):
        codec.encode_method_frame(1, commands.Basic.Consume(queue="q", consumer_tag="c" * 300))
    with pytest.raises(UsageError):
        codec.encode_method_frame(1, commands.Queue.Declare(queue="q", arguments={"x": object()}))


def test_slow_path_uses_our_table_quirks() -> None:
    method = commands.Queue.Declare(queue="q", arguments={"f": 0.5, "b": b"\x01", "t": codec.UInt8(3)})
    decoded = codec.decode_method(payload_of(codec.encode_method_frame(1, method)))
    assert decoded.arguments == {"f": 0.5, "b": b"\x01", "t": 3}
