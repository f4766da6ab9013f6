"""The error families, without a broker: misuse is one type (UsageError, also a
ValueError), timeouts are OperationTimeoutError (publishes: PublishTimeoutError), and
every public error name is importable from where it was."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any

import pytest

import ojs_anyio as ojs
from ojs_anyio import amqp
from ojs_anyio.jobs import _errors, _verdicts, compute_delay_ms, priority_to_amqp

#: Pure test module: runs under ``pytest -m "not broker"`` (see tests/conftest.py).

MISUSE = [
    ojs.InvalidJobError,
    _errors.InvalidDurationError,
    ojs.TopologyError,
    ojs.DelayOutOfRangeError,
    amqp.DeliveryAlreadySettledError,
    amqp.StaleDeliveryError,
    _errors.ArgumentTypeError,
]


@pytest.mark.parametrize("cls", MISUSE, ids=lambda c: c.__name__)
def test_misuse_is_one_type_and_still_a_value_error(cls: type[Exception]) -> None:
    assert issubclass(cls, amqp.UsageError)
    assert issubclass(cls, amqp.AMQPError)
    assert issubclass(cls, ValueError)  # ``except ValueError`` written earlier still catches it


@pytest.mark.parametrize(
    ("call", "types"),
    [
        (lambda: compute_delay_ms(None, 0, random.Random(1)), (amqp.UsageError, ValueError)),
        (lambda: ojs.Worker(queues=["q"], concurrency=0), (amqp.UsageError, ValueError)),
        (lambda: priority_to_amqp("high"), (amqp.UsageError, TypeError)),  # type: ignore[arg-type]
    ],
    ids=["retry-attempt", "worker-concurrency", "priority-type"],
)
def test_misuse_raises_usage_error(call: object, types: tuple[type[Exception], ...]) -> None:
    with pytest.raises(amqp.UsageError) as info:
        call()  # type: ignore[operator]
    assert isinstance(info.value, types)


def test_timeouts_are_operation_timeouts_and_only_publishes_are_publish_errors() -> None:
    assert issubclass(amqp.OperationTimeoutError, TimeoutError)
    assert not issubclass(amqp.OperationTimeoutError, amqp.PublishError)
    for cls in (amqp.PublishTimeoutError, amqp.BlockedTimeoutError):
        assert issubclass(cls, amqp.OperationTimeoutError)
        assert issubclass(cls, amqp.PublishError)


def test_runtime_errors_are_amqp_errors_and_verdicts_are_not() -> None:
    pushes = (ojs.QueueFullError, ojs.UnroutableJobError, ojs.PushNotSentError, ojs.PushOutcomeUnknownError)
    for cls in (ojs.PushError, *pushes):
        assert issubclass(cls, ojs.JobError) and issubclass(cls, amqp.AMQPError)
        assert not issubclass(cls, amqp.UsageError)
    for verdict in (ojs.Retry, ojs.Discard, ojs.DeadLetter):
        assert not issubclass(verdict, amqp.AMQPError)


def test_every_name_is_importable_from_where_it_was() -> None:
    for name in (*_errors.__all__, *_verdicts.__all__):  # the public names, from their homes
        home = _verdicts if name in _verdicts.__all__ else _errors
        if hasattr(ojs, name):
            assert getattr(ojs, name) is getattr(home, name)
    for name in ("DelayOutOfRangeError", "ErrorCode", "InvalidJobError", "TopologyError"):
        assert getattr(ojs, name) is getattr(_errors, name)
    jobs_names = ("DelayOutOfRangeError", "ErrorCode", "InvalidDurationError", "InvalidJobError")
    for name in jobs_names:
        assert getattr(ojs.jobs, name) is getattr(_errors, name)


#: Modules outside the rule, each with its reason.  memory/ is the in-process test broker
#: (issue 26 reworks it); demo.py's handler fails on purpose, as a user's job would.
_RAISE_RULE_EXEMPT = ("memory/", "demo.py")


def test_the_library_raises_no_bare_value_or_type_error() -> None:
    """Misuse raises ``UsageError`` or ``ArgumentTypeError`` (both still a ``ValueError`` /
    ``TypeError`` for older ``except`` clauses); remote bad input has its own classes.  A
    bare ``raise ValueError(...)`` or ``raise TypeError(...)`` anywhere in the library
    fails here, with where it is."""
    import ast
    from pathlib import Path

    root = Path(ojs.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(_RAISE_RULE_EXEMPT):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Raise) or node.exc is None:
                continue
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name) and exc.id in ("ValueError", "TypeError"):
                found.append(f"{rel}:{node.lineno}: raise {exc.id}")
    assert not found, "\n".join(found)


_NOW = datetime(2026, 1, 1, tzinfo=UTC)
_ID = "01890a5d-ac96-774b-bcce-b302099a8057"
_AGREE_CASES: list[dict[str, Any]] = [
    {},
    {"meta": {"k": 1}, "priority": 3, "timeout": 30},
    {"priority": 0},
    {"priority": True},
    {"priority": 2**40},
    {"timeout": 0},
    {"timeout": -1},
    {"meta": {1: "x"}},
    {"type": "Bad Type"},
    {"type": ""},
    {"queue": "dlx.x"},
    {"queue": "x" * 200},
    {"id": "not-a-uuid"},
    {"id": _ID.upper()},
]


@pytest.mark.parametrize("overrides", _AGREE_CASES, ids=repr)
def test_new_job_fast_and_slow_paths_agree(overrides: dict[str, Any]) -> None:
    """``new_job`` builds a plain job directly (a memo in front of the validator); the
    validator itself (``job_from_dict``) must give the same job, or the same refusal."""
    from ojs_anyio.jobs._build import new_job
    from ojs_anyio.jobs._envelope import format_timestamp, job_from_dict

    given: dict[str, Any] = {"type": "email.send", "queue": "email", "id": _ID, **overrides}
    job_type, queue = given.pop("type"), given.pop("queue")
    data = {
        "specversion": ojs.jobs.SPEC_VERSION, "type": job_type, "queue": queue, "args": [1],
        "state": "available", "attempt": 0, "created_at": format_timestamp(_NOW), **given,
    }  # fmt: skip
    try:
        expected: Any = job_from_dict(data)
    except ojs.InvalidJobError as exc:
        expected = type(exc)
    try:
        got: Any = new_job(job_type, [1], queue=queue, now=_NOW, **given)
    except ojs.InvalidJobError as exc:
        got = type(exc)
    assert got == expected


def test_build_with_a_retry_that_is_not_a_policy_names_its_type() -> None:
    """``client.build(..., retry="3x")`` says what is wrong (it once failed with "'str' object
    is not callable": the job type parameter shadowed ``type`` there)."""
    from ojs_anyio.jobs._build import build_job

    with pytest.raises(_errors.ArgumentTypeError, match="RetryPolicy or None, not str"):
        build_job(
            None, "a.job", [], queue="default", priority=None, timeout=None, retry="3x",  # type: ignore[arg-type]
            meta=None, scheduled_at=None, delay=None, expires_at=None, id=None,
        )  # fmt: skip
