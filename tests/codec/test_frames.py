"""The frame layer: FrameReader over any split of the stream, and frame building."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands, frame, header, heartbeat

import ojs_codec
from ojs_codec import FrameError, FrameReader, ProtocolVersionMismatch, UsageError

from .codec_impls import IMPLS, Impl
from .codec_strategies import OJS_PROPERTIES, SETTINGS, split_at


def raw_frame(frame_type: int, channel: int, payload: bytes, end: int = 0xCE) -> bytes:
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + bytes([end])


# A recorded-style trace: a connection start, heartbeats, two deliveries on two
# channels (one with a body split over two frames), an empty-body message, a close.
TRACE_FRAMES: list[tuple[int, int, bytes]] = [
    (1, 0, frame.marshal(commands.Connection.Start(server_properties={"product": "RabbitMQ"}), 0)[7:-1]),
    (8, 0, b""),
    (1, 1, frame.marshal(commands.Basic.Deliver("c1", 1, False, "ex", "rk"), 1)[7:-1]),
    (2, 1, frame.marshal(header.ContentHeader(0, 5000, ojs_codec.to_pamqp(OJS_PROPERTIES)), 1)[7:-1]),
    (1, 2, frame.marshal(commands.Basic.Deliver("c2", 1, True, "", "q"), 2)[7:-1]),
    (3, 1, bytes(range(256)) * 16),
    (2, 2, frame.marshal(header.ContentHeader(0, 0), 2)[7:-1]),
    (8, 0, b""),
    (3, 1, b"y" * 904),
    (1, 0, frame.marshal(commands.Connection.Close(320, "CONNECTION_FORCED", 0, 0), 0)[7:-1]),
]
TRACE = b"".join(raw_frame(*f) for f in TRACE_FRAMES)


def read_all(reader: FrameReader, chunks: list[bytes]) -> list[tuple[int, int, bytes]]:
    out = []
    for chunk in chunks:
        reader.feed(chunk)
        while (f := reader.next_frame()) is not None:
            out.append(f)
    return out


@pytest.mark.parametrize("impl", IMPLS)
def test_trace_in_one_piece(impl: Impl) -> None:
    assert impl.reader().frames(TRACE) == TRACE_FRAMES
    reader = impl.reader()
    assert read_all(reader, [TRACE]) == TRACE_FRAMES
    assert reader.buffered == 0


@pytest.mark.parametrize("impl", IMPLS)
def test_trace_split_at_every_offset(impl: Impl) -> None:
    for cut in range(len(TRACE) + 1):
        pieces = [TRACE[:cut], TRACE[cut:]]
        assert read_all(impl.reader(), pieces) == TRACE_FRAMES, cut
        reader = impl.reader()
        assert reader.frames(pieces[0]) + reader.frames(pieces[1]) == TRACE_FRAMES, cut


@pytest.mark.parametrize("impl", IMPLS)
def test_trace_byte_by_byte(impl: Impl) -> None:
    reader = impl.reader()
    out = []
    for i in range(len(TRACE)):
        out += reader.frames(TRACE[i : i + 1])
        assert reader.buffered < 4096 + 8
    assert out == TRACE_FRAMES
    assert read_all(impl.reader(), [TRACE[i : i + 1] for i in range(len(TRACE))]) == TRACE_FRAMES


@pytest.mark.parametrize("impl", IMPLS)
@SETTINGS
@given(st.lists(st.integers(0, len(TRACE)), max_size=30), st.booleans())
def test_trace_any_split(impl: Impl, cuts: list[int], as_bytearray: bool) -> None:
    chunks = split_at(TRACE, cuts)
    if as_bytearray:
        chunks = [bytearray(c) for c in chunks]  # type: ignore[misc]
    reader = impl.reader()
    out = []
    for chunk in chunks:
        out += reader.frames(chunk)
        assert reader.buffer_size <= reader.frame_max + len(chunk)
    assert out == TRACE_FRAMES
    assert all(type(p) is bytes for _, _, p in out)


@pytest.mark.parametrize("impl", IMPLS)
def test_buffer_is_released_after_draining(impl: Impl) -> None:
    reader = impl.reader()
    big = raw_frame(3, 1, b"x" * 100_000)
    assert reader.frames(big[:50_000]) == []
    assert reader.buffer_size == 50_000
    assert reader.frames(big[50_000:] + ojs_codec.HEARTBEAT_FRAME[:3]) == [(3, 1, b"x" * 100_000)]
    assert reader.buffer_size == reader.buffered == 3
    assert reader.frames(ojs_codec.HEARTBEAT_FRAME[3:]) == [(8, 0, b"")]
    assert reader.buffer_size == 0
    reader.feed(ojs_codec.HEARTBEAT_FRAME)
    assert reader.next_frame() == (8, 0, b"")
    assert reader.buffer_size == 8  # consumed; released when next_frame() runs dry
    assert reader.next_frame() is None
    assert reader.buffer_size == 0


@pytest.mark.parametrize("impl", IMPLS)
def test_payloads_are_independent_of_the_buffer(impl: Impl) -> None:
    reader = impl.reader()
    data = bytearray(raw_frame(1, 1, b"abc") + raw_frame(1, 1, b"def")[:5])
    first = reader.frames(data)
    data[7:10] = b"zzz"
    assert first == [(1, 1, b"abc")]
    assert reader.frames(raw_frame(1, 1, b"def")[5:]) == [(1, 1, b"def")]


# --- size limits -------------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
def test_oversized_frame_is_rejected_from_its_header(impl: Impl) -> None:
    reader = impl.reader(frame_max=4096)
    reader.feed(struct.pack(">BHI", 3, 1, 4096 - 7))  # one byte too many; no payload sent
    with pytest.raises(FrameError) as info:
        reader.next_frame()
    assert info.value.code == 501 and info.value.remote is False
    assert reader.buffered == 7


@pytest.mark.parametrize("impl", IMPLS)
def test_oversized_frame_never_buffered_even_when_declared_huge(impl: Impl) -> None:
    reader = impl.reader()
    header_only = struct.pack(">BHI", 3, 1, 2**32 - 1)
    with pytest.raises(FrameError):
        reader.frames(header_only + b"\x00" * 100)
    assert reader.buffer_size <= 107


@pytest.mark.parametrize("impl", IMPLS)
def test_largest_frame_is_accepted(impl: Impl) -> None:
    reader = impl.reader(frame_max=4096)
    payload = b"x" * (4096 - 8)
    assert reader.frames(raw_frame(3, 1, payload)) == [(3, 1, payload)]


@pytest.mark.parametrize("impl", IMPLS)
def test_frame_max_can_change_and_zero_means_protocol_max(impl: Impl) -> None:
    reader = impl.reader(frame_max=4096)
    big = raw_frame(3, 1, b"x" * 10000)
    reader.frame_max = 0
    assert reader.frame_max == 0
    assert reader.frames(big) == [(3, 1, b"x" * 10000)]
    reader.frame_max = 131072
    assert reader.frames(big) == [(3, 1, b"x" * 10000)]
    reader.frame_max = 4096
    with pytest.raises(FrameError):
        reader.frames(big)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("bad", [1, 4095, 2**32, -1, 1.5, True, "4096"])
def test_bad_frame_max(impl: Impl, bad: object) -> None:
    with pytest.raises(UsageError):
        impl.reader(frame_max=bad)  # type: ignore[arg-type]
    reader = impl.reader()
    with pytest.raises(UsageError):
        reader.frame_max = bad  # type: ignore[assignment]
    assert reader.frame_max == 131072


@pytest.mark.parametrize("impl", IMPLS)
def test_feeding_without_draining_is_refused(impl: Impl) -> None:
    reader = impl.reader(frame_max=4096)
    frame_bytes = raw_frame(1, 1, b"x" * 1000)
    for _ in range(4):
        reader.feed(frame_bytes)  # 4032 bytes: less than one max frame
    reader.feed(frame_bytes)
    with pytest.raises(UsageError, match="next_frame"):
        reader.feed(frame_bytes)
    assert len(reader.frames(b"")) == 5
    reader.feed(frame_bytes)  # drained: accepted again


# --- protocol errors ------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
def test_bad_frame_end(impl: Impl) -> None:
    reader = impl.reader()
    with pytest.raises(FrameError, match="end octet"):
        reader.frames(raw_frame(1, 1, b"abc", end=0x00))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("frame_type", [0, 4, 7, 9, 65, 255])
def test_unknown_frame_type(impl: Impl, frame_type: int) -> None:
    reader = impl.reader()
    reader.frames(raw_frame(8, 0, b""))  # not at the start of the stream any more
    with pytest.raises(FrameError, match="unknown frame type"):
        reader.frames(bytes([frame_type]))  # detected from the first byte


@pytest.mark.parametrize("impl", IMPLS)
def test_unknown_frame_type_at_start(impl: Impl) -> None:
    with pytest.raises(FrameError, match="unknown frame type"):
        impl.reader().frames(b"\x04")
    with pytest.raises(FrameError, match="unknown frame type"):
        impl.reader().frames(b"AMQX\x00\x00\x09\x01")


@pytest.mark.parametrize("impl", IMPLS)
def test_reader_stays_broken(impl: Impl) -> None:
    reader = impl.reader()
    with pytest.raises(FrameError):
        reader.frames(raw_frame(1, 1, b"", end=1))
    assert reader.broken
    for call in (lambda: reader.feed(raw_frame(8, 0, b"")), reader.next_frame, lambda: reader.frames(b"")):
        with pytest.raises(FrameError):
            call()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "offered", [b"AMQP\x00\x00\x09\x01", b"AMQP\x01\x01\x00\x0a", b"AMQP\x00\x00\x08\x00"]
)
def test_protocol_header_reply(impl: Impl, offered: bytes) -> None:
    for pieces in (
        [offered],
        [offered[i : i + 1] for i in range(8)],
        [offered[:3], offered[3:7], offered[7:]],
    ):
        reader = impl.reader()
        with pytest.raises(ProtocolVersionMismatch) as info:
            for piece in pieces:
                reader.frames(piece)
        assert info.value.header == offered
        assert isinstance(info.value, ojs_codec.ProtocolError)
        with pytest.raises(ProtocolVersionMismatch):
            reader.next_frame()


@pytest.mark.parametrize("impl", IMPLS)
def test_partial_protocol_header_waits(impl: Impl) -> None:
    reader = impl.reader()
    assert reader.frames(b"AMQP\x00\x00\x09") == []
    assert reader.buffered == 7


@pytest.mark.parametrize("impl", IMPLS)
def test_protocol_header_only_at_the_start(impl: Impl) -> None:
    reader = impl.reader()
    reader.frames(ojs_codec.HEARTBEAT_FRAME)
    with pytest.raises(FrameError):
        reader.frames(b"AMQP\x00\x00\x09\x01")


@pytest.mark.parametrize("impl", IMPLS)
def test_heartbeats(impl: Impl) -> None:
    reader = impl.reader()
    assert reader.frames(ojs_codec.HEARTBEAT_FRAME * 3) == [(8, 0, b"")] * 3
    assert heartbeat.Heartbeat.marshal() == ojs_codec.HEARTBEAT_FRAME
    assert header.ProtocolHeader().marshal() == ojs_codec.PROTOCOL_HEADER
    with pytest.raises(FrameError, match="heartbeat"):
        impl.reader().frames(raw_frame(8, 1, b""))
    with pytest.raises(FrameError, match="heartbeat"):
        impl.reader().frames(raw_frame(8, 0, b"x"))


# --- building frames ------------------------------------------------------------------------


def test_encode_frame() -> None:
    assert ojs_codec.encode_frame(1, 5, b"abc") == b"\x01\x00\x05\x00\x00\x00\x03abc\xce"
    assert ojs_codec.encode_frame(8, 0, b"") == ojs_codec.HEARTBEAT_FRAME
    with pytest.raises(UsageError):
        ojs_codec.encode_frame(1, 65536, b"")


@pytest.mark.parametrize("impl", IMPLS)
def test_encode_content_empty_body_has_no_body_frame(impl: Impl) -> None:
    data = ojs_codec.encode_content(1, 60, None, b"", 4096)
    frames = impl.reader().frames(data)
    assert [f[0] for f in frames] == [2]
    assert ojs_codec.decode_content_header(frames[0][2]) == (60, 0, ojs_codec.BasicProperties())


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    ("size", "frame_max", "expected"),
    [
        (1, 4096, [1]),
        (4088, 4096, [4088]),
        (4089, 4096, [4088, 1]),
        (3 * 4088, 4096, [4088] * 3),
        (10000, 5000, [4992, 4992, 16]),
        (200_000, 131072, [131064, 68936]),
        (200_000, 0, [200_000]),
    ],
)
def test_encode_content_splits_at_frame_max_minus_8(
    impl: Impl, size: int, frame_max: int, expected: list[int]
) -> None:
    body = bytes(i % 256 for i in range(size))
    data = ojs_codec.encode_content(7, 60, OJS_PROPERTIES, body, frame_max)
    frames = impl.reader(frame_max).frames(data)
    assert frames[0][0] == 2
    assert [len(p) for t, ch, p in frames[1:] if t == 3 and ch == 7] == expected
    assert len(frames) == len(expected) + 1
    assert b"".join(p for _, _, p in frames[1:]) == body
    assert ojs_codec.decode_content_header(frames[0][2]) == (60, size, OJS_PROPERTIES)


@SETTINGS
@given(size=st.integers(0, 20000), frame_max=st.integers(4096, 9000))
def test_encode_content_matches_pamqp(size: int, frame_max: int) -> None:
    from pamqp import body as pbody

    body = bytes(i % 251 for i in range(size))
    chunk = frame_max - 8
    theirs = frame.marshal(header.ContentHeader(0, size, ojs_codec.to_pamqp(OJS_PROPERTIES)), 3) + b"".join(
        frame.marshal(pbody.ContentBody(body[i : i + chunk]), 3) for i in range(0, size, chunk)
    )
    assert ojs_codec.encode_content(3, 60, OJS_PROPERTIES, body, frame_max) == theirs


def test_encode_content_errors() -> None:
    with pytest.raises(UsageError, match="frame_max"):
        ojs_codec.encode_content(1, 60, None, b"x", 100)
    with pytest.raises(UsageError, match="content header"):
        ojs_codec.encode_content(1, 60, ojs_codec.BasicProperties(headers={"k": "v" * 4100}), b"", 4096)
    with pytest.raises(UsageError):
        ojs_codec.encode_content(70000, 60, None, b"", 4096)


def test_encode_method_frame_unvalidated_matches_the_checked_encoder() -> None:
    """The encoder for a peer (the memory:// broker): the same bytes as the checked one for
    a valid method, a name pamqp's pattern refuses let through, missing ints written as 0."""
    fields = {"queue": "jobs", "message_count": 3, "consumer_count": 1}
    assert ojs_codec.encode_method_frame_unvalidated(
        1, commands.Queue.DeclareOk, fields
    ) == ojs_codec.encode_method_frame(1, commands.Queue.DeclareOk(**fields))
    odd = ojs_codec.encode_method_frame_unvalidated(1, commands.Queue.DeclareOk, {"queue": "jobs é/$"})
    method = ojs_codec.decode_method(odd[7:-1])
    assert (method.queue, method.message_count, method.consumer_count) == ("jobs é/$", 0, 0)
    with pytest.raises(UsageError):
        bad = {"queue": "q", "message_count": "x"}
        ojs_codec.encode_method_frame_unvalidated(1, commands.Queue.DeclareOk, bad)
