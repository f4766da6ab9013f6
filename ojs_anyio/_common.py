"""What jobs and events share below both: ids, the tracing probe, one error out of a group.

A leaf: no project module.

* :func:`new_id`: the one id generator of the library (job ids, event message ids).
  UUIDv7 text as ``str(uuid6.uuid7())`` gives it (48-bit millisecond time, version 7,
  variant ``10``), ordered as uuid6 orders its ids: strictly increasing within a process.
  The 74 other bits are a per-process random part (42 bits) and a 32-bit counter, so the
  time prefix is formatted once per millisecond and an id costs one small int format.
  Measured with ``timeit`` on the 2-core test machine (issue 25): 0.4-0.6 µs an id
  against 3.5-7.6 µs for ``str(uuid6.uuid7())`` (1.8 µs for a per-id random UUIDv7), and
  ``new_job`` + ``encode_job`` took 8.4 µs with it against 11.4 µs with uuid6 (x1.36):
  too much for the push path, hence one generator of our own.
  ``tests/jobs/test_ids.py`` checks format and ordering against ``uuid6``.
* :func:`tracing_recording`: whether a tracer records spans (an SDK tracer provider is
  installed, or the tracer is one): the probe the job and event layers ask before every
  span.  (Whether an SDK *meter* provider is installed is ``amqp.sdk_meter_provider_installed``.)
* :func:`utc_second`: the one datetime of a whole second (UTC), the AMQP ``timestamp``
  property of what jobs and events publish.  Messages published in the same second share
  one object, so ``datetime.fromtimestamp`` runs once a second.
* :func:`current_backend`: ``"asyncio"`` or ``"trio"``, the backend running the caller,
  without a dependency on sniffio: anyio no longer requires it (only Trio does, and
  imports it), so when sniffio was never imported, no Trio can be running.
* :func:`single_error`: the one real error of a task group's exception group
  (cancellations aside), so callers raise that error, not a group.

State that outlives a call (the id clock, the tracing probe, the last second) lives in
small named objects, never in ``global`` rebinding: ``tests/jobs/test_jobs_structure.py``
forbids the ``global`` statement in the library.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from datetime import UTC, datetime
from typing import Final

import anyio
from opentelemetry import trace

__all__ = ["current_backend", "new_id", "single_error", "tracing_recording", "utc_second"]

# ----------------------------------------------------------------------------- ids

_RANDOM_A: Final = f"{int.from_bytes(os.urandom(2), 'big') & 0xFFF:03x}"
_RANDOM_B: Final = (int.from_bytes(os.urandom(4), "big") & 0x3FFFFFFF) | 0x80000000  # variant 10
_MIDDLE: Final = f"-7{_RANDOM_A}-{_RANDOM_B >> 16:04x}-{_RANDOM_B & 0xFFFF:04x}"


class _IdClock:
    """The millisecond of the last id and its formatted time prefix."""

    __slots__ = ("counter", "ms", "prefix")

    def __init__(self) -> None:
        self.counter = itertools.count()
        self.ms = -1
        self.prefix = ""


_ids: Final = _IdClock()


def new_id() -> str:
    """A new UUIDv7, as text (see the module docstring)."""
    clock = _ids
    ms = time.time_ns() // 1_000_000
    if ms > clock.ms:  # a clock stepping back keeps the last prefix: ids stay ordered
        h = f"{ms & 0xFFFFFFFFFFFF:012x}"
        clock.prefix = f"{h[:8]}-{h[8:]}{_MIDDLE}"
        clock.ms = ms
    return f"{clock.prefix}{next(clock.counter) & 0xFFFFFFFF:08x}"


# ----------------------------------------------------------------------------- time


class _LastSecond:
    """The last whole second asked for and its datetime."""

    __slots__ = ("second", "value")

    def __init__(self) -> None:
        self.second = 0
        self.value = datetime.fromtimestamp(0, UTC)


_last_second: Final = _LastSecond()


def utc_second(second: int) -> datetime:
    """The aware UTC datetime of a whole POSIX second, one object per second."""
    last = _last_second
    if second != last.second:
        last.value = datetime.fromtimestamp(second, UTC)
        last.second = second
    return last.value


# ----------------------------------------------------------------------------- tracing


class _Probe:
    """What is known of the global tracer provider: "records" for good, "not" for a second."""

    __slots__ = ("checked_at", "known")

    def __init__(self) -> None:
        self.known = False
        self.checked_at = -1.0


_probe: Final = _Probe()


def tracing_recording(tracer: trace.Tracer) -> bool:
    """Whether ``tracer`` records spans (else spans are skipped: they would be no-ops).

    A tracer from the API's global proxy follows the global provider, which is set once:
    "yes" is kept for good, "no" for a second (asking reads the environment each time),
    so a provider installed later takes effect within a second."""
    if not isinstance(tracer, trace.ProxyTracer):
        return not isinstance(tracer, trace.NoOpTracer)
    probe = _probe
    if probe.known:
        return True
    now = time.monotonic()
    if now - probe.checked_at < 1.0:
        return False
    probe.checked_at = now
    provider = trace.get_tracer_provider()
    probe.known = not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)
    return probe.known


# ----------------------------------------------------------------------------- backend


def current_backend() -> str:
    """The async library running the calling task: ``"asyncio"`` or ``"trio"``."""
    sniffio = sys.modules.get("sniffio")
    if sniffio is None:  # Trio imports sniffio: without it only asyncio can be running
        return "asyncio"
    name: str = sniffio.current_async_library()
    return name


# ----------------------------------------------------------------------------- errors


def single_error(eg: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The one error in ``eg`` that is not a cancellation (groups flattened), or None when
    there are several (or none)."""
    cancelled = anyio.get_cancelled_exc_class()
    found: BaseException | None = None
    pending: list[BaseException] = [eg]
    while pending:
        exc = pending.pop()
        if isinstance(exc, BaseExceptionGroup):
            pending.extend(exc.exceptions)
        elif not isinstance(exc, cancelled):
            if found is not None:
                return None
            found = exc
    return found
