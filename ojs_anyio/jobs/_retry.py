"""OJS retry policies (``ojs-retry.md``), ISO 8601 durations, and the bounded retry ladder.

Pure functions: no I/O, no clock.  Randomness comes in as a :class:`random.Random`.

Retry policy
    :class:`RetryPolicy` is the wire form (``retry-policy.schema.json``): every field may be
    absent, so a job's ``retry`` object round-trips exactly.  :func:`merge` fills the absent
    fields from the defaults (OJS retry §8.1: 3 attempts, ``PT1S``, x2.0, ``PT5M``, jitter
    on, no non-retryable errors, ``discard``), and :func:`resolve_retry` turns the result
    into an :class:`EffectiveRetryPolicy` with plain millisecond integers.

    The backoff strategy is not part of the schema; OJS retry §3 lets implementations carry
    it in a ``backoff_strategy`` extension field.  We accept that field (``exponential``,
    the default, ``linear``, ``none`` or ``polynomial``) and emit it only when it was set.

Delay formulas (OJS retry §3, §5), for retry number ``n`` (the attempt that just failed)
    exponential ``I * C**(n-1)``; linear ``I * n``; none ``I`` (constant: OJS retry §3.1
    defines ``none`` as a constant ``initial_interval``, not zero); polynomial ``I * n**C``.
    The result is capped at ``max_interval``, multiplied by ``0.5 + random()`` (a factor in
    ``[0.5, 1.5)``) when jitter is on, capped again, and rounded to whole milliseconds.

The retry ladder (DECISIONS 4)
    Jitter would give nearly every failure its own ``delay_ms`` and so its own retry queue
    ``ojs.queue.retry.{q}.{delay_ms}``.  :func:`ladder_delay_ms` rounds each delay to the
    nearest rung of :data:`RETRY_LADDER_MS`, a fixed series of "round" durations from
    100 ms to 24 h (a 1-2-5 series that also holds the usual caps 30 s, 5 min, 30 min, 1 h):
    100, 200, 500 ms; 1, 2, 5, 10, 20, 30 s; 1, 2, 5, 10, 20, 30 min; 1, 2, 3, 6, 12, 24 h.
    So a job queue never has more than :data:`MAX_RETRY_QUEUES` (21) retry queues, whatever
    the policies of its jobs.  Neighbouring rungs are at most x2.5 apart, so rounding moves a
    delay by at most 43 % (typically far less than the jitter itself).  Delays above 24 h
    are clamped to 24 h.  With ``max_ms`` (a policy's ``max_interval``) the rung never
    exceeds the cap unless the cap is below the lowest rung.
"""

from __future__ import annotations

import math
import random
import re
from bisect import bisect_left
from decimal import ROUND_HALF_EVEN, Decimal
from functools import lru_cache
from typing import Annotated, Any, Final, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from ojs_anyio.amqp import UsageError

from ._errors import InvalidDurationError, InvalidJobError

__all__ = [
    "DEFAULT_RETRY_POLICY",
    "MAX_RETRY_QUEUES",
    "RETRY_LADDER_MS",
    "BackoffStrategy",
    "EffectiveRetryPolicy",
    "OnExhaustion",
    "RetryPolicy",
    "compute_delay_ms",
    "format_duration_ms",
    "has_attempts_left",
    "is_retryable",
    "ladder_delay_ms",
    "merge",
    "parse_duration_ms",
    "resolve_retry",
    "retry_queue_delay_ms",
    "validate_duration_syntax",
]

BackoffStrategy = Literal["exponential", "linear", "none", "polynomial"]
OnExhaustion = Literal["discard", "dead_letter"]

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

Duration = Annotated[str, Meta(pattern=DURATION_PATTERN)]


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


class RetryPolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """An OJS retry policy as on the wire: any field may be absent (``UNSET``).

    Construct partial policies freely; :func:`merge` / :func:`resolve_retry` apply defaults.
    Errors raised by construction name the field relative to the policy (``max_interval``);
    inside a job envelope the path is prefixed with ``retry.``.
    """

    max_attempts: Annotated[int, Meta(ge=0)] | UnsetType = UNSET
    initial_interval: Duration | UnsetType = UNSET
    backoff_coefficient: Annotated[float, Meta(ge=1.0)] | UnsetType = UNSET
    max_interval: Duration | UnsetType = UNSET
    jitter: bool | UnsetType = UNSET
    non_retryable_errors: tuple[Annotated[str, Meta(min_length=1)], ...] | UnsetType = UNSET
    on_exhaustion: OnExhaustion | UnsetType = UNSET
    #: Extension field (OJS retry §3); absent means exponential.
    backoff_strategy: BackoffStrategy | UnsetType = UNSET

    def __post_init__(self) -> None:
        _check_policy(self)


def _interval_ms(field: str, value: str | UnsetType) -> int | None:
    if value is UNSET:
        return None
    try:
        return parse_duration_ms(value)
    except InvalidDurationError as exc:
        raise InvalidJobError(field, str(exc)) from None


def _check_policy(policy: RetryPolicy) -> None:
    """The rules the schema's keywords cannot say (OJS retry §11.1, uniqueItems)."""
    initial = _interval_ms("initial_interval", policy.initial_interval)
    maximum = _interval_ms("max_interval", policy.max_interval)
    if initial is not None and initial <= 0:
        raise InvalidJobError("initial_interval", "must be greater than zero")
    if initial is not None and maximum is not None and maximum < initial:
        raise InvalidJobError(
            "max_interval", f"must be >= initial_interval ({policy.max_interval} < {policy.initial_interval})"
        )
    errors = policy.non_retryable_errors
    if errors is not UNSET and len(set(errors)) != len(errors):
        raise InvalidJobError("non_retryable_errors", "items must be unique")


class EffectiveRetryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """A retry policy with every default applied and the durations in milliseconds."""

    max_attempts: int
    initial_interval_ms: int
    backoff_coefficient: float
    max_interval_ms: int
    jitter: bool
    non_retryable_errors: tuple[str, ...]
    on_exhaustion: OnExhaustion
    backoff_strategy: BackoffStrategy


#: The OJS default policy (OJS retry §8), with the default strategy made explicit.
DEFAULT_RETRY_POLICY: Final = RetryPolicy(
    max_attempts=3,
    initial_interval="PT1S",
    backoff_coefficient=2.0,
    max_interval="PT5M",
    jitter=True,
    non_retryable_errors=(),
    on_exhaustion="discard",
    backoff_strategy="exponential",
)


def merge(partial: RetryPolicy | None, defaults: RetryPolicy = DEFAULT_RETRY_POLICY) -> RetryPolicy:
    """Fill the fields absent from ``partial`` from ``defaults`` (OJS retry §8.1).

    The merged policy is validated as a whole, so ``{"initial_interval": "PT10M"}`` over
    the default ``PT5M`` cap raises ``InvalidJobError("max_interval", ...)``.
    """
    if partial is None:
        return defaults
    changes = {
        name: getattr(partial, name)
        for name in RetryPolicy.__struct_fields__
        if getattr(partial, name) is not UNSET
    }
    return msgspec.structs.replace(defaults, **changes)  # runs __post_init__, so _check_policy


def resolve_retry(
    policy: RetryPolicy | EffectiveRetryPolicy | UnsetType | None = None,
    defaults: RetryPolicy = DEFAULT_RETRY_POLICY,
) -> EffectiveRetryPolicy:
    """The effective policy for a job's ``retry`` attribute (absent: the defaults)."""
    if isinstance(policy, EffectiveRetryPolicy):
        return policy
    partial = None if isinstance(policy, UnsetType) else policy
    try:
        hash((partial, defaults))
    except TypeError:  # built in code with a list where the type says tuple: skip the cache
        return _resolve.__wrapped__(partial, defaults)
    return _resolve(partial, defaults)


@lru_cache(maxsize=256)  # policies are frozen and hashable; jobs share a handful of them
def _resolve(policy: RetryPolicy | None, defaults: RetryPolicy) -> EffectiveRetryPolicy:
    merged = merge(policy, defaults)

    def value(name: str) -> Any:
        found = getattr(merged, name)
        if found is UNSET:
            raise InvalidJobError(name, "is absent and the defaults give no value")
        return found

    return EffectiveRetryPolicy(
        max_attempts=value("max_attempts"),
        initial_interval_ms=parse_duration_ms(value("initial_interval")),
        backoff_coefficient=float(value("backoff_coefficient")),
        max_interval_ms=parse_duration_ms(value("max_interval")),
        jitter=value("jitter"),
        non_retryable_errors=tuple(value("non_retryable_errors")),
        on_exhaustion=value("on_exhaustion"),
        backoff_strategy=value("backoff_strategy"),
    )


def _raw_delay(eff: EffectiveRetryPolicy, n: int) -> float:
    """The uncapped formula, already clamped to ``max_interval`` where it would overflow."""
    base, coeff, cap = eff.initial_interval_ms, eff.backoff_coefficient, eff.max_interval_ms
    strategy = eff.backoff_strategy
    if strategy == "none":
        return float(base)
    if strategy == "linear":
        return float(min(base * n, cap))
    # exponential: base * coeff**(n-1); polynomial: base * n**coeff.  Compare logarithms
    # first so that attempt 10,000 with coefficient 2 caps instead of overflowing a float.
    log_growth = (n - 1) * math.log(coeff) if strategy == "exponential" else coeff * math.log(n)
    if log_growth >= math.log(cap / base):
        return float(cap)
    return base * math.exp(log_growth)


def compute_delay_ms(
    policy: RetryPolicy | EffectiveRetryPolicy | UnsetType | None, attempt: int, rng: random.Random
) -> int:
    """The OJS retry delay after attempt ``attempt`` (1-based) failed, in milliseconds.

    ``attempt`` is the retry number ``n`` of OJS retry §3: the attempt that just failed,
    so attempt 1 failing gives ``initial_interval`` under every strategy.  The delay is
    capped at ``max_interval``, jittered x[0.5, 1.5) when jitter is on, capped again.
    This is the exact OJS delay; :func:`retry_queue_delay_ms` puts it on the ladder.
    """
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise UsageError(f"attempt must be an int >= 1 (the attempt that failed), got {attempt!r}")
    eff = resolve_retry(policy)
    cap = eff.max_interval_ms
    delay = min(_raw_delay(eff, attempt), float(cap))
    if eff.jitter:
        delay = min(delay * (0.5 + rng.random()), float(cap))
    return max(0, min(round(delay), cap))


def is_retryable(policy: RetryPolicy | EffectiveRetryPolicy | UnsetType | None, error_type: str) -> bool:
    """False when ``error_type`` matches ``non_retryable_errors`` (OJS retry §6.2).

    An entry matches exactly, or, when it ends in ``.*``, as a prefix including the dot:
    ``auth.*`` matches ``auth.forbidden`` but neither ``auth`` nor ``external.auth.x``.
    """
    for entry in resolve_retry(policy).non_retryable_errors:
        if error_type == entry or (entry.endswith(".*") and error_type.startswith(entry[:-1])):
            return False
    return True


def has_attempts_left(policy: RetryPolicy | EffectiveRetryPolicy | UnsetType | None, attempt: int) -> bool:
    """Whether a job whose attempt ``attempt`` (1-based) failed may run again.

    ``max_attempts`` counts every execution: 0 and 1 both mean "never retry".
    """
    return attempt < resolve_retry(policy).max_attempts


#: The rungs of the retry ladder in milliseconds (see the module docstring).
RETRY_LADDER_MS: Final[tuple[int, ...]] = (
    100, 200, 500,
    1_000, 2_000, 5_000, 10_000, 20_000, 30_000,
    60_000, 120_000, 300_000, 600_000, 1_200_000, 1_800_000,
    3_600_000, 7_200_000, 10_800_000, 21_600_000, 43_200_000, 86_400_000,
)  # fmt: skip
#: The most retry queues (``ojs.queue.retry.{q}.{delay_ms}``) one job queue can ever have.
MAX_RETRY_QUEUES: Final = len(RETRY_LADDER_MS)


def ladder_delay_ms(delay_ms: int, *, max_ms: int | None = None) -> int:
    """Round ``delay_ms`` to the nearest rung of :data:`RETRY_LADDER_MS` (ties go up).

    0 stays 0 (retry at once: no retry queue needed); any positive delay gives a rung, so
    never 0.  With ``max_ms`` only rungs ``<= max_ms`` are candidates (the policy's
    ``max_interval`` stays a hard cap), except when ``max_ms`` is below the lowest rung,
    which is then used.  Monotone: a longer delay never gets a shorter rung.
    """
    if isinstance(delay_ms, bool) or not isinstance(delay_ms, int) or delay_ms < 0:
        raise UsageError(f"delay_ms must be a non-negative int, got {delay_ms!r}")
    if delay_ms == 0:
        return 0
    rungs = RETRY_LADDER_MS
    if max_ms is not None:
        rungs = rungs[: max(1, bisect_left(rungs, max_ms + 1))]
    i = bisect_left(rungs, delay_ms)
    if i == 0:
        return rungs[0]
    if i == len(rungs):
        return rungs[-1]
    lower, upper = rungs[i - 1], rungs[i]
    return lower if delay_ms - lower < upper - delay_ms else upper


def retry_queue_delay_ms(
    policy: RetryPolicy | EffectiveRetryPolicy | UnsetType | None, attempt: int, rng: random.Random
) -> int:
    """The ladder delay (the ``{delay_ms}`` of the retry queue) after attempt ``attempt`` failed."""
    eff = resolve_retry(policy)
    return ladder_delay_ms(compute_delay_ms(eff, attempt, rng), max_ms=eff.max_interval_ms)
