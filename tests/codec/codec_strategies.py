"""Hypothesis strategies and helpers shared by the codec tests.

Named ``codec_strategies`` (not ``strategies``) because pytest puts every test
directory on ``sys.path`` and module names must be unique across the suite.
"""

from __future__ import annotations

import datetime
import itertools
import math
import struct
from decimal import Decimal
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

import ojs_codec as codec

UTC = datetime.UTC

# No example database: keep the work tree clean.
SETTINGS = settings(database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- keys and strings ------------------------------------------------------------------

# pamqp truncates keys over 128 bytes; stay within that for byte-for-byte comparisons.
table_keys = st.text(max_size=24).filter(lambda k: len(k.encode()) <= 128)
short_text = st.text(max_size=40).filter(lambda s: len(s.encode()) <= 255)
# What pamqp's exchange-name validation accepts.
exchange_names = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:@#,/+ ", max_size=127
)

# --- values pamqp encodes exactly as we do ------------------------------------------------

decimals = st.one_of(
    st.builds(
        lambda m, s: Decimal(m).scaleb(-s),
        st.integers(-(2**31), 2**31 - 1),
        st.integers(0, 255),
    ),
    # positive exponents: scaled up into the mantissa
    st.builds(lambda m, e: Decimal(f"{m}E+{e}"), st.integers(-21, 21), st.integers(1, 8)),
)
utc_datetimes = st.datetimes(
    min_value=datetime.datetime(1970, 1, 2),
    max_value=datetime.datetime(2105, 12, 31),
    timezones=st.just(UTC),
)
naive_datetimes = st.datetimes(
    min_value=datetime.datetime(1970, 1, 2), max_value=datetime.datetime(2105, 12, 31)
)

pamqp_leaves = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.sampled_from([-129, -128, 127, 128, -32769, -32768, 32767, 32768, 65535, 65536,
                     -(2**31) - 1, -(2**31), 2**31 - 1, 2**31, 2**32 - 1, 2**32,
                     -(2**63), 2**63 - 1]),
    decimals,
    st.text(max_size=30),
    utc_datetimes,
    naive_datetimes,
    st.binary(max_size=20).map(bytearray),
    st.none(),
)  # fmt: skip


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(table_keys, children, max_size=4),
    )


pamqp_values = st.recursive(pamqp_leaves, _containers, max_leaves=12)
pamqp_tables = st.dictionaries(table_keys, pamqp_values, max_size=6)

# --- every value we can encode (wrappers and our extensions included) ----------------------

float32_values = st.floats(width=32, allow_nan=False).map(codec.Float32)
our_leaves = st.one_of(
    pamqp_leaves,
    st.floats(allow_nan=False),
    float32_values,
    st.binary(max_size=20),
    st.integers(-128, 127).map(codec.Int8),
    st.integers(0, 255).map(codec.UInt8),
    st.integers(-(2**15), 2**15 - 1).map(codec.Int16),
    st.integers(0, 2**16 - 1).map(codec.UInt16),
    st.integers(-(2**31), 2**31 - 1).map(codec.Int32),
    st.integers(0, 2**32 - 1).map(codec.UInt32),
    st.integers(-(2**63), 2**63 - 1).map(codec.Int64),
    st.binary(max_size=20).map(codec.LongString),
)


def _our_containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(table_keys, children, max_size=4),
    )


our_values = st.recursive(our_leaves, _our_containers, max_leaves=12)
our_tables = st.dictionaries(table_keys, our_values, max_size=6)


def expected_roundtrip(value: Any) -> Any:
    """What decoding the encoding of ``value`` must give back."""
    if isinstance(value, codec.Float32):
        return struct.unpack(">f", struct.pack(">f", value.value))[0]
    if isinstance(value, codec.LongString):
        try:
            return value.value.decode("utf-8")
        except UnicodeDecodeError:
            return value.value
    if isinstance(value, codec.Int8 | codec.UInt8 | codec.Int16 | codec.UInt16 | codec.Int32 | codec.UInt32
                  | codec.Int64):  # fmt: skip
        return value.value
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if isinstance(value, Decimal):
        exponent = value.as_tuple().exponent
        assert isinstance(exponent, int)
        return Decimal(int(value)) if exponent > 0 else value  # 1E+2 is sent as 100
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value.replace(microsecond=0)
    if isinstance(value, dict):
        return {k: expected_roundtrip(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [expected_roundtrip(v) for v in value]
    return value


def plain(value: Any) -> Any:
    """pamqp's decoded values in our representation (bytearray -> bytes)."""
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def assert_same(ours: Any, theirs: Any, path: str = "") -> None:
    """Deep equality that also checks types (``1 == True`` is not enough) and NaN."""
    assert type(ours) is type(theirs), f"{path}: {type(ours).__name__} != {type(theirs).__name__}"
    if isinstance(ours, dict):
        assert set(ours) == set(theirs), path
        for key in ours:
            assert_same(ours[key], theirs[key], f"{path}.{key}")
    elif isinstance(ours, list):
        assert len(ours) == len(theirs), path
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert_same(a, b, f"{path}[{i}]")
    elif isinstance(ours, float) and math.isnan(ours):
        assert math.isnan(theirs), path
    elif isinstance(ours, Decimal):
        assert ours == theirs and str(ours) == str(theirs), f"{path}: {ours!r} != {theirs!r}"
    else:
        assert ours == theirs, f"{path}: {ours!r} != {theirs!r}"


# --- properties --------------------------------------------------------------------------


def _props(tables: st.SearchStrategy[Any]) -> st.SearchStrategy[codec.BasicProperties]:
    maybe_text = st.none() | short_text
    return st.builds(
        codec.BasicProperties,
        content_type=maybe_text,
        content_encoding=maybe_text,
        headers=st.none() | tables,
        delivery_mode=st.none() | st.integers(0, 255),
        priority=st.none() | st.integers(0, 255),
        correlation_id=maybe_text,
        reply_to=maybe_text,
        expiration=maybe_text,
        message_id=maybe_text,
        timestamp=st.none() | utc_datetimes | naive_datetimes,
        type=maybe_text,
        user_id=maybe_text,
        app_id=maybe_text,
        cluster_id=maybe_text,
    )


pamqp_properties = _props(pamqp_tables)
our_properties = _props(our_tables)


def expected_properties(props: codec.BasicProperties) -> codec.BasicProperties:
    """What decoding the encoding of ``props`` must give back: ``""`` is absent,
    timestamps lose their sub-second part, header values as :func:`expected_roundtrip`."""
    values: dict[str, Any] = {}
    for name in props.__struct_fields__:
        value = getattr(props, name)
        if value == "":
            value = None
        elif (name == "headers" and value is not None) or (name == "timestamp" and value is not None):
            value = expected_roundtrip(value)
        values[name] = value
    return codec.BasicProperties(**values)


def assert_same_properties(ours: codec.BasicProperties, theirs: codec.BasicProperties) -> None:
    for name in ours.__struct_fields__:
        assert_same(getattr(ours, name), getattr(theirs, name), name)


OJS_PROPERTIES = codec.BasicProperties(
    content_type="application/openjobspec+json",
    content_encoding="utf-8",
    delivery_mode=2,
    message_id="018f86a4-3c2b-7a51-9d3e-4b5c6d7e8f90",
    type="email.send",
    timestamp=datetime.datetime(2024, 5, 17, 12, 30, 45, tzinfo=UTC),
    app_id="ojs",
    headers={
        "x-ojs-queue": "default",
        "x-ojs-attempt": 1,
        "x-ojs-max-attempts": 25,
        "x-ojs-created-at": "2024-05-17T12:30:45.123456Z",
        "x-ojs-enqueued-at": "2024-05-17T12:30:45.234567Z",
        "x-ojs-tags": "billing,email",
    },
)


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at the given offsets (any order, duplicates allowed)."""
    points = sorted({min(max(c, 0), len(data)) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]
