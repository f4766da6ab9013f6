"""The AMQP 0-9-1 frame layer: splitting a byte stream into frames, and building frames.

A frame is ``type:u8 channel:u16 size:u32 payload[size] 0xCE``.  :class:`FrameReader`
takes bytes of any split and yields ``(frame_type, channel, payload)`` tuples; the
``encode_*`` functions build complete frames.

The slow path for methods (:func:`encode_method_frame`, :func:`decode_method`) works
for every method pamqp knows: it takes pamqp's generated command classes for the
field list, and encodes and decodes the fields with this package's strict codec
(field tables as in :mod:`ojs_codec._table`).  For values pamqp can encode the bytes are
pamqp's.  Differences: ``longlong`` fields (delivery tags) are unsigned, as the spec
says (pamqp packs them signed); a ``None`` string field is sent as ``""``; long-string
fields also take ``bytes``; and decoding rejects truncated fields, non-UTF-8 short
strings and trailing bytes, which pamqp lets through.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from typing import Any, Final, NoReturn

from ._accel import SPEEDUPS
from ._errors import CommandInvalid, FrameError, ProtocolSyntaxError, ProtocolVersionMismatch, UsageError
from ._properties import BasicProperties, encode_properties_into, encode_short_string
from ._table import (
    _decode_table,
    decode_timestamp,
    encode_table_into,
    timestamp_seconds,
)

__all__ = [
    "FRAME_BODY",
    "FRAME_END",
    "FRAME_HEADER",
    "FRAME_HEARTBEAT",
    "FRAME_MAX_DEFAULT",
    "FRAME_METHOD",
    "FRAME_MIN_SIZE",
    "FRAME_OVERHEAD",
    "HEARTBEAT_FRAME",
    "MAX_INCOMING_CONTENT_HEADER",
    "PROTOCOL_HEADER",
    "FrameReader",
    "decode_method",
    "encode_content",
    "encode_frame",
    "encode_method_frame",
    "encode_method_frame_unvalidated",
]

FRAME_METHOD: Final = 1
FRAME_HEADER: Final = 2
FRAME_BODY: Final = 3
FRAME_HEARTBEAT: Final = 8
FRAME_END: Final = 0xCE
FRAME_MIN_SIZE: Final = 4096
FRAME_MAX_DEFAULT: Final = 131072
FRAME_OVERHEAD: Final = 8
"""Bytes a frame adds around its payload: 7 of header, 1 end octet."""
MAX_INCOMING_CONTENT_HEADER: Final = 1 << 20
"""The largest content header frame (1 MiB, frame header and end octet included) that
:class:`~ojs_codec.AMQPConnection` reads from the broker when it is larger than the
negotiated ``frame_max``.  RabbitMQ checks ``frame_max`` on what it receives, not on
the content headers it sends: dead-lettering adds ``x-death`` to a header that fitted
when it was published, and a publisher with a larger ``frame_max`` than ours may send
more.  Such a delivery is read and flagged malformed rather than closing the
connection.  The cap keeps a bound on what the reader buffers: 8 times RabbitMQ's
default ``frame_max`` (131072), enough for a header published at that size plus
thousands of ``x-death`` entries; beyond it the frame is a FRAME_ERROR, as before."""
PROTOCOL_HEADER: Final = b"AMQP\x00\x00\x09\x01"
HEARTBEAT_FRAME: Final = b"\x08\x00\x00\x00\x00\x00\x00\xce"

Frame = tuple[int, int, bytes]
"""``(frame_type, channel, payload)``, as :class:`FrameReader` returns frames."""

_PROTOCOL_MAX = 2**32 - 1
_FRAME_HDR = struct.Struct(">BHI")
_U32 = struct.Struct(">I")
_CONTENT_HDR = struct.Struct(">BHIHHQ")  # frame header + class id, weight, body size
_END = b"\xce"
_AMQP = b"AMQP"


def _check_frame_max(frame_max: int) -> int:
    """The largest frame size for a negotiated ``frame_max`` (0 means no limit)."""
    if isinstance(frame_max, bool) or not isinstance(frame_max, int):
        raise UsageError(f"frame_max must be an int, not {type(frame_max).__name__}")
    if frame_max == 0:
        return _PROTOCOL_MAX
    if not FRAME_MIN_SIZE <= frame_max <= _PROTOCOL_MAX:
        raise UsageError(f"frame_max must be 0 or {FRAME_MIN_SIZE}..{_PROTOCOL_MAX}, got {frame_max}")
    return frame_max


def _frame_error(message: str) -> FrameError:
    return FrameError(message, remote=False)


class FrameReader:
    """Split a byte stream from the broker into frames.

    Feed bytes of any split with :meth:`feed`, then call :meth:`next_frame` until it
    returns ``None`` (more data needed).  :meth:`frames` does both.

    * A frame whose declared payload exceeds ``frame_max - 8`` raises
      :class:`FrameError` as soon as its 7-byte header has arrived, before its
      payload is buffered.  ``content_header_max`` (0: none) lets content header frames
      up to that size through even so (a client reading from the broker passes
      :data:`MAX_INCOMING_CONTENT_HEADER`).
    * A bad end octet, an unknown frame type, or a heartbeat that is not on channel 0
      or carries a payload raises :class:`FrameError`.
    * ``AMQP`` + 4 bytes at the very start of the stream is the broker refusing our
      protocol version: :class:`ProtocolVersionMismatch`.
    * After an error the reader is broken: every later call raises the same error.

    Memory: the buffer holds at most one incomplete frame plus the latest
    :meth:`feed`.  Feeding again while a whole frame (``frame_max`` bytes or more, or
    ``content_header_max`` when that is larger) is still undrained raises
    :class:`UsageError`.
    """

    __slots__ = (
        "_at_start",
        "_buf",
        "_error",
        "_frame_max",
        "_header_max",
        "_header_max_payload",
        "_max_payload",
        "_pos",
        "_split",
    )

    def __init__(self, frame_max: int = FRAME_MAX_DEFAULT, *, content_header_max: int = 0) -> None:
        # the loop of frames() that slices whole frames out of new data: C when
        # ojs_codec._speedups is loaded (codec/ojs_codec/_accel.py)
        self._split = _split_frames
        self._buf = bytearray()
        self._pos = 0
        self._at_start = True
        self._error: Exception | None = None
        if content_header_max:
            _check_frame_max(content_header_max)
        self._header_max = content_header_max
        self.frame_max = frame_max

    @property
    def frame_max(self) -> int:
        """The negotiated maximum frame size (0 means the protocol maximum)."""
        return self._frame_max

    @frame_max.setter
    def frame_max(self, value: int) -> None:
        self._max_payload = _check_frame_max(value) - FRAME_OVERHEAD
        self._header_max_payload = max(self._max_payload, self._header_max - FRAME_OVERHEAD)
        self._frame_max = value

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        return len(self._buf) - self._pos

    @property
    def buffer_size(self) -> int:
        """Bytes the internal buffer holds now, including already consumed ones."""
        return len(self._buf)

    @property
    def broken(self) -> bool:
        """Whether the reader has hit a protocol error (every call now raises it)."""
        return self._error is not None

    @property
    def drained(self) -> bool:
        """Whether every byte fed so far was returned as a frame (no error either)."""
        return self._error is None and self._pos == len(self._buf)

    def split(self, result: list[Frame], data: bytes) -> int:
        """Append the complete, well-formed frames at the start of ``data`` to ``result``
        and return the offset of the first byte not taken; only when :attr:`drained`.

        Nothing is buffered: the caller feeds ``data[offset:]`` (an incomplete frame, or
        one that :meth:`next_frame` will reject) before calling :meth:`next_frame`.
        """
        if self._pos:
            del self._buf[:]
            self._pos = 0
        end = self._split(result, data, self._max_payload)
        if end:
            self._at_start = False
        return end

    def detach(self) -> bytes:
        """Remove and return the bytes fed but not yet returned as frames (the reader is
        then :attr:`drained`).  Raises the reader's error if it is broken."""
        if self._error is not None:
            raise self._error.with_traceback(None)
        rest = bytes(self._buf[self._pos :])
        del self._buf[:]
        self._pos = 0
        return rest

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append bytes received from the broker."""
        if self._error is not None:
            raise self._error.with_traceback(None)
        if not data:
            return
        buf = self._buf
        pos = self._pos
        if pos:
            # Drop consumed bytes.  What stays is one incomplete frame, moved at most
            # once: nothing is consumed again until that frame is complete.
            del buf[:pos]
            self._pos = 0
        if len(buf) >= self._header_max_payload + FRAME_OVERHEAD:
            raise UsageError("FrameReader.feed() with a whole frame undrained: call next_frame() first")
        buf += data

    def next_frame(self) -> Frame | None:
        """Return the next ``(frame_type, channel, payload)``, or ``None`` if more
        bytes are needed."""
        if self._error is not None:
            raise self._error.with_traceback(None)
        buf = self._buf
        pos = self._pos
        available = len(buf) - pos
        if available < 7:
            if available and buf[pos] not in _FRAME_TYPES:
                self._check_type(buf, pos)
            if pos:  # release the consumed bytes (what stays is < 7 bytes)
                del buf[:pos]
                self._pos = 0
            return None
        frame_type, channel, size = _FRAME_HDR.unpack_from(buf, pos)
        if frame_type not in _FRAME_TYPES:
            self._check_type(buf, pos)
            return None  # a protocol header may still be arriving
        if size > self._max_payload:
            if frame_type != FRAME_HEADER or not self._header_max:
                self._fail(
                    _frame_error(
                        f"frame of {size + FRAME_OVERHEAD} bytes exceeds the negotiated "
                        f"frame_max of {self._max_payload + FRAME_OVERHEAD}"
                    )
                )
            if size > self._header_max_payload:
                self._fail(
                    _frame_error(
                        f"content header frame of {size + FRAME_OVERHEAD} bytes exceeds both the "
                        f"negotiated frame_max of {self._max_payload + FRAME_OVERHEAD} and the "
                        f"{self._header_max_payload + FRAME_OVERHEAD} bytes accepted for a content header"
                    )
                )
        end = pos + 7 + size
        if end >= len(buf):
            if pos:  # keep only the incomplete frame; it is moved at most once
                del buf[:pos]
                self._pos = 0
            return None
        if buf[end] != FRAME_END:
            self._fail(_frame_error(f"frame end octet is {buf[end]:#04x}, not 0xce"))
        if frame_type == FRAME_HEARTBEAT and (channel or size):
            self._fail(_frame_error(f"heartbeat frame on channel {channel} with {size} payload bytes"))
        payload = bytes(buf[pos + 7 : end])
        self._pos = end + 1
        self._at_start = False
        return frame_type, channel, payload

    def frames(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Feed ``data`` and return every frame that is now complete.

        On a protocol error this raises, and the frames of ``data`` before the bad one
        are lost with the connection; use :meth:`feed` and :meth:`next_frame` to get
        every frame up to an error.
        """
        result: list[Frame] = []
        if self._error is None and self._pos == len(self._buf) and type(data) is bytes:
            # Nothing pending: slice frames straight out of ``data`` (one copy each).
            # Anything unusual (an error, an incomplete frame) is left to next_frame().
            pos = self.split(result, data)
            if pos == len(data):
                return result
            self._buf += memoryview(data)[pos:]
        else:
            self.feed(data)
        while (frame := self.next_frame()) is not None:
            result.append(frame)
        return result

    def _check_type(self, buf: bytearray, pos: int) -> None:
        """Raise for an unknown frame type, unless it may be a protocol header still
        arriving (then return and wait)."""
        if self._at_start and buf[pos] == _AMQP[0]:
            head = bytes(buf[pos : pos + 8])
            if _AMQP.startswith(head[:4]):
                if len(head) < 8:
                    return
                self._fail(ProtocolVersionMismatch(head))
        self._fail(_frame_error(f"unknown frame type {buf[pos]}"))

    def _fail(self, error: Exception) -> NoReturn:
        self._error = error
        raise error


_FRAME_TYPES = frozenset((FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT))


def _split_frames_py(result: list[Frame], data: bytes, max_payload: int) -> int:
    """Append to ``result`` the complete, well-formed frames at the start of ``data``;
    return the offset of the first byte not consumed.

    Stops at an incomplete frame or at anything wrong (too large, unknown type, bad end
    octet, bad heartbeat), which :meth:`FrameReader.next_frame` then handles.
    ``ojs_codec._speedups.split_frames`` is the same loop in C.
    """
    pos = 0
    total = len(data)
    unpack = _FRAME_HDR.unpack_from
    while total - pos >= 7:
        frame_type, channel, size = unpack(data, pos)
        end = pos + 7 + size
        if (
            end >= total
            or size > max_payload
            or frame_type not in _FRAME_TYPES
            or data[end] != FRAME_END
            or (frame_type == FRAME_HEARTBEAT and (channel or size))
        ):
            break
        result.append((frame_type, channel, data[pos + 7 : end]))
        pos = end + 1
    return pos


_split_frames: Callable[[list[Frame], bytes, int], int]
if SPEEDUPS:
    from ._speedups import split_frames as _split_frames
else:
    _split_frames = _split_frames_py


# --- building frames ---------------------------------------------------------------


def encode_frame(frame_type: int, channel: int, payload: bytes) -> bytes:
    """One complete frame."""
    try:
        header = _FRAME_HDR.pack(frame_type, channel, len(payload))
    except struct.error as exc:
        raise UsageError(f"bad frame type {frame_type!r} or channel {channel!r}: {exc}") from None
    return b"".join((header, payload, _END))


def encode_content(
    channel: int,
    class_id: int,
    properties: BasicProperties | None,
    body: bytes,
    frame_max: int,
) -> bytes:
    """A content header frame followed by body frames of at most ``frame_max - 8``
    payload bytes each.  An empty body produces no body frame."""
    chunk = _check_frame_max(frame_max) - FRAME_OVERHEAD
    body_size = len(body)
    out = bytearray()
    try:
        out += _CONTENT_HDR.pack(FRAME_HEADER, channel, 0, class_id, 0, body_size)
    except struct.error as exc:
        raise UsageError(f"bad channel {channel!r} or class id {class_id!r}: {exc}") from None
    if properties is None:
        out += b"\x00\x00"
    else:
        encode_properties_into(out, properties)
    header_size = len(out) - 7
    if header_size > chunk:
        raise UsageError(
            f"the content header is {header_size + FRAME_OVERHEAD} bytes, more than frame_max "
            f"({chunk + FRAME_OVERHEAD}); send fewer or smaller headers"
        )
    _U32.pack_into(out, 3, header_size)
    out += _END
    if body_size <= chunk:
        if body_size:
            out += _FRAME_HDR.pack(FRAME_BODY, channel, body_size)
            out += body
            out += _END
        return bytes(out)
    parts: list[bytes | bytearray | memoryview] = [out]
    view = memoryview(body)
    for start in range(0, body_size, chunk):
        piece = view[start : start + chunk]
        parts.append(_FRAME_HDR.pack(FRAME_BODY, channel, len(piece)))
        parts.append(piece)
        parts.append(_END)
    return b"".join(parts)


# --- the slow path for any method -------------------------------------------------------

_FieldSpec = tuple[tuple[str, str], ...]
_SPECS: dict[type[Any], _FieldSpec] = {}
_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")


def _spec(cls: type[Any]) -> _FieldSpec:
    spec = _SPECS.get(cls)
    if spec is None:
        spec = tuple((name, cls.amqp_type(name)) for name in cls.__slots__)
        _SPECS[cls] = spec
    return spec


def _index_mapping() -> dict[int, type[Any]]:
    from pamqp import commands

    mapping: dict[int, type[Any]] = commands.INDEX_MAPPING
    return mapping


def encode_method_frame(channel: int, method: Any) -> bytes:
    """A method frame for any pamqp method object (``pamqp.commands.Queue.Declare(...)``)."""
    try:
        method.validate()
    except ValueError as exc:
        raise UsageError(f"invalid {getattr(method, 'name', type(method).__name__)}: {exc}") from None
    return _encode_method(channel, type(method), lambda name: getattr(method, name, None))


def encode_method_frame_unvalidated(
    channel: int, method_class: type[Any], fields: Mapping[str, Any]
) -> bytes:
    """A method frame from a pamqp method *class* and its field values, without pamqp's
    validation: for a peer that writes what RabbitMQ writes (names are any UTF-8 there;
    pamqp's patterns are narrower), such as the ``memory://`` broker.  A missing integer
    field is 0, a missing string or table empty; a value of the wrong type still raises
    :class:`UsageError`."""
    return _encode_method(channel, method_class, fields.get, missing_int=0)


def _encode_method(
    channel: int, method_class: type[Any], value_of: Callable[[str], Any], missing_int: int | None = None
) -> bytes:
    out = bytearray(_U32.pack(method_class.index))
    bits = -1  # the bit octet being built, or -1
    bit_index = 0
    for name, kind in _spec(method_class):
        value = value_of(name)
        if kind == "bit":
            if bits < 0 or bit_index == 8:
                if bits >= 0:
                    out.append(bits)
                bits, bit_index = 0, 0
            if value:
                bits |= 1 << bit_index
            bit_index += 1
            continue
        if bits >= 0:
            out.append(bits)
            bits = -1
        if value is None and kind in _INT_STRUCTS:
            value = missing_int
        try:
            _encode_field(out, kind, value, name)
        except (struct.error, OverflowError) as exc:
            raise UsageError(f"{method_class.name}.{name}: {value!r} does not fit a {kind}: {exc}") from None
    if bits >= 0:
        out.append(bits)
    return encode_frame(FRAME_METHOD, channel, bytes(out))


def _encode_field(out: bytearray, kind: str, value: Any, name: str) -> None:
    if kind == "shortstr":
        out += encode_short_string("" if value is None else value, name)
    elif kind in ("octet", "short", "long", "longlong"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise UsageError(f"{name} must be an int, not {type(value).__name__}")
        out += _INT_STRUCTS[kind].pack(value)
    elif kind == "table":
        if value is None:
            value = {}
        elif not isinstance(value, dict):
            raise UsageError(f"{name} must be a dict, not {type(value).__name__}")
        encode_table_into(out, value)
    elif kind == "longstr":
        if value is None:
            value = b""
        elif isinstance(value, str):
            value = value.encode("utf-8")
        elif not isinstance(value, bytes | bytearray):
            raise UsageError(f"{name} must be str or bytes, not {type(value).__name__}")
        out += _U32.pack(len(value))
        out += value
    elif kind == "timestamp":
        out += _U64.pack(timestamp_seconds(value))
    else:  # pragma: no cover - pamqp's spec has no other field types
        raise UsageError(f"unknown AMQP field type {kind!r}")


_INT_STRUCTS = {"octet": _U8, "short": _U16, "long": _U32, "longlong": _U64}


def _syntax(message: str) -> ProtocolSyntaxError:
    return ProtocolSyntaxError(message, remote=False)


def decode_method(payload: bytes) -> Any:
    """Decode a method frame payload into the matching pamqp command object.

    An unknown class/method id raises :class:`CommandInvalid`; fields that do not
    decode (truncated, not UTF-8, trailing bytes) raise :class:`ProtocolSyntaxError`.
    """
    if len(payload) < 4:
        raise _syntax("method frame payload is shorter than its class and method ids")
    index = _U32.unpack_from(payload, 0)[0]
    cls = _index_mapping().get(index)
    if cls is None:
        raise CommandInvalid(
            f"unknown method {index >> 16}.{index & 0xFFFF}",
            class_id=index >> 16,
            method_id=index & 0xFFFF,
            remote=False,
        )
    # Every field is set below; skipping __init__ also skips pamqp's deprecation
    # warning for Basic.RecoverAsync.
    method = object.__new__(cls)
    try:
        end = _decode_fields(method, payload, 4)
    except ProtocolSyntaxError as exc:
        raise ProtocolSyntaxError(
            f"{cls.name}: {exc.reply_text}", class_id=index >> 16, method_id=index & 0xFFFF, remote=False
        ) from None
    except (IndexError, struct.error):
        raise ProtocolSyntaxError(
            f"{cls.name} is truncated", class_id=index >> 16, method_id=index & 0xFFFF, remote=False
        ) from None
    if end != len(payload):
        raise ProtocolSyntaxError(
            f"{cls.name} has {len(payload) - end} unexpected trailing bytes",
            class_id=index >> 16,
            method_id=index & 0xFFFF,
            remote=False,
        )
    return method


def _decode_fields(method: Any, buf: bytes, pos: int) -> int:
    limit = len(buf)
    octet = 0
    bit_index = 8  # no bit octet read yet
    for name, kind in _spec(type(method)):
        if kind == "bit":
            if bit_index == 8:
                octet = buf[pos]
                pos += 1
                bit_index = 0
            value: Any = bool(octet >> bit_index & 1)
            bit_index += 1
        else:
            bit_index = 8
            if kind == "shortstr":
                stop = pos + 1 + buf[pos]
                if stop > limit:
                    raise _syntax(f"{name} runs past the end of the frame")
                try:
                    value = buf[pos + 1 : stop].decode("utf-8")
                except UnicodeDecodeError:
                    raise _syntax(f"{name} is not UTF-8") from None
                pos = stop
            elif kind == "longstr":
                stop = pos + 4 + _U32.unpack_from(buf, pos)[0]
                if stop > limit:
                    raise _syntax(f"{name} runs past the end of the frame")
                raw = buf[pos + 4 : stop]
                try:
                    value = raw.decode("utf-8")
                except UnicodeDecodeError:
                    value = bytes(raw)
                pos = stop
            elif kind == "table":
                value, pos = _decode_table(buf, pos, limit, 1)
            elif kind == "timestamp":
                value = decode_timestamp(_U64.unpack_from(buf, pos)[0])
                pos += 8
            else:
                fixed = _INT_STRUCTS[kind]
                value = fixed.unpack_from(buf, pos)[0]
                pos += fixed.size
        setattr(method, name, value)
    return pos
