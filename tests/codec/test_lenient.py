"""A delivery's content header is decoded leniently; everything else stays strict.

RabbitMQ accepts (and delivers) properties and headers that are valid AMQP but outside
the codec's strict rules: a short-string property or a table key that is not UTF-8,
tables nested deeper than ``MAX_DEPTH``, a timestamp no datetime can hold, a content
header larger than the consumer's ``frame_max``.  Before, one such delivery closed the
whole connection.  Now ``decode_content_header_lenient`` lets it through, flagged with a
reason, in pure Python and in C alike (the C calls are checked against the Python ones),
and ``AMQPConnection`` hands it out as a ``Delivery`` whose ``malformed`` says why.
Method frames, other frames and the encoders stay strict.

The hostile bytes are written by hand here (``Node`` and friends), since the codec's
encoders refuse to produce them.
"""

from __future__ import annotations

import datetime
import struct
from collections.abc import Callable
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands

import ojs_codec as codec
from ojs_codec import NESTED_TOO_DEEP, BasicProperties, ProtocolSyntaxError, UsageError, _hot
from ojs_codec._table import decode_timestamp

from .codec_impls import IMPLS, Impl
from .codec_strategies import SETTINGS, split_at
from .test_protocol import Peer, open_channel, open_connection

UTC = datetime.UTC
MAX = codec.MAX_DEPTH
BAD = b"\xff\xfe"  # never UTF-8
DEEP_NOTE = f"header tables and arrays nest deeper than {MAX} levels"
FLAGS = {
    "content_type": 0x8000, "content_encoding": 0x4000, "headers": 0x2000, "delivery_mode": 0x1000,
    "priority": 0x0800, "correlation_id": 0x0400, "reply_to": 0x0200, "expiration": 0x0100,
    "message_id": 0x0080, "timestamp": 0x0040, "type": 0x0020, "user_id": 0x0010, "app_id": 0x0008,
    "cluster_id": 0x0004,
}  # fmt: skip
SHORT_FIELDS = [name for name in FLAGS if name not in ("headers", "delivery_mode", "priority", "timestamp")]


# --- writing hostile bytes ---------------------------------------------------------------


def short(raw: bytes) -> bytes:
    return bytes([len(raw)]) + raw


def raw_table(*entries: tuple[bytes, bytes]) -> bytes:
    """A field table from (raw key, type octet + value) pairs."""
    body = b"".join(short(key) + value for key, value in entries)
    return struct.pack(">I", len(body)) + body


def raw_array(*values: bytes) -> bytes:
    body = b"".join(values)
    return struct.pack(">I", len(body)) + body


def raw_properties(**fields: Any) -> bytes:
    """Property flags and fields in wire order: short strings as raw bytes, ``headers`` as
    an encoded table, ``timestamp`` as an int, octets as ints."""
    flags = 0
    out = b""
    for name, flag in FLAGS.items():
        if name not in fields:
            continue
        flags |= flag
        value = fields[name]
        if name == "headers":
            out += value
        elif name in ("delivery_mode", "priority"):
            out += bytes([value])
        elif name == "timestamp":
            out += struct.pack(">Q", value)
        else:
            out += short(value)
    return struct.pack(">H", flags) + out


def header_payload(props: bytes, body_size: int = 5) -> bytes:
    """A content header frame payload: class 60, weight 0, body size, then ``props``."""
    return struct.pack(">HHQ", 60, 0, body_size) + props


def nested(levels: int, kind: bytes = b"F", leaf: bytes = b"V") -> bytes:
    """``levels`` tables (or arrays) each holding the next, the innermost holding ``leaf``
    (a type octet + value)."""
    value = leaf
    for _ in range(levels):
        value = kind + (raw_table((b"n", value)) if kind == b"F" else raw_array(value))
    return value


def expected_nested(levels: int, depth: int, kind: bytes = b"F", leaf: Any = None) -> Any:
    """What a lenient decode makes of ``nested(levels)`` as a value in a table of depth
    ``depth - 1`` (so the outermost nested table is at ``depth``)."""
    if levels == 0:
        return leaf
    if depth > MAX:
        return NESTED_TOO_DEEP
    inner = expected_nested(levels - 1, depth + 1, kind, leaf)
    return {"n": inner} if kind == b"F" else [inner]


# --- each lenient case, in both implementations -----------------------------------------------

OUT_OF_RANGE = 2**64 - 1  # read as milliseconds, still past year 9999


def _cases() -> list[Any]:
    cases: list[Any] = []
    for name in SHORT_FIELDS:
        cases.append(
            pytest.param(
                raw_properties(**{name: b"id-" + BAD}),
                {name: b"id-" + BAD},
                f"{name} is not UTF-8",
                id=f"{name}-not-utf8",
            )
        )
    cases += [
        pytest.param(
            raw_properties(headers=raw_table((b"k" + BAD, b"I" + struct.pack(">i", 7)))),
            {"headers": {b"k" + BAD: 7}},
            f"header table key {b'k' + BAD!r} is not UTF-8",
            id="key-not-utf8",
        ),
        pytest.param(
            raw_properties(headers=raw_table((b"a", b"A" + raw_array(b"F" + raw_table((BAD, b"V")))))),
            {"headers": {"a": [{BAD: None}]}},
            f"header table key {BAD!r} is not UTF-8",
            id="nested-key-not-utf8",
        ),
        pytest.param(
            raw_properties(headers=raw_table((b"deep", nested(MAX)))),
            {"headers": {"deep": expected_nested(MAX, 2)}},
            DEEP_NOTE,
            id="tables-too-deep",
        ),
        pytest.param(
            raw_properties(headers=raw_table((b"deep", nested(200, b"A")), (b"after", b"t\x01"))),
            {"headers": {"deep": expected_nested(200, 2, b"A"), "after": True}},
            DEEP_NOTE,
            id="arrays-too-deep-then-more-keys",
        ),
        pytest.param(
            raw_properties(timestamp=OUT_OF_RANGE),
            {"timestamp": OUT_OF_RANGE},
            f"timestamp {OUT_OF_RANGE} is out of range",
            id="timestamp-property",
        ),
        pytest.param(
            raw_properties(headers=raw_table((b"t", b"T" + struct.pack(">Q", OUT_OF_RANGE)))),
            {"headers": {"t": OUT_OF_RANGE}},
            f"timestamp {OUT_OF_RANGE} is out of range",
            id="timestamp-in-headers",
        ),
        pytest.param(
            raw_properties(
                content_type=b"application/json",
                headers=raw_table((BAD, b"V"), (b"x" + BAD, b"V"), (b"d", nested(MAX))),
                message_id=BAD,
                type=b"ok",
                app_id=BAD,
            ),
            {
                "content_type": "application/json",
                "headers": {BAD: None, b"x" + BAD: None, "d": expected_nested(MAX, 2)},
                "message_id": BAD,
                "type": "ok",
                "app_id": BAD,
            },
            # in wire order; the first three different notes, then how many more
            f"header table key {BAD!r} is not UTF-8; header table key {b'x' + BAD!r} is not UTF-8; "
            f"{DEEP_NOTE}; and 2 more",
            id="several",
        ),
    ]
    return cases


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("props", "fields", "reason"), _cases())
def test_each_lenient_case_is_a_flagged_header(
    impl: Impl, props: bytes, fields: dict[str, Any], reason: str
) -> None:
    payload = header_payload(props, body_size=1234)
    with pytest.raises(ProtocolSyntaxError):  # the strict decoder refuses it, as before
        impl.decode_content_header(payload)
    class_id, body_size, decoded, malformed = impl.decode_content_header_lenient(payload)
    assert (class_id, body_size, malformed) == (60, 1234, reason)
    assert decoded == BasicProperties(**fields)


@pytest.mark.parametrize("impl", IMPLS)
def test_a_well_formed_header_is_not_flagged(impl: Impl) -> None:
    props = BasicProperties(
        content_type="application/json",
        headers={"x-ojs-attempt": codec.Int32(2), "deep": expected_nested(MAX - 1, 2), "s": b"\xff"},
        message_id="m-1",
        timestamp=datetime.datetime(2024, 5, 17, 12, 30, 45, tzinfo=UTC),
    )
    payload = header_payload(impl.encode_properties(props))
    assert impl.decode_content_header_lenient(payload) == (*impl.decode_content_header(payload), None)
    empty = header_payload(b"\x00\x00", body_size=0)
    assert impl.decode_content_header_lenient(empty) == (60, 0, BasicProperties(), None)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "props",
    [
        b"\x80",  # flags truncated
        b"\x80\x00\x05ab",  # content_type runs past the end
        raw_properties(message_id=BAD) + b"\x00",  # trailing byte
        raw_properties(headers=raw_table((BAD, b"Z"))),  # unknown field type after a bad key
        raw_properties(headers=raw_table((b"a", b"S\x00\x00\x00\x09abc"))),  # string past its table
        # a table too deep (skipped) whose length does not fit the table around it
        raw_properties(headers=raw_table((b"d", nested(MAX - 1, leaf=b"F\x00\x00\x00\x09")))),
        # an array too deep whose length is cut short
        raw_properties(headers=raw_table((b"d", nested(MAX - 1, b"A", leaf=b"A\x00\x00")))),
        raw_properties(timestamp=OUT_OF_RANGE)[:-1],  # timestamp truncated
    ],
)
def test_what_is_not_valid_amqp_still_raises(impl: Impl, props: bytes) -> None:
    with pytest.raises(ProtocolSyntaxError):
        impl.decode_content_header_lenient(header_payload(props))
    with pytest.raises(ProtocolSyntaxError):
        impl.decode_content_header_lenient(b"\x00\x3c\x00\x00\x00")  # shorter than the fixed part


@pytest.mark.parametrize("impl", IMPLS)
def test_the_other_decoders_stay_strict(impl: Impl) -> None:
    """decode_table, decode_array and decode_properties (used for method frames and
    by the in-process broker) still refuse what the lenient decoder lets through."""
    with pytest.raises(ProtocolSyntaxError, match="key is not UTF-8"):
        impl.decode_table(raw_table((BAD, b"V")))
    with pytest.raises(ProtocolSyntaxError, match="deeper"):
        impl.decode_table(raw_table((b"d", nested(MAX))))
    with pytest.raises(ProtocolSyntaxError, match="deeper"):
        impl.decode_array(raw_array(nested(MAX, b"A")))
    with pytest.raises(ProtocolSyntaxError, match="message_id is not UTF-8"):
        impl.decode_properties(raw_properties(message_id=BAD))
    with pytest.raises(ProtocolSyntaxError, match="content_type is not UTF-8"):
        impl.decode_properties(raw_properties(content_type=BAD))
    with pytest.raises(ProtocolSyntaxError, match="out of range"):
        impl.decode_properties(raw_properties(timestamp=OUT_OF_RANGE))
    # method payloads: a short string that is not UTF-8 in Basic.Deliver
    deliver = Peer.method(1, commands.Basic.Deliver("c", 1, False, "ex", "rk"))[7:-1]
    hostile = deliver[:-3] + short(b"r" + BAD)
    with pytest.raises(ProtocolSyntaxError, match="not UTF-8"):
        impl.decode_deliver(hostile)


@pytest.mark.parametrize("impl", IMPLS)
def test_encoding_stays_strict(impl: Impl) -> None:
    """What a lenient decode produced cannot be sent back out as it is."""
    with pytest.raises(UsageError):
        impl.encode_properties(BasicProperties(message_id=BAD))  # type: ignore[arg-type]
    with pytest.raises(UsageError):
        impl.encode_table({"deep": NESTED_TOO_DEEP})
    with pytest.raises(UsageError):
        impl.encode_table({BAD: 1})  # type: ignore[dict-item]
    decoded = impl.decode_content_header_lenient(
        header_payload(raw_properties(headers=raw_table((b"d", nested(MAX)))))
    )
    with pytest.raises(UsageError):
        impl.encode_publish(1, "", "q", decoded[2], b"body", 131072)


def test_the_marker() -> None:
    assert repr(NESTED_TOO_DEEP) == f"<nested deeper than {MAX} levels>"
    import copy
    import pickle

    assert pickle.loads(pickle.dumps(NESTED_TOO_DEEP)) is NESTED_TOO_DEEP
    assert copy.deepcopy(NESTED_TOO_DEEP) is NESTED_TOO_DEEP


# --- the connection stays up ---------------------------------------------------------------


def _deliver_method(cid: int, tag: int) -> bytes:
    return Peer.method(cid, commands.Basic.Deliver(f"c{cid}", tag, False, "ex", f"k{tag}"))


def hostile_delivery(cid: int, tag: int, props: bytes, body: bytes) -> bytes:
    """Basic.Deliver, a hand-written content header with ``props``, and the body."""
    head = codec.encode_frame(codec.FRAME_HEADER, cid, header_payload(props, len(body)))
    return (
        _deliver_method(cid, tag) + head + (codec.encode_frame(codec.FRAME_BODY, cid, body) if body else b"")
    )


@pytest.mark.parametrize("split", [False, True], ids=["whole-reads", "byte-by-byte"])
@pytest.mark.parametrize(("props", "fields", "reason"), _cases())
def test_a_flagged_delivery_keeps_the_connection(
    props: bytes, fields: dict[str, Any], reason: str, split: bool
) -> None:
    """The hostile delivery comes out as a Delivery with ``malformed`` set, between two
    good ones, on the fast path (whole deliveries in one read) and frame by frame."""
    proto = open_connection()
    cid = open_channel(proto)
    data = (
        Peer.deliver(cid, 1, b"before")
        + hostile_delivery(cid, 2, props, b"poison body")
        + Peer.deliver(cid, 3, b"after")
    )
    reads = [data[i : i + 1] for i in range(len(data))] if split else [data]
    events = [e for read in reads for e in proto.receive_data(read)]
    assert proto.state is codec.ConnectionState.OPEN
    assert [(e.delivery_tag, e.body, e.malformed) for e in events] == [
        (1, b"before", None),
        (2, b"poison body", reason),
        (3, b"after", None),
    ]
    assert events[1].properties == BasicProperties(**fields)
    assert proto.error is None


def test_a_method_frame_that_is_not_utf8_still_closes_the_connection() -> None:
    proto = open_connection()
    cid = open_channel(proto)
    deliver = _deliver_method(cid, 1)
    hostile = codec.encode_frame(codec.FRAME_METHOD, cid, deliver[7:-1][:-3] + short(b"k" + BAD))
    with pytest.raises(ProtocolSyntaxError, match="not UTF-8"):
        proto.receive_data(hostile + codec.encode_frame(2, cid, header_payload(b"\x00\x00", 0)))
    assert proto.state is codec.ConnectionState.ERROR


def test_get_ok_and_return_carry_the_flag_too() -> None:
    proto = open_connection()
    cid = open_channel(proto)
    proto.send_method(cid, commands.Basic.Get(queue="q"))
    head = codec.encode_frame(codec.FRAME_HEADER, cid, header_payload(raw_properties(type=BAD), 1))
    events = proto.receive_data(
        Peer.method(cid, commands.Basic.GetOk(1, False, "", "q", 0)) + head + codec.encode_frame(3, cid, b"x")
    )
    assert [(type(e), e.body, e.malformed) for e in events] == [(codec.GetOk, b"x", "type is not UTF-8")]
    events = proto.receive_data(
        Peer.method(cid, commands.Basic.Return(312, "NO_ROUTE", "", "q"))
        + head
        + codec.encode_frame(3, cid, b"x")
    )
    assert [(type(e), e.malformed) for e in events] == [(codec.Returned, "type is not UTF-8")]


def _connection(frame_max: int) -> codec.AMQPConnection:
    proto = codec.AMQPConnection(codec.ConnectionParameters(frame_max=frame_max))
    proto.initiate()
    proto.receive_data(Peer.start())
    proto.receive_data(Peer.tune(frame_max=131072))
    proto.receive_data(Peer.method(0, commands.Connection.OpenOk()))
    assert proto.frame_max == frame_max
    return proto


@pytest.mark.parametrize("split", [False, True], ids=["whole-read", "in-pieces"])
def test_a_content_header_larger_than_frame_max_is_flagged(split: bool) -> None:
    """RabbitMQ checks frame_max on what it receives, not on the headers it delivers: a
    header that fitted the publisher's frame_max (or that grew with x-death) reaches a
    consumer with a smaller one.  It is read (up to MAX_INCOMING_CONTENT_HEADER) and flagged."""
    proto = _connection(4096)
    cid = open_channel(proto)
    props = raw_properties(headers=raw_table((b"pad", b"S" + struct.pack(">I", 10_000) + b"x" * 10_000)))
    data = hostile_delivery(cid, 1, props, b"big header") + Peer.deliver(cid, 2, b"next")
    reads = split_at(data, list(range(100, len(data), 1000))) if split else [data]
    events = [e for read in reads for e in proto.receive_data(read)]
    size = len(header_payload(props)) + 8
    assert [(e.body, e.malformed) for e in events] == [
        (b"big header", f"content header of {size} bytes is larger than frame_max (4096): "
                        "it cannot be published again as it is"),
        (b"next", None),
    ]  # fmt: skip
    assert events[0].properties.headers == {"pad": "x" * 10_000}
    # both reasons when it is malformed besides
    props = raw_properties(
        message_id=BAD, headers=raw_table((b"pad", b"x" + struct.pack(">I", 5000) + bytes(5000)))
    )
    (event,) = proto.receive_data(hostile_delivery(cid, 3, props, b"b"))
    assert event.malformed == (
        f"content header of {len(header_payload(props)) + 8} bytes is larger than frame_max (4096): "
        "it cannot be published again as it is; message_id is not UTF-8"
    )
    assert proto.state is codec.ConnectionState.OPEN


def test_the_hard_cap_on_content_headers_remains() -> None:
    proto = _connection(4096)
    cid = open_channel(proto)
    cap = codec.MAX_INCOMING_CONTENT_HEADER
    fits = raw_properties(headers=raw_table((b"pad", b"x" + struct.pack(">I", cap - 40) + bytes(cap - 40))))
    assert len(header_payload(fits)) + 8 <= cap
    (event,) = proto.receive_data(hostile_delivery(cid, 1, fits, b"b"))
    assert event.malformed is not None and event.body == b"b"
    over = raw_properties(headers=raw_table((b"pad", b"x" + struct.pack(">I", cap) + bytes(cap))))
    with pytest.raises(codec.FrameError, match="accepted for a content header"):
        # refused from the frame header, before its payload is buffered
        proto.receive_data(hostile_delivery(cid, 2, over, b"b")[:200])
    assert proto.state is codec.ConnectionState.ERROR


def test_only_content_headers_get_the_allowance() -> None:
    """A method or body frame above frame_max is a FRAME_ERROR as before, and a reader
    without ``content_header_max`` (the in-process broker's) refuses big headers too."""
    for frame in (
        codec.encode_frame(codec.FRAME_BODY, 1, bytes(5000)),
        codec.encode_frame(codec.FRAME_METHOD, 1, bytes(5000)),
    ):
        proto = _connection(4096)
        open_channel(proto)
        with pytest.raises(codec.FrameError, match="frame_max"):
            proto.receive_data(frame)
    header = codec.encode_frame(codec.FRAME_HEADER, 1, bytes(5000))
    with pytest.raises(codec.FrameError, match="frame_max"):
        codec.FrameReader(4096).frames(header)
    assert codec.FrameReader(4096, content_header_max=8192).frames(header) == [(2, 1, bytes(5000))]


# --- Hypothesis: any mix of hostile headers ------------------------------------------------


class Node:
    """A header value as it goes on the wire, and what a lenient decode must make of it."""

    def wire(self) -> bytes:
        raise NotImplementedError

    def expect(self, depth: int, notes: list[str]) -> Any:
        """The decoded value when this is a value inside a table of depth ``depth - 1``."""
        raise NotImplementedError


class Leaf(Node):
    def __init__(self, wire: bytes, value: Any, note: str | None = None) -> None:
        self._wire, self.value, self.note = wire, value, note

    def wire(self) -> bytes:
        return self._wire

    def expect(self, depth: int, notes: list[str]) -> Any:
        if self.note is not None:
            notes.append(self.note)
        return self.value


class Table(Node):
    def __init__(self, entries: list[tuple[bytes, Node]]) -> None:
        self.entries = entries

    def wire(self) -> bytes:
        return b"F" + raw_table(*((key, node.wire()) for key, node in self.entries))

    def expect(self, depth: int, notes: list[str]) -> Any:
        if depth > MAX:
            notes.append(DEEP_NOTE)
            return NESTED_TOO_DEEP
        result: dict[Any, Any] = {}
        for raw, node in self.entries:
            try:
                key: Any = raw.decode("utf-8")
            except UnicodeDecodeError:
                key = raw
                notes.append(f"header table key {raw!r} is not UTF-8")
            result[key] = node.expect(depth + 1, notes)
        return result


class Array(Node):
    def __init__(self, items: list[Node]) -> None:
        self.items = items

    def wire(self) -> bytes:
        return b"A" + raw_array(*(node.wire() for node in self.items))

    def expect(self, depth: int, notes: list[str]) -> Any:
        if depth > MAX:
            notes.append(DEEP_NOTE)
            return NESTED_TOO_DEEP
        return [node.expect(depth + 1, notes) for node in self.items]


def _seconds_leaf(seconds: int) -> Leaf:
    wire = b"T" + struct.pack(">Q", seconds)
    try:
        return Leaf(wire, decode_timestamp(seconds))
    except ProtocolSyntaxError:
        return Leaf(wire, seconds, f"timestamp {seconds} is out of range")


raw_keys = st.one_of(
    st.text(max_size=8).map(lambda s: s.encode()),
    st.binary(min_size=1, max_size=8),  # often not UTF-8
    st.just(BAD),
)
leaves = st.one_of(
    st.integers(-(2**31), 2**31 - 1).map(lambda n: Leaf(b"I" + struct.pack(">i", n), n)),
    st.text(max_size=12).map(lambda s: Leaf(b"S" + struct.pack(">I", len(s.encode())) + s.encode(), s)),
    st.binary(max_size=8).map(lambda b: Leaf(b"x" + struct.pack(">I", len(b)) + b, b)),
    st.booleans().map(lambda v: Leaf(b"t" + bytes([v]), v)),
    st.just(Leaf(b"V", None)),
    st.one_of(st.integers(0, 2**40), st.integers(2**62, 2**64 - 1)).map(_seconds_leaf),
)


def _containers(children: st.SearchStrategy[Node]) -> st.SearchStrategy[Node]:
    return st.one_of(
        st.lists(st.tuples(raw_keys, children), max_size=3).map(Table),
        st.lists(children, max_size=3).map(Array),
    )


def _chain(kinds: list[bool], leaf: Node) -> Node:
    """Tables (True) and arrays (False) each holding the next: deep nesting on demand."""
    node = leaf
    for is_table in kinds:
        node = Table([(b"n", node)]) if is_table else Array([node])
    return node


values = st.one_of(
    st.recursive(leaves, _containers, max_leaves=8),
    st.builds(_chain, st.lists(st.booleans(), min_size=MAX - 3, max_size=MAX + 3), leaves),
)
header_tables = st.lists(st.tuples(raw_keys, values), max_size=4).map(Table)
short_values = st.one_of(
    st.none(),
    st.text(max_size=12).filter(lambda s: len(s.encode()) <= 255).map(lambda s: s.encode()),
    st.binary(max_size=12),  # often not UTF-8
)


@st.composite
def hostile_headers(draw: st.DrawFn) -> tuple[bytes, BasicProperties, str | None]:
    """A property list as it goes on the wire, the properties a lenient decode must give,
    and the reason it must give (None when nothing is malformed)."""
    fields: dict[str, Any] = {}
    expected: dict[str, Any] = {}
    notes: list[str] = []
    for name in FLAGS:
        if name == "headers":
            if draw(st.booleans()):
                table = draw(header_tables)
                fields["headers"] = table.wire()[1:]
                expected["headers"] = table.expect(1, notes)
        elif name in ("delivery_mode", "priority"):
            octet = draw(st.none() | st.integers(0, 255))
            if octet is not None:
                fields[name] = expected[name] = octet
        elif name == "timestamp":
            seconds = draw(st.none() | st.integers(0, 2**64 - 1))
            if seconds is not None:
                fields[name] = seconds
                expected[name] = _seconds_leaf(seconds).expect(1, notes)
        else:
            raw = draw(short_values)
            if raw is None or raw == b"":  # absent (an empty short string decodes to "")
                continue
            fields[name] = raw
            try:
                expected[name] = raw.decode("utf-8")
            except UnicodeDecodeError:
                expected[name] = raw
                notes.append(f"{name} is not UTF-8")
    return raw_properties(**fields), BasicProperties(**expected), codec.malformed_reason(notes)


def _strictly(decode: Callable[[bytes], Any], payload: bytes) -> Any:
    try:
        return decode(payload)
    except ProtocolSyntaxError:
        return None


@pytest.mark.parametrize("impl", IMPLS)
@given(header=hostile_headers(), body_size=st.integers(0, 2**64 - 1))
@settings(SETTINGS, max_examples=300)
def test_any_hostile_header_decodes_to_its_flagged_properties(
    impl: Impl, header: tuple[bytes, BasicProperties, str | None], body_size: int
) -> None:
    """Never an exception for valid AMQP; exactly the properties and the reason the model
    says; the strict decoder agrees wherever nothing was malformed."""
    props, expected, reason = header
    payload = header_payload(props, body_size)
    assert impl.decode_content_header_lenient(payload) == (60, body_size, expected, reason)
    strict = _strictly(impl.decode_content_header, payload)
    assert (strict is None) == (reason is not None)
    if strict is not None:
        assert strict == (60, body_size, expected)


@pytest.mark.parametrize("impl", IMPLS)
@given(
    messages=st.lists(st.tuples(hostile_headers(), st.binary(max_size=300)), min_size=1, max_size=6),
    cuts=st.lists(st.integers(min_value=0, max_value=6000), max_size=6),
)
@settings(SETTINGS, max_examples=150)
def test_a_connection_reads_any_hostile_delivery_and_keeps_every_body(
    impl: Impl, messages: list[tuple[tuple[bytes, BasicProperties, str | None], bytes]], cuts: list[int]
) -> None:
    """Deliveries with hostile headers, each cut at random into reads: one Delivery per
    message, in order, with its whole body, its properties and its reason, and the
    connection open at the end."""
    data = b"".join(
        hostile_delivery(1, tag, props, body) for tag, ((props, _, _), body) in enumerate(messages, start=1)
    )
    with mock.patch.object(_hot, "decode_content_header_lenient", impl.decode_content_header_lenient):
        proto = open_connection()
        open_channel(proto)
        events = [e for read in split_at(data, cuts) for e in proto.receive_data(read)]
    assert proto.state is codec.ConnectionState.OPEN
    assert [(e.delivery_tag, e.body, e.properties, e.malformed) for e in events] == [
        (tag, body, expected, reason) for tag, ((_, expected, reason), body) in enumerate(messages, start=1)
    ]
