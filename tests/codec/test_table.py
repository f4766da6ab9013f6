"""Field tables and arrays: differential tests against pamqp 4.0.1, and our quirks."""

from __future__ import annotations

import datetime
import math
import struct
import time
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import decode as pdecode
from pamqp import encode as pencode

import ojs_codec
from ojs_codec import ProtocolSyntaxError, UsageError

from .codec_impls import IMPLS, Impl
from .codec_strategies import (
    SETTINGS,
    UTC,
    assert_same,
    expected_roundtrip,
    our_tables,
    our_values,
    pamqp_tables,
    pamqp_values,
    plain,
)


def entry(key: bytes, kind: bytes, value: bytes) -> bytes:
    return bytes([len(key)]) + key + kind + value


def table(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack(">I", len(body)) + body


# --- differential: pamqp ------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
@SETTINGS
@given(pamqp_tables)
def test_encode_table_matches_pamqp(impl: Impl, value: dict[str, Any]) -> None:
    assert impl.encode_table(value) == pencode.field_table(value)


@pytest.mark.parametrize("impl", IMPLS)
@SETTINGS
@given(st.lists(pamqp_values, max_size=6))
def test_encode_array_matches_pamqp(impl: Impl, value: list[Any]) -> None:
    assert impl.encode_array(value) == pencode.field_array(value)


@pytest.mark.parametrize("impl", IMPLS)
@SETTINGS
@given(pamqp_tables)
def test_decode_table_matches_pamqp(impl: Impl, value: dict[str, Any]) -> None:
    data = pencode.field_table(value)
    ours, offset = impl.decode_table(data)
    consumed, theirs = pdecode.field_table(data)
    assert offset == consumed == len(data)
    assert_same(ours, plain(theirs))


@pytest.mark.parametrize("impl", IMPLS)
@SETTINGS
@given(our_tables)
def test_decode_matches_pamqp_for_every_wire_type(impl: Impl, value: dict[str, Any]) -> None:
    """Bytes pamqp cannot produce (d, f, B, x from bytes, explicit widths) still decode
    to the values pamqp decodes them to."""
    data = impl.encode_table(value)
    ours, _ = impl.decode_table(data)
    _, theirs = pdecode.field_table(data)
    assert_same(ours, plain(theirs))


@pytest.mark.parametrize("impl", IMPLS)
@SETTINGS
@given(st.binary(max_size=8), st.integers(0, 5))
def test_decode_at_offset(impl: Impl, prefix: bytes, extra: int) -> None:
    data = prefix + impl.encode_table({"a": 1, "b": "x"}) + b"\x00" * extra
    value, offset = impl.decode_table(data, len(prefix))
    assert value == {"a": 1, "b": "x"}
    assert offset == len(data) - extra


# --- our own round trips are lossless ---------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
@SETTINGS
@given(our_tables)
def test_roundtrip(impl: Impl, value: dict[str, Any]) -> None:
    data = impl.encode_table(value)
    decoded, offset = impl.decode_table(data)
    assert offset == len(data)
    assert_same(decoded, expected_roundtrip(value))


@pytest.mark.parametrize("impl", IMPLS)
@SETTINGS
@given(st.lists(our_values, max_size=6))
def test_array_roundtrip(impl: Impl, value: list[Any]) -> None:
    data = impl.encode_array(value)
    decoded, offset = impl.decode_array(data)
    assert offset == len(data)
    assert_same(decoded, expected_roundtrip(value))


# --- table-driven wire cases ----------------------------------------------------------------

WIRE_CASES: list[tuple[Any, bytes]] = [
    (True, b"t\x01"),
    (False, b"t\x00"),
    (-128, b"b\x80"),
    (127, b"b\x7f"),
    (128, b"s\x00\x80"),
    (-32768, b"s\x80\x00"),
    (32768, b"u\x80\x00"),
    (65535, b"u\xff\xff"),
    (65536, b"I\x00\x01\x00\x00"),
    (-(2**31), b"I\x80\x00\x00\x00"),
    (2**31, b"i\x80\x00\x00\x00"),
    (2**32 - 1, b"i\xff\xff\xff\xff"),
    (2**32, b"l\x00\x00\x00\x01\x00\x00\x00\x00"),
    (-(2**63), b"l\x80" + b"\x00" * 7),
    (Decimal("1.23"), b"D\x02\x00\x00\x00\x7b"),
    (Decimal("-5"), b"D\x00\xff\xff\xff\xfb"),
    (Decimal("1E+2"), b"D\x00\x00\x00\x00\x64"),
    (1.5, b"d" + struct.pack(">d", 1.5)),
    (ojs_codec.Float32(1.5), b"f" + struct.pack(">f", 1.5)),
    ("héllo", b"S\x00\x00\x00\x06h\xc3\xa9llo"),
    (datetime.datetime(2024, 1, 1, tzinfo=UTC), b"T" + struct.pack(">Q", 1704067200)),
    (datetime.datetime(2024, 1, 1), b"T" + struct.pack(">Q", 1704067200)),  # naive = UTC
    (time.gmtime(1704067200), b"T" + struct.pack(">Q", 1704067200)),
    ({"k": None}, b"F\x00\x00\x00\x03\x01kV"),
    ([1, "a"], b"A\x00\x00\x00\x08b\x01S\x00\x00\x00\x01a"),
    ((1,), b"A\x00\x00\x00\x02b\x01"),
    (bytearray(b"\x00\xff"), b"x\x00\x00\x00\x02\x00\xff"),
    (b"\x00\xff", b"x\x00\x00\x00\x02\x00\xff"),
    (None, b"V"),
    (ojs_codec.Int8(1), b"b\x01"),
    (ojs_codec.UInt8(200), b"B\xc8"),
    (ojs_codec.Int16(1), b"s\x00\x01"),
    (ojs_codec.UInt16(1), b"u\x00\x01"),
    (ojs_codec.Int32(1), b"I\x00\x00\x00\x01"),
    (ojs_codec.UInt32(1), b"i\x00\x00\x00\x01"),
    (ojs_codec.Int64(1), b"l" + b"\x00" * 7 + b"\x01"),
    (ojs_codec.LongString(b"\xff"), b"S\x00\x00\x00\x01\xff"),
]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("value", "wire"), WIRE_CASES, ids=[repr(v)[:40] for v, _ in WIRE_CASES])
def test_wire_bytes(impl: Impl, value: Any, wire: bytes) -> None:
    assert impl.encode_table({"k": value}) == table(entry(b"k", wire[:1], wire[1:]))
    assert impl.encode_array([value]) == struct.pack(">I", len(wire)) + wire


@pytest.mark.parametrize("impl", IMPLS)
def test_empty_and_none_tables(impl: Impl) -> None:
    assert impl.encode_table(None) == b"\x00\x00\x00\x00"
    assert impl.encode_table({}) == b"\x00\x00\x00\x00"
    assert impl.decode_table(b"\x00\x00\x00\x00") == ({}, 4)
    assert impl.encode_array([]) == b"\x00\x00\x00\x00"


@pytest.mark.parametrize("impl", IMPLS)
def test_keys_are_sorted_like_pamqp(impl: Impl) -> None:
    value = {"b": 1, "a": 2, "B": 3}
    assert impl.encode_table(value) == table(entry(b"B", b"b", b"\x03"), entry(b"a", b"b", b"\x02"),
                                        entry(b"b", b"b", b"\x01"))  # fmt: skip
    assert impl.encode_table(value) == pencode.field_table(value)


@pytest.mark.parametrize("impl", IMPLS)
def test_same_keys_in_another_order_give_the_same_bytes(impl: Impl) -> None:
    # The key-template cache is keyed by iteration order; both orders must sort.
    assert impl.encode_table({"x": 1, "y": 2}) == impl.encode_table({"y": 2, "x": 1})


@pytest.mark.parametrize("impl", IMPLS)
def test_decode_every_type_code(impl: Impl) -> None:
    data = table(
        entry(b"t", b"t", b"\x02"),  # any non-zero octet is true
        entry(b"b", b"b", b"\xff"),
        entry(b"B", b"B", b"\xff"),
        entry(b"s", b"s", b"\xff\xfe"),
        entry(b"u", b"u", b"\xff\xfe"),
        entry(b"I", b"I", b"\xff\xff\xff\xfe"),
        entry(b"i", b"i", b"\xff\xff\xff\xfe"),
        entry(b"l", b"l", b"\xff" * 7 + b"\xfe"),
        entry(b"L", b"L", b"\xff" * 7 + b"\xfe"),
        entry(b"f", b"f", struct.pack(">f", 0.25)),
        entry(b"d", b"d", struct.pack(">d", 0.1)),
        entry(b"D", b"D", b"\x03\xff\xff\xff\xff"),
        entry(b"S", b"S", b"\x00\x00\x00\x02hi"),
        entry(b"S2", b"S", b"\x00\x00\x00\x01\xff"),
        entry(b"A", b"A", b"\x00\x00\x00\x02t\x01"),
        entry(b"T", b"T", struct.pack(">Q", 1700000000)),
        entry(b"Tms", b"T", struct.pack(">Q", 1700000000123)),
        entry(b"F", b"F", b"\x00\x00\x00\x00"),
        entry(b"V", b"V", b""),
        entry(b"0", b"\x00", b""),
        entry(b"x", b"x", b"\x00\x00\x00\x01\x00"),
    )
    ours, offset = impl.decode_table(data)
    assert offset == len(data)
    _, theirs = pdecode.field_table(data)
    assert_same(ours, plain(theirs))
    assert ours["t"] is True
    assert ours["b"] == -1 and ours["B"] == 255 and ours["s"] == -2 and ours["u"] == 65534
    assert ours["I"] == -2 and ours["i"] == 2**32 - 2 and ours["l"] == -2 and ours["L"] == -2
    assert ours["D"] == Decimal("-0.001")
    assert ours["S2"] == b"\xff"  # not UTF-8: bytes, as pamqp returns
    assert ours["x"] == b"\x00" and type(ours["x"]) is bytes  # pamqp: bytearray
    assert ours["T"] == datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
    assert ours["T"].tzinfo is not None
    # above 0xFFFFFFFF a timestamp is milliseconds (pamqp's rule)
    assert ours["Tms"] == datetime.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=UTC)
    assert ours["0"] is None and ours["V"] is None


@pytest.mark.parametrize("impl", IMPLS)
def test_duplicate_keys_last_wins_like_pamqp(impl: Impl) -> None:
    data = table(entry(b"a", b"b", b"\x01"), entry(b"a", b"b", b"\x02"))
    assert impl.decode_table(data)[0] == {"a": 2} == pdecode.field_table(data)[1]


# --- documented quirks ------------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
def test_quirk_float_is_64_bit_and_lossless(impl: Impl) -> None:
    value = 0.1
    data = impl.encode_table({"f": value})
    assert data[6:7] == b"d"
    assert impl.decode_table(data)[0]["f"] == value  # exact
    # pamqp writes the same float as a lossy 32-bit 'f'
    theirs = pencode.field_table({"f": value})
    assert theirs[6:7] == b"f"
    assert pdecode.field_table(theirs)[1]["f"] != value


@pytest.mark.parametrize("impl", IMPLS)
def test_quirk_float32_wrapper_writes_f_like_pamqp(impl: Impl) -> None:
    value = 1.25
    assert impl.encode_table({"f": ojs_codec.Float32(value)}) == pencode.field_table({"f": value})
    assert (
        impl.decode_table(impl.encode_table({"f": ojs_codec.Float32(0.1)}))[0]["f"]
        == struct.unpack(">f", struct.pack(">f", 0.1))[0]
    )
    with pytest.raises(UsageError):
        ojs_codec.Float32(1e300)


@pytest.mark.parametrize("impl", IMPLS)
def test_quirk_bytes_are_a_byte_array(impl: Impl) -> None:
    assert impl.encode_table({"x": b"\x01\x02"}) == pencode.field_table({"x": bytearray(b"\x01\x02")})
    with pytest.raises(TypeError):
        pencode.field_table({"x": b"\x01\x02"})
    decoded = impl.decode_table(impl.encode_table({"x": b"\x01\x02"}))[0]["x"]
    assert decoded == b"\x01\x02" and type(decoded) is bytes


@pytest.mark.parametrize("impl", IMPLS)
def test_quirk_timestamp_truncates_subseconds(impl: Impl) -> None:
    moment = datetime.datetime(2024, 5, 17, 12, 30, 45, 999999, tzinfo=UTC)
    data = impl.encode_table({"t": moment})
    assert data == pencode.field_table({"t": moment})
    decoded = impl.decode_table(data)[0]["t"]
    assert decoded == moment.replace(microsecond=0)
    assert decoded.tzinfo is not None and decoded.utcoffset() == datetime.timedelta(0)
    # a whole-second datetime round-trips exactly, in any time zone
    paris = datetime.timezone(datetime.timedelta(hours=2))
    whole = datetime.datetime(2024, 5, 17, 14, 30, 45, tzinfo=paris)
    assert impl.decode_table(impl.encode_table({"t": whole}))[0]["t"] == whole


@pytest.mark.parametrize("impl", IMPLS)
def test_quirk_timestamp_before_1970_is_refused(impl: Impl) -> None:
    with pytest.raises(UsageError):
        impl.encode_table({"t": datetime.datetime(1969, 12, 31, tzinfo=UTC)})


@pytest.mark.parametrize("impl", IMPLS)
def test_quirk_non_utf8_long_string_and_long_string_wrapper(impl: Impl) -> None:
    data = table(entry(b"s", b"S", b"\x00\x00\x00\x02\xff\xfe"))
    value = impl.decode_table(data)[0]["s"]
    assert value == b"\xff\xfe" == pdecode.field_table(data)[1]["s"]
    assert impl.encode_table({"s": ojs_codec.LongString(value)}) == data  # written back as 'S'
    assert impl.encode_table({"s": value})[6:7] == b"x"  # plain bytes would be 'x'


@pytest.mark.parametrize("impl", IMPLS)
def test_quirk_long_keys(impl: Impl) -> None:
    key = "k" * 200  # pamqp truncates keys over 128 bytes; we send them whole
    assert impl.decode_table(impl.encode_table({key: 1}))[0] == {key: 1}
    with pytest.raises(UsageError, match="255"):
        impl.encode_table({"k" * 256: 1})


def test_typed_wrappers_validate_and_compare() -> None:
    with pytest.raises(UsageError):
        ojs_codec.Int8(128)
    with pytest.raises(UsageError):
        ojs_codec.UInt8(-1)
    with pytest.raises(UsageError):
        ojs_codec.UInt32(2**32)
    with pytest.raises(UsageError):
        ojs_codec.Int64(2**63)
    with pytest.raises(UsageError):
        ojs_codec.Int16(True)  # type: ignore[arg-type]
    with pytest.raises(UsageError):
        ojs_codec.LongString(1)  # type: ignore[arg-type]
    assert ojs_codec.Int8(1) == ojs_codec.Int8(1)
    assert ojs_codec.Int8(1) != ojs_codec.UInt8(1)
    assert hash(ojs_codec.Int32(5)) == hash(ojs_codec.Int32(5))
    assert repr(ojs_codec.UInt16(7)) == "UInt16(7)"
    with pytest.raises(AttributeError):
        ojs_codec.Int8(1).value = 2  # type: ignore[misc]


# --- encoding errors -------------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "value",
    [
        2**63,
        -(2**63) - 1,
        Decimal("NaN"),
        Decimal("Infinity"),
        Decimal("1E-256"),
        Decimal("21474836.48"),
        object(),
        {1, 2},
        1j,
    ],
)
def test_unencodable_values_raise_usage_error(impl: Impl, value: Any) -> None:
    with pytest.raises(UsageError):
        impl.encode_table({"k": value})


@pytest.mark.parametrize("impl", IMPLS)
def test_bad_tables_raise_usage_error(impl: Impl) -> None:
    with pytest.raises(UsageError):
        impl.encode_table([("a", 1)])  # type: ignore[arg-type]
    with pytest.raises(UsageError):
        impl.encode_table({1: 1})  # type: ignore[dict-item]
    with pytest.raises(UsageError):
        impl.encode_table({"a": 1, 2: 1})  # type: ignore[dict-item]
    with pytest.raises(UsageError):
        impl.encode_array({"a": 1})  # type: ignore[arg-type]


@pytest.mark.parametrize("impl", IMPLS)
def test_encode_depth_limit_and_cycles(impl: Impl) -> None:
    nested: dict[str, Any] = {}
    inner = nested
    for _ in range(ojs_codec.MAX_DEPTH - 1):
        inner["n"] = {}
        inner = inner["n"]
    assert impl.decode_table(impl.encode_table(nested))[0] == nested
    inner["n"] = {}
    with pytest.raises(UsageError, match="deeper"):
        impl.encode_table(nested)
    cycle: dict[str, Any] = {}
    cycle["self"] = cycle
    with pytest.raises(UsageError):
        impl.encode_table(cycle)
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(UsageError):
        impl.encode_array(loop)


# --- malformed input --------------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00\x00\x00",
        b"\x00\x00\x00\x05",  # longer than the buffer
        table(b"\x05ab"),  # key longer than the table
        table(b"\x01a"),  # key without a type
        table(entry(b"a", b"S", b"\x00\x00\x00\x09abc")),  # string longer than the table
        table(entry(b"a", b"S", b"\x00\x00")),  # string length truncated
        table(entry(b"a", b"I", b"\x00\x00")),  # int truncated
        table(entry(b"a", b"b", b"")),
        table(entry(b"a", b"D", b"\x01\x00")),
        table(entry(b"a", b"T", b"\x00")),
        table(entry(b"a", b"T", b"\xff" * 8)),  # no datetime can hold it
        table(entry(b"a", b"Z", b"")),  # unknown type
        table(entry(b"\xff", b"V", b"")),  # key not UTF-8
        table(entry(b"a", b"F", b"\x00\x00\x00\x09")),  # inner table longer than outer
        table(entry(b"a", b"A", b"\x00\x00\x00\x02b")),  # array item truncated
        table(entry(b"a", b"x", b"\xff\xff\xff\xff")),
    ],
)
def test_malformed_tables_raise_syntax_error(impl: Impl, data: bytes) -> None:
    with pytest.raises(ProtocolSyntaxError) as info:
        impl.decode_table(data)
    assert info.value.remote is False
    assert info.value.code == 502


@pytest.mark.parametrize("impl", IMPLS)
def test_value_cannot_overrun_its_table(impl: Impl) -> None:
    # pamqp reads past a table's declared end; we refuse.
    inner = entry(b"a", b"S", b"\x00\x00\x00\x03abc")
    data = struct.pack(">I", len(inner) - 2) + inner
    with pytest.raises(ProtocolSyntaxError):
        impl.decode_table(data)


@pytest.mark.parametrize("impl", IMPLS)
def test_decode_depth_limit(impl: Impl) -> None:
    data = b"\x00\x00\x00\x00"
    for _ in range(ojs_codec.MAX_DEPTH - 1):
        data = table(entry(b"n", b"F", data))
    impl.decode_table(data)
    deeper = table(entry(b"n", b"F", data))
    with pytest.raises(ProtocolSyntaxError, match="deeper"):
        impl.decode_table(deeper)
    arrays = b"\x00\x00\x00\x00"
    for _ in range(ojs_codec.MAX_DEPTH):
        arrays = struct.pack(">I", len(arrays) + 1) + b"A" + arrays
    with pytest.raises(ProtocolSyntaxError, match="deeper"):
        impl.decode_array(arrays)


@pytest.mark.parametrize("impl", IMPLS)
@SETTINGS
@given(st.binary(max_size=64), st.integers(-2, 70))
def test_random_bytes_never_escape(impl: Impl, data: bytes, offset: int) -> None:
    for decoder in (impl.decode_table, impl.decode_array):
        try:
            value, end = decoder(data, offset)
        except ProtocolSyntaxError:
            continue
        assert offset + 4 <= end <= len(data)
        assert isinstance(value, dict | list)


@pytest.mark.parametrize("impl", IMPLS)
def test_nan_and_infinity_round_trip(impl: Impl) -> None:
    decoded = impl.decode_table(
        impl.encode_table({"n": math.nan, "i": math.inf, "f": ojs_codec.Float32(-math.inf)})
    )[0]
    assert math.isnan(decoded["n"]) and decoded["i"] == math.inf and decoded["f"] == -math.inf
