"""The OJS error object of a failed attempt, how it travels with a retry, and log extras.

The error object (``error.schema.json``) is ``{"type", "message", "backtrace"}``; the
backtrace keeps the innermost 50 frames, each one line (``File "app.py", line 12, in
send: raise PaymentDeclined(...)``), and at most 10,000 characters in all.

The job's body is never rewritten (a retry carries the bytes the producer sent), so the
error travels in headers beside the two that OJS AMQP binding §6.2 names
(``x-ojs-error-code``, ``x-ojs-error-message``): ``x-ojs-error-type`` and
``x-ojs-error-backtrace`` (the frames joined by newlines).  A worker running the next
attempt reads them back, and INFO answers carry the object.
"""

from __future__ import annotations

import json
import traceback
from typing import Any, Final

from ._retry import error_type_name
from ._wire import H_ERRORS

__all__ = [
    "H_ERROR_BACKTRACE",
    "H_ERROR_TYPE",
    "MAX_BACKTRACE_CHARS",
    "MAX_BACKTRACE_FRAMES",
    "MAX_ERROR_HISTORY",
    "error_from_headers",
    "error_history",
    "with_error",
    "error_object",
    "log_extra",
]

H_ERROR_TYPE: Final = "x-ojs-error-type"
H_ERROR_BACKTRACE: Final = "x-ojs-error-backtrace"
MAX_BACKTRACE_FRAMES: Final = 50
MAX_BACKTRACE_CHARS: Final = 10_000


def backtrace(exc: BaseException) -> list[str]:
    """The innermost frames of ``exc``'s traceback, one line each, within both caps."""
    frames = traceback.extract_tb(exc.__traceback__)[-MAX_BACKTRACE_FRAMES:]
    lines = [
        f'File "{f.filename}", line {f.lineno}, in {f.name}' + (f": {f.line.strip()}" if f.line else "")
        for f in frames
    ]
    total = sum(len(line) + 1 for line in lines)
    while lines and total > MAX_BACKTRACE_CHARS:
        total -= len(lines.pop(0)) + 1  # drop the outermost frames first
    if lines and len(lines[-1]) > MAX_BACKTRACE_CHARS:
        lines[-1] = lines[-1][: MAX_BACKTRACE_CHARS - 3] + "..."
    return lines


def error_object(exc: BaseException | None, error_type: str, message: str) -> dict[str, Any]:
    """The OJS error object; ``backtrace`` only when there is an exception with a traceback."""
    out: dict[str, Any] = {"type": error_type or "Error", "message": message or error_type or "error"}
    if exc is not None:
        if not error_type:
            out["type"] = error_type_name(type(exc))
        frames = backtrace(exc)
        if frames:
            out["backtrace"] = frames
    return out


def error_headers(error: dict[str, Any]) -> dict[str, str]:
    """The extra headers a retry carries for ``error`` (besides code and message)."""
    headers = {H_ERROR_TYPE: str(error["type"])[:1000]}
    frames = error.get("backtrace")
    if frames:
        headers[H_ERROR_BACKTRACE] = "\n".join(frames)
    return headers


#: How many of a job's errors travel with it (the OJS retry spec asks for at least 10), and
#: how much of each message (the last error's full object travels in its own headers).
MAX_ERROR_HISTORY: Final = 10
MAX_HISTORY_MESSAGE: Final = 300


def error_history(headers: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The error history a message carries (``x-ojs-errors``), oldest first; ``[]`` when
    absent or unreadable (another implementation's job, a hand-made header)."""
    raw = (headers or {}).get(H_ERRORS)
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", "replace")
    if not isinstance(raw, str):
        return []
    try:
        records = json.loads(raw)
    except ValueError:
        return []
    if not isinstance(records, list):
        return []
    return [r for r in records if isinstance(r, dict) and isinstance(r.get("code"), str)][-MAX_ERROR_HISTORY:]


def with_error(
    headers: dict[str, Any] | None, *, code: str, message: str, error_type: str, attempt: int, at: str
) -> str:
    """The ``x-ojs-errors`` value after one more failed attempt: the last
    :data:`MAX_ERROR_HISTORY` records, messages cut to :data:`MAX_HISTORY_MESSAGE`."""
    record = {
        "code": code,
        "message": message[:MAX_HISTORY_MESSAGE],
        "type": error_type[:200],
        "attempt": attempt,
        "at": at,
    }
    records = [*error_history(headers), record][-MAX_ERROR_HISTORY:]
    return json.dumps(records, separators=(",", ":"), ensure_ascii=False)


def error_from_headers(headers: dict[str, Any] | None) -> dict[str, Any] | None:
    """The previous attempt's error object, from a delivered message's headers (or None)."""
    if not headers:
        return None
    message = headers.get("x-ojs-error-message")
    etype = headers.get(H_ERROR_TYPE)
    if not isinstance(message, str | bytes) and not isinstance(etype, str | bytes):
        return None
    out: dict[str, Any] = {
        "type": _text(etype) or _text(headers.get("x-ojs-error-code")) or "Error",
        "message": _text(message) or "error",
    }
    frames = headers.get(H_ERROR_BACKTRACE)
    if isinstance(frames, str | bytes) and frames:
        out["backtrace"] = _text(frames).split("\n")[-MAX_BACKTRACE_FRAMES:]
    return out


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else ""


def log_extra(job_id: str | None, job_type: str | None, queue: str, attempt: int) -> dict[str, Any]:
    """The ``extra`` of every per-job log record: ``job_id``, ``job_type``, ``queue``, ``attempt``."""
    return {"job_id": job_id, "job_type": job_type, "queue": queue, "attempt": attempt}
