"""The hot path: hand-written encoders and decoders for publishing and consuming.

No pamqp at run time.  Every function here produces or accepts exactly pamqp 4.0.1's
bytes for the same method (``longlong`` delivery tags are unsigned, as the spec says).

Dispatch on :func:`method_key`: the class id and method id of a method frame payload
as one int, ``(class_id << 16) | method_id`` (the same number as pamqp's
``Method.index``), compared against the ids of :mod:`ojs_codec._methods`.

Decoders take the method frame payload (starting at the class id) and return a tuple.
A payload that is truncated, has trailing bytes, carries a short string that is not
UTF-8, or is not the method the decoder is for raises :class:`ProtocolSyntaxError`.
Encoders raise :class:`UsageError` for a short string over 255 bytes, a channel out of
range, or a delivery tag that is not an unsigned 64-bit integer.
"""

from __future__ import annotations

import struct
from typing import NoReturn

from ._errors import ProtocolSyntaxError, UsageError
from ._frames import FRAME_MAX_DEFAULT, FRAME_MIN_SIZE
from ._methods import (
    BASIC_ACK,
    BASIC_DELIVER,
    BASIC_GET_OK,
    BASIC_NACK,
    BASIC_PUBLISH,
    BASIC_REJECT,
    BASIC_RETURN,
)
from ._properties import (
    EMPTY_PROPERTIES,
    BasicProperties,
    _decode_properties,
    _encode_properties_into,
    _short_cache_get,
    cached_short_string,
    decode_properties,
)
from ._table import malformed_reason

__all__ = [
    "decode_ack",
    "decode_content_header",
    "decode_content_header_lenient",
    "decode_deliver",
    "decode_get_ok",
    "decode_nack",
    "decode_reject",
    "decode_return",
    "encode_ack",
    "encode_nack",
    "encode_publish",
    "encode_reject",
    "method_key",
]


_U32 = struct.Struct(">I")
# frame header + class/method + ticket, for Basic.Publish
_PUBLISH_HEAD = struct.Struct(">BHIIH")
# Basic.Publish's bits and frame end, then the content header's frame header, class
# id, weight and body size
_PUBLISH_MIDDLE = struct.Struct(">BBBHIHHQ")
# the previous frame's end octet, then a body frame's header
_BODY_HEAD = struct.Struct(">BBHI")
_END = b"\xce"
# whole frames: header, class/method, delivery tag, bits, frame end
_TAG_BITS_FRAME = struct.Struct(">BHIIQBB")
_TAG_BITS = struct.Struct(">QB")
_TAG_BITS_LEN = struct.Struct(">QBB")  # delivery tag, bits, length of the next short string
_CODE_LEN = struct.Struct(">HB")  # reply code, length of reply text
_TAG_BITS_SIZE = 13  # class/method + tag + bits
_CONTENT_HEAD_FIXED = struct.Struct(">HHQ")

_DELIVER_ID = _U32.pack(BASIC_DELIVER)
_RETURN_ID = _U32.pack(BASIC_RETURN)
_GET_OK_ID = _U32.pack(BASIC_GET_OK)
_ACK_ID = _U32.pack(BASIC_ACK)
_NACK_ID = _U32.pack(BASIC_NACK)
_REJECT_ID = _U32.pack(BASIC_REJECT)


def _syntax(message: str) -> ProtocolSyntaxError:
    return ProtocolSyntaxError(message, remote=False)


def method_key(payload: bytes) -> int:
    """``(class_id << 16) | method_id`` of a method frame payload, to dispatch on."""
    if len(payload) < 4:
        raise _syntax("method frame payload is shorter than its class and method ids")
    key: int = _U32.unpack_from(payload, 0)[0]
    return key


# --- encoders ----------------------------------------------------------------------


def encode_publish(
    channel: int,
    exchange: str,
    routing_key: str,
    properties: BasicProperties | None,
    body: bytes,
    frame_max: int,
    mandatory: bool = False,
    immediate: bool = False,
) -> bytes:
    """Basic.Publish, its content header and body frames, as one bytes object."""
    get = _short_cache_get
    ex = get(exchange) or cached_short_string(exchange, "exchange")
    rk = get(routing_key) or cached_short_string(routing_key, "routing_key")
    if frame_max == FRAME_MAX_DEFAULT:
        chunk = FRAME_MAX_DEFAULT - 8
    elif frame_max == 0:
        chunk = 2**32 - 9
    elif isinstance(frame_max, int) and FRAME_MIN_SIZE <= frame_max < 2**32:
        chunk = frame_max - 8
    else:
        raise UsageError(f"frame_max must be 0 or {FRAME_MIN_SIZE}..{2**32 - 1}, got {frame_max!r}")
    props: bytes | bytearray
    if properties is None:
        props = b"\x00\x00"
    else:
        props = bytearray()
        try:
            _encode_properties_into(props, properties)
        except TypeError as exc:
            raise UsageError(f"invalid message property: {exc}") from None
    header_size = 12 + len(props)
    if header_size > chunk:
        raise UsageError(
            f"the content header is {header_size + 8} bytes, more than frame_max ({chunk + 8}); "
            "send fewer or smaller headers"
        )
    body_size = len(body)
    try:
        head = _PUBLISH_HEAD.pack(1, channel, 7 + len(ex) + len(rk), BASIC_PUBLISH, 0)
        middle = _PUBLISH_MIDDLE.pack(
            (2 if immediate else 0) | (1 if mandatory else 0), 0xCE, 2, channel, header_size, 60, 0, body_size
        )
    except struct.error as exc:
        raise UsageError(f"bad channel {channel!r}: {exc}") from None
    if body_size <= chunk:
        if body_size:
            return b"".join(
                (head, ex, rk, middle, props, _BODY_HEAD.pack(0xCE, 3, channel, body_size), body, _END)
            )
        return b"".join((head, ex, rk, middle, props, _END))
    parts: list[bytes | bytearray | memoryview] = [head, ex, rk, middle, props]
    view = memoryview(body)
    for first in range(0, body_size, chunk):
        piece = view[first : first + chunk]
        parts.append(_BODY_HEAD.pack(0xCE, 3, channel, len(piece)))  # ends the previous frame
        parts.append(piece)
    parts.append(_END)
    return b"".join(parts)


def _tag_frame(channel: int, method: int, delivery_tag: int, bits: int) -> bytes:
    try:
        return _TAG_BITS_FRAME.pack(1, channel, _TAG_BITS_SIZE, method, delivery_tag, bits, 0xCE)
    except struct.error:
        _bad_tag_frame(channel, delivery_tag)


def _bad_tag_frame(channel: object, delivery_tag: object) -> NoReturn:
    if isinstance(delivery_tag, int) and not 0 <= delivery_tag < 2**64:
        raise UsageError(f"delivery tag {delivery_tag} is not an unsigned 64-bit integer") from None
    raise UsageError(f"bad channel {channel!r} or delivery tag {delivery_tag!r}") from None


def encode_ack(channel: int, delivery_tag: int, multiple: bool = False) -> bytes:
    """A Basic.Ack method frame."""
    try:  # _tag_frame, inline: one per consumed message
        bits = 1 if multiple else 0
        return _TAG_BITS_FRAME.pack(1, channel, _TAG_BITS_SIZE, BASIC_ACK, delivery_tag, bits, 0xCE)
    except struct.error:
        _bad_tag_frame(channel, delivery_tag)


def encode_nack(channel: int, delivery_tag: int, multiple: bool = False, requeue: bool = True) -> bytes:
    """A Basic.Nack method frame."""
    return _tag_frame(channel, BASIC_NACK, delivery_tag, (2 if requeue else 0) | (1 if multiple else 0))


def encode_reject(channel: int, delivery_tag: int, requeue: bool = True) -> bytes:
    """A Basic.Reject method frame."""
    return _tag_frame(channel, BASIC_REJECT, delivery_tag, 1 if requeue else 0)


# --- decoders ----------------------------------------------------------------------


def decode_deliver(payload: bytes) -> tuple[str, int, bool, str, str]:
    """Basic.Deliver -> ``(consumer_tag, delivery_tag, redelivered, exchange, routing_key)``."""
    try:
        if payload[:4] != _DELIVER_ID:
            raise _syntax("not a Basic.Deliver payload")
        pos = 5 + payload[4]
        consumer_tag = payload[5:pos].decode("utf-8")
        delivery_tag, bits, size = _TAG_BITS_LEN.unpack_from(payload, pos)
        pos += 10
        stop = pos + size
        exchange = payload[pos:stop].decode("utf-8")
        pos = stop + 1
        stop = pos + payload[stop]
        if stop != len(payload):
            raise _syntax("Basic.Deliver has the wrong length")
        routing_key = payload[pos:stop].decode("utf-8")
    except (IndexError, struct.error):
        raise _syntax("Basic.Deliver is truncated") from None
    except UnicodeDecodeError:
        raise _syntax("Basic.Deliver has a short string that is not UTF-8") from None
    return consumer_tag, delivery_tag, bool(bits & 1), exchange, routing_key


def decode_return(payload: bytes) -> tuple[int, str, str, str]:
    """Basic.Return -> ``(reply_code, reply_text, exchange, routing_key)``."""
    try:
        if payload[:4] != _RETURN_ID:
            raise _syntax("not a Basic.Return payload")
        reply_code, size = _CODE_LEN.unpack_from(payload, 4)
        stop = 7 + size
        reply_text = payload[7:stop].decode("utf-8")
        pos = stop + 1
        stop = pos + payload[stop]
        exchange = payload[pos:stop].decode("utf-8")
        pos = stop + 1
        stop = pos + payload[stop]
        if stop != len(payload):
            raise _syntax("Basic.Return has the wrong length")
        routing_key = payload[pos:stop].decode("utf-8")
    except (IndexError, struct.error):
        raise _syntax("Basic.Return is truncated") from None
    except UnicodeDecodeError:
        raise _syntax("Basic.Return has a short string that is not UTF-8") from None
    return reply_code, reply_text, exchange, routing_key


def decode_get_ok(payload: bytes) -> tuple[int, bool, str, str, int]:
    """Basic.GetOk -> ``(delivery_tag, redelivered, exchange, routing_key, message_count)``."""
    try:
        if payload[:4] != _GET_OK_ID:
            raise _syntax("not a Basic.GetOk payload")
        delivery_tag, bits, size = _TAG_BITS_LEN.unpack_from(payload, 4)
        stop = 14 + size
        exchange = payload[14:stop].decode("utf-8")
        pos = stop + 1
        stop = pos + payload[stop]
        routing_key = payload[pos:stop].decode("utf-8")
        if stop + 4 != len(payload):
            raise _syntax("Basic.GetOk has the wrong length")
        message_count = _U32.unpack_from(payload, stop)[0]
    except (IndexError, struct.error):
        raise _syntax("Basic.GetOk is truncated") from None
    except UnicodeDecodeError:
        raise _syntax("Basic.GetOk has a short string that is not UTF-8") from None
    return delivery_tag, bool(bits & 1), exchange, routing_key, message_count


def _tag_bits(payload: bytes, method_id: bytes, name: str) -> tuple[int, int]:
    if len(payload) != _TAG_BITS_SIZE or payload[:4] != method_id:
        raise _syntax(f"not a {name} payload of {_TAG_BITS_SIZE} bytes")
    tag_bits: tuple[int, int] = _TAG_BITS.unpack_from(payload, 4)
    return tag_bits


def decode_ack(payload: bytes) -> tuple[int, bool]:
    """Basic.Ack -> ``(delivery_tag, multiple)``."""
    delivery_tag, bits = _tag_bits(payload, _ACK_ID, "Basic.Ack")
    return delivery_tag, bool(bits & 1)


def decode_nack(payload: bytes) -> tuple[int, bool, bool]:
    """Basic.Nack -> ``(delivery_tag, multiple, requeue)``."""
    delivery_tag, bits = _tag_bits(payload, _NACK_ID, "Basic.Nack")
    return delivery_tag, bool(bits & 1), bool(bits & 2)


def decode_reject(payload: bytes) -> tuple[int, bool]:
    """Basic.Reject -> ``(delivery_tag, requeue)``."""
    delivery_tag, bits = _tag_bits(payload, _REJECT_ID, "Basic.Reject")
    return delivery_tag, bool(bits & 1)


def decode_content_header(payload: bytes) -> tuple[int, int, BasicProperties]:
    """A content header frame payload -> ``(class_id, body_size, properties)``."""
    if len(payload) < 14:
        raise _syntax("content header is truncated")
    class_id, _weight, body_size = _CONTENT_HEAD_FIXED.unpack_from(payload, 0)
    if len(payload) == 14 and payload[12] == 0 and payload[13] == 0:
        return class_id, body_size, EMPTY_PROPERTIES
    return class_id, body_size, decode_properties(payload, 12)


def decode_content_header_lenient(payload: bytes) -> tuple[int, int, BasicProperties, str | None]:
    """A delivery's content header -> ``(class_id, body_size, properties, malformed)``.

    As :func:`decode_content_header`, but properties and headers that are valid AMQP
    and outside this codec's strict rules are let through, and ``malformed`` says what
    (``None`` when nothing was): a short-string property or a table key that is not
    UTF-8 is kept as ``bytes``, a table or array nested deeper than ``MAX_DEPTH`` becomes
    ``NESTED_TOO_DEEP``, a timestamp no datetime can hold stays an ``int``.  Anything
    else wrong (truncated, lengths that do not fit, an unknown field type, trailing
    bytes) still raises :class:`ProtocolSyntaxError`.
    """
    if len(payload) < 14:
        raise _syntax("content header is truncated")
    class_id, _weight, body_size = _CONTENT_HEAD_FIXED.unpack_from(payload, 0)
    if len(payload) == 14 and payload[12] == 0 and payload[13] == 0:
        return class_id, body_size, EMPTY_PROPERTIES, None
    notes: list[str] = []
    props = _decode_properties(payload, 12, notes)
    return class_id, body_size, props, malformed_reason(notes) if notes else None
