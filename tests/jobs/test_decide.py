"""The worker's outcome decision as a table: handler result -> ack / retry / dead letter /
cancelled / abandoned.  Pure logic, no broker."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from ojs_anyio.jobs._decide import ABANDONED, ACK, CANCELLED, Verdict, decide, error_type
from ojs_anyio.jobs._retry import RetryPolicy, resolve_retry
from ojs_anyio.jobs._verdicts import DeadLetter, Discard, Retry


class AuthForbidden(Exception):
    pass


AuthForbidden.__module__ = "auth"
AuthForbidden.__qualname__ = "forbidden"

# No jitter: delays are exact.  1 s initial, x2, capped at 5 min; "auth.*" never retried.
POLICY = resolve_retry(
    RetryPolicy(
        max_attempts=3,
        initial_interval="PT1S",
        backoff_coefficient=2.0,
        max_interval="PT5M",
        jitter=False,
        non_retryable_errors=("auth.*", "KeyError"),
    )
)


def run(raised: BaseException | None, **kw: Any) -> Verdict:
    args: dict[str, Any] = {
        "cancelled_caught": False,
        "cancel_requested": False,
        "abandoned": False,
        "timeout": 30.0,
        "policy": POLICY,
        "attempt": 1,
        "max_attempts": 3,
        "rng": random.Random(7),
    }
    args.update(kw)
    return decide(raised, **args)


@pytest.mark.parametrize(
    ("raised", "kw", "expected"),
    [
        # returned normally
        (None, {}, ACK),
        # returned normally although a CANCEL flag was set too late to cancel it: completed
        (None, {"cancel_requested": True}, ACK),
        # its scope was cancelled: by CANCEL, by the grace period, or by its deadline
        (None, {"cancelled_caught": True, "cancel_requested": True}, CANCELLED),
        (None, {"cancelled_caught": True, "abandoned": True}, ABANDONED),
        (
            None,
            {"cancelled_caught": True, "timeout": 2.5, "attempt": 1},
            Verdict("retry", "HANDLER_TIMEOUT", "TimeoutError: handler exceeded its timeout of 2.5s", 1000),
        ),
        (
            None,
            {"cancelled_caught": True, "timeout": 2.5, "attempt": 3},
            Verdict(
                "dead_letter",
                "HANDLER_TIMEOUT",
                "TimeoutError: handler exceeded its timeout of 2.5s (attempt 3 of 3, retries exhausted)",
            ),
        ),
        # an ordinary error: retried on the ladder (1 s, then 2 s), then exhausted
        (ValueError("boom"), {}, Verdict("retry", "HANDLER_ERROR", "ValueError: boom", 1000)),
        (ValueError("boom"), {"attempt": 2}, Verdict("retry", "HANDLER_ERROR", "ValueError: boom", 2000)),
        (
            ValueError("boom"),
            {"attempt": 3},
            Verdict("dead_letter", "HANDLER_ERROR", "ValueError: boom (attempt 3 of 3, retries exhausted)"),
        ),
        # an error without a message is named by its type
        (RuntimeError(), {}, Verdict("retry", "HANDLER_ERROR", "RuntimeError: RuntimeError", 1000)),
        # the message's header says more attempts than the policy
        (
            ValueError("x"),
            {"attempt": 3, "max_attempts": 5},
            Verdict("retry", "HANDLER_ERROR", "ValueError: x", 5000),
        ),
        # non_retryable_errors: exact and prefix matches dead-letter at once
        (KeyError("k"), {}, Verdict("dead_letter", "NON_RETRYABLE_ERROR", "KeyError: 'k'")),
        (AuthForbidden("no"), {}, Verdict("dead_letter", "NON_RETRYABLE_ERROR", "auth.forbidden: no")),
        # BaseExceptions that are not cancellation: a panic, never retried
        (SystemExit(3), {}, Verdict("dead_letter", "HANDLER_PANIC", "SystemExit: SystemExit(3)")),
        (
            KeyboardInterrupt(),
            {},
            Verdict("dead_letter", "HANDLER_PANIC", "KeyboardInterrupt: KeyboardInterrupt()"),
        ),
        # the handler's own verdicts
        (Discard("spam"), {}, Verdict("dead_letter", "DISCARDED", "spam")),
        (DeadLetter("poison"), {}, Verdict("dead_letter", "DEAD_LETTER", "poison")),
        (Retry("later"), {}, Verdict("retry", "HANDLER_ERROR", "Retry: later", 1000)),
        (Retry(), {}, Verdict("retry", "HANDLER_ERROR", "Retry: handler asked for a retry", 1000)),
        # Retry(delay=...) picks the rung nearest to the delay, even beyond max_interval
        (Retry("soon", delay=0.15), {}, Verdict("retry", "HANDLER_ERROR", "Retry: soon", 200)),
        (Retry("much later", delay=600), {}, Verdict("retry", "HANDLER_ERROR", "Retry: much later", 600_000)),
        # Retry is still bounded by the attempts
        (
            Retry("again"),
            {"attempt": 3},
            Verdict("dead_letter", "HANDLER_ERROR", "Retry: again (attempt 3 of 3, retries exhausted)"),
        ),
        # a handler that raised after being cancelled is judged by what it raised
        (
            ValueError("late"),
            {"cancelled_caught": False, "cancel_requested": True},
            Verdict("retry", "HANDLER_ERROR", "ValueError: late", 1000),
        ),
    ],
)
def test_decide_table(raised: BaseException | None, kw: dict[str, Any], expected: Verdict) -> None:
    assert run(raised, **kw) == expected


def test_jitter_comes_from_the_rng() -> None:
    jittered = resolve_retry(RetryPolicy(initial_interval="PT10S", jitter=True, max_interval="PT5M"))
    delays = {run(ValueError(), policy=jittered, rng=random.Random(seed)).delay_ms for seed in range(40)}
    # 10 s x [0.5, 1.5) lands on the 5 s, 10 s or 20 s rung, and the seed decides which
    assert delays <= {5000, 10000, 20000}
    assert len(delays) > 1
    same = [run(ValueError(), policy=jittered, rng=random.Random(3)).delay_ms for _ in range(3)]
    assert len(set(same)) == 1


def test_error_type_names() -> None:
    assert error_type(ValueError()) == "ValueError"
    assert error_type(AuthForbidden()) == "auth.forbidden"
    assert error_type(json.JSONDecodeError("x", "", 0)) == "json.decoder.JSONDecodeError"
