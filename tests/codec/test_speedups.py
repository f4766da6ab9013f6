"""The C extension ``ojs_codec._speedups``: it is loaded, and on edge cases, malformed input
and unusual arguments it gives exactly what the pure-Python code gives.

Calls go through ``codec_impls.C``, whose functions also run the pure-Python function
and assert the same value or the same exception (type and message).
"""

from __future__ import annotations

import collections
import datetime
import enum
import gc
import math
import os
import struct
import subprocess
import sys
import time
import types
from collections.abc import Callable, Iterator, Mapping
from decimal import Decimal
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands, frame

import ojs_codec
from ojs_codec import _fast, _frames, _hot

from .codec_impls import PURE, C, Impl, speedups
from .codec_strategies import OJS_PROPERTIES, SETTINGS

needs_c = pytest.mark.skipif(C is None, reason="ojs_codec._speedups is not built")
UTC = datetime.UTC
HOT_NAMES = sorted(_hot.__all__)


def c_impl() -> Impl:
    assert C is not None
    return C


def run(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The result or the exception of a checked call (a mismatch still fails)."""
    try:
        return func(*args, **kwargs)
    except AssertionError:
        raise
    except Exception as exc:
        return exc


# --- which implementation is active ---------------------------------------------------------


def test_extension_is_loaded_unless_pure_python_is_asked_for() -> None:
    if os.environ.get("OJS_CODEC_PURE") == "1":
        assert ojs_codec.SPEEDUPS is False
        assert ojs_codec.encode_publish is _fast.encode_publish
        assert ojs_codec.FrameReader()._split is _frames._split_frames_py
        return
    assert speedups is not None, (
        "ojs_codec._speedups is not built: install with `pip install -e .` where a C compiler is "
        "available, or set OJS_CODEC_PURE=1 to test the pure-Python code only"
    )
    assert ojs_codec.SPEEDUPS is True
    for name in HOT_NAMES:
        assert getattr(ojs_codec, name) is getattr(speedups, name), name
        assert getattr(_hot, name) is getattr(speedups, name), name  # what AMQPConnection calls
    assert ojs_codec.FrameReader()._split is speedups.split_frames


def test_environment_variable_selects_pure_python() -> None:
    code = (
        "import ojs_codec; "
        "print(ojs_codec.SPEEDUPS, ojs_codec.encode_publish.__module__, "
        "ojs_codec.FrameReader()._split.__name__)"
    )
    env = {**os.environ, "OJS_CODEC_PURE": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "ojs_codec._fast", "_split_frames_py"]


# --- every wire type, then every truncation and byte change -----------------------------------

RICH_HEADERS: dict[str, Any] = {
    "bool": True,
    "int8": -5,
    "int16": -300,
    "uint16": 60000,
    "int32": -70000,
    "uint32": 3_000_000_000,
    "int64": -(2**40),
    "float": 0.1,
    "float32": ojs_codec.Float32(0.5),
    "decimal": Decimal("-12.345"),
    "text": "héllo wörld",
    "long text": "x" * 300,
    "timestamp": datetime.datetime(2024, 5, 17, 12, 30, 45, tzinfo=UTC),
    "table": {"inner": [1, "two", None, {"deep": b"\x00\xff"}]},
    "array": [True, 1.5, "s", [], {}],
    "void": None,
    "bytes": b"\x01\x02\x03",
    "wrapped": [ojs_codec.Int8(1), ojs_codec.UInt8(2), ojs_codec.Int16(3), ojs_codec.UInt16(4),
                ojs_codec.Int32(5), ojs_codec.UInt32(6), ojs_codec.Int64(7), ojs_codec.LongString(b"\xfe")],
    "ключ": "значение",
}  # fmt: skip
RICH_PROPERTIES = ojs_codec.BasicProperties(
    content_type="application/json",
    content_encoding="gzip",
    headers=RICH_HEADERS,
    delivery_mode=2,
    priority=9,
    correlation_id="corr",
    reply_to="amq.rabbitmq.reply-to",
    expiration="60000",
    message_id="018f86a4-3c2b-7a51-9d3e-4b5c6d7e8f90",
    timestamp=datetime.datetime(2024, 5, 17, 12, 30, 45, tzinfo=UTC),
    type="email.send",
    user_id="guest",
    app_id="ojs",
    cluster_id="c1",
)


def rich_header_payload() -> bytes:
    props = c_impl().encode_properties(RICH_PROPERTIES)
    return struct.pack(">HHQ", 60, 0, 1234) + props


def mutations(data: bytes, values: tuple[int, ...]) -> Iterator[bytes]:
    for i in range(len(data)):
        for v in values:
            if data[i] != v:
                yield data[:i] + bytes([v]) + data[i + 1 :]


@needs_c
def test_rich_properties_round_trip() -> None:
    impl = c_impl()
    _, size, props = impl.decode_content_header(rich_header_payload())
    assert size == 1234
    assert props.headers is not None and props.headers["ключ"] == "значение"
    assert impl.decode_properties(impl.encode_properties(props)) == props


@needs_c
def test_content_header_every_truncation_and_byte_change() -> None:
    impl = c_impl()
    payload = rich_header_payload()
    for size in range(len(payload) + 1):
        run(impl.decode_content_header, payload[:size])
        run(impl.decode_content_header_lenient, payload[:size])
        run(impl.decode_properties, payload[:size], 12)
    for changed in mutations(payload, (0x00, 0x01, 0x7F, 0x80, 0xFF, *b"tbBsuIilLfdDSATFVxZ")):
        run(impl.decode_content_header, changed)
        run(impl.decode_content_header_lenient, changed)  # many are malformed but valid AMQP


METHOD_PAYLOADS = [
    # our slow-path encoder: pamqp packs delivery tags signed
    (
        "decode_deliver",
        ojs_codec.encode_method_frame(1, commands.Basic.Deliver("ctag-é", 2**64 - 1, True, "ex", "rk"))[7:-1],
    ),
    ("decode_return", frame.marshal(commands.Basic.Return(312, "NO_ROUTE", "ex", "rk"), 1)[7:-1]),
    ("decode_get_ok", frame.marshal(commands.Basic.GetOk(7, True, "ex", "rk", 2**32 - 1), 1)[7:-1]),
    ("decode_ack", ojs_codec.encode_ack(1, 2**64 - 1, True)[7:-1]),
    ("decode_nack", ojs_codec.encode_nack(1, 5, True, False)[7:-1]),
    ("decode_reject", ojs_codec.encode_reject(1, 5, False)[7:-1]),
]


@needs_c
@pytest.mark.parametrize(("decoder", "payload"), METHOD_PAYLOADS, ids=[m[0] for m in METHOD_PAYLOADS])
def test_method_payload_every_truncation_and_byte_value(decoder: str, payload: bytes) -> None:
    decode = getattr(c_impl(), decoder)
    for size in range(len(payload) + 2):
        run(decode, payload[:size])
        run(decode, payload + b"\x00" * (size - len(payload)))
    for changed in mutations(payload, tuple(range(256))):
        run(decode, changed)


@needs_c
def test_non_utf8_everywhere() -> None:
    impl = c_impl()
    for i, name in enumerate(ojs_codec.BasicProperties.__struct_fields__):
        if name in ("headers", "delivery_mode", "priority", "timestamp"):
            continue
        for bad in (b"\xff", b"a\xc3", b"\xed\xa0\x80"):  # invalid, cut short, a surrogate
            data = struct.pack(">H", 0x8000 >> i) + bytes([len(bad)]) + bad
            assert isinstance(run(impl.decode_properties, data), ojs_codec.ProtocolSyntaxError)
    assert isinstance(run(impl.decode_table, b"\x00\x00\x00\x03\x01\xffV"), ojs_codec.ProtocolSyntaxError)
    assert isinstance(
        run(impl.decode_array, b"\x00\x00\x00\x07F\x00\x00\x00\x02\x01\xff"), ojs_codec.ProtocolError
    )
    value = impl.decode_table(b"\x00\x00\x00\x0a\x01sS\x00\x00\x00\x03a\xc3\xff")[0]
    assert value == {"s": b"a\xc3\xff"}  # a long string that is not UTF-8 is bytes
    for method, payload in METHOD_PAYLOADS[:3]:
        for i in range(len(payload)):
            run(getattr(impl, method), payload[:i] + b"\xc3" + payload[i + 1 :])


# --- encoding: unusual values and arguments ---------------------------------------------------


class Color(enum.IntEnum):
    RED = 1
    BIG = 2**40


class Text(str):
    pass


class Table(dict[str, Any]):
    pass


class Props(ojs_codec.BasicProperties):
    pass


class Raises:
    def __bool__(self) -> bool:
        raise ValueError("no truth here")


class ReadOnlyMapping(Mapping[str, Any]):
    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


PARIS = datetime.timezone(datetime.timedelta(hours=2))
UNUSUAL_VALUES: list[Any] = [
    Color.RED, Color.BIG, Text("sub"), Table(a=1), collections.OrderedDict(b=2, a=1),
    types.MappingProxyType({"m": 1}), ReadOnlyMapping({"r": [1]}), (1, "t"), bytearray(b"ba"),
    memoryview(b"mv"), 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**20000, 1e308, -0.0, math.inf, math.nan,
    datetime.datetime(1970, 1, 1), datetime.datetime(1969, 12, 31, 23, 59, 59, 500000, tzinfo=UTC),
    datetime.datetime(1969, 12, 31, tzinfo=UTC), datetime.datetime(2399, 12, 31, 23, 59, 59, 999999),
    datetime.datetime(2400, 1, 1), datetime.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    datetime.datetime(2024, 5, 17, 14, 30, tzinfo=PARIS), time.gmtime(0), datetime.date(2024, 1, 1),
    Decimal("1E+3"), Decimal("NaN"), "\ud800", "a" * 70000, object(), {1, 2}, 1j, {"\ud800": 1}, {1: 2},
    {Text("k"): 1}, {"k" * 255: 1}, {"é" * 128: 1}, {"z": 1, "a": {"y": object()}}, [[[[object()]]]],
]  # fmt: skip


@needs_c
@pytest.mark.parametrize(
    "value", UNUSUAL_VALUES, ids=[f"{type(v).__name__}-{i}" for i, v in enumerate(UNUSUAL_VALUES)]
)
def test_unusual_header_values(value: Any) -> None:
    impl = c_impl()
    run(impl.encode_table, {"k": value, "a": 1, "z": "last"})
    run(impl.encode_array, [1, value, "x"])
    props = ojs_codec.BasicProperties(headers={"k": value})
    run(impl.encode_properties, props)
    run(impl.encode_publish, 1, "ex", "rk", props, b"body", 4096)


@needs_c
@pytest.mark.parametrize("field", ojs_codec.BasicProperties.__struct_fields__)
@pytest.mark.parametrize(
    "value",
    [None, "", "x", "é" * 200, "x" * 256, "\ud800", Text("t"), Text(""), 0, 1, 255, 256, -1, True, 2**70,
     Color.RED, 1.0, b"x", b"", ["x"], [], {}, {"a": 1}, Raises(), object(),
     datetime.datetime(2024, 1, 1), datetime.datetime(2024, 1, 1, tzinfo=PARIS), time.gmtime(86400)],
    ids=repr,
)  # fmt: skip
def test_unusual_property_values(field: str, value: Any) -> None:
    impl = c_impl()
    props = ojs_codec.BasicProperties(**{field: value})
    run(impl.encode_properties, props)
    run(impl.encode_publish, 1, "", "", props, b"", 4096)


junk = st.one_of(
    st.none(), st.text(max_size=4), st.integers(-300, 300), st.booleans(), st.binary(max_size=3),
    st.floats(), st.lists(st.integers(), max_size=2), st.datetimes(timezones=st.none() | st.just(UTC)),
    st.dictionaries(st.text(max_size=3), st.integers() | st.text(max_size=3) | st.none(), max_size=3),
)  # fmt: skip


@needs_c
@SETTINGS
@given(st.fixed_dictionaries({name: junk for name in ojs_codec.BasicProperties.__struct_fields__}))
def test_junk_properties(values: dict[str, Any]) -> None:
    impl = c_impl()
    props = ojs_codec.BasicProperties(**values)
    run(impl.encode_properties, props)
    run(impl.encode_publish, 3, "ex", "rk", props, b"abc", 4096)


@needs_c
def test_table_with_many_keys_is_sorted() -> None:
    impl = c_impl()
    keys = [f"{chr(0x41 + (i * 7919) % 60)}{i}" for i in range(100)] + ["é", "\u4e2d", "\U0001f600", ""]
    table = {k: i for i, k in enumerate(keys)}
    data = impl.encode_table(table)
    assert list(impl.decode_table(data)[0]) == sorted(keys)


@needs_c
@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((1, "ex", "rk", None, b"body", 4096), {}),
        ((), {"channel": 1, "exchange": "", "routing_key": "q", "properties": None, "body": b"b",
              "frame_max": 4096, "immediate": True, "mandatory": True}),
        ((1, "ex", "rk", None, b"body", 4096, True), {"immediate": True}),
        ((1, "ex", "rk", None, b"body", 4096, True), {"mandatory": True}),  # given twice
        ((1, "ex", "rk", None, b"body", 4096), {"bogus": 1}),
        ((1, "ex", "rk", None, b"body"), {}),
        ((1, "ex", "rk", None, b"body", 4096, False, False, None), {}),
        ((1, None, "rk", None, b"", 4096), {}),
        ((1, "ex", 5, None, b"", 4096), {}),
        ((1, Text("ex"), "rk", None, b"", 4096), {}),
        ((1, "ex", "r" * 256, None, b"", 4096), {}),
        ((1, "é" * 128, "rk", None, b"", 4096), {}),
        ((1, "\ud800", "rk", None, b"", 4096), {}),
        ((1, "ex", "rk", None, b"", 131072.0), {}),
        ((1, "ex", "rk", None, b"", 0.0), {}),
        ((1, "ex", "rk", None, b"", True), {}),
        ((1, "ex", "rk", None, b"", 4095), {}),
        ((1, "ex", "rk", None, b"", 2**32), {}),
        ((1, "ex", "rk", None, b"", 2**70), {}),
        ((1, "ex", "rk", None, b"", -1), {}),
        ((1, "ex", "rk", None, b"", None), {}),
        ((1, "ex", "rk", {}, b"", 4096), {}),
        ((1, "ex", "rk", Props(app_id="sub"), b"", 4096), {}),
        ((1, "ex", "rk", None, bytearray(b"x" * 5000), 4096), {}),
        ((1, "ex", "rk", None, memoryview(b"x" * 5000), 4096), {}),
        ((1, "ex", "rk", None, "text", 4096), {}),
        ((1, "ex", "rk", None, None, 4096), {}),
        ((-1, "ex", "rk", None, b"", 4096), {}),
        ((65536, "ex", "rk", None, b"", 4096), {}),
        ((2**70, "ex", "rk", None, b"", 4096), {}),
        ((True, "ex", "rk", None, b"", 4096), {}),
        ((1.0, "ex", "rk", None, b"", 4096), {}),
        (("1", "ex", "rk", None, b"", 4096), {}),
        ((1, "ex", "rk", None, b"", 4096, 1, 0), {}),
        ((1, "ex", "rk", None, b"", 4096, "yes", None), {}),
        ((1, "ex", "rk", None, b"", 4096, Raises()), {}),
        ((1, "ex", "rk", ojs_codec.BasicProperties(headers={"k": "v" * 5000}), b"", 4096), {}),
        ((1, "ex", "rk", ojs_codec.BasicProperties(headers={"k": "v" * 4072}), b"x" * 9000, 4096), {}),
        ((1, "ex", "rk", ojs_codec.BasicProperties(headers={"k": "v" * 4073}), b"", 4096), {}),
        ((1, "ex", "rk", ojs_codec.BasicProperties(content_type=["x"]), b"", 4096), {}),
        ((70000, "ex", "rk", ojs_codec.BasicProperties(delivery_mode=300), b"", 4096), {}),
        ((70000, "ex", "rk", None, b"", 4095), {}),
    ],
)  # fmt: skip
def test_encode_publish_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    run(c_impl().encode_publish, *args, **kwargs)


@needs_c
def test_encode_publish_splits_the_body_like_pure_python() -> None:
    impl = c_impl()
    for size in (0, 1, 4087, 4088, 4089, 8176, 8177, 20000):
        frames = impl.reader(4096).frames(impl.encode_publish(2, "e", "r", OJS_PROPERTIES, b"b" * size, 4096))
        assert [len(f[2]) for f in frames[2:]] == [min(4088, size - i) for i in range(0, size, 4088)]


@needs_c
@pytest.mark.parametrize(
    ("name", "args", "kwargs"),
    [
        ("decode_deliver", (), {"payload": METHOD_PAYLOADS[0][1]}),
        ("decode_deliver", (bytearray(METHOD_PAYLOADS[0][1]),), {}),
        ("decode_deliver", (memoryview(METHOD_PAYLOADS[0][1]),), {}),
        ("decode_deliver", (), {}),
        ("decode_deliver", (b"", b""), {}),
        ("decode_ack", (bytearray(METHOD_PAYLOADS[3][1]),), {}),
        ("decode_content_header", (bytearray(rich_header_payload()),), {}),
        ("decode_content_header", (None,), {}),
        ("decode_properties", (b"junk\x00\x08\x01x",), {"offset": 4}),
        ("decode_properties", (b"junk\x00\x08\x01x", True), {}),
        ("decode_properties", (b"\x00\x00", -1), {}),
        ("decode_properties", (b"\x00\x00", 2**62), {}),
        ("decode_properties", (b"\x00\x00", 2**100), {}),
        ("decode_properties", (b"\x00\x00", -(2**100)), {}),
        ("decode_properties", (b"\x00\x00", 1.0), {}),
        ("decode_table", (b"\x00\x00\x00\x00", 2**61), {}),
        ("decode_table", (bytearray(b"\x00\x00\x00\x00"),), {}),
        ("decode_array", (b"\x00\x00\x00\x02V\x00", -3), {}),
        ("encode_properties", (), {"props": None}),
        ("encode_properties", (Props(app_id="x"),), {}),
        ("encode_properties", ("not properties",), {}),
        ("encode_table", (Table(a=1),), {}),
        ("encode_table", ([("a", 1)],), {}),
        ("encode_table", (ReadOnlyMapping({"a": 1}),), {}),
        ("encode_array", ((1, 2),), {}),
        ("encode_array", ("ab",), {}),
        ("encode_array", ([],), {"values": []}),
    ],
)  # fmt: skip
def test_unusual_arguments(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    run(getattr(c_impl(), name), *args, **kwargs)


@needs_c
def test_depth_limits() -> None:
    impl = c_impl()
    for depth in (ojs_codec.MAX_DEPTH - 1, ojs_codec.MAX_DEPTH, ojs_codec.MAX_DEPTH + 1):
        table: Any = {}
        array: Any = []
        for i in range(depth):
            table = {"t": table} if i % 2 else {"a": [table]}
            array = [array]
        run(impl.encode_table, table)
        run(impl.encode_array, array)
        run(impl.encode_properties, ojs_codec.BasicProperties(headers=table))
        nested = b"\x00\x00\x00\x00"
        for i in range(depth):
            nested = (
                struct.pack(">I", len(nested) + 3) + b"\x01nF" + nested
                if i % 2
                else (struct.pack(">I", len(nested) + 1) + b"A" + nested)
            )
        run(impl.decode_table, nested)
        run(impl.decode_array, nested)


@needs_c
def test_timestamps() -> None:
    impl = c_impl()
    for seconds in (
        0,
        1,
        2**31,
        0xFFFFFFFF,
        0xFFFFFFFF + 1,
        1_700_000_000_123,
        253402300799999,
        2**63,
        2**64 - 1,
    ):
        data = b"\x00\x40" + struct.pack(">Q", seconds)
        run(impl.decode_properties, data)
        run(impl.decode_properties, data)  # the last-timestamp cache
        run(impl.decode_table, b"\x00\x00\x00\x0b\x01tT" + struct.pack(">Q", seconds))


# --- the frame reader -------------------------------------------------------------------------


def raw_frame(
    frame_type: int, channel: int, payload: bytes, end: int = 0xCE, size: int | None = None
) -> bytes:
    return (
        struct.pack(">BHI", frame_type, channel, len(payload) if size is None else size)
        + payload
        + bytes([end])
    )


@needs_c
@pytest.mark.parametrize(
    "bad",
    [
        raw_frame(3, 1, b"x" * 4089),  # one byte over frame_max
        raw_frame(3, 1, b"", size=2**32 - 1),  # declared huge, never buffered
        raw_frame(1, 1, b"abc", end=0x00),
        raw_frame(7, 1, b"abc"),
        raw_frame(8, 1, b""),
        raw_frame(8, 0, b"x"),
        b"AMQP\x00\x00\x09\x01",
        b"AMQ",
        raw_frame(1, 1, b"abc")[:-1],
    ],
)
def test_reader_errors_match(bad: bytes) -> None:
    good = raw_frame(1, 1, b"method") + raw_frame(8, 0, b"")
    for data in (bad, good + bad, good + bad + good):
        outcomes = []
        for impl in (PURE, c_impl()):
            reader = impl.reader(4096)
            outcome = run(reader.frames, data)
            outcomes.append((repr(outcome), reader.broken, reader.buffered, run(reader.next_frame)))
        assert repr(outcomes[0]) == repr(outcomes[1])


@needs_c
def test_split_frames_rejects_wrong_arguments() -> None:
    assert speedups is not None
    with pytest.raises(TypeError):
        speedups.split_frames([], bytearray(b"x"), 10)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        speedups.split_frames((), b"", 10)  # type: ignore[arg-type]


# --- references and memory ---------------------------------------------------------------------


@needs_c
def test_errors_mid_table_keep_reference_counts() -> None:
    impl = c_impl()
    bad, ok, key = object(), ["kept"], "key-" + "x" * 10
    table = {key: ok, "b": bad, "c": "after"}
    props = ojs_codec.BasicProperties(headers=table, app_id="x")
    assert isinstance(run(impl.encode_table, table), ojs_codec.UsageError)  # the same error as Python
    assert isinstance(run(impl.encode_publish, 1, "", "", props, b"", 4096), ojs_codec.UsageError)
    assert speedups is not None
    before = [sys.getrefcount(x) for x in (bad, ok, key, table, props)]
    for _ in range(1000):
        with pytest.raises(ojs_codec.UsageError):
            speedups.encode_table(table)
        with pytest.raises(ojs_codec.UsageError):
            speedups.encode_publish(1, "", "", props, b"", 4096)
    assert [sys.getrefcount(x) for x in (bad, ok, key, table, props)] == before


def _hostile_header_payload() -> bytes:
    """A content header with every kind of lenient case: a short string and a table key
    that are not UTF-8, tables nested too deep, timestamps out of range."""
    deep = b"V"
    for _ in range(ojs_codec.MAX_DEPTH + 2):
        deep = b"F" + struct.pack(">I", len(deep) + 2) + b"\x01n" + deep
    entries = b"\x02k\xff" + b"I\x00\x00\x00\x01" + b"\x04deep" + deep + b"\x01tT" + b"\xff" * 8
    headers = struct.pack(">I", len(entries)) + entries
    props = struct.pack(">H", 0x2000 | 0x0080 | 0x0040) + headers + b"\x02\xff\xfe" + b"\xff" * 8
    return struct.pack(">HHQ", 60, 0, 5) + props


@needs_c
def test_hostile_header_every_truncation_and_byte_change() -> None:
    impl = c_impl()
    payload = _hostile_header_payload()
    assert impl.decode_content_header_lenient(payload)[3] is not None
    for size in range(len(payload) + 1):
        run(impl.decode_content_header_lenient, payload[:size])
    for changed in mutations(payload, (0x00, 0x01, 0x7F, 0x80, 0xFF, *b"FATVS")):
        run(impl.decode_content_header_lenient, changed)


def _leak_workload() -> list[Callable[[], Any]]:
    assert speedups is not None
    s = speedups
    header = rich_header_payload()
    hostile = _hostile_header_payload()
    delivery = b"".join(
        raw_frame(t, 1, p) for t, p in [(1, METHOD_PAYLOADS[0][1]), (2, header), (3, b"x" * 300)]
    )
    bad_props = ojs_codec.BasicProperties(headers={"a": 1, "b": [object()]})
    return [
        lambda: s.encode_publish(1, "ex", "rk", RICH_PROPERTIES, b"x" * 9000, 4096),
        lambda: s.encode_publish(1, "ex", "rk", OJS_PROPERTIES, b"x" * 10, 131072, mandatory=True),
        lambda: s.encode_publish(1, "ex", "rk", bad_props, b"", 4096),
        lambda: s.encode_publish(70000, "ex", "rk", None, b"", 4096),  # a bail-out
        lambda: s.encode_table({"\ud800": 1}),
        lambda: s.decode_content_header(header),
        lambda: s.decode_content_header(header[:-3]),
        lambda: s.decode_content_header(header[:200] + b"\xff" + header[201:]),
        lambda: s.decode_content_header_lenient(header),
        lambda: s.decode_content_header_lenient(hostile),
        lambda: s.decode_content_header_lenient(hostile[:-3]),  # fails after notes were taken
        lambda: s.decode_content_header_lenient(hostile[:40] + b"Z" + hostile[41:]),
        lambda: s.decode_deliver(METHOD_PAYLOADS[0][1]),
        lambda: s.decode_deliver(METHOD_PAYLOADS[0][1][:-1]),
        lambda: s.decode_get_ok(METHOD_PAYLOADS[2][1]),
        lambda: s.decode_return(METHOD_PAYLOADS[1][1] + b"\x00"),
        lambda: s.decode_ack(METHOD_PAYLOADS[3][1]),
        lambda: s.decode_nack(METHOD_PAYLOADS[4][1]),
        lambda: s.split_frames([], delivery, 131064),
        lambda: s.decode_table(b"\x00\x00\x00\x09\x01aF\x00\x00\x00\x02\x01b"),
    ]


def _swallow(func: Callable[[], Any]) -> None:
    try:
        func()
    except (ojs_codec.AMQPError, UnicodeError):
        pass


@needs_c
def test_no_memory_leaks() -> None:
    """Each operation, successful or failing, allocates nothing that outlives it."""
    work = _leak_workload()
    for func in work:  # warm up the caches (strings, keyword names, fallbacks)
        for _ in range(50):
            _swallow(func)
    gc.collect()
    for func in work:
        before = sys.getallocatedblocks()
        for _ in range(2000):
            _swallow(func)
        gc.collect()
        assert sys.getallocatedblocks() - before < 100, func


@needs_c
def test_properties_struct_is_built_like_python() -> None:
    impl = c_impl()
    props = impl.decode_properties(impl.encode_properties(RICH_PROPERTIES))
    assert type(props) is ojs_codec.BasicProperties
    assert msgspec.structs.asdict(props).keys() == msgspec.structs.asdict(RICH_PROPERTIES).keys()
    assert impl.decode_properties(b"\x00\x00") is ojs_codec._properties.EMPTY_PROPERTIES
    assert gc.is_tracked(props)  # it holds a dict
    with pytest.raises(AttributeError):
        props.app_id = "y"  # type: ignore[misc]
