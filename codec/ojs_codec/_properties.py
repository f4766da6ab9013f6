"""Basic content properties: the part of a content header after the body size.

The wire form is one 16-bit flag word (more words follow while bit 0 is set) and then
the present fields in flag order.  :func:`encode_properties` produces exactly the
bytes of pamqp 4.0.1's ``commands.Basic.Properties.marshal()``, including its rule
that a property is *absent* when it is ``None`` **or the empty string** (so ``""``
decodes back as ``None``), while an empty ``headers`` table is present and decodes as
``{}``.  Header tables follow :mod:`ojs_codec._table` (its documented quirks apply).

Other differences from pamqp:

* pamqp calls the ``type`` property ``message_type``; :func:`to_pamqp` and
  :func:`from_pamqp` translate.
* pamqp refuses to build a ``cluster_id``; we encode and decode it (it is deprecated
  and RabbitMQ ignores it).
* ``delivery_mode`` and ``priority`` accept any octet (0..255); pamqp only allows a
  delivery mode of 1 or 2.
* Decoding is strict: a truncated field, a short string that is not UTF-8, or bytes
  left over after the last present field raise :class:`ProtocolSyntaxError`.  A
  delivery's content header is decoded leniently instead
  (:func:`~ojs_codec.decode_content_header_lenient`): a short string that is not UTF-8
  is kept as ``bytes``, a timestamp no datetime can hold as its ``int``, and the headers
  follow :mod:`ojs_codec._table`'s lenient rules; each is noted.
"""

from __future__ import annotations

import datetime
import struct
from collections.abc import Mapping
from typing import Any

import msgspec

from ._errors import ProtocolSyntaxError, UsageError
from ._table import (
    _decode_table,
    decode_timestamp,
    encode_table_into,
    lenient_timestamp,
    timestamp_seconds,
)

__all__ = [
    "BasicProperties",
    "decode_properties",
    "encode_properties",
    "from_pamqp",
    "to_pamqp",
]


class BasicProperties(msgspec.Struct, kw_only=True, frozen=True):
    """The properties of a message (``Basic`` content class).  Every field is optional."""

    content_type: str | None = None
    content_encoding: str | None = None
    headers: dict[str, Any] | None = None
    delivery_mode: int | None = None
    priority: int | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    expiration: str | None = None
    message_id: str | None = None
    timestamp: datetime.datetime | None = None
    type: str | None = None
    user_id: str | None = None
    app_id: str | None = None
    cluster_id: str | None = None


EMPTY_PROPERTIES = BasicProperties()

FLAG_CONTENT_TYPE = 0x8000
FLAG_CONTENT_ENCODING = 0x4000
FLAG_HEADERS = 0x2000
FLAG_DELIVERY_MODE = 0x1000
FLAG_PRIORITY = 0x0800
FLAG_CORRELATION_ID = 0x0400
FLAG_REPLY_TO = 0x0200
FLAG_EXPIRATION = 0x0100
FLAG_MESSAGE_ID = 0x0080
FLAG_TIMESTAMP = 0x0040
FLAG_TYPE = 0x0020
FLAG_USER_ID = 0x0010
FLAG_APP_ID = 0x0008
FLAG_CLUSTER_ID = 0x0004

_UTC = datetime.UTC
_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")

# Encoded short strings (length octet + UTF-8) of values that repeat from message to
# message (content type, encoding, message type, app id...).  Bounded.
_SHORT_CACHE: dict[str, bytes] = {}
_SHORT_CACHE_MAX = 1024
_short_cache_get = _SHORT_CACHE.get


def encode_short_string(value: str, what: str = "short string") -> bytes:
    """Length octet + UTF-8 bytes.  More than 255 bytes raises :class:`UsageError`."""
    if not isinstance(value, str):
        raise UsageError(f"{what} must be a str, not {type(value).__name__}")
    raw = value.encode("utf-8")
    size = len(raw)
    if size > 255:
        raise UsageError(f"{what} is {size} bytes of UTF-8; an AMQP short string holds at most 255 bytes")
    return bytes((size,)) + raw


def cached_short_string(value: str, what: str = "short string") -> bytes:
    """:func:`encode_short_string`, memoised for values that repeat."""
    encoded = _short_cache_get(value)
    if encoded is None:
        encoded = encode_short_string(value, what)
        if len(_SHORT_CACHE) >= _SHORT_CACHE_MAX:
            _SHORT_CACHE.clear()
        _SHORT_CACHE[value] = encoded
    return encoded


def _octet(value: int, what: str) -> bytes:
    if not isinstance(value, int) or not 0 <= value <= 255:
        raise UsageError(f"{what} must be an int from 0 to 255, got {value!r}")
    return bytes((value,))


def encode_properties(props: BasicProperties | None) -> bytes:
    """Encode the property flags and fields (as they follow the body size in a
    content header)."""
    if props is None:
        return b"\x00\x00"
    out = bytearray()
    encode_properties_into(out, props)
    return bytes(out)


def encode_properties_into(out: bytearray, props: BasicProperties) -> None:
    """Append the property flags and fields to ``out``."""
    try:
        _encode_properties_into(out, props)
    except TypeError as exc:  # an unhashable value reached a cache lookup
        raise UsageError(f"invalid message property: {exc}") from None


def _encode_properties_into(out: bytearray, p: BasicProperties) -> None:
    start = len(out)
    out += b"\x00\x00"
    flags = 0
    get = _short_cache_get
    v: Any = p.content_type
    if v:  # None and "" are both absent (pamqp's rule)
        flags = FLAG_CONTENT_TYPE
        out += get(v) or cached_short_string(v, "content_type")
    v = p.content_encoding
    if v:
        flags |= FLAG_CONTENT_ENCODING
        out += get(v) or cached_short_string(v, "content_encoding")
    v = p.headers
    if v is not None:
        flags |= FLAG_HEADERS
        if not isinstance(v, Mapping):
            raise UsageError(f"headers must be a mapping, not {type(v).__name__}")
        encode_table_into(out, v)
    v = p.delivery_mode
    if v is not None:
        flags |= FLAG_DELIVERY_MODE
        out += _octet(v, "delivery_mode")
    v = p.priority
    if v is not None:
        flags |= FLAG_PRIORITY
        out += _octet(v, "priority")
    v = p.correlation_id
    if v:
        flags |= FLAG_CORRELATION_ID
        out += encode_short_string(v, "correlation_id")
    v = p.reply_to
    if v:
        flags |= FLAG_REPLY_TO
        out += get(v) or cached_short_string(v, "reply_to")
    v = p.expiration
    if v:
        flags |= FLAG_EXPIRATION
        out += get(v) or cached_short_string(v, "expiration")
    v = p.message_id
    if v:
        flags |= FLAG_MESSAGE_ID
        out += encode_short_string(v, "message_id")
    v = p.timestamp
    if v is not None:
        flags |= FLAG_TIMESTAMP
        if type(v) is datetime.datetime and v.tzinfo is _UTC and v.year >= 1970:
            out += _U64.pack(int(v.timestamp()))
        else:
            out += _U64.pack(timestamp_seconds(v))
    v = p.type
    if v:
        flags |= FLAG_TYPE
        out += get(v) or cached_short_string(v, "type")
    v = p.user_id
    if v:
        flags |= FLAG_USER_ID
        out += get(v) or cached_short_string(v, "user_id")
    v = p.app_id
    if v:
        flags |= FLAG_APP_ID
        out += get(v) or cached_short_string(v, "app_id")
    v = p.cluster_id
    if v:
        flags |= FLAG_CLUSTER_ID
        out += get(v) or cached_short_string(v, "cluster_id")
    if flags:
        _U16.pack_into(out, start, flags)


def _syntax(message: str) -> ProtocolSyntaxError:
    return ProtocolSyntaxError(message, remote=False)


def _not_utf8(raw: bytes, what: str, notes: list[str] | None) -> bytes:
    """A short-string property that is not UTF-8: an error, or (lenient) its bytes."""
    if notes is None:
        raise _syntax(f"{what} is not UTF-8")
    notes.append(f"{what} is not UTF-8")
    return bytes(raw)


def _short(buf: bytes, pos: int, end: int, what: str, notes: list[str] | None) -> tuple[Any, int]:
    if pos >= end:
        raise _syntax(f"{what} is truncated")
    stop = pos + 1 + buf[pos]
    if stop > end:
        raise _syntax(f"{what} runs past the end of the content header")
    raw = buf[pos + 1 : stop]
    try:
        return raw.decode("utf-8"), stop
    except UnicodeDecodeError:
        return _not_utf8(raw, what, notes), stop


def decode_properties(buf: bytes, offset: int = 0) -> BasicProperties:
    """Decode property flags and fields from ``buf[offset:]`` to the end of ``buf``."""
    return _decode_properties(buf, offset, None)


def _decode_properties(buf: bytes, offset: int, notes: list[str] | None) -> BasicProperties:
    """:func:`decode_properties`; with a ``notes`` list, leniently (the module docstring
    says how), noting what was let through."""
    end = len(buf)
    pos = offset
    if pos < 0 or pos + 2 > end:
        raise _syntax("content header property flags are truncated")
    flags = _U16.unpack_from(buf, pos)[0]
    pos += 2
    more = flags
    while more & 1:  # continuation: further flag words (none are defined; skip them)
        if pos + 2 > end:
            raise _syntax("content header property flags are truncated")
        more = _U16.unpack_from(buf, pos)[0]
        pos += 2
    if not flags & 0xFFFC:
        if pos != end:
            raise _syntax("unexpected bytes after the content header properties")
        return EMPTY_PROPERTIES

    # Any: a lenient decode may leave bytes (or an int timestamp) in them.
    content_type: Any = None
    content_encoding: Any = None
    correlation_id: Any = None
    reply_to: Any = None
    expiration: Any = None
    message_id: Any = None
    type_: Any = None
    user_id: Any = None
    app_id: Any = None
    cluster_id: Any = None
    headers = delivery_mode = priority = None
    timestamp: Any = None
    try:
        if flags & FLAG_CONTENT_TYPE:
            stop = pos + 1 + buf[pos]
            if stop > end:
                raise _syntax("content_type runs past the end of the content header")
            raw = buf[pos + 1 : stop]
            try:
                content_type = raw.decode("utf-8")
            except UnicodeDecodeError:
                content_type = _not_utf8(raw, "content_type", notes)
            pos = stop
        if flags & FLAG_CONTENT_ENCODING:
            stop = pos + 1 + buf[pos]
            if stop > end:
                raise _syntax("content_encoding runs past the end of the content header")
            raw = buf[pos + 1 : stop]
            try:
                content_encoding = raw.decode("utf-8")
            except UnicodeDecodeError:
                content_encoding = _not_utf8(raw, "content_encoding", notes)
            pos = stop
        if flags & FLAG_HEADERS:
            headers, pos = _decode_table(buf, pos, end, 1, notes)
        if flags & FLAG_DELIVERY_MODE:
            delivery_mode = buf[pos]
            pos += 1
        if flags & FLAG_PRIORITY:
            priority = buf[pos]
            pos += 1
        if flags & FLAG_CORRELATION_ID:
            correlation_id, pos = _short(buf, pos, end, "correlation_id", notes)
        if flags & FLAG_REPLY_TO:
            reply_to, pos = _short(buf, pos, end, "reply_to", notes)
        if flags & FLAG_EXPIRATION:
            expiration, pos = _short(buf, pos, end, "expiration", notes)
        if flags & FLAG_MESSAGE_ID:
            stop = pos + 1 + buf[pos]
            if stop > end:
                raise _syntax("message_id runs past the end of the content header")
            raw = buf[pos + 1 : stop]
            try:
                message_id = raw.decode("utf-8")
            except UnicodeDecodeError:
                message_id = _not_utf8(raw, "message_id", notes)
            pos = stop
        if flags & FLAG_TIMESTAMP:
            if pos + 8 > end:
                raise _syntax("timestamp is truncated")
            seconds = _U64.unpack_from(buf, pos)[0]
            timestamp = decode_timestamp(seconds) if notes is None else lenient_timestamp(seconds, notes)
            pos += 8
        if flags & FLAG_TYPE:
            type_, pos = _short(buf, pos, end, "type", notes)
        if flags & FLAG_USER_ID:
            user_id, pos = _short(buf, pos, end, "user_id", notes)
        if flags & FLAG_APP_ID:
            stop = pos + 1 + buf[pos]
            if stop > end:
                raise _syntax("app_id runs past the end of the content header")
            raw = buf[pos + 1 : stop]
            try:
                app_id = raw.decode("utf-8")
            except UnicodeDecodeError:
                app_id = _not_utf8(raw, "app_id", notes)
            pos = stop
        if flags & FLAG_CLUSTER_ID:
            cluster_id, pos = _short(buf, pos, end, "cluster_id", notes)
    except IndexError:
        raise _syntax("content header properties are truncated") from None
    if pos != end:
        raise _syntax("unexpected bytes after the content header properties")
    return BasicProperties(
        content_type=content_type,
        content_encoding=content_encoding,
        headers=headers,
        delivery_mode=delivery_mode,
        priority=priority,
        correlation_id=correlation_id,
        reply_to=reply_to,
        expiration=expiration,
        message_id=message_id,
        timestamp=timestamp,
        type=type_,
        user_id=user_id,
        app_id=app_id,
        cluster_id=cluster_id,
    )


# --- pamqp conversion ------------------------------------------------------------

_STR_FIELDS = (
    "content_type",
    "content_encoding",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "user_id",
    "app_id",
)


def to_pamqp(props: BasicProperties | None) -> Any:
    """The equivalent ``pamqp.commands.Basic.Properties`` (for tests and the slow path)."""
    from pamqp import commands

    if props is None:
        return commands.Basic.Properties()
    result = commands.Basic.Properties(
        content_type=props.content_type,
        content_encoding=props.content_encoding,
        headers=props.headers,
        delivery_mode=None,  # pamqp validates 1/2 only; set below without validation
        priority=props.priority,
        correlation_id=props.correlation_id,
        reply_to=props.reply_to,
        expiration=props.expiration,
        message_id=props.message_id,
        timestamp=props.timestamp,
        message_type=props.type,
        user_id=props.user_id,
        app_id=props.app_id,
    )
    result.delivery_mode = props.delivery_mode
    # pamqp's constructor refuses a cluster_id; its marshal() sends one if set.
    result.cluster_id = props.cluster_id if props.cluster_id is not None else ""
    return result


def _plain(value: Any) -> Any:
    """pamqp values as our decoder returns them (``bytearray`` -> ``bytes``)."""
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def from_pamqp(props: Any) -> BasicProperties:
    """Build :class:`BasicProperties` from a ``pamqp.commands.Basic.Properties``.

    Empty strings become ``None`` (pamqp does not send them) and ``bytearray`` values
    in the headers become ``bytes``, so the result equals what :func:`decode_properties`
    returns for ``props.marshal()``.
    """
    values: dict[str, Any] = {}
    for name in _STR_FIELDS:
        value = getattr(props, name, None)
        values[name] = None if value == "" else value
    message_type = getattr(props, "message_type", None)
    cluster_id = getattr(props, "cluster_id", None)
    headers = getattr(props, "headers", None)
    return BasicProperties(
        headers=None if headers is None else _plain(headers),
        delivery_mode=props.delivery_mode,
        priority=props.priority,
        timestamp=props.timestamp,
        type=None if message_type == "" else message_type,
        cluster_id=None if cluster_id == "" else cluster_id,
        **values,
    )
