"""AMQP 0-9-1 field tables and field arrays, in RabbitMQ's dialect.

Every field type RabbitMQ uses is supported::

    t bool      b int8      B uint8     s int16     u uint16
    I int32     i uint32    l int64     f float32   d float64
    D decimal   S longstr   A array     T timestamp F table
    V void      x byte array

Decoding also accepts ``L`` (read as a signed 64-bit integer) and ``\\x00`` (void), as
pamqp does.

Encoding picks the wire type from the Python type, exactly as pamqp 4.0.1 does, and
produces pamqp's bytes for every value pamqp can encode: ``bool`` -> ``t``; ``int`` ->
the smallest of ``b s u I i l``; :class:`~decimal.Decimal` -> ``D``; ``str`` -> ``S``;
:class:`~datetime.datetime` (and :class:`time.struct_time`) -> ``T``; a mapping -> ``F``
(keys sorted, as pamqp sorts them); ``list`` -> ``A``; ``bytearray`` -> ``x``; ``None``
-> ``V``.  The typed wrappers (:class:`Int8`, :class:`UInt8`, :class:`Int16`,
:class:`UInt16`, :class:`Int32`, :class:`UInt32`, :class:`Int64`, :class:`Float32`,
:class:`LongString`) write a type explicitly, so every wire type can be produced.
Decoding always returns plain Python values, never wrappers.

Deliberate differences from pamqp (each has a test):

* **float**: pamqp encodes a Python ``float`` as a 32-bit ``f``, which loses
  precision.  We encode it as a 64-bit ``d`` (lossless).  Wrap the value in
  :class:`Float32` to get ``f``.
* **bytes**: pamqp rejects ``bytes`` in a table.  We encode ``bytes`` like
  ``bytearray``, as ``x``.  ``tuple`` is encoded like ``list`` and any
  :class:`~collections.abc.Mapping` like ``dict``.
* **x decodes to bytes**: pamqp returns a ``bytearray`` for ``x``; we return
  immutable ``bytes`` (they compare equal).
* **S that is not UTF-8** decodes to ``bytes`` (as pamqp does).  Re-encoding those
  ``bytes`` would give ``x``; wrap them in :class:`LongString` to write ``S`` again.
* **Timestamps** (``T``) are whole seconds since the epoch on the wire.  Encoding
  truncates the sub-second part (a naive datetime is taken as UTC); decoding returns a
  timezone-aware UTC datetime.  Like pamqp, a value above ``0xFFFFFFFF`` is read as
  milliseconds, so a datetime after 2106-02-07 does not round-trip; a value no datetime
  can hold raises :class:`ProtocolSyntaxError`.
* **Keys** longer than 255 UTF-8 bytes raise :class:`UsageError`; pamqp silently
  truncates keys longer than 128 bytes (we send keys of 129..255 bytes unchanged).
* **Malformed input is rejected.**  pamqp reads past a table's declared length and
  truncates short strings silently; we raise :class:`ProtocolSyntaxError` whenever a
  length does not fit its buffer or enclosing table, a key is not UTF-8, a type is
  unknown, or tables/arrays nest deeper than :data:`MAX_DEPTH`.
* **Except in a delivery's headers** (``decode_content_header_lenient``): there a key
  that is not UTF-8 is kept as ``bytes``, a table or array nested deeper than
  :data:`MAX_DEPTH` is replaced by :data:`NESTED_TOO_DEEP` (its bytes skipped, not
  decoded) and a timestamp no datetime can hold is kept as its ``int``; each is noted,
  and :func:`malformed_reason` words the notes.  Everything else stays an error.

Encoding errors (a value of an unsupported type, an integer out of range, a string
too long) raise :class:`UsageError`: nothing has been sent.
"""

from __future__ import annotations

import calendar
import datetime
import struct
import time
from collections.abc import Mapping, Sequence
from decimal import Context, Decimal
from typing import Any, ClassVar, Final

from ._errors import ProtocolSyntaxError, UsageError

__all__ = [
    "MAX_DEPTH",
    "NESTED_TOO_DEEP",
    "Float32",
    "Int8",
    "Int16",
    "Int32",
    "Int64",
    "LongString",
    "UInt8",
    "UInt16",
    "UInt32",
    "decode_array",
    "decode_table",
    "encode_array",
    "encode_table",
    "malformed_reason",
]

MAX_DEPTH = 64
"""How deeply tables and arrays may nest (a table inside a table is depth 2)."""

_UTC = datetime.UTC


class _NestedTooDeep:
    """The type of :data:`NESTED_TOO_DEEP` (one instance)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"<nested deeper than {MAX_DEPTH} levels>"

    def __reduce__(self) -> str:
        return "NESTED_TOO_DEEP"


NESTED_TOO_DEEP: Any = _NestedTooDeep()
"""What a lenient decode puts in place of a table or array nested deeper than
:data:`MAX_DEPTH` (see :func:`~ojs_codec.decode_content_header_lenient`).  It cannot be
encoded: a message holding it cannot be republished as it is."""

# --- precompiled structs -----------------------------------------------------

_U8 = struct.Struct(">B")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")

# type octet + value, packed in one call
_T_BOOL = struct.Struct(">BB")
_T_I8 = struct.Struct(">Bb")
_T_U8 = struct.Struct(">BB")
_T_I16 = struct.Struct(">Bh")
_T_U16 = struct.Struct(">BH")
_T_I32 = struct.Struct(">Bi")
_T_U32 = struct.Struct(">BI")
_T_I64 = struct.Struct(">Bq")
_T_F32 = struct.Struct(">Bf")
_T_F64 = struct.Struct(">Bd")
_T_DEC = struct.Struct(">BBi")
_T_TS = struct.Struct(">BQ")
_T_LEN = struct.Struct(">BI")  # type octet + 32-bit length (S, x, F, A)

# value only, for decoding
_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_F32 = struct.Struct(">f")
_F64 = struct.Struct(">d")

_u32_from = _U32.unpack_from

_EMPTY_TABLE = b"\x00\x00\x00\x00"
_DEC_CONTEXT = Context(prec=64)

# Encoded table keys (length octet + UTF-8), bounded.
_KEY_CACHE: dict[str, bytes] = {}
_KEY_CACHE_MAX = 512
# Table key sets (in iteration order) -> sorted (key, encoded key) pairs.  Bounded.
_TEMPLATE_CACHE: dict[tuple[str, ...], tuple[tuple[str, bytes], ...]] = {}
_TEMPLATE_CACHE_MAX = 256
# Encoded short str values ("S" + length + UTF-8), which repeat from message to
# message (queue names, tags...).  Only values up to _VALUE_CACHE_LEN bytes: longer
# ones are usually unique (ids, timestamps).  Bounded.
_VALUE_CACHE: dict[str, bytes] = {}
_VALUE_CACHE_MAX = 1024
_VALUE_CACHE_LEN = 24


# --- typed wrappers ------------------------------------------------------------


class _Typed:
    """Base of the explicitly typed wrappers: an immutable box around one value."""

    __slots__ = ("value",)
    type_code: ClassVar[bytes] = b""
    value: Any

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return bool(self.value == other.value)

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.value))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.value!r})"

    def _encode_into(self, out: bytearray) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


class _TypedInt(_Typed):
    __slots__ = ()
    _struct: ClassVar[struct.Struct]
    _min: ClassVar[int]
    _max: ClassVar[int]

    value: int

    def __init__(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise UsageError(f"{type(self).__name__} needs an int, not {type(value).__name__}")
        if not self._min <= value <= self._max:
            raise UsageError(f"{type(self).__name__} range is {self._min}..{self._max}, got {value}")
        object.__setattr__(self, "value", int(value))

    def _encode_into(self, out: bytearray) -> None:
        out += self._struct.pack(self.type_code[0], self.value)


class Int8(_TypedInt):
    """A signed 8-bit integer, written as ``b``."""

    __slots__ = ()
    type_code = b"b"
    _struct = _T_I8
    _min, _max = -(2**7), 2**7 - 1


class UInt8(_TypedInt):
    """An unsigned 8-bit integer, written as ``B``."""

    __slots__ = ()
    type_code = b"B"
    _struct = _T_U8
    _min, _max = 0, 2**8 - 1


class Int16(_TypedInt):
    """A signed 16-bit integer, written as ``s``."""

    __slots__ = ()
    type_code = b"s"
    _struct = _T_I16
    _min, _max = -(2**15), 2**15 - 1


class UInt16(_TypedInt):
    """An unsigned 16-bit integer, written as ``u``."""

    __slots__ = ()
    type_code = b"u"
    _struct = _T_U16
    _min, _max = 0, 2**16 - 1


class Int32(_TypedInt):
    """A signed 32-bit integer, written as ``I``."""

    __slots__ = ()
    type_code = b"I"
    _struct = _T_I32
    _min, _max = -(2**31), 2**31 - 1


class UInt32(_TypedInt):
    """An unsigned 32-bit integer, written as ``i``."""

    __slots__ = ()
    type_code = b"i"
    _struct = _T_U32
    _min, _max = 0, 2**32 - 1


class Int64(_TypedInt):
    """A signed 64-bit integer, written as ``l``."""

    __slots__ = ()
    type_code = b"l"
    _struct = _T_I64
    _min, _max = -(2**63), 2**63 - 1


class Float32(_Typed):
    """A 32-bit float, written as ``f`` (a plain ``float`` is written as 64-bit ``d``)."""

    __slots__ = ()
    type_code = b"f"
    value: float

    def __init__(self, value: float) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise UsageError(f"Float32 needs a float, not {type(value).__name__}")
        try:
            _F32.pack(value)
        except (OverflowError, struct.error) as exc:
            raise UsageError(f"{value!r} does not fit a 32-bit float") from exc
        object.__setattr__(self, "value", float(value))

    def _encode_into(self, out: bytearray) -> None:
        out += _T_F32.pack(0x66, self.value)


class LongString(_Typed):
    """A long string ``S`` given as raw bytes (for example, bytes that are not UTF-8)."""

    __slots__ = ()
    type_code = b"S"
    value: bytes

    def __init__(self, value: bytes | bytearray | str) -> None:
        if isinstance(value, str):
            raw = value.encode("utf-8")
        elif isinstance(value, bytes | bytearray):
            raw = bytes(value)
        else:
            raise UsageError(f"LongString needs bytes or str, not {type(value).__name__}")
        if len(raw) > 0xFFFFFFFF:
            raise UsageError("a long string is at most 4 GiB")
        object.__setattr__(self, "value", raw)

    def _encode_into(self, out: bytearray) -> None:
        out += _T_LEN.pack(0x53, len(self.value))
        out += self.value


# --- encoding --------------------------------------------------------------------


def encode_table(table: Mapping[str, Any] | None) -> bytes:
    """Encode a field table, with its 4-byte length prefix.  ``None`` and ``{}`` give
    four zero bytes."""
    if table is None:
        return _EMPTY_TABLE
    if type(table) is not dict and not isinstance(table, Mapping):
        raise UsageError(f"a field table must be a mapping, not {type(table).__name__}")
    if not table:
        return _EMPTY_TABLE
    out = bytearray()
    encode_table_into(out, table)
    return bytes(out)


def encode_array(values: Sequence[Any]) -> bytes:
    """Encode a field array, with its 4-byte length prefix."""
    if not isinstance(values, list | tuple):
        raise UsageError(f"a field array must be a list or tuple, not {type(values).__name__}")
    out = bytearray()
    _encode_array_into(out, values, 1)
    return bytes(out)


def short_string_key(key: str) -> bytes:
    """The encoded form (length octet + UTF-8) of a table key, cached."""
    cached = _KEY_CACHE.get(key)
    if cached is not None:
        return cached
    if not isinstance(key, str):
        raise UsageError(f"table keys must be str, not {type(key).__name__}")
    raw = key.encode("utf-8")
    if len(raw) > 255:
        raise UsageError(f"table key {key[:40]!r}... is {len(raw)} bytes; the maximum is 255")
    encoded = _U8.pack(len(raw)) + raw
    if len(_KEY_CACHE) >= _KEY_CACHE_MAX:
        _KEY_CACHE.clear()
    _KEY_CACHE[key] = encoded
    return encoded


def encode_table_into(out: bytearray, table: Mapping[str, Any], depth: int = 1) -> None:
    """Append a field table (length prefix included) to ``out``."""
    if depth > MAX_DEPTH:
        raise UsageError(f"field tables and arrays nest deeper than {MAX_DEPTH} levels")
    start = len(out)
    out += _EMPTY_TABLE
    if not table:
        return
    try:
        template = _TEMPLATE_CACHE.get(tuple(table))
    except TypeError:  # an unhashable key
        template = None
    if template is None:
        template = _table_template(table)
    value_get = _VALUE_CACHE.get
    for key, encoded_key in template:
        value = table[key]
        out += encoded_key
        # Fast paths for the common header value types; everything else goes through
        # _encode_value, which checks types in pamqp's order.
        vtype = type(value)
        if vtype is str:
            encoded = value_get(value)
            if encoded is None:
                raw = value.encode("utf-8")
                encoded = _T_LEN.pack(0x53, len(raw)) + raw
                if len(raw) <= _VALUE_CACHE_LEN:
                    if len(_VALUE_CACHE) >= _VALUE_CACHE_MAX:
                        _VALUE_CACHE.clear()
                    _VALUE_CACHE[value] = encoded
            out += encoded
        elif vtype is int and -128 <= value <= 127:
            out += _T_I8.pack(0x62, value)
        else:
            try:
                _encode_value(out, value, depth)
            except UsageError as exc:
                raise UsageError(f"table key {key!r}: {exc}") from None
    size = len(out) - start - 4
    if size > 0xFFFFFFFF:
        raise UsageError("a field table is at most 4 GiB")
    _U32.pack_into(out, start, size)


def _table_template(table: Mapping[str, Any]) -> tuple[tuple[str, bytes], ...]:
    """The keys of a table in pamqp's (sorted) order, with their encoded form.

    Cached by the keys in iteration order: messages tend to carry the same header
    keys, so the sort and the key encoding are done once per key set.
    """
    keys = tuple(table)
    for key in keys:
        if not isinstance(key, str):
            raise UsageError(f"table keys must be str, not {type(key).__name__}")
    template = tuple((key, short_string_key(key)) for key in sorted(keys))
    if len(_TEMPLATE_CACHE) >= _TEMPLATE_CACHE_MAX:
        _TEMPLATE_CACHE.clear()
    _TEMPLATE_CACHE[keys] = template
    return template


def _encode_array_into(out: bytearray, values: Sequence[Any], depth: int) -> None:
    if depth > MAX_DEPTH:
        raise UsageError(f"field tables and arrays nest deeper than {MAX_DEPTH} levels")
    start = len(out)
    out += _EMPTY_TABLE
    for value in values:
        _encode_value(out, value, depth)
    size = len(out) - start - 4
    if size > 0xFFFFFFFF:
        raise UsageError("a field array is at most 4 GiB")
    _U32.pack_into(out, start, size)


def _encode_int(out: bytearray, value: int) -> None:
    # pamqp's choice: the smallest of b, s, u, I, i, l.
    if -128 <= value <= 127:
        out += _T_I8.pack(0x62, value)
    elif -32768 <= value <= 32767:
        out += _T_I16.pack(0x73, value)
    elif 0 <= value <= 65535:
        out += _T_U16.pack(0x75, value)
    elif -2147483648 <= value <= 2147483647:
        out += _T_I32.pack(0x49, value)
    elif 0 <= value <= 4294967295:
        out += _T_U32.pack(0x69, value)
    elif -9223372036854775808 <= value <= 9223372036854775807:
        out += _T_I64.pack(0x6C, value)
    else:
        raise UsageError(f"integer {value} does not fit a signed 64-bit field")


def _encode_decimal(out: bytearray, value: Decimal) -> None:
    exponent = value.as_tuple().exponent
    if not isinstance(exponent, int):
        raise UsageError(f"cannot encode {value} as a decimal")
    if exponent > 0:  # scale a positive exponent up into the mantissa
        scale = 0
        mantissa = int(value)
    else:
        scale = -exponent
        mantissa = int(value.scaleb(scale, _DEC_CONTEXT))
    if not 0 <= scale <= 255:
        raise UsageError(f"decimal {value} has {scale} places; the maximum is 255")
    if not -2147483648 <= mantissa <= 2147483647:
        raise UsageError(f"decimal {value} needs a mantissa outside the signed 32-bit range")
    out += _T_DEC.pack(0x44, scale, mantissa)


def timestamp_seconds(value: datetime.datetime | time.struct_time) -> int:
    """Whole seconds since the epoch, as AMQP sends a timestamp (naive means UTC)."""
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None or value.tzinfo.utcoffset(value) is None:
            value = value.replace(tzinfo=_UTC)
        seconds = int(value.timestamp())
    elif isinstance(value, time.struct_time):
        seconds = calendar.timegm(value)
    else:
        raise UsageError(f"a timestamp must be a datetime, not {type(value).__name__}")
    if not 0 <= seconds <= 0xFFFFFFFFFFFFFFFF:
        raise UsageError(f"timestamp {value} is before 1970 and cannot be sent")
    return seconds


def _encode_value(out: bytearray, value: Any, depth: int) -> None:
    """Append one typed field value.  Checks types in pamqp's order (bool before int)."""
    if isinstance(value, bool):
        out += _T_BOOL.pack(0x74, value)
    elif isinstance(value, int):
        _encode_int(out, value)
    elif isinstance(value, Decimal):
        _encode_decimal(out, value)
    elif isinstance(value, float):
        out += _T_F64.pack(0x64, value)
    elif isinstance(value, str):
        raw = value.encode("utf-8")
        if len(raw) > 0xFFFFFFFF:
            raise UsageError("a long string is at most 4 GiB")
        out += _T_LEN.pack(0x53, len(raw))
        out += raw
    elif isinstance(value, datetime.datetime | time.struct_time):
        out += _T_TS.pack(0x54, timestamp_seconds(value))
    elif isinstance(value, Mapping):
        out += b"F"
        encode_table_into(out, value, depth + 1)
    elif isinstance(value, list | tuple):
        out += b"A"
        _encode_array_into(out, value, depth + 1)
    elif isinstance(value, bytes | bytearray):
        if len(value) > 0xFFFFFFFF:
            raise UsageError("a byte array is at most 4 GiB")
        out += _T_LEN.pack(0x78, len(value))
        out += value
    elif value is None:
        out += b"V"
    elif isinstance(value, _Typed):
        value._encode_into(out)
    else:
        raise UsageError(f"cannot encode a {type(value).__name__} in a field table: {value!r:.60}")


# --- decoding --------------------------------------------------------------------


def _syntax(message: str) -> ProtocolSyntaxError:
    return ProtocolSyntaxError(message, remote=False)


def decode_table(buf: bytes, offset: int = 0) -> tuple[dict[str, Any], int]:
    """Decode the field table that starts (with its length) at ``buf[offset]``.

    Returns the table and the offset just past it.  Raises
    :class:`ProtocolSyntaxError` on malformed input.
    """
    try:
        return _decode_table(buf, offset, len(buf), 1)
    except ProtocolSyntaxError:
        raise
    except (IndexError, struct.error, ValueError, TypeError, OverflowError) as exc:  # pragma: no cover
        raise _syntax(f"malformed field table: {exc}") from None


def decode_array(buf: bytes, offset: int = 0) -> tuple[list[Any], int]:
    """Decode the field array that starts (with its length) at ``buf[offset]``."""
    try:
        return _decode_array(buf, offset, len(buf), 1)
    except ProtocolSyntaxError:
        raise
    except (IndexError, struct.error, ValueError, TypeError, OverflowError) as exc:  # pragma: no cover
        raise _syntax(f"malformed field array: {exc}") from None


def _decode_table(
    buf: bytes, pos: int, limit: int, depth: int, notes: list[str] | None = None
) -> tuple[dict[Any, Any], int]:
    """The table at ``buf[pos]``.  ``notes``: ``None`` is strict; a list makes the decode
    lenient (see the module docstring) and collects what was let through."""
    if depth > MAX_DEPTH:
        raise _syntax(f"field tables and arrays nest deeper than {MAX_DEPTH} levels")
    if pos < 0 or pos + 4 > limit:
        raise _syntax("field table length is truncated")
    end = pos + 4 + _u32_from(buf, pos)[0]
    if end > limit:
        raise _syntax("field table is longer than its buffer")
    pos += 4
    result: dict[Any, Any] = {}
    try:
        while pos < end:
            key_start = pos + 1
            pos = key_start + buf[pos]  # now at the type octet
            if pos >= end:
                raise _syntax("field table key runs past the end of the table")
            raw_key = buf[key_start:pos]
            try:
                key: Any = raw_key.decode("utf-8")
            except UnicodeDecodeError:
                if notes is None:
                    raise _syntax("field table key is not UTF-8") from None
                key = bytes(raw_key)
                notes.append(f"header table key {key!r} is not UTF-8")
            kind = buf[pos]
            # Inline the two most common header value types.
            if kind == 0x53:  # 'S'
                value_start = pos + 5
                pos = value_start + _u32_from(buf, pos + 1)[0]
                if pos > end:
                    raise _syntax("long string runs past the end of its table")
                raw = buf[value_start:pos]
                try:
                    result[key] = raw.decode("utf-8")
                except UnicodeDecodeError:
                    result[key] = bytes(raw)
            elif kind == 0x62:  # 'b'
                pos += 2
                if pos > end:
                    raise _syntax("field value of type 'b' is truncated")
                octet = buf[pos - 1]
                result[key] = octet - 256 if octet > 127 else octet
            else:
                result[key], pos = _decode_value(buf, kind, pos + 1, end, depth, notes)
    except (IndexError, struct.error):
        raise _syntax("field table is truncated") from None
    return result, end


def _decode_array(
    buf: bytes, pos: int, limit: int, depth: int, notes: list[str] | None = None
) -> tuple[list[Any], int]:
    if depth > MAX_DEPTH:
        raise _syntax(f"field tables and arrays nest deeper than {MAX_DEPTH} levels")
    if pos < 0 or pos + 4 > limit:
        raise _syntax("field array length is truncated")
    end = pos + 4 + _U32.unpack_from(buf, pos)[0]
    if end > limit:
        raise _syntax("field array is longer than its buffer")
    pos += 4
    result: list[Any] = []
    append = result.append
    while pos < end:
        kind = buf[pos]
        value, pos = _decode_value(buf, kind, pos + 1, end, depth, notes)
        append(value)
    return result, end


def _skip_too_deep(buf: bytes, kind: int, pos: int, end: int, notes: list[str]) -> tuple[Any, int]:
    """Lenient: the table or array at ``buf[pos]`` would nest deeper than
    :data:`MAX_DEPTH`.  Its length is checked, its bytes are skipped, and
    :data:`NESTED_TOO_DEEP` stands in for it."""
    what = "table" if kind == 0x46 else "array"
    if pos + 4 > end:
        raise _syntax(f"field {what} length is truncated")
    stop = pos + 4 + _u32_from(buf, pos)[0]
    if stop > end:
        raise _syntax(f"field {what} is longer than its buffer")
    notes.append(f"header tables and arrays nest deeper than {MAX_DEPTH} levels")
    return NESTED_TOO_DEEP, stop


def lenient_timestamp(seconds: int, notes: list[str]) -> datetime.datetime | int:
    """:func:`decode_timestamp`, but a value no datetime can hold is kept as its ``int``
    and noted."""
    try:
        return decode_timestamp(seconds)
    except ProtocolSyntaxError:
        notes.append(f"timestamp {seconds} is out of range")
        return seconds


def malformed_reason(notes: list[str]) -> str | None:
    """What a lenient decode let through, in one line (``None`` when nothing): the first
    three different notes, and how many others there were."""
    if not notes:
        return None
    distinct = list(dict.fromkeys(notes))
    reason = "; ".join(distinct[:3])
    if len(distinct) > 3:
        reason += f"; and {len(distinct) - 3} more"
    return reason


class _LastTimestamp:
    """The last wire timestamp decoded and its datetime (the C extension keeps its own)."""

    __slots__ = ("seconds", "value")

    def __init__(self) -> None:
        self.seconds = 0
        self.value = datetime.datetime.fromtimestamp(0, tz=_UTC)


_last_timestamp: Final = _LastTimestamp()


def decode_timestamp(seconds: int) -> datetime.datetime:
    """A wire timestamp as a UTC datetime; values above 0xFFFFFFFF are milliseconds
    (pamqp's rule)."""
    last = _last_timestamp
    if last.seconds == seconds:  # messages published in the same second share it
        return last.value
    value: float = seconds
    if seconds > 0xFFFFFFFF:
        value = seconds / 1000.0
    try:
        result = datetime.datetime.fromtimestamp(value, tz=_UTC)
    except (OverflowError, ValueError, OSError):
        raise _syntax(f"timestamp {seconds} is out of range") from None
    last.seconds = seconds
    last.value = result
    return result


_FIXED_SIZE = {
    0x74: 1,  # t
    0x62: 1,  # b
    0x42: 1,  # B
    0x73: 2,  # s
    0x75: 2,  # u
    0x49: 4,  # I
    0x69: 4,  # i
    0x6C: 8,  # l
    0x4C: 8,  # L
    0x66: 4,  # f
    0x64: 8,  # d
    0x44: 5,  # D
    0x54: 8,  # T
}

_FIXED_STRUCT: dict[int, struct.Struct] = {
    0x62: _I8,
    0x42: _U8,
    0x73: _I16,
    0x75: _U16,
    0x49: _I32,
    0x69: _U32,
    0x6C: _I64,
    0x4C: _I64,
    0x66: _F32,
    0x64: _F64,
}


def _decode_value(
    buf: bytes, kind: int, pos: int, end: int, depth: int, notes: list[str] | None = None
) -> tuple[Any, int]:
    """Decode one value of type ``kind`` whose data starts at ``pos`` (before ``end``);
    ``notes`` as for :func:`_decode_table`."""
    size = _FIXED_SIZE.get(kind)
    if size is not None:
        value_end = pos + size
        if value_end > end:
            raise _syntax(f"field value of type {chr(kind)!r} is truncated")
        fixed = _FIXED_STRUCT.get(kind)
        if fixed is not None:
            return fixed.unpack_from(buf, pos)[0], value_end
        if kind == 0x74:  # t
            return buf[pos] != 0, value_end
        if kind == 0x54:  # T
            if notes is not None:
                return lenient_timestamp(_U64.unpack_from(buf, pos)[0], notes), value_end
            return decode_timestamp(_U64.unpack_from(buf, pos)[0]), value_end
        # D: an unsigned scale octet, then a signed 32-bit mantissa
        scale = buf[pos]
        mantissa = _I32.unpack_from(buf, pos + 1)[0]
        return Decimal(mantissa).scaleb(-scale, _DEC_CONTEXT), value_end
    if kind == 0x53 or kind == 0x78:  # S, x
        value_start = pos + 4
        if value_start > end:
            raise _syntax("string length is truncated")
        value_end = value_start + _U32.unpack_from(buf, pos)[0]
        if value_end > end:
            raise _syntax("string runs past the end of its table or array")
        raw = buf[value_start:value_end]
        if kind == 0x78:
            return bytes(raw), value_end
        try:
            return raw.decode("utf-8"), value_end
        except UnicodeDecodeError:
            return bytes(raw), value_end
    if kind == 0x46 or kind == 0x41:  # F, A
        if depth >= MAX_DEPTH and notes is not None:
            return _skip_too_deep(buf, kind, pos, end, notes)
        if kind == 0x46:
            return _decode_table(buf, pos, end, depth + 1, notes)
        return _decode_array(buf, pos, end, depth + 1, notes)
    if kind == 0x56 or kind == 0x00:  # V, and NUL as pamqp accepts
        return None, pos
    raise _syntax(f"unknown field type {bytes([kind])!r}")
