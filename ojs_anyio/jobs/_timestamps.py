"""RFC 3339 timestamps as OJS writes and reads them (OJS JSON format §5): parsing with
calendar checks, formatting in UTC with milliseconds.  Pure; a leaf."""

from __future__ import annotations

import calendar
import re
from datetime import UTC, datetime, timedelta, timezone
from typing import Final

from ojs_anyio.amqp import UsageError

__all__ = ["TIMESTAMP_PATTERN", "format_timestamp", "match_timestamp", "parse_timestamp"]

TIMESTAMP_PATTERN: Final = r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[Zz]|[+-]\d{2}:\d{2})\Z"

_TIMESTAMP_RE: Final = re.compile(
    r"(?P<y>\d{4})-(?P<mo>\d{2})-(?P<d>\d{2})[Tt](?P<h>\d{2}):(?P<mi>\d{2}):(?P<s>\d{2})"
    r"(?:\.(?P<frac>\d+))?(?:(?P<z>[Zz])|(?P<sign>[+-])(?P<oh>\d{2}):(?P<om>\d{2}))"
)


def match_timestamp(text: str) -> re.Match[str]:
    """Match an RFC 3339 timestamp and check its ranges (without building a datetime)."""
    match = _TIMESTAMP_RE.fullmatch(text)
    if match is None:
        raise UsageError(f"{text!r} is not an RFC 3339 timestamp with a timezone ('2026-02-15T10:30:00Z')")
    year, month, day = int(match["y"]), int(match["mo"]), int(match["d"])
    if not (year >= 1 and 1 <= month <= 12 and 1 <= day <= _days_in_month(year, month)):
        raise UsageError(f"{text!r} is not a calendar date")
    if int(match["h"]) > 23 or int(match["mi"]) > 59 or int(match["s"]) > 60:
        raise UsageError(f"{text!r} is not a time of day")
    if not match["z"] and (int(match["oh"]) > 23 or int(match["om"]) > 59):
        raise UsageError(f"{text!r} has an invalid UTC offset")
    if year in (1, 9999):  # only there can a leap second or an offset leave datetime's range
        try:
            _to_datetime(match).astimezone(UTC)
        except OverflowError:
            raise UsageError(f"{text!r} is outside the range of timestamps (years 1 to 9999 UTC)") from None
    return match


_DAYS_IN_MONTH: Final = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _days_in_month(year: int, month: int) -> int:
    return 29 if month == 2 and calendar.isleap(year) else _DAYS_IN_MONTH[month - 1]


def parse_timestamp(text: str) -> datetime:
    """Parse an RFC 3339 timestamp into an aware datetime (OJS JSON format §5).

    The offset is kept.  Fractions beyond microseconds are truncated; a leap second
    (``:60``) becomes the first instant of the next minute.  Raises ``ValueError``.
    """
    return _to_datetime(match_timestamp(text))


def _to_datetime(match: re.Match[str]) -> datetime:
    if match["z"]:
        tz = UTC
    else:
        offset = timedelta(hours=int(match["oh"]), minutes=int(match["om"]))
        tz = timezone(-offset if match["sign"] == "-" else offset)
    second = int(match["s"])
    micros = int((match["frac"] or "0")[:6].ljust(6, "0"))
    leap = second == 60
    fields = (int(match["y"]), int(match["mo"]), int(match["d"]), int(match["h"]), int(match["mi"]))
    result = datetime(*fields, 59 if leap else second, micros, tzinfo=tz)
    return result + timedelta(seconds=1) if leap else result


# The last moment formatted and its text: a push formats its ``now`` for the job it returns
# and for the message's header (datetimes are immutable, so the same object, the same text);
# and the last second formatted, as its fields (second first: the one that changes) and its
# text ("2026-02-15T10:30:00"): moments in the same second only add their milliseconds to it.
class _LastFormatted:
    __slots__ = ("fields", "moment", "second", "text")

    def __init__(self) -> None:
        self.moment: datetime | None = None
        self.text = ""
        self.fields: tuple[int, ...] = ()
        self.second = ""


_last_formatted: Final = _LastFormatted()
#: ".000Z" to ".999Z": a moment's milliseconds, looked up (twice as fast as formatting them).
_MILLIS: Final = tuple(f".{ms:03d}Z" for ms in range(1000))


def format_timestamp(moment: datetime) -> str:
    """Format an aware datetime as RFC 3339 UTC with milliseconds: ``2026-02-15T10:30:00.000Z``."""
    last = _last_formatted
    if moment is last.moment:
        return last.text
    if moment.tzinfo is UTC:
        utc = moment
    elif moment.tzinfo is None or moment.utcoffset() is None:
        raise UsageError("timestamps must be timezone-aware (OJS JSON format §5.3)")
    else:
        utc = moment.astimezone(UTC)
    # Twice per push: the second's text from C ("...T10:30:00+00:00", once a second), then
    # the milliseconds, truncated as isoformat does; a fourth of the time of isoformat each time.
    fields = (utc.second, utc.minute, utc.hour, utc.day, utc.month, utc.year)
    if fields != last.fields:
        last.fields = fields
        last.second = utc.isoformat(timespec="seconds")[:-6]
    text = last.second + _MILLIS[utc.microsecond // 1000]
    last.moment = moment
    last.text = text
    return text
