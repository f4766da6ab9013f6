"""Checks on what a producer passes: queue name lists and job arguments.

Job arguments travel as JSON (the envelope's ``args`` array).  JSON carries ``None``,
``bool``, ``int``, finite ``float``, ``str``, arrays (``list``, ``tuple``) and objects with
string keys, and nothing else faithfully: a ``datetime`` would arrive as a string, ``bytes``
as base64, a ``set`` as a list, a ``Decimal`` or an enum as something else again.  So
:func:`check_json_args` refuses any other value, naming the argument (``args[1]``,
``args[0]['when']``) and the fix.  To pass such a value, convert it yourself and annotate
the handler's parameter; the worker converts it back (see ``_handlers``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ojs_anyio.amqp import UsageError

from ._errors import ArgumentTypeError
from ._topology import check_queue

__all__ = ["check_json_args", "check_queue_names"]

_SCALARS = frozenset({str, int, bool, type(None)})

_FIXES: dict[str, str] = {
    "datetime": "pass value.isoformat() (an RFC 3339 string) and annotate the handler parameter as "
    "datetime to get a datetime back",
    "date": "pass value.isoformat() and annotate the handler parameter as date",
    "time": "pass value.isoformat() and annotate the handler parameter as time",
    "timedelta": "pass value.total_seconds() and annotate the handler parameter as float (or timedelta)",
    "bytes": "pass base64.b64encode(value).decode() and annotate the handler parameter as bytes",
    "bytearray": "pass base64.b64encode(value).decode() and annotate the handler parameter as bytes",
    "memoryview": "pass base64.b64encode(value).decode() and annotate the handler parameter as bytes",
    "set": "pass sorted(value) (a list) and annotate the handler parameter as set[...]",
    "frozenset": "pass sorted(value) (a list) and annotate the handler parameter as frozenset[...]",
    "UUID": "pass str(value) and annotate the handler parameter as UUID",
    "Decimal": "pass str(value) and annotate the handler parameter as Decimal",
}


def check_queue_names(queues: object, where: str) -> list[str]:
    """``queues`` as a list of valid OJS queue names; a str (not a list) is refused."""
    if isinstance(queues, str | bytes):
        raise ArgumentTypeError(
            f"{where} must be a list of queue names, not a string: write [{queues!r}] "
            f"(a string would be read as the queues {', '.join(repr(c) for c in str(queues)[:5])}…)"
        )
    if not isinstance(queues, Sequence | set | frozenset):
        raise ArgumentTypeError(f"{where} must be a list of queue names, not {type(queues).__name__}")
    names = list(queues)
    if not names:
        raise UsageError(f"{where} must name at least one queue")
    for name in names:
        if not isinstance(name, str):
            raise ArgumentTypeError(f"{where}: queue names are strings, got {type(name).__name__} ({name!r})")
        check_queue(name)
    if len(set(names)) != len(names):
        raise UsageError(f"{where} names a queue twice: {names!r}")
    return names


def check_json_args(args: Sequence[Any], job_type: str = "") -> None:
    """Raise ``TypeError`` for the first value of ``args`` that JSON cannot carry as it is."""
    for i, value in enumerate(args):
        if type(value) in _SCALARS:
            continue
        _check(value, f"args[{i}]", job_type, 0)


def _check(value: Any, path: str, job_type: str, depth: int) -> None:
    cls = type(value)
    if cls in _SCALARS:
        return
    if cls is float:
        if math.isnan(value) or math.isinf(value):
            raise ArgumentTypeError(
                f"{_where(path, job_type)} is {value!r}, which JSON cannot carry (it would arrive as null); "
                "pass a finite number, None, or a string"
            )
        return
    if depth > 100:
        raise ArgumentTypeError(f"{_where(path, job_type)} is nested more than 100 levels deep")
    if cls is list or cls is tuple:
        for i, item in enumerate(value):
            _check(item, f"{path}[{i}]", job_type, depth + 1)
        return
    if cls is dict:
        for key, item in value.items():
            if type(key) is not str:
                raise ArgumentTypeError(
                    f"{_where(path, job_type)} has the key {key!r} ({type(key).__name__}): JSON object keys "
                    "are strings, so it would arrive as a different key; use str keys"
                )
            _check(item, f"{path}[{key!r}]", job_type, depth + 1)
        return
    name = cls.__name__
    shown = name if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    fix = _FIXES.get(name)
    if fix is None:
        for base in cls.__mro__[1:]:
            if base in (str, int, float) or base.__name__ in _FIXES:
                fix = _FIXES.get(base.__name__) or f"pass {base.__name__}(value) (value.value for an enum)"
                break
    if fix is None:
        fix = (
            "pass plain JSON values (dict, list, str, int, float, bool, None), e.g. "
            "msgspec.to_builtins(value) or dataclasses.asdict(value), and annotate the handler "
            "parameter with the type to get it back"
        )
    raise ArgumentTypeError(
        f"{_where(path, job_type)} is a {shown}, which JSON cannot carry faithfully; {fix}"
    )


def _where(path: str, job_type: str) -> str:
    return f"{path} of job {job_type!r}" if job_type else path
