"""ISO 8601 durations as OJS writes them (``PT1S``, ``PT0.5S``, ``P1DT2H``): parse, format.

A leaf of the job layer: it imports only the error types, so both the retry policy and
the duration helper can use it.
"""

from __future__ import annotations

import re
from decimal import ROUND_HALF_EVEN, Decimal
from functools import lru_cache
from typing import Final

from ._errors import InvalidDurationError

__all__ = [
    "DURATION_PATTERN",
    "MAX_DURATION_MS",
    "format_duration_ms",
    "parse_duration_ms",
    "validate_duration_syntax",
]

# The schemas' duration pattern, anchored with \Z so that a trailing newline does not pass.
DURATION_PATTERN: Final = (
    r"^P(?:\d+Y)?(?:\d+M)?(?:\d+W)?(?:\d+D)?(?:T(?:\d+H)?(?:\d+M)?(?:\d+(?:\.\d+)?S)?)?\Z"
)
_DURATION_RE: Final = re.compile(
    r"P(?:(?P<years>\d+)Y)?(?:(?P<months>\d+)M)?(?:(?P<weeks>\d+)W)?(?:(?P<days>\d+)D)?"
    r"(?P<t>T(?:(?P<hours>\d+)H)?(?:(?P<minutes>\d+)M)?(?:(?P<seconds>\d+(?:\.\d+)?)S)?)?"
)
_MS_PER: Final = {"weeks": 604_800_000, "days": 86_400_000, "hours": 3_600_000, "minutes": 60_000}
#: Longest duration we convert: beyond 2**53 ms floats stop being exact (that is 285,000 years).
MAX_DURATION_MS: Final = 2**53 - 1


def _match_duration(text: str) -> re.Match[str]:
    match = _DURATION_RE.fullmatch(text)
    if match is None:
        raise InvalidDurationError(
            f"{text!r} is not an ISO 8601 duration (expected e.g. 'PT1S', 'PT0.5S', 'PT5M', 'P1D')"
        )
    groups = match.groupdict()
    if all(groups[k] is None for k in ("years", "months", "weeks", "days", "hours", "minutes", "seconds")):
        raise InvalidDurationError(f"{text!r} has no components (expected e.g. 'PT1S')")
    if groups["t"] == "T":
        raise InvalidDurationError(f"{text!r} has a 'T' with no hours, minutes or seconds after it")
    return match


def validate_duration_syntax(text: str) -> None:
    """Check the ISO 8601 syntax only (years and months allowed); raise InvalidDurationError."""
    _match_duration(text)


@lru_cache(maxsize=1024)
def parse_duration_ms(text: str) -> int:
    """Parse an ISO 8601 duration (``PT1.5S``, ``PT5M``, ``P1DT2H``, ``P2W``) into milliseconds.

    Weeks, days, hours, minutes and seconds (with a decimal fraction) are accepted; fractions
    below a millisecond are rounded half-to-even.  Years and months are refused because
    their length varies (OJS retry §4.2 does not recommend them for intervals), as is any
    string that is not ISO 8601 syntax, an empty ``P``/``PT``, or a duration over
    :data:`MAX_DURATION_MS`.
    """
    match = _match_duration(text)
    groups = match.groupdict()
    if groups["years"] is not None or groups["months"] is not None:
        raise InvalidDurationError(
            f"{text!r} uses years or months, which have no fixed length; use weeks or days (e.g. 'P30D')"
        )
    total = sum(int(groups[unit]) * per for unit, per in _MS_PER.items() if groups[unit] is not None)
    if groups["seconds"] is not None:
        seconds_ms = (Decimal(groups["seconds"]) * 1000).to_integral_value(rounding=ROUND_HALF_EVEN)
        total += int(seconds_ms)
    if total > MAX_DURATION_MS:
        raise InvalidDurationError(f"{text!r} is too long (more than {MAX_DURATION_MS} ms)")
    return total


def format_duration_ms(ms: int) -> str:
    """Format milliseconds as a canonical ISO 8601 duration: ``PT0.5S``, ``PT5M``, ``P1DT1H``."""
    if isinstance(ms, bool) or not isinstance(ms, int) or ms < 0:
        raise InvalidDurationError(f"a duration must be a non-negative int of milliseconds, got {ms!r}")
    if ms == 0:
        return "PT0S"
    days, rest = divmod(ms, 86_400_000)
    hours, rest = divmod(rest, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds, millis = divmod(rest, 1000)
    out = f"P{days}D" if days else "P"
    time = ""
    if hours:
        time += f"{hours}H"
    if minutes:
        time += f"{minutes}M"
    if seconds or millis:
        time += f"{seconds}.{millis:03d}".rstrip("0").rstrip(".") + "S"
    return out + ("T" + time if time else "")
