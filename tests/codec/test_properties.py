"""Basic content properties: differential tests against pamqp 4.0.1."""

from __future__ import annotations

import datetime
import struct

import msgspec
import pytest
from hypothesis import given
from pamqp import commands

import ojs_codec as codec
from ojs_codec import BasicProperties, ProtocolSyntaxError, UsageError

from .codec_impls import IMPLS, Impl
from .codec_strategies import (
    OJS_PROPERTIES,
    SETTINGS,
    UTC,
    assert_same_properties,
    expected_properties,
    our_properties,
    pamqp_properties,
)


def pamqp_decode(data: bytes) -> commands.Basic.Properties:
    """pamqp's own unmarshal of property flags + fields."""
    props = commands.Basic.Properties()
    flags = struct.unpack(">H", data[:2])[0]
    props.unmarshal(flags, data[2:])
    return props


@pytest.mark.parametrize("impl", IMPLS)
@SETTINGS
@given(pamqp_properties)
def test_encode_matches_pamqp(impl: Impl, props: BasicProperties) -> None:
    assert impl.encode_properties(props) == codec.to_pamqp(props).marshal()


@pytest.mark.parametrize("impl", IMPLS)
@SETTINGS
@given(pamqp_properties)
def test_decode_matches_pamqp(impl: Impl, props: BasicProperties) -> None:
    data = codec.to_pamqp(props).marshal()
    ours = impl.decode_properties(data)
    theirs = codec.from_pamqp(pamqp_decode(data))
    assert_same_properties(ours, theirs)


@pytest.mark.parametrize("impl", IMPLS)
@SETTINGS
@given(our_properties)
def test_roundtrip(impl: Impl, props: BasicProperties) -> None:
    decoded = impl.decode_properties(impl.encode_properties(props))
    assert_same_properties(decoded, expected_properties(props))


@SETTINGS
@given(pamqp_properties)
def test_pamqp_converters_roundtrip(props: BasicProperties) -> None:
    assert_same_properties(codec.from_pamqp(codec.to_pamqp(props)), expected_properties_no_truncation(props))


def expected_properties_no_truncation(props: BasicProperties) -> BasicProperties:
    """from_pamqp(to_pamqp(p)): only "" becomes None and bytearray becomes bytes."""
    expected = expected_properties(props)
    return msgspec.structs.replace(expected, timestamp=props.timestamp, headers=_plain_headers(props.headers))


def _plain_headers(value: object) -> object:
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, dict):
        return {k: _plain_headers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain_headers(v) for v in value]
    return value


@pytest.mark.parametrize("impl", IMPLS)
def test_ojs_property_set_matches_pamqp(impl: Impl) -> None:
    data = impl.encode_properties(OJS_PROPERTIES)
    assert data == codec.to_pamqp(OJS_PROPERTIES).marshal()
    assert impl.decode_properties(data) == OJS_PROPERTIES


@pytest.mark.parametrize("impl", IMPLS)
def test_wire_layout(impl: Impl) -> None:
    props = BasicProperties(content_type="a", delivery_mode=2, type="t", cluster_id="c")
    assert impl.encode_properties(props) == b"\x90\x24" + b"\x01a" + b"\x02" + b"\x01t" + b"\x01c"
    assert impl.encode_properties(BasicProperties()) == b"\x00\x00"
    assert impl.encode_properties(None) == b"\x00\x00"
    assert impl.decode_properties(b"\x00\x00") == BasicProperties()
    stamp = datetime.datetime(2024, 1, 1, tzinfo=UTC)
    assert impl.encode_properties(BasicProperties(timestamp=stamp)) == b"\x00\x40" + struct.pack(
        ">Q", 1704067200
    )


@pytest.mark.parametrize("impl", IMPLS)
def test_every_flag_bit(impl: Impl) -> None:
    fields = {
        "content_type": ("x", 0x8000),
        "content_encoding": ("x", 0x4000),
        "headers": ({}, 0x2000),
        "delivery_mode": (1, 0x1000),
        "priority": (0, 0x0800),
        "correlation_id": ("x", 0x0400),
        "reply_to": ("x", 0x0200),
        "expiration": ("x", 0x0100),
        "message_id": ("x", 0x0080),
        "timestamp": (datetime.datetime(2024, 1, 1, tzinfo=UTC), 0x0040),
        "type": ("x", 0x0020),
        "user_id": ("x", 0x0010),
        "app_id": ("x", 0x0008),
        "cluster_id": ("x", 0x0004),
    }
    for name, (value, flag) in fields.items():
        props = BasicProperties(**{name: value})  # type: ignore[arg-type]
        data = impl.encode_properties(props)
        assert struct.unpack(">H", data[:2])[0] == flag, name
        assert data == codec.to_pamqp(props).marshal(), name
        assert impl.decode_properties(data) == props, name


@pytest.mark.parametrize("impl", IMPLS)
def test_empty_string_is_absent_like_pamqp(impl: Impl) -> None:
    props = BasicProperties(content_type="", message_id="", headers={}, priority=0)
    data = impl.encode_properties(props)
    assert data == codec.to_pamqp(props).marshal()
    assert impl.decode_properties(data) == BasicProperties(headers={}, priority=0)


@pytest.mark.parametrize("impl", IMPLS)
def test_timestamp_truncated_and_naive_is_utc(impl: Impl) -> None:
    moment = datetime.datetime(2024, 5, 17, 12, 30, 45, 500000)
    decoded = impl.decode_properties(impl.encode_properties(BasicProperties(timestamp=moment)))
    assert decoded.timestamp == moment.replace(microsecond=0, tzinfo=UTC)
    with pytest.raises(UsageError):
        impl.encode_properties(BasicProperties(timestamp=datetime.datetime(1960, 1, 1, tzinfo=UTC)))


@pytest.mark.parametrize("impl", IMPLS)
def test_decode_at_offset_and_flag_continuation(impl: Impl) -> None:
    data = impl.encode_properties(BasicProperties(app_id="x"))
    assert impl.decode_properties(b"junk" + data, 4) == BasicProperties(app_id="x")
    # bit 0 says another flag word follows; none are defined, so it is skipped
    continued = b"\x00\x09\x00\x00\x01x"
    assert impl.decode_properties(continued) == BasicProperties(app_id="x")
    assert codec.from_pamqp(pamqp_decode_full(continued)) == BasicProperties(app_id="x")


def pamqp_decode_full(data: bytes) -> commands.Basic.Properties:
    from pamqp import header

    content = header.ContentHeader()
    content.unmarshal(b"\x00\x3c\x00\x00" + b"\x00" * 8 + data)
    return content.properties


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x80",
        b"\x80\x00",  # content_type missing
        b"\x80\x00\x05ab",  # content_type truncated
        b"\x80\x00\x01\xff",  # not UTF-8
        b"\x00\x80\x02\xff\xfe",  # message_id not UTF-8
        b"\x20\x00\x00\x00\x00",  # headers table truncated
        b"\x10\x00",  # delivery_mode missing
        b"\x00\x40\x00\x00",  # timestamp truncated
        b"\x00\x40" + b"\xff" * 8,  # timestamp out of range
        b"\x00\x00\x00",  # trailing byte
        b"\x00\x08\x01ax",  # trailing byte after app_id
        b"\x00\x01",  # continuation flag word missing
        b"\x00\x04\x03ab",  # cluster_id truncated
    ],
)
def test_malformed_properties_raise_syntax_error(impl: Impl, data: bytes) -> None:
    with pytest.raises(ProtocolSyntaxError):
        impl.decode_properties(data)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "props",
    [
        BasicProperties(content_type="x" * 256),
        BasicProperties(message_id="é" * 128),
        BasicProperties(delivery_mode=256),
        BasicProperties(priority=-1),
        BasicProperties(content_type=5),  # type: ignore[arg-type]
        BasicProperties(correlation_id=["x"]),  # type: ignore[arg-type]
        BasicProperties(headers=[1]),  # type: ignore[arg-type]
        BasicProperties(headers={"k": object()}),
        BasicProperties(timestamp="2024-01-01"),  # type: ignore[arg-type]
    ],
)
def test_bad_properties_raise_usage_error(impl: Impl, props: BasicProperties) -> None:
    with pytest.raises(UsageError):
        impl.encode_properties(props)


@pytest.mark.parametrize("impl", IMPLS)
def test_short_string_limit_message(impl: Impl) -> None:
    with pytest.raises(UsageError, match="255 bytes"):
        impl.encode_properties(BasicProperties(app_id="a" * 300))
    assert (
        impl.decode_properties(impl.encode_properties(BasicProperties(app_id="a" * 255))).app_id == "a" * 255
    )


def test_struct_is_frozen_and_keyword_only() -> None:
    props = BasicProperties(app_id="x")
    with pytest.raises(AttributeError):
        props.app_id = "y"  # type: ignore[misc]
    with pytest.raises(TypeError):
        BasicProperties("x")  # type: ignore[misc]
    assert BasicProperties.__struct_fields__ == (
        "content_type", "content_encoding", "headers", "delivery_mode", "priority", "correlation_id",
        "reply_to", "expiration", "message_id", "timestamp", "type", "user_id", "app_id", "cluster_id",
    )  # fmt: skip


def test_to_pamqp_names_and_cluster_id() -> None:
    theirs = codec.to_pamqp(BasicProperties(type="t", cluster_id="c", delivery_mode=7))
    assert theirs.message_type == "t"
    assert theirs.cluster_id == "c"
    assert theirs.delivery_mode == 7
    assert codec.to_pamqp(None) == commands.Basic.Properties()
    assert codec.from_pamqp(commands.Basic.Properties()) == BasicProperties()
