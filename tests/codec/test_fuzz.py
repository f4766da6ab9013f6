"""Fuzzing: the reader and the decoders only ever return values or raise ProtocolError.

The example count defaults to a modest number so the suite stays fast; set
``OJS_FUZZ_EXAMPLES`` (for example ``OJS_FUZZ_EXAMPLES=100000``) for a long run.
"""

from __future__ import annotations

import os
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands, frame, header

import ojs_codec
from ojs_codec import ProtocolError

from .codec_impls import IMPLS, Impl
from .codec_strategies import OJS_PROPERTIES, SETTINGS, split_at

EXAMPLES = int(os.environ.get("OJS_FUZZ_EXAMPLES", "500"))
FUZZ = settings(SETTINGS, max_examples=EXAMPLES)
# Long runs need more than the suite's per-test timeout: about 10 ms per example.
pytestmark = pytest.mark.timeout(max(120, EXAMPLES // 100))
FRAME_MAX = 4096


def _payload(method: Any) -> bytes:
    return frame.marshal(method, 1)[7:-1]


SEED_METHODS = [
    _payload(commands.Basic.Deliver("ctag", 7, True, "ex", "rk")),
    _payload(commands.Basic.Return(312, "NO_ROUTE", "ex", "rk")),
    _payload(commands.Basic.GetOk(1, False, "ex", "rk", 3)),
    _payload(commands.Basic.Ack(5, True)),
    _payload(commands.Basic.Nack(5, False, True)),
    _payload(commands.Basic.Reject(5, False)),
    _payload(commands.Basic.GetEmpty()),
    _payload(commands.Connection.Start(server_properties={"capabilities": {"publisher_confirms": True},
                                                          "product": "RabbitMQ", "x": [1, 2.5, None]})),
    _payload(commands.Connection.Tune(2047, 131072, 60)),
    _payload(commands.Connection.Close(320, "CONNECTION_FORCED", 0, 0)),
    _payload(commands.Channel.Close(406, "PRECONDITION_FAILED", 50, 10)),
    _payload(commands.Queue.DeclareOk("q", 3, 1)),
    _payload(commands.Basic.ConsumeOk("ctag")),
]  # fmt: skip
SEED_HEADERS = [
    frame.marshal(header.ContentHeader(0, 300, ojs_codec.to_pamqp(OJS_PROPERTIES)), 1)[7:-1],
    frame.marshal(header.ContentHeader(0, 0), 1)[7:-1],
]
SEED_STREAM = b"".join(
    [frame.marshal(commands.Connection.Start(), 0), ojs_codec.HEARTBEAT_FRAME]
    + [ojs_codec.encode_frame(1, 1, p) for p in SEED_METHODS]
    + [ojs_codec.encode_frame(2, 1, p) for p in SEED_HEADERS]
    + [ojs_codec.encode_frame(3, 1, b"body" * 50), ojs_codec.HEARTBEAT_FRAME]
)

FAST_DECODERS = {
    ojs_codec.BASIC_DELIVER: "decode_deliver",
    ojs_codec.BASIC_RETURN: "decode_return",
    ojs_codec.BASIC_GET_OK: "decode_get_ok",
    ojs_codec.BASIC_ACK: "decode_ack",
    ojs_codec.BASIC_NACK: "decode_nack",
    ojs_codec.BASIC_REJECT: "decode_reject",
}


# --- mutations ---------------------------------------------------------------------------

mutation = st.one_of(
    st.tuples(st.just("set"), st.integers(0, 10**6), st.integers(0, 255)),
    st.tuples(st.just("flip"), st.integers(0, 10**6), st.integers(0, 7)),
    st.tuples(st.just("insert"), st.integers(0, 10**6), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("delete"), st.integers(0, 10**6), st.integers(1, 8)),
    st.tuples(st.just("truncate"), st.integers(0, 10**6), st.just(0)),
)


def mutate(data: bytes, ops: list[tuple[str, int, Any]]) -> bytes:
    buf = bytearray(data)
    for op, where, arg in ops:
        if not buf:
            buf += b"\x00"
        i = where % (len(buf) + (op == "insert"))
        if op == "set":
            buf[i] = arg
        elif op == "flip":
            buf[i] ^= 1 << arg
        elif op == "insert":
            buf[i:i] = arg
        elif op == "delete":
            del buf[i : i + arg]
        else:
            del buf[i:]
    return bytes(buf)


# --- checks ------------------------------------------------------------------------------


def decode_payload(impl: Impl, frame_type: int, payload: bytes) -> None:
    """Run the decoders a connection would run on this frame."""
    if frame_type == ojs_codec.FRAME_METHOD:
        try:
            key = ojs_codec.method_key(payload)
        except ProtocolError:
            return
        fast = FAST_DECODERS.get(key)
        if fast is not None:
            try:
                assert isinstance(getattr(impl, fast)(payload), tuple)
            except ProtocolError:
                pass
        try:
            ojs_codec.decode_method(payload)
        except ProtocolError:
            pass
    elif frame_type == ojs_codec.FRAME_HEADER:
        try:
            class_id, size, props = impl.decode_content_header(payload)
            assert isinstance(props, ojs_codec.BasicProperties) and size >= 0 and class_id >= 0
        except ProtocolError:
            pass


def run_reader(impl: Impl, chunks: list[bytes], use_next_frame: bool) -> None:
    reader = impl.reader(FRAME_MAX)
    try:
        for chunk in chunks:
            if use_next_frame:
                reader.feed(chunk)
                frames = []
                while (f := reader.next_frame()) is not None:
                    frames.append(f)
            else:
                frames = reader.frames(chunk)
            # bounded: at most one incomplete frame plus the latest chunk
            assert reader.buffer_size <= FRAME_MAX + len(chunk)
            assert reader.buffered < FRAME_MAX
            for frame_type, channel, payload in frames:
                assert frame_type in (1, 2, 3, 8)
                assert 0 <= channel <= 65535
                assert len(payload) <= FRAME_MAX - 8
                decode_payload(impl, frame_type, payload)
    except ProtocolError:
        assert reader.broken
        try:
            reader.next_frame()
        except ProtocolError:
            pass
        else:
            raise AssertionError("a broken reader must keep raising") from None


# --- fuzz targets ------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
@FUZZ
@given(ops=st.lists(mutation, max_size=6), cuts=st.lists(st.integers(0, len(SEED_STREAM)), max_size=12),
       use_next_frame=st.booleans())  # fmt: skip
def test_fuzz_reader_mutated_stream(
    impl: Impl, ops: list[tuple[str, int, Any]], cuts: list[int], use_next_frame: bool
) -> None:
    run_reader(impl, split_at(mutate(SEED_STREAM, ops), cuts), use_next_frame)


@pytest.mark.parametrize("impl", IMPLS)
@FUZZ
@given(
    data=st.binary(max_size=400), cuts=st.lists(st.integers(0, 400), max_size=8), use_next_frame=st.booleans()
)
def test_fuzz_reader_random_bytes(impl: Impl, data: bytes, cuts: list[int], use_next_frame: bool) -> None:
    run_reader(impl, split_at(data, cuts), use_next_frame)


frame_like = st.builds(
    lambda t, ch, payload, size, end: (
        struct.pack(">BHI", t, ch, size if size is not None else len(payload)) + payload + bytes([end])
    ),
    st.sampled_from([1, 2, 3, 8, 8, 0, 65]),
    st.sampled_from([0, 0, 1, 65535]),
    st.binary(max_size=64),
    st.none() | st.none() | st.integers(0, 2**32 - 1),
    st.sampled_from([0xCE, 0xCE, 0xCE, 0x00]),
)


@pytest.mark.parametrize("impl", IMPLS)
@FUZZ
@given(frames=st.lists(frame_like, max_size=8), cuts=st.lists(st.integers(0, 600), max_size=8),
       prefix=st.sampled_from([b"", b"", b"AMQP\x00\x00\x09\x01", b"AMQ"]))  # fmt: skip
def test_fuzz_reader_frame_like(impl: Impl, frames: list[bytes], cuts: list[int], prefix: bytes) -> None:
    run_reader(impl, split_at(prefix + b"".join(frames), cuts), use_next_frame=False)


@pytest.mark.parametrize("impl", IMPLS)
@FUZZ
@given(seed=st.sampled_from(SEED_METHODS), ops=st.lists(mutation, min_size=1, max_size=5))
def test_fuzz_method_decoders(impl: Impl, seed: bytes, ops: list[tuple[str, int, Any]]) -> None:
    payload = mutate(seed, ops)
    decode_payload(impl, ojs_codec.FRAME_METHOD, payload)
    for decoder in FAST_DECODERS.values():  # even when the id does not match
        try:
            getattr(impl, decoder)(payload)
        except ProtocolError:
            pass


@pytest.mark.parametrize("impl", IMPLS)
@FUZZ
@given(seed=st.sampled_from(SEED_HEADERS), ops=st.lists(mutation, min_size=1, max_size=5))
def test_fuzz_header_decoder(impl: Impl, seed: bytes, ops: list[tuple[str, int, Any]]) -> None:
    decode_payload(impl, ojs_codec.FRAME_HEADER, mutate(seed, ops))


@pytest.mark.parametrize("impl", IMPLS)
@FUZZ
@given(data=st.binary(max_size=200), offset=st.integers(0, 8))
def test_fuzz_decoders_random_bytes(impl: Impl, data: bytes, offset: int) -> None:
    decode_payload(impl, ojs_codec.FRAME_METHOD, data)
    decode_payload(impl, ojs_codec.FRAME_HEADER, data)
    for decoder in (impl.decode_table, impl.decode_array, impl.decode_properties):
        try:
            decoder(data, offset)
        except ProtocolError:
            pass
