"""The OJS envelope against the official fixtures, plus the rules the fixtures do not reach."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ojs_anyio.jobs._build import new_job
from ojs_anyio.jobs._envelope import (
    ErrorRecord,
    Job,
    decode_job,
    encode_job,
    format_timestamp,
    job_from_dict,
    job_to_dict,
    parse_timestamp,
    validate_job,
)
from ojs_anyio.jobs._errors import ErrorCode, InvalidJobError
from ojs_anyio.jobs._retry import RetryPolicy

#: Pure test module: runs under ``pytest -m "not broker"`` (see tests/conftest.py).

SCHEMA_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "ojs-json-schema"
if not (SCHEMA_DIR / "tests" / "valid").is_dir():
    pytest.fail(
        f"OJS JSON schema fixtures not found at {SCHEMA_DIR} (../shared beside the repo)", pytrace=False
    )

VALID = sorted((SCHEMA_DIR / "tests" / "valid").glob("*.json"))
INVALID = sorted((SCHEMA_DIR / "tests" / "invalid").glob("*.json"))

#: The field each invalid fixture must be rejected for.
EXPECTED_FIELD = {
    "01-missing-specversion.json": "specversion",
    "02-missing-id.json": "id",
    "03-missing-type.json": "type",
    "04-missing-args.json": "args",
    "05-args-not-array.json": "args",
    "06-invalid-id-format.json": "id",
    "07-invalid-type-format.json": "type",
    "08-invalid-queue-format.json": "queue",
    "09-invalid-state.json": "state",
    "10-wrong-specversion.json": "specversion",
    "11-negative-attempt.json": "attempt",
    "12-negative-timeout.json": "timeout",
    "13-retry-negative-backoff.json": "retry.backoff_coefficient",
    "14-retry-invalid-on-exhaustion.json": "retry.on_exhaustion",
    "15-unique-invalid-conflict.json": "unique.on_conflict",
    "16-error-missing-type.json": "error.type",
    "17-type-exceeds-max-length.json": "type",
    "18-queue-exceeds-max-length.json": "queue",
    "19-unique-meta-without-meta-keys.json": "unique.meta_keys",
    "20-empty-type.json": "type",
    "21-args-null.json": "args",
    "22-type-with-hyphens.json": "type",
    "23-type-starts-with-number.json": "type",
    "24-args-object-not-array.json": "args",
}

MINIMAL: dict[str, Any] = {
    "specversion": "1.0",
    "id": "019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f",
    "type": "email.send",
    "queue": "default",
    "args": ["user@example.com"],
}


def minimal(**changes: Any) -> dict[str, Any]:
    return {**MINIMAL, **changes}


def rejected_field(data: Any) -> str:
    raw = data if isinstance(data, bytes | str) else json.dumps(data)
    with pytest.raises(InvalidJobError) as info:
        decode_job(raw)
    assert info.value.field in str(info.value)
    return info.value.field


def test_the_fixture_sets_are_complete() -> None:
    assert len(VALID) == 17
    assert {p.name for p in INVALID} == set(EXPECTED_FIELD)


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.name)
def test_valid_fixture_round_trips(path: Path) -> None:
    raw = path.read_bytes()
    job = decode_job(raw)
    encoded = encode_job(job)
    assert json.loads(encoded) == json.loads(raw)
    assert encode_job(decode_job(encoded)) == encoded
    assert decode_job(raw.decode()) == job  # str input too


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_invalid_fixture_names_the_field(path: Path) -> None:
    with pytest.raises(InvalidJobError) as info:
        decode_job(path.read_bytes())
    assert info.value.field == EXPECTED_FIELD[path.name]
    assert str(info.value).startswith(f"{info.value.field}: ")
    assert isinstance(info.value, ValueError)
    assert info.value.code is ErrorCode.INVALID_PAYLOAD


def test_a_delivered_envelope_without_specversion_is_read_as_1_0() -> None:
    """001 §15.1's publishing example sends no ``specversion``: a worker reads such a body
    as 1.0 (``delivered=True``); a missing version is still an error everywhere else, and a
    delivered body keeps every other rule."""
    body = b'{"id": "019539a4-b68c-7def-8000-1a2b3c4d5e6f", "type": "email.send", "queue": "q", "args": [1]}'
    with pytest.raises(InvalidJobError) as info:
        decode_job(body)
    assert info.value.field == "specversion"
    job = decode_job(body, delivered=True)
    assert (job.specversion, job.type, job.args) == ("1.0", "email.send", [1])
    with pytest.raises(InvalidJobError) as info:
        decode_job(body.replace(b'"args": [1]', b'"args": 1'), delivered=True)
    assert info.value.field == "args"
    fixture = SCHEMA_DIR / "tests" / "invalid" / "01-missing-specversion.json"
    assert decode_job(fixture.read_bytes(), delivered=True).specversion == "1.0"


def test_unknown_attributes_are_kept_and_reemitted_at_top_level() -> None:
    job = decode_job((SCHEMA_DIR / "tests" / "valid" / "13-unknown-attributes-preserved.json").read_bytes())
    assert job.extensions["x_custom_field"] == "custom_value"
    assert job.extensions["x_backend_hint"] == {"partition": 3, "shard": "us-east-1"}
    out = json.loads(encode_job(job))
    assert out["x_backend_hint"] == {"partition": 3, "shard": "us-east-1"}
    assert "extensions" not in out


def test_an_unknown_key_called_extensions_survives() -> None:
    data = minimal(extensions={"a": 1})
    assert json.loads(encode_job(decode_job(json.dumps(data)))) == data


def test_extra_keys_of_error_entries_are_kept() -> None:
    entry = {
        "code": "HANDLER_ERROR",
        "message": "boom",
        "attempt": 1,
        "occurred_at": "2026-02-12T10:01:00Z",
        "details": {"port": 25},
    }
    data = minimal(errors=[entry])
    job = decode_job(json.dumps(data))
    assert isinstance(job.errors, tuple)
    assert job.errors[0].extensions == {"details": {"port": 25}}
    assert json.loads(encode_job(job)) == data


@pytest.mark.parametrize(
    ("body", "message"),
    [(b"{", "not valid JSON"), (b"[1, 2]", "JSON object"), (b"null", "JSON object"), (b"\xff", "JSON")],
)
def test_bad_bodies(body: bytes, message: str) -> None:
    with pytest.raises(InvalidJobError, match=message) as info:
        decode_job(body)
    assert info.value.field == "<body>"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"retry": {"initial_interval": "PT10M"}}, "retry.max_interval"),  # merged with the PT5M default
        ({"retry": {"initial_interval": "PT0S"}}, "retry.initial_interval"),
        ({"retry": {"initial_interval": "P1M"}}, "retry.initial_interval"),  # months: no fixed length
        ({"retry": {"max_interval": "PT"}}, "retry.max_interval"),
        ({"retry": {"non_retryable_errors": ["a", "a"]}}, "retry.non_retryable_errors"),
        ({"retry": {"unknown": 1}}, "retry.unknown"),
        ({"retry": {"backoff_strategy": "fibonacci"}}, "retry.backoff_strategy"),
        ({"unique": {"period": "P"}}, "unique.period"),
        ({"unique": {"keys": ["type", "type"]}}, "unique.keys"),
        ({"unique": {"keys": ["meta"], "meta_keys": []}}, "unique.meta_keys"),
        ({"unique": {"states": ["processing"]}}, "unique.states[0]"),
        ({"error": {"type": "E", "message": "m", "code": "X"}}, "error.code"),
        ({"error": {"type": "E", "message": "m", "backtrace": ["f"] * 51}}, "error.backtrace"),
        (
            {"errors": [{"code": "X", "message": "m", "attempt": 0, "occurred_at": "2026-01-01T00:00:00Z"}]},
            "errors[0].attempt",
        ),
        (
            {"errors": [{"code": "X", "message": "m", "attempt": 1, "occurred_at": "yesterday"}]},
            "errors[0].occurred_at",
        ),
        ({"created_at": "2026-02-30T10:00:00Z"}, "created_at"),
        ({"created_at": "2026-02-12T10:00:00"}, "created_at"),  # no timezone
        ({"scheduled_at": "2026-02-12T10:00:00+24:00"}, "scheduled_at"),
        ({"priority": 1.5}, "priority"),
        ({"attempt": True}, "attempt"),
        ({"meta": []}, "meta"),
        ({"schema": "not a uri"}, "schema"),
        ({"id": "019461A8-1A2B-7C3D-8E4F-5A6B7C8D9E0F"}, "id"),  # uppercase
        ({"type": "email.send\n"}, "type"),
        ({"queue": "email\n"}, "queue"),
        ({"type": "a" * 256}, "type"),
        ({"type": ""}, "type"),
        ({"type": 7}, "type"),
        ({"queue": "q" * 129}, "queue"),
        ({"queue": ""}, "queue"),
        ({"enqueued_at": "2026-02-12 10:00:00Z"}, "enqueued_at"),
    ],
)
def test_rules_beyond_the_fixtures(changes: dict[str, Any], field: str) -> None:
    assert rejected_field(minimal(**changes)) == field


def test_pattern_errors_read_well() -> None:
    with pytest.raises(InvalidJobError, match="UUIDv7"):
        decode_job(json.dumps(minimal(id="550e8400-e29b-41d4-a716-446655440000")))
    with pytest.raises(InvalidJobError, match="dot-separated segments"):
        decode_job(json.dumps(minimal(type="Email.Send")))
    with pytest.raises(InvalidJobError, match="at most 128 characters"):
        decode_job(json.dumps(minimal(queue="q" * 129)))


def test_type_queue_and_timestamp_checks_remember_only_valid_values() -> None:
    # The struct checks these three itself (with a memo of the values seen valid), for a
    # decoded job and a directly built one alike; a value refused once is refused again.
    for _ in range(2):
        decode_job(json.dumps(minimal(type="memo.ok", queue="memo-ok", created_at="2026-03-01T00:00:00Z")))
        for field, bad in (("type", "memo.Bad"), ("queue", "Memo"), ("created_at", "2026-03-01")):
            assert rejected_field(minimal(**{field: bad})) == field
            with pytest.raises(InvalidJobError) as info:
                fields = {"specversion": "1.0", "id": MINIMAL["id"], "type": "a", "queue": "q", "args": []}
                Job(**{**fields, field: bad})
            assert info.value.field == field


def test_explicit_nulls_mean_absent_except_result() -> None:
    job = decode_job(json.dumps(minimal(meta=None, priority=None, retry={"max_attempts": None}, result=None)))
    assert isinstance(job.meta, msgspec.UnsetType)
    assert job.retry == RetryPolicy()
    assert job.result is None
    assert json.loads(encode_job(job)) == minimal(retry={}, result=None)


def test_any_integer_priority_is_accepted() -> None:
    # The schema allows any integer; the AMQP mapping clamps it (0..9) instead of refusing it.
    for priority in (150, -500, 10**12):
        assert decode_job(json.dumps(minimal(priority=priority))).priority == priority
        assert new_job("a", [], priority=priority, now=NOW).priority == priority


def test_effective_values() -> None:
    job = decode_job(json.dumps(MINIMAL))
    assert job.effective_meta() == {}
    assert job.effective_priority() == 0
    assert job.effective_attempt() == 0
    retry = job.effective_retry()
    assert (retry.max_attempts, retry.initial_interval_ms, retry.max_interval_ms) == (3, 1000, 300_000)
    job = decode_job(json.dumps(minimal(priority=-10, attempt=2, retry={"max_attempts": 9})))
    assert (job.effective_priority(), job.effective_attempt(), job.effective_retry().max_attempts) == (
        -10,
        2,
        9,
    )


def test_formatting_the_same_moments_again_gives_each_its_own_text() -> None:
    # format_timestamp remembers its last moment: alternating moments, and a moment in
    # another zone, still come out right; a naive one is refused every time.
    a = datetime(2026, 2, 15, 10, 30, 0, 1000, tzinfo=UTC)
    b = datetime(2026, 2, 15, 10, 30, 0, 2000, tzinfo=UTC)
    plus1 = datetime(2026, 2, 15, 11, 30, 0, 1000, tzinfo=timezone(timedelta(hours=1)))
    for _ in range(2):
        assert format_timestamp(a) == "2026-02-15T10:30:00.001Z"
        assert format_timestamp(a) == "2026-02-15T10:30:00.001Z"
        assert format_timestamp(b) == "2026-02-15T10:30:00.002Z"
        assert format_timestamp(plus1) == "2026-02-15T10:30:00.001Z"
    naive = datetime(2026, 2, 15)
    for _ in range(2):
        with pytest.raises(ValueError, match="timezone-aware"):
            format_timestamp(naive)


def test_a_bad_timestamp_is_refused_however_many_good_ones_passed_before() -> None:
    # The envelope remembers the last few timestamp texts that passed its check (a pushed
    # job's created_at and enqueued_at alternate): a bad one is still checked, in any field.
    good = [f"2026-02-15T10:30:00.{ms:03d}Z" for ms in range(20)]
    base = new_job("email.send", [], queue="email")
    for text in good:
        msgspec.structs.replace(base, created_at=text, enqueued_at=good[0])
    for field in ("created_at", "enqueued_at", "scheduled_at", "expires_at", "started_at", "completed_at"):
        with pytest.raises(InvalidJobError) as info:
            msgspec.structs.replace(base, **{field: "2026-02-30T10:30:00.000Z"})
        assert info.value.field == field


def test_timestamps() -> None:
    assert parse_timestamp("2026-02-17T08:00:00+01:00") == datetime(2026, 2, 17, 7, 0, tzinfo=UTC)
    assert parse_timestamp("2026-02-17T08:00:00.123456789Z").microsecond == 123456
    assert parse_timestamp("2016-12-31T23:59:60Z") == datetime(2017, 1, 1, tzinfo=UTC)
    assert (
        format_timestamp(datetime(2026, 2, 15, 10, 30, 0, 123999, tzinfo=UTC)) == "2026-02-15T10:30:00.123Z"
    )
    plus2 = timezone(timedelta(hours=2))
    assert format_timestamp(datetime(2026, 2, 15, 12, 30, tzinfo=plus2)) == "2026-02-15T10:30:00.000Z"
    with pytest.raises(ValueError, match="timezone-aware"):
        format_timestamp(datetime(2026, 2, 15))
    for bad in (
        "2026-13-01T00:00:00Z",
        "2026-01-01T24:00:00Z",
        "2026-01-01 00:00:00Z",
        "2026-01-01T00:00:00",
    ):
        with pytest.raises(ValueError):
            parse_timestamp(bad)


NOW = datetime(2026, 2, 15, 10, 30, 0, 250_000, tzinfo=UTC)


def test_new_job() -> None:
    job = new_job("email.send", ["a@example.com"], now=NOW)
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", job.id)
    assert (job.specversion, job.type, job.queue, job.args) == (
        "1.0",
        "email.send",
        "default",
        ["a@example.com"],
    )
    assert (job.state, job.attempt, job.created_at) == ("available", 0, "2026-02-15T10:30:00.250Z")
    assert json.loads(encode_job(job)) == {
        "specversion": "1.0",
        "id": job.id,
        "type": "email.send",
        "queue": "default",
        "args": ["a@example.com"],
        "state": "available",
        "attempt": 0,
        "created_at": "2026-02-15T10:30:00.250Z",
    }
    assert new_job("a", [], now=NOW).id != new_job("a", [], now=NOW).id


def test_new_job_options() -> None:
    job = new_job(
        "report.generate",
        (42, "q4"),
        queue="reports",
        meta={"tenant": "acme"},
        priority=10,
        timeout=300,
        scheduled_at=NOW + timedelta(hours=1),
        expires_at="2026-02-16T00:00:00Z",
        retry=RetryPolicy(max_attempts=5),
        schema="urn:ojs:schema:report.generate:v2",
        extensions={"x_hint": 1},
        now=NOW,
    )
    assert job.state == "scheduled"
    assert job.scheduled_at == "2026-02-15T11:30:00.250Z"
    assert job.retry == RetryPolicy(max_attempts=5)
    assert job.args == [42, "q4"]
    assert decode_job(encode_job(job)) == job
    assert new_job("a", [], scheduled_at=NOW - timedelta(seconds=1), now=NOW).state == "available"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"type": "Email.Send", "args": []}, "type"),
        ({"type": "a", "args": "not-a-list"}, "args"),
        ({"type": "a", "args": {"k": 1}}, "args"),
        ({"type": "a", "args": [], "queue": "Bad Queue"}, "queue"),
        ({"type": "a", "args": [], "now": datetime(2026, 1, 1)}, "created_at"),
        ({"type": "a", "args": [], "extensions": {"queue": "x"}}, "extensions.queue"),
    ],
)
def test_new_job_rejects(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidJobError) as info:
        new_job(**kwargs)
    assert info.value.field == field


def test_direct_construction_and_validate_job() -> None:
    job = Job(specversion="1.0", id="nope", type="a", queue="q", args=[])  # field rules not run here
    with pytest.raises(InvalidJobError) as info:
        validate_job(job)
    assert info.value.field == "id"
    with pytest.raises(InvalidJobError, match="defined attribute"):
        Job(specversion="1.0", id=MINIMAL["id"], type="a", queue="q", args=[], extensions={"type": "b"})
    with pytest.raises(InvalidJobError) as info:
        ErrorRecord(code="X", message="m", attempt=1, occurred_at="2026-02-31T00:00:00Z")
    assert info.value.field == "occurred_at"
    ok = Job(specversion="1.0", id=MINIMAL["id"], type="a", queue="q", args=[], extensions={"x": 1})
    assert validate_job(ok) == ok
    assert job_from_dict(job_to_dict(ok)) == ok


json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.text(max_size=8)
    | st.floats(allow_nan=False, allow_infinity=False)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


@given(
    args=st.lists(json_values, max_size=5),
    meta=st.none() | st.dictionaries(st.text(max_size=6), json_values, max_size=4),
    extensions=st.dictionaries(st.from_regex(r"x_[a-z]{1,6}", fullmatch=True), json_values, max_size=3),
    result=st.just(msgspec.UNSET) | json_values,
)
def test_any_json_content_round_trips(
    args: list[Any], meta: dict[str, Any] | None, extensions: dict[str, Any], result: Any
) -> None:
    data: dict[str, Any] = {**minimal(args=args), **extensions}
    if meta is not None:
        data["meta"] = meta
    if result is not msgspec.UNSET:
        data["result"] = result
    assert json.loads(encode_job(decode_job(json.dumps(data)))) == data


FIELD_NAMES = [*sorted(set(Job.__struct_fields__) - {"extensions"}), "x_other"]


@given(
    st.dictionaries(
        st.sampled_from(FIELD_NAMES), json_values | st.sampled_from(["PT1S", "1.0", MINIMAL["id"]])
    ),
    st.sampled_from([{}, MINIMAL]),
)
def test_fuzz_decode_only_raises_invalid_job_error(fields: dict[str, Any], base: dict[str, Any]) -> None:
    data = {**base, **fields}
    try:
        job = decode_job(json.dumps(data))
    except InvalidJobError as exc:
        assert exc.field
        return
    without_nulls = {k: v for k, v in data.items() if v is not None or k in ("result", "x_other")}
    reencoded = json.loads(encode_job(job))
    assert set(reencoded) == set(without_nulls)


def _outcome(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except InvalidJobError as exc:
        return ("error", exc.field, exc.message)


@given(
    st.dictionaries(
        st.sampled_from([*FIELD_NAMES, "extensions", "errors"]),
        json_values | st.sampled_from(["PT1S", "1.0", MINIMAL["id"], "2026-02-15T10:30:00Z"]),
    ),
    st.sampled_from([{}, MINIMAL]),
)
def test_bytes_fast_path_agrees_with_the_long_way(fields: dict[str, Any], base: dict[str, Any]) -> None:
    # bytes go straight into the struct when they can; a str always takes the dict route.
    text = json.dumps({**base, **fields})
    assert _outcome(decode_job, text.encode()) == _outcome(decode_job, text)


def test_bytes_fast_path_keeps_extensions_and_drops_nulls() -> None:
    body = json.dumps({**MINIMAL, "x_trace": {"a": 1}, "meta": None, "result": None}).encode()
    job = decode_job(body)
    assert job.extensions == {"x_trace": {"a": 1}}
    assert job.meta is msgspec.UNSET and job.result is None
    nested = json.dumps({**MINIMAL, "extensions": {"a": 1}}).encode()
    assert decode_job(nested).extensions == {"extensions": {"a": 1}}


TYPES = st.sampled_from(["email.send", "a", "Email.Send", "", "x" * 256, "a..b", "report_2.run"])
QUEUES = st.sampled_from(["default", "billing.invoices", "Bad Queue", "", "q" * 129, "-x", "0-q"])


@given(
    type_=TYPES,
    queue=QUEUES,
    priority=st.none() | st.sampled_from([0, -100, 100, 101, -101, True, 5]),
    timeout=st.none() | st.sampled_from([0, 30, -1, False]),
    meta=st.none() | st.sampled_from([{}, {"tenant": "acme"}, {1: "x"}, {"k": [1, None]}]),
    id_=st.none() | st.sampled_from([MINIMAL["id"], MINIMAL["id"].upper(), "nope"]),
)
def test_new_job_accepts_exactly_what_the_schema_accepts(
    type_: str, queue: str, priority: Any, timeout: Any, meta: Any, id_: str | None
) -> None:
    # new_job builds common jobs directly; the full schema check must agree with it.
    kwargs = {"queue": queue, "priority": priority, "timeout": timeout, "meta": meta, "id": id_}
    made = _outcome(new_job, type_, ["a"], now=NOW, **kwargs)
    data: dict[str, Any] = {
        "specversion": "1.0",
        "id": id_ or MINIMAL["id"],
        "type": type_,
        "queue": queue,
        "args": ["a"],
        "state": "available",
        "attempt": 0,
        "created_at": "2026-02-15T10:30:00.250Z",
    }
    # in new_job's order, so that with two bad fields both name the same one first
    data.update({k: kwargs[k] for k in ("meta", "priority", "timeout") if kwargs[k] is not None})
    reference = _outcome(job_from_dict, data)
    if isinstance(reference, tuple):
        assert isinstance(made, tuple), f"new_job accepted what the schema rejects: {reference}"
        assert made[1] == reference[1]
    else:
        assert isinstance(made, Job)
        assert msgspec.structs.replace(made, id=reference.id) == reference


def test_handler_arity_matches_signature_bind() -> None:
    import inspect

    from ojs_anyio.jobs._handlers import _positional_arity

    def two(ctx: Any, a: Any, b: Any) -> None: ...
    def defaults(ctx: Any, a: Any, b: Any = 1) -> None: ...
    def star(ctx: Any, *rest: Any) -> None: ...
    def kw_required(ctx: Any, a: Any, *, flag: Any) -> None: ...
    def kw_default(ctx: Any, a: Any, *, flag: Any = 0) -> None: ...

    for fn in (two, defaults, star, kw_required, kw_default):
        sig = inspect.signature(fn)
        arity = _positional_arity(sig)
        for count in range(5):
            try:
                sig.bind(*range(count))
                fits = True
            except TypeError:
                fits = False
            quick = arity is not None and arity[0] <= count <= arity[1]
            # the quick check may only say "fits" when bind agrees; else bind decides
            assert not quick or fits, (fn.__name__, count)
            if arity is not None:
                assert quick == fits, (fn.__name__, count)
