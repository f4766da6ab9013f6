"""What every command shares: exit codes, one-line errors, output, the connection."""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any, NoReturn

from .. import Client, amqp, connect
from ..jobs import DEFAULT_URL, InvalidDurationError, parse_duration_ms

__all__ = [
    "EXIT_APP",
    "EXIT_AUTH",
    "EXIT_BROKER",
    "EXIT_CONNECT",
    "EXIT_DIFFERENT",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_UNINTERRUPTIBLE",
    "EXIT_USAGE",
    "CLIError",
    "broker_where",
    "count_arg",
    "open_client",
    "parse_duration",
    "print_json",
    "print_table",
    "refuse_memory",
    "resolve_url",
]

#: Exit codes, documented in docs/cli.md.
EXIT_OK = 0
EXIT_DIFFERENT = 1  # topology check found a difference
EXIT_USAGE = 2  # bad arguments: bad URL, bad --args JSON, bad duration (argparse uses 2 too)
EXIT_CONNECT = 3  # the broker cannot be reached
EXIT_AUTH = 4  # authentication failed, access refused, no such vhost
EXIT_NOT_FOUND = 5  # a queue or a job that does not exist
EXIT_APP = 6  # module:attribute does not import or is not the right object
EXIT_BROKER = 7  # the broker refused the operation (conflicting declaration, queue full, ...)
EXIT_CRASHING = 8  # the supervisor gave up: workers keep crashing
EXIT_UNINTERRUPTIBLE = 9  # cancel asked, but the handler runs in a thread: it runs to completion
EXIT_INTERRUPTED = 130  # stopped by SIGINT before finishing


class CLIError(Exception):
    """An expected failure: printed as one line on stderr, exits with ``code``."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def resolve_url(url: str | None) -> str:
    return url or os.environ.get("OJS_AMQP_URL") or DEFAULT_URL


def refuse_memory(url: str) -> None:
    """Every command but ``demo`` works with a broker that other processes see: refuse
    ``memory://`` (and raise :class:`amqp.InvalidURL` for a malformed URL, before any I/O)."""
    if amqp.parse_url(url).memory:
        raise CLIError(
            "--url names the in-process memory broker, which lives inside this ojs-anyio process and "
            "vanishes with it: no other process (a worker, a producer, the next command) would see "
            "what this command does; give the amqp:// URL of a RabbitMQ",
            EXIT_USAGE,
        )


def count_arg(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: a whole number, ``minimum`` or more (a bad one is a one-line
    usage error, before anything is sent)."""

    def whole_number(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {minimum} or more, got {value}")
        return value

    return whole_number


def redact(text: str, url: str | None) -> str:
    """``text`` with the URL's password replaced by ``***``, wherever it appears."""
    if not url:
        return text
    try:
        parsed = amqp.parse_url(url)
    except amqp.InvalidURL:
        # Hide whatever sits between "user:" and "@" in the raw URL.
        return text.replace(url, re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url))
    text = text.replace(url, parsed.redacted())
    if parsed.password and parsed.password != parsed.username and len(parsed.password) >= 3:
        text = text.replace(parsed.password, "***")
    return text


def error_for(exc: BaseException, url: str | None) -> CLIError:
    """Map a library exception onto a one-line message and an exit code."""
    from .. import PushError, PushNotSentError, QueueNotFoundError, TopologyConflictError

    where = broker_where(url)
    if isinstance(exc, CLIError):
        return exc
    if isinstance(exc, amqp.InvalidURL):
        return CLIError(f"{exc} (set --url or $OJS_AMQP_URL)", EXIT_USAGE)
    ours = amqp.DeliveryAlreadySettledError | amqp.StaleDeliveryError  # a bug here, not bad input
    if isinstance(exc, amqp.UsageError) and not isinstance(exc, ours):
        return CLIError(str(exc), EXIT_USAGE)  # a bad job id, argument, duration, queue name, number...
    if isinstance(exc, QueueNotFoundError):
        return CLIError(str(exc), EXIT_NOT_FOUND)
    if isinstance(exc, amqp.AuthenticationError):
        return CLIError(f"authentication failed{where}: check the user name and password", EXIT_AUTH)
    if isinstance(exc, amqp.AccessRefused):
        return CLIError(f"access refused{where}: {_reply(exc)}", EXIT_AUTH)
    if isinstance(exc, amqp.ConnectionLevelError) and getattr(exc, "reply_code", None) == 530:
        return CLIError(f"the broker refused the connection{where}: {_reply(exc)}", EXIT_AUTH)
    if isinstance(exc, amqp.ConnectionLostError | amqp.ConnectionClosedError | OSError | PushNotSentError):
        return CLIError(f"cannot reach the broker{where}: {exc}", EXIT_CONNECT)
    if isinstance(exc, amqp.NotFound):
        return CLIError(f"not found: {_reply(exc)}", EXIT_NOT_FOUND)
    if isinstance(exc, TopologyConflictError):
        return CLIError(str(exc), EXIT_BROKER)
    if isinstance(exc, PushError | amqp.AMQPError):
        return CLIError(str(exc), EXIT_BROKER)
    if isinstance(exc, TimeoutError):
        return CLIError(f"timed out talking to the broker{where}", EXIT_CONNECT)
    raise exc


def broker_where(url: str | None) -> str:
    """`` at amqp://user:***@host:port/vhost`` for an error line (empty for no or a bad URL)."""
    if url is None:
        return ""
    try:
        return f" at {amqp.parse_url(url).redacted()}"
    except amqp.InvalidURL:
        return ""


def _reply(exc: BaseException) -> str:
    text = getattr(exc, "reply_text", None)
    return str(text) if text else str(exc)


def fail(message: str, code: int) -> NoReturn:
    raise CLIError(message, code)


@asynccontextmanager
async def open_client(
    url: str | None, prefix: str, *, recovery: bool = False, role: str = "cli"
) -> AsyncIterator[Client]:
    """``ojs_anyio.connect`` for a command: no recovery (fail fast), 10 s to connect; the
    connection is named ``ojs-anyio {role} pid=N`` for ``rabbitmqctl list_connections``."""
    policy = amqp.RecoveryPolicy() if recovery else amqp.RecoveryPolicy(enabled=False)
    name = f"ojs-anyio {role} pid={os.getpid()}"
    async with connect(
        resolve_url(url), prefix=prefix, recovery=policy, connection_timeout=10.0, name=name
    ) as client:
        yield client


# ------------------------------------------------------------------ durations

_SUFFIX = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)?")
_SUFFIX_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000, None: 1000}


def parse_duration(text: str, what: str) -> timedelta:
    """``30``, ``2.5``, ``30s``, ``500ms``, ``5m``, ``2h``, ``7d``, or ISO 8601 (``PT30S``, ``P180D``)."""
    text = text.strip()
    if text[:1] in ("P", "p"):
        try:
            return timedelta(milliseconds=parse_duration_ms(text.upper()))
        except InvalidDurationError as exc:
            fail(f"{what}: {exc}", EXIT_USAGE)
    match = _SUFFIX.fullmatch(text)
    if match is None:
        fail(
            f"{what}: {text!r} is not a duration; use seconds (30, 2.5), a unit (500ms, 30s, 5m, 2h, 7d) "
            "or ISO 8601 (PT30S, P180D)",
            EXIT_USAGE,
        )
    try:
        return timedelta(milliseconds=float(match.group(1)) * _SUFFIX_MS[match.group(2)])
    except OverflowError:
        fail(f"{what}: {text!r} is too long (more than {timedelta.max.days} days)", EXIT_USAGE)


def format_age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.1f}s"


# ---------------------------------------------------------------------- output


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[str(h) for h in headers], *([("-" if c is None else str(c)) for c in row] for row in rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for row in cells:
        sys.stdout.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n")


# --------------------------------------------------------------------- logging

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JSONFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, pid, the record's extras,
    and the traceback when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["traceback"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JSONFormatter())
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s [%(process)d] %(name)s: %(message)s")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    try:
        root.setLevel(level.upper())
    except ValueError:
        fail(f"--log-level: unknown level {level!r} (DEBUG, INFO, WARNING, ERROR)", EXIT_USAGE)
