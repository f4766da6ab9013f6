"""The two implementations of the codec's hot path, for tests that must pass on both.

``PURE`` is the pure-Python code.  ``C`` is the C extension ``ojs_codec._speedups``, wrapped
so that every call is also made on the pure-Python function and must come out the same:
deeply equal values of the same types, or an exception of the same type and message.
So a test written against ``impl`` checks the C code against pamqp (its own assertions)
and against the pure-Python code (the wrapper) at once.

Parametrize a test with ``@pytest.mark.parametrize("impl", IMPLS)``.  The C variant is
skipped when the extension cannot be imported; ``test_speedups.py`` fails then, unless
``OJS_CODEC_PURE=1`` says that is intended.
"""

from __future__ import annotations

import dataclasses
import datetime
import struct
from collections.abc import Callable
from decimal import Decimal
from types import ModuleType
from typing import Any

import msgspec
import pytest

import ojs_codec
from ojs_codec import _fast, _frames, _properties, _table

speedups: ModuleType | None
try:
    from ojs_codec import _speedups as speedups
except ImportError:  # not built: the C variant is skipped
    speedups = None

_NAMES = (
    "encode_publish",
    "encode_properties",
    "decode_properties",
    "decode_content_header",
    "decode_content_header_lenient",
    "decode_deliver",
    "decode_return",
    "decode_get_ok",
    "decode_ack",
    "decode_nack",
    "decode_reject",
    "encode_table",
    "decode_table",
    "encode_array",
    "decode_array",
)


@dataclasses.dataclass(frozen=True)
class Impl:
    """One implementation of the hot-path functions."""

    name: str
    encode_publish: Callable[..., bytes]
    encode_properties: Callable[..., bytes]
    decode_properties: Callable[..., ojs_codec.BasicProperties]
    decode_content_header: Callable[..., tuple[int, int, ojs_codec.BasicProperties]]
    decode_content_header_lenient: Callable[..., tuple[int, int, ojs_codec.BasicProperties, str | None]]
    decode_deliver: Callable[..., tuple[str, int, bool, str, str]]
    decode_return: Callable[..., tuple[int, str, str, str]]
    decode_get_ok: Callable[..., tuple[int, bool, str, str, int]]
    decode_ack: Callable[..., tuple[int, bool]]
    decode_nack: Callable[..., tuple[int, bool, bool]]
    decode_reject: Callable[..., tuple[int, bool]]
    encode_table: Callable[..., bytes]
    decode_table: Callable[..., tuple[dict[str, Any], int]]
    encode_array: Callable[..., bytes]
    decode_array: Callable[..., tuple[list[Any], int]]
    split_frames: Callable[[list[tuple[int, int, bytes]], bytes, int], int]

    def reader(self, frame_max: int = ojs_codec.FRAME_MAX_DEFAULT) -> ojs_codec.FrameReader:
        """A FrameReader whose frame-splitting loop is this implementation's."""
        reader = ojs_codec.FrameReader(frame_max)
        reader._split = self.split_frames
        return reader

    def __repr__(self) -> str:
        return self.name


def _pure_functions() -> dict[str, Any]:
    modules = (_fast, _properties, _table)
    found = {name: next(getattr(m, name) for m in modules if hasattr(m, name)) for name in _NAMES}
    found["split_frames"] = _frames._split_frames_py
    return found


_PURE_FUNCTIONS = _pure_functions()
PURE = Impl("pure", **_PURE_FUNCTIONS)


# --- comparing outcomes ---------------------------------------------------------------------


def assert_identical(ours: Any, theirs: Any, path: str = "value") -> None:
    """Deep equality that also checks types at every level, dict order, float bits
    (NaN payloads and -0.0), Decimal exponents and datetime time zones."""
    assert type(ours) is type(theirs), f"{path}: {type(ours).__name__} != {type(theirs).__name__}"
    if isinstance(ours, dict):
        assert list(ours) == list(theirs), f"{path}: keys {list(ours)} != {list(theirs)}"
        for key in ours:
            assert_identical(ours[key], theirs[key], f"{path}[{key!r}]")
    elif isinstance(ours, list | tuple):
        assert len(ours) == len(theirs), f"{path}: length {len(ours)} != {len(theirs)}"
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert_identical(a, b, f"{path}[{i}]")
    elif isinstance(ours, msgspec.Struct):
        for name in ours.__struct_fields__:
            assert_identical(getattr(ours, name), getattr(theirs, name), f"{path}.{name}")
    elif isinstance(ours, float):
        # the bits: NaN payloads and the sign of zero too
        assert struct.pack(">d", ours) == struct.pack(">d", theirs), f"{path}: {ours!r} != {theirs!r}"
    elif isinstance(ours, Decimal):
        assert str(ours) == str(theirs), f"{path}: {ours!r} != {theirs!r}"
    elif isinstance(ours, datetime.datetime):
        assert (ours, ours.tzinfo) == (theirs, theirs.tzinfo), f"{path}: {ours!r} != {theirs!r}"
    else:
        assert ours == theirs, f"{path}: {ours!r} != {theirs!r}"


def _error_signature(exc: BaseException) -> tuple[Any, ...]:
    return (
        type(exc),
        str(exc),
        getattr(exc, "reply_text", None),
        getattr(exc, "code", None),
        getattr(exc, "remote", None),
    )


def _checked(name: str, c_func: Callable[..., Any], pure_func: Callable[..., Any]) -> Callable[..., Any]:
    """c_func, also run as pure_func: both must return identical values or raise the
    same exception (type, message, reply code)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            result = c_func(*args, **kwargs)
        except Exception as c_exc:
            try:
                pure_func(*args, **kwargs)
            except Exception as pure_exc:
                assert _error_signature(c_exc) == _error_signature(pure_exc), f"{name}{args!r:.300}"
                raise c_exc from None
            raise AssertionError(f"{name}: C raised {c_exc!r}, pure Python did not; args {args!r:.300}")
        try:
            expected = pure_func(*args, **kwargs)
        except Exception as pure_exc:
            raise AssertionError(
                f"{name}: pure Python raised {pure_exc!r}, C did not; args {args!r:.300}"
            ) from None
        assert_identical(result, expected, name)
        return result

    call.__name__ = name
    return call


def _checked_split(c_split: Callable[..., int]) -> Callable[[list[tuple[int, int, bytes]], bytes, int], int]:
    def split(result: list[tuple[int, int, bytes]], data: bytes, max_payload: int) -> int:
        expected: list[tuple[int, int, bytes]] = list(result)
        pos = c_split(result, data, max_payload)
        assert pos == _frames._split_frames_py(expected, data, max_payload)
        assert_identical(result, expected, "split_frames")
        return pos

    return split


C: Impl | None = None
if speedups is not None:
    C = Impl(
        "c",
        **{name: _checked(name, getattr(speedups, name), _PURE_FUNCTIONS[name]) for name in _NAMES},
        split_frames=_checked_split(speedups.split_frames),
    )

IMPLS = [
    pytest.param(PURE, id="pure"),
    pytest.param(C, id="c", marks=pytest.mark.skipif(C is None, reason="ojs_codec._speedups is not built")),
]
"""Parametrize with ``@pytest.mark.parametrize("impl", IMPLS)``."""
