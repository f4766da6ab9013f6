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

The retry ladder (a bounded set of retry queues per job queue)
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
from datetime import timedelta
from functools import lru_cache
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from ojs_anyio._ladder import nearest_rung
from ojs_anyio.amqp import UsageError

from ._errors import InvalidDurationError, InvalidJobError
from ._iso_duration import (
    DURATION_PATTERN,
    format_duration_ms,
    parse_duration_ms,
    validate_duration_syntax,
)

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
    "error_type_name",
    "error_type_names",
    "is_retryable",
    "is_retryable_error",
    "ladder_delay_ms",
    "merge",
    "parse_duration_ms",
    "resolve_retry",
    "retry_queue_delay_ms",
    "validate_duration_syntax",
]

BackoffStrategy = Literal["exponential", "linear", "none", "polynomial"]
OnExhaustion = Literal["discard", "dead_letter"]

Duration = Annotated[str, Meta(pattern=DURATION_PATTERN)]

if TYPE_CHECKING:
    # What code may pass; __post_init__ turns it into the wire form (the runtime types below,
    # which are what msgspec decodes a job's ``retry`` object into).
    _Interval = Duration | float | timedelta
    _ErrorEntry = str | type[BaseException]
else:
    _Interval = Duration
    _ErrorEntry = Annotated[str, Meta(min_length=1)]


class RetryPolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """An OJS retry policy as on the wire: any field may be absent (``UNSET``).

    Construct partial policies freely; :func:`merge` / :func:`resolve_retry` apply defaults.
    Errors raised by construction name the field relative to the policy (``max_interval``);
    inside a job envelope the path is prefixed with ``retry.``.
    """

    max_attempts: Annotated[int, Meta(ge=0)] | UnsetType = UNSET
    initial_interval: _Interval | UnsetType = UNSET
    backoff_coefficient: Annotated[float, Meta(ge=1.0)] | UnsetType = UNSET
    max_interval: _Interval | UnsetType = UNSET
    jitter: bool | UnsetType = UNSET
    non_retryable_errors: tuple[_ErrorEntry, ...] | UnsetType = UNSET
    on_exhaustion: OnExhaustion | UnsetType = UNSET
    #: Extension field (OJS retry §3); absent means exponential.
    backoff_strategy: BackoffStrategy | UnsetType = UNSET

    def __post_init__(self) -> None:
        _coerce_fields(self)
        _check_policy(self)

    def carries_classes(self) -> bool:
        """Whether ``non_retryable_errors`` holds exception classes (code-only: they cannot
        travel in a message, so such a policy is for :class:`Worker` only)."""
        errors = self.non_retryable_errors
        return isinstance(errors, tuple) and any(not isinstance(entry, str) for entry in errors)


def _coerce_fields(policy: RetryPolicy) -> None:
    """Bring what code passed into the wire form: intervals given as seconds or a timedelta
    become ISO 8601 strings, a list of errors a tuple; check the error entries."""
    from ._durations import duration_text

    for name in ("initial_interval", "max_interval"):
        value = getattr(policy, name)
        if value is not UNSET and not isinstance(value, str):
            try:
                text = duration_text(value, name)
            except (TypeError, ValueError) as exc:
                raise InvalidJobError(name, str(exc)) from None
            msgspec.structs.force_setattr(policy, name, text)
    errors: Any = policy.non_retryable_errors
    if errors is UNSET:
        return
    if isinstance(errors, str | bytes) or not isinstance(errors, tuple | list):
        raise InvalidJobError(
            "non_retryable_errors",
            f"must be a tuple of exception classes or OJS error types, not {type(errors).__name__} "
            f"({errors!r}); write ({errors!r},) for one entry",
        )
    for entry in errors:
        is_class = isinstance(entry, type) and issubclass(entry, BaseException)
        if not is_class and not (isinstance(entry, str) and entry):
            raise InvalidJobError(
                "non_retryable_errors",
                f"{entry!r} is neither an exception class nor an OJS error type string "
                "(e.g. 'mypkg.errors.PaymentDeclined' or 'mypkg.errors.*')",
            )
    if isinstance(errors, list):
        msgspec.structs.force_setattr(policy, "non_retryable_errors", tuple(errors))


def _interval_ms(field: str, value: object) -> int | None:
    if not isinstance(value, str):  # UNSET (anything else was made a str by _coerce_fields)
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
    non_retryable_errors: tuple[str | type[BaseException], ...]
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
        if isinstance(entry, str) and _matches(error_type, entry):
            return False
    return True


def error_type_names(exc_type: type[BaseException]) -> list[str]:
    """The OJS error types an exception class answers to: its own qualified name and those of
    its base classes (``module.QualName``; builtins and ``__main__`` without the module)."""
    return [error_type_name(cls) for cls in exc_type.__mro__ if issubclass(cls, BaseException)]


def error_type_name(cls: type[BaseException]) -> str:
    """An exception class's OJS error type: ``mypkg.errors.PaymentDeclined``, ``ValueError``."""
    module = cls.__module__
    return cls.__qualname__ if module in ("builtins", "__main__") else f"{module}.{cls.__qualname__}"


def is_retryable_error(
    policy: RetryPolicy | EffectiveRetryPolicy | UnsetType | None, exc: BaseException
) -> bool:
    """False when ``exc`` matches an entry of ``non_retryable_errors``.

    * An exception class matches with ``isinstance``: subclasses count.
    * A string is an OJS error type, matched against the qualified name
      (``module.QualName``) of the exception's class *or any of its base classes*,
      exactly or, when it ends in ``.*``, as a prefix: ``"mypkg.errors.*"`` matches every
      exception defined in ``mypkg.errors`` (and their subclasses elsewhere).
    """
    entries = resolve_retry(policy).non_retryable_errors
    if not entries:
        return True
    names: list[str] | None = None
    for entry in entries:
        if isinstance(entry, str):
            if names is None:
                names = error_type_names(type(exc))
            if any(_matches(name, entry) for name in names):
                return False
        elif isinstance(exc, entry):
            return False
    return True


def _matches(error_type: str, entry: str) -> bool:
    return error_type == entry or (entry.endswith(".*") and error_type.startswith(entry[:-1]))


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
    return nearest_rung(RETRY_LADDER_MS, delay_ms, max_ms=max_ms, error=UsageError)


def retry_queue_delay_ms(
    policy: RetryPolicy | EffectiveRetryPolicy | UnsetType | None, attempt: int, rng: random.Random
) -> int:
    """The ladder delay (the ``{delay_ms}`` of the retry queue) after attempt ``attempt`` failed."""
    eff = resolve_retry(policy)
    return ladder_delay_ms(compute_delay_ms(eff, attempt, rng), max_ms=eff.max_interval_ms)
