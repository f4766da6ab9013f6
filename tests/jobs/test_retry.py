"""OJS retry policies: durations, merging, delay formulas, matching, and the retry ladder."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ojs_anyio.amqp import UsageError
from ojs_anyio.jobs._errors import InvalidDurationError, InvalidJobError
from ojs_anyio.jobs._retry import (
    DEFAULT_RETRY_POLICY,
    MAX_RETRY_QUEUES,
    RETRY_LADDER_MS,
    RetryPolicy,
    compute_delay_ms,
    format_duration_ms,
    has_attempts_left,
    is_retryable,
    ladder_delay_ms,
    merge,
    parse_duration_ms,
    resolve_retry,
    retry_queue_delay_ms,
    validate_duration_syntax,
)

#: Pure test module: runs under ``pytest -m "not broker"`` (see tests/conftest.py).

# ------------------------------------------------------------------ durations


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("PT1S", 1000),
        ("PT0.5S", 500),
        ("PT1.25S", 1250),
        ("PT0.0005S", 0),  # half-even below a millisecond
        ("PT0.0015S", 2),
        ("PT5M", 300_000),
        ("PT1M30S", 90_000),
        ("PT1H", 3_600_000),
        ("PT24H", 86_400_000),
        ("P1D", 86_400_000),
        ("P1DT2H", 93_600_000),
        ("P2W", 1_209_600_000),
        ("PT0S", 0),
    ],
)
def test_parse_duration(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize(
    "text",
    [
        "",
        "P",
        "PT",
        "P1DT",
        "1S",
        "PT1.S",
        "PT.5S",
        "PT-1S",
        "PT1S\n",
        "pt1s",
        "PT1H1H",
        "PT1S1M",
        "P1.5D",
        "PT1,5S",
    ],
)
def test_parse_duration_rejects_garbage(text: str) -> None:
    with pytest.raises(InvalidDurationError):
        parse_duration_ms(text)


@pytest.mark.parametrize("text", ["P1Y", "P1M", "P1Y2M3D"])
def test_years_and_months_are_syntax_but_not_intervals(text: str) -> None:
    validate_duration_syntax(text)
    with pytest.raises(InvalidDurationError, match="no fixed length"):
        parse_duration_ms(text)


def test_too_long_duration() -> None:
    with pytest.raises(InvalidDurationError, match="too long"):
        parse_duration_ms("P999999999999D")


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "PT0S"),
        (500, "PT0.5S"),
        (1000, "PT1S"),
        (1250, "PT1.25S"),
        (300_000, "PT5M"),
        (3_600_000, "PT1H"),
        (86_400_000, "P1D"),
        (90_061_001, "P1DT1H1M1.001S"),
    ],
)
def test_format_duration(ms: int, text: str) -> None:
    assert format_duration_ms(ms) == text


@given(st.integers(min_value=0, max_value=10**13))
def test_format_then_parse_is_identity(ms: int) -> None:
    assert parse_duration_ms(format_duration_ms(ms)) == ms


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_format_duration_rejects(bad: object) -> None:
    with pytest.raises(InvalidDurationError):
        format_duration_ms(bad)  # type: ignore[arg-type]


# ------------------------------------------------------------------ policies


def test_defaults_are_ojs_defaults() -> None:
    eff = resolve_retry(None)
    assert (eff.max_attempts, eff.initial_interval_ms, eff.backoff_coefficient, eff.max_interval_ms) == (
        3,
        1000,
        2.0,
        300_000,
    )
    assert (eff.jitter, eff.non_retryable_errors, eff.on_exhaustion, eff.backoff_strategy) == (
        True,
        (),
        "discard",
        "exponential",
    )


def test_partial_policy_merges_with_defaults() -> None:  # OJS retry §8.1 example
    merged = merge(RetryPolicy(max_attempts=10, on_exhaustion="dead_letter"))
    assert merged == RetryPolicy(
        max_attempts=10,
        initial_interval="PT1S",
        backoff_coefficient=2.0,
        max_interval="PT5M",
        jitter=True,
        non_retryable_errors=(),
        on_exhaustion="dead_letter",
        backoff_strategy="exponential",
    )
    assert merge(None) is DEFAULT_RETRY_POLICY
    custom = RetryPolicy(max_attempts=1, initial_interval="PT2S", max_interval="PT2S")
    assert merge(RetryPolicy(), custom) == custom


def test_merge_checks_the_merged_policy() -> None:
    with pytest.raises(InvalidJobError) as info:
        merge(RetryPolicy(initial_interval="PT10M"))
    assert info.value.field == "max_interval"
    with pytest.raises(InvalidJobError, match="defaults give no value"):
        resolve_retry(RetryPolicy(), defaults=RetryPolicy(max_attempts=1))


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"initial_interval": "PT0S"}, "initial_interval"),
        ({"initial_interval": "PT5S", "max_interval": "PT1S"}, "max_interval"),
        ({"max_interval": "garbage"}, "max_interval"),
        ({"non_retryable_errors": ("a", "a")}, "non_retryable_errors"),
    ],
)
def test_policy_construction_checks(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidJobError) as info:
        RetryPolicy(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


def no_jitter(**kwargs: object) -> RetryPolicy:
    return RetryPolicy(jitter=False, **kwargs)  # type: ignore[arg-type]


RNG = random.Random(0)


@pytest.mark.parametrize(
    ("policy", "delays"),
    [
        # OJS retry §3.3: exponential 1s x2, capped at 5 min on the 10th retry.
        (no_jitter(), [1000, 2000, 4000, 8000, 16000, 32000, 64000, 128000, 256000, 300000, 300000]),
        # §3.2 linear, §3.1 none (constant initial_interval).
        (no_jitter(initial_interval="PT5S", backoff_strategy="linear"), [5000, 10000, 15000, 20000]),
        (no_jitter(initial_interval="PT5S", backoff_strategy="none"), [5000, 5000, 5000, 5000]),
        # §3.4 / §12.3 polynomial: 15 s * n^4, capped at 1 h.
        (
            no_jitter(
                initial_interval="PT15S",
                backoff_coefficient=4.0,
                max_interval="PT1H",
                backoff_strategy="polynomial",
            ),
            [15000, 240000, 1215000, 3600000, 3600000],
        ),
        # coefficient 1.0 with max == initial: constant (§12.5).
        (no_jitter(initial_interval="PT10S", backoff_coefficient=1.0, max_interval="PT10S"), [10000] * 4),
    ],
)
def test_delay_formulas(policy: RetryPolicy, delays: list[int]) -> None:
    assert [compute_delay_ms(policy, n, RNG) for n in range(1, len(delays) + 1)] == delays


def test_huge_attempts_do_not_overflow() -> None:
    for strategy in ("exponential", "polynomial", "linear", "none"):
        policy = no_jitter(backoff_coefficient=3.5, backoff_strategy=strategy)
        assert compute_delay_ms(policy, 10**9, RNG) <= 300_000
    assert compute_delay_ms(None, 10**9, RNG) <= 300_000


@pytest.mark.parametrize("bad", [0, -1, True, 1.0])
def test_attempt_must_be_positive_int(bad: object) -> None:
    with pytest.raises(ValueError, match="attempt"):
        compute_delay_ms(None, bad, RNG)  # type: ignore[arg-type]


def formula_ms(strategy: str, initial: int, coeff: float, cap: int, n: int) -> float:
    """OJS retry §3 written out plainly, capped at ``cap``."""
    try:
        if strategy == "exponential":
            raw = initial * coeff ** (n - 1)
        elif strategy == "polynomial":
            raw = initial * float(n) ** coeff
        elif strategy == "linear":
            raw = float(initial * n)
        else:
            raw = float(initial)
    except OverflowError:
        raw = math.inf
    return min(raw, float(cap))


@given(
    strategy=st.sampled_from(["exponential", "linear", "none", "polynomial"]),
    initial=st.integers(1, 60_000),
    extra=st.integers(0, 3_600_000),
    coeff=st.floats(1.0, 5.0),
    attempt=st.integers(1, 200),
    jitter=st.booleans(),
    seed=st.integers(0, 2**32),
)
def test_delay_is_formula_within_jitter_and_cap(
    strategy: str, initial: int, extra: int, coeff: float, attempt: int, jitter: bool, seed: int
) -> None:
    cap = initial + extra
    policy = RetryPolicy(
        initial_interval=format_duration_ms(initial),
        max_interval=format_duration_ms(cap),
        backoff_coefficient=coeff,
        jitter=jitter,
        backoff_strategy=strategy,  # type: ignore[arg-type]
    )
    expected = formula_ms(strategy, initial, coeff, cap, attempt)
    delay = compute_delay_ms(policy, attempt, random.Random(seed))
    assert 0 <= delay <= cap
    if jitter:
        assert 0.5 * expected * (1 - 1e-9) - 0.5 <= delay <= min(1.5 * expected, cap) * (1 + 1e-9) + 0.5
    else:
        assert delay == pytest.approx(expected, rel=1e-9, abs=0.5)


def test_jitter_spreads_over_the_whole_range() -> None:
    rng = random.Random(42)
    delays = [
        compute_delay_ms(RetryPolicy(initial_interval="PT10S", max_interval="PT1H"), 1, rng)
        for _ in range(2000)
    ]
    assert 5000 <= min(delays) < 5100
    assert 14900 < max(delays) < 15000


@pytest.mark.parametrize(
    ("error_type", "retryable"),
    [
        ("validation.payload_invalid", False),  # exact (OJS retry §6.2 table)
        ("validation.schema_error", True),
        ("auth.token_expired", False),  # prefix auth.*
        ("auth.forbidden", False),
        ("auth", True),
        ("external.auth.failure", True),
        ("ValidationError", True),
    ],
)
def test_non_retryable_matching(error_type: str, retryable: bool) -> None:
    policy = RetryPolicy(non_retryable_errors=("validation.payload_invalid", "auth.*"))
    assert is_retryable(policy, error_type) is retryable
    assert is_retryable(None, error_type) is True


@pytest.mark.parametrize(
    ("max_attempts", "attempt", "left"),
    [(0, 1, False), (1, 1, False), (3, 1, True), (3, 2, True), (3, 3, False), (25, 24, True)],
)
def test_attempts_left(max_attempts: int, attempt: int, left: bool) -> None:
    assert has_attempts_left(RetryPolicy(max_attempts=max_attempts), attempt) is left


# ------------------------------------------------------------------ ladder


def test_ladder_is_small_sorted_and_stated() -> None:
    assert list(RETRY_LADDER_MS) == sorted(set(RETRY_LADDER_MS))
    assert MAX_RETRY_QUEUES == len(RETRY_LADDER_MS) == 21
    assert RETRY_LADDER_MS[0] == 100
    assert RETRY_LADDER_MS[-1] == 86_400_000
    assert all(b / a <= 2.5 for a, b in itertools.pairwise(RETRY_LADDER_MS))
    for common in ("PT1S", "PT30S", "PT1M", "PT5M", "PT30M", "PT1H", "PT24H"):
        assert parse_duration_ms(common) in RETRY_LADDER_MS


@pytest.mark.parametrize(
    ("delay", "rung"),
    [
        (0, 0),
        (1, 100),
        (149, 100),
        (150, 200),
        (350, 500),
        (1_400, 1_000),
        (1_500, 2_000),
        (250_000, 300_000),
        (10**12, 86_400_000),
    ],
)
def test_ladder_examples(delay: int, rung: int) -> None:
    assert ladder_delay_ms(delay) == rung


def test_ladder_respects_max() -> None:
    assert ladder_delay_ms(290_000, max_ms=300_000) == 300_000
    assert ladder_delay_ms(450_000, max_ms=300_000) == 300_000  # nearest would be 600_000
    assert ladder_delay_ms(299_999, max_ms=299_999) == 120_000
    assert ladder_delay_ms(40, max_ms=50) == 100  # cap below the lowest rung: the lowest rung


@given(st.integers(0, 2 * 86_400_000), st.none() | st.integers(1, 2 * 86_400_000))
def test_ladder_is_bounded_and_nearest(delay: int, max_ms: int | None) -> None:
    rung = ladder_delay_ms(delay, max_ms=max_ms)
    if delay == 0:
        assert rung == 0
        return
    assert rung in RETRY_LADDER_MS
    allowed = [r for r in RETRY_LADDER_MS if max_ms is None or r <= max_ms] or [RETRY_LADDER_MS[0]]
    assert rung in allowed
    assert all(abs(delay - rung) <= abs(delay - other) for other in allowed)


@given(st.integers(0, 2 * 86_400_000), st.integers(0, 2 * 86_400_000), st.none() | st.integers(1, 10**9))
def test_ladder_is_monotone(a: int, b: int, max_ms: int | None) -> None:
    low, high = sorted((a, b))
    assert ladder_delay_ms(low, max_ms=max_ms) <= ladder_delay_ms(high, max_ms=max_ms)


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_ladder_rejects(bad: object) -> None:
    with pytest.raises(UsageError, match="delay_ms"):  # the job layer's misuse error, a ValueError
        ladder_delay_ms(bad)  # type: ignore[arg-type]


def test_retry_queues_per_job_queue_stay_bounded() -> None:
    rng = random.Random(7)
    policies = [
        None,
        RetryPolicy(max_interval="PT24H", initial_interval="PT0.1S", backoff_coefficient=1.7),
        RetryPolicy(backoff_strategy="polynomial", backoff_coefficient=4.0, max_interval="PT2H"),
    ]
    seen = {retry_queue_delay_ms(p, n, rng) for p in policies for n in range(1, 40) for _ in range(50)}
    assert seen <= set(RETRY_LADDER_MS)
    assert len(seen) <= MAX_RETRY_QUEUES
    assert max(retry_queue_delay_ms(None, n, rng) for n in range(1, 30)) == 300_000  # never above PT5M


def test_unhashable_policy_built_in_code_still_resolves() -> None:
    policy = RetryPolicy(non_retryable_errors=["auth.*"])  # type: ignore[arg-type]
    assert resolve_retry(policy).non_retryable_errors == ("auth.*",)
    assert is_retryable(policy, "auth.x") is False
