"""Issue 16: nothing in the public API is accepted and then ignored.

One section per failure the issue lists (its numbers), each on the real broker on asyncio
and Trio where a broker is involved; the checks that need none are plain tests.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import threading
import uuid
import warnings
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import msgspec
import pytest
from support.brokers import RABBITMQ_URL as URL

import ojs_anyio as ojs
from ojs_anyio import amqp
from ojs_anyio.jobs._dedup import lock_queue
from ojs_anyio.jobs._durations import duration_seconds
from ojs_anyio.jobs._retry import is_retryable_error

from .broker_support import WAIT, Outcomes, current_url, running

ROOT = Path(__file__).resolve().parents[2]
FAST = ojs.RetryPolicy(initial_interval="PT0.1S", jitter=False)


class PaymentDeclined(Exception):
    pass


class CardExpired(PaymentDeclined):
    pass


class Fraud(Exception):
    pass


PaymentDeclined.__module__ = CardExpired.__module__ = Fraud.__module__ = "billing.errors"


class Address(msgspec.Struct):
    street: str
    zip: str


@dataclasses.dataclass
class Money:
    amount: int
    currency: str


async def job_count(raw: amqp.Connection, queue: str) -> int:
    async with raw.channel(confirms=False) as ch:
        return (await ch.queue_declare(queue, passive=True)).message_count


# ------------------------------------------------------------- 1. handlers


@pytest.mark.anyio
async def test_1_sync_handler_runs_once_in_a_thread_bounded_by_concurrency(
    client: ojs.Client, q: str
) -> None:
    """A plain ``def`` handler runs in a worker thread, once per job (not three failed
    attempts), and never more of them at once than ``concurrency``."""
    worker = ojs.Worker(queues=[q], concurrency=2)
    outcomes = Outcomes(worker)
    loop_thread = threading.get_ident()
    lock = threading.Lock()
    release = threading.Event()
    two_running = anyio.Event()
    state = {"now": 0, "max": 0}
    calls: list[tuple[int, int]] = []

    @worker.handler("sync.job")
    def handler(ctx: ojs.JobContext, n: int) -> None:
        with lock:
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])
            calls.append((n, threading.get_ident()))
            if state["now"] == 2:
                anyio.from_thread.run_sync(two_running.set)
        release.wait(WAIT)
        with lock:
            state["now"] -= 1

    async with running(worker, client):
        jobs = [await client.push("sync.job", [n], queue=q) for n in range(4)]
        with anyio.fail_after(WAIT):
            await two_running.wait()
        release.set()
        for job in jobs:
            assert (await outcomes.wait_final(job.id)).outcome == "completed"
    assert sorted(n for n, _ in calls) == [0, 1, 2, 3]  # each ran exactly once
    assert all(ident != loop_thread for _, ident in calls)
    assert state["max"] == 2


@pytest.mark.anyio
async def test_1_a_sync_handler_past_its_timeout_is_waited_for_and_its_outcome_counts(
    client: ojs.Client, q: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A thread cannot be interrupted: the worker waits for it, acks the job it finished (not
    a timeout and a second run), and says so in a warning."""
    worker = ojs.Worker(queues=[q], retry=ojs.RetryPolicy(max_attempts=2))
    outcomes = Outcomes(worker)
    runs: list[int] = []
    past_deadline = threading.Event()
    started = anyio.Event()

    @worker.handler("slow.sync")
    def handler(ctx: ojs.JobContext) -> None:
        runs.append(ctx.attempt)
        anyio.from_thread.run_sync(started.set)
        past_deadline.wait(WAIT)

    async with running(worker, client):
        job = await client.push("slow.sync", [], queue=q, timeout=1)
        with anyio.fail_after(WAIT):
            await started.wait()
            [(_, ctx)] = worker._running[job.id]
            assert ctx.deadline is not None
            await anyio.sleep_until(ctx.deadline + 0.05)  # the job's own deadline passes
        past_deadline.set()
        final = await outcomes.wait_final(job.id)
    assert (final.outcome, runs) == ("completed", [1])
    assert "ran past its timeout" in caplog.text


@pytest.mark.anyio
async def test_1_plain_function_returning_a_coroutine_says_so(client: ojs.Client, q: str) -> None:
    worker = ojs.Worker(queues=[q], retry=ojs.RetryPolicy(max_attempts=1))
    outcomes = Outcomes(worker)

    async def body(ctx: ojs.JobContext) -> None:
        pass

    worker.register("lambda.job", lambda ctx: body(ctx))
    async with running(worker, client):
        job = await client.push("lambda.job", [], queue=q)
        final = await outcomes.wait_final(job.id)
    assert final.outcome == "dead_lettered"
    assert final.error_message is not None and "declare it `async def`" in final.error_message


class _SyncCallable:
    def __call__(self, ctx: Any) -> None:
        pass


class _AsyncCallable:
    async def __call__(self, ctx: Any) -> None:
        pass


def _gen(ctx: Any) -> Any:
    yield ctx


async def _agen(ctx: Any) -> Any:
    yield ctx


@pytest.mark.parametrize(
    ("fn", "words"),
    [
        (42, "must be an async def or def function"),
        (_SyncCallable, "is the class"),
        (_SyncCallable(), "neither a coroutine function"),
        (_gen, "generator function"),
        (_agen, "generator function"),
        (lambda: None, "takes no positional parameter"),
    ],
)
def test_1_handlers_that_cannot_work_are_refused_at_registration(fn: Any, words: str) -> None:
    worker = ojs.Worker(queues=["x"])
    with pytest.raises(TypeError, match=words):
        worker.register("some.job", fn)
    worker.register("ok.async", _AsyncCallable())  # an object with async __call__ is fine


def test_1_annotations_that_json_cannot_fill_are_refused_at_registration() -> None:
    worker = ojs.Worker(queues=["x"])

    def handler(ctx: ojs.JobContext, lock: threading.Lock) -> None: ...

    with pytest.raises(TypeError, match="parameter 'lock'"):
        worker.register("lock.job", handler)


# ------------------------------------------------------- 2. retry precedence


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("job_policy", "worker_policy", "producer_policy", "attempts"),
    [
        (None, None, None, 3),  # the OJS defaults
        (None, 2, None, 2),  # the worker's (on main, the client's default 3 won)
        (1, 2, None, 1),  # the job's own beats the worker's
        (None, 2, 1, 1),  # connect(retry=) is written into the job: the job's own
        (2, None, 1, 2),  # the job's field beats the producer default's
    ],
)
async def test_2_retry_policy_precedence(
    q: str,
    job_policy: int | None,
    worker_policy: int | None,
    producer_policy: int | None,
    attempts: int,
) -> None:
    """Job's own policy, then the worker's, then the defaults; the message carries
    ``x-ojs-max-attempts`` only when the job set ``max_attempts``."""
    worker = ojs.Worker(
        queues=[q],
        retry=FAST if worker_policy is None else ojs.RetryPolicy(max_attempts=worker_policy, jitter=False,
                                                                  initial_interval="PT0.1S"),
    )  # fmt: skip
    outcomes = Outcomes(worker)
    seen: list[int] = []
    headers: list[dict[str, Any]] = []

    @worker.handler("failing.job")
    async def handler(ctx: ojs.JobContext) -> None:
        seen.append(ctx.attempt)
        headers.append(dict(ctx.message.properties.headers or {}))
        raise RuntimeError("no")

    producer = None if producer_policy is None else ojs.RetryPolicy(max_attempts=producer_policy)
    async with ojs.connect(current_url(), retry=producer) as client, running(worker, client):
        retry = None if job_policy is None else ojs.RetryPolicy(max_attempts=job_policy)
        job = await client.push("failing.job", [], queue=q, retry=retry)
        final = await outcomes.wait_final(job.id, timeout=30)
    assert final.outcome == "dead_lettered"
    assert seen == list(range(1, attempts + 1))
    own = job_policy if job_policy is not None else producer_policy
    if own is None:
        assert "x-ojs-max-attempts" not in headers[0]
    else:
        assert headers[0]["x-ojs-max-attempts"] == own


# ----------------------------------------------------- 3. non_retryable_errors


def test_3_non_retryable_errors_classes_and_error_types() -> None:
    by_class = ojs.RetryPolicy(non_retryable_errors=(PaymentDeclined,))
    assert not is_retryable_error(by_class, PaymentDeclined())
    assert not is_retryable_error(by_class, CardExpired())  # a subclass counts
    assert is_retryable_error(by_class, Fraud())
    exact = ojs.RetryPolicy(non_retryable_errors=("billing.errors.PaymentDeclined",))
    assert not is_retryable_error(exact, PaymentDeclined())
    assert not is_retryable_error(exact, CardExpired())  # its base class has that name
    assert is_retryable_error(exact, Fraud())
    prefix = ojs.RetryPolicy(non_retryable_errors=["billing.*"])  # type: ignore[arg-type]  # a list works
    assert not is_retryable_error(prefix, Fraud())
    assert is_retryable_error(prefix, ValueError())
    builtin = ojs.RetryPolicy(non_retryable_errors=("ValueError",))
    assert not is_retryable_error(builtin, UnicodeDecodeError("utf-8", b"", 0, 1, "x"))
    with pytest.raises(ojs.InvalidJobError, match="neither an exception class"):
        ojs.RetryPolicy(non_retryable_errors=(42,))  # type: ignore[arg-type]
    with pytest.raises(ojs.InvalidJobError, match=r"write \('billing.\*',\)"):
        ojs.RetryPolicy(non_retryable_errors="billing.*")  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_3_a_subclass_of_a_non_retryable_class_dead_letters_at_once(client: ojs.Client, q: str) -> None:
    worker = ojs.Worker(queues=[q], retry=ojs.RetryPolicy(non_retryable_errors=(PaymentDeclined,)))
    outcomes = Outcomes(worker)

    @worker.handler("charge.card")
    async def handler(ctx: ojs.JobContext) -> None:
        raise CardExpired("card 4242 expired")

    async with running(worker, client):
        job = await client.push("charge.card", [], queue=q, retry=ojs.RetryPolicy(max_attempts=5))
        final = await outcomes.wait_final(job.id)
    assert (final.outcome, final.attempt, final.error_code) == ("dead_lettered", 1, "NON_RETRYABLE_ERROR")
    assert final.error_message == "billing.errors.CardExpired: card 4242 expired"


@pytest.mark.anyio
async def test_3_classes_cannot_travel_in_a_message(client: ojs.Client, q: str) -> None:
    with pytest.raises(TypeError, match="cannot travel in a job's message"):
        await client.push("charge.card", [], queue=q, retry=ojs.RetryPolicy(non_retryable_errors=(Fraud,)))


# ------------------------------------------------ 4. options that cannot work


def test_3_a_bare_class_name_is_warned_about() -> None:
    with pytest.warns(UserWarning, match="'PaymentDeclined' has no module"):
        ojs.Worker(queues=["x"], retry=ojs.RetryPolicy(non_retryable_errors=("PaymentDeclined",)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ojs.Worker(queues=["x"], retry=ojs.RetryPolicy(non_retryable_errors=("ValueError", "a.B")))


def test_4_on_exhaustion_discard_warns_at_construction() -> None:
    with pytest.warns(UserWarning, match="dead-letter queue"):
        ojs.Worker(queues=["x"], retry=ojs.RetryPolicy(on_exhaustion="discard"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ojs.Worker(queues=["x"], retry=ojs.RetryPolicy(on_exhaustion="dead_letter"))


@pytest.mark.anyio
async def test_4_discard_warns_at_push_and_unenforceable_unique_policies_are_refused(
    client: ojs.Client, raw: amqp.Connection, q: str
) -> None:
    await client.declare_queue(q)
    with pytest.warns(UserWarning, match="on_exhaustion='discard'"):
        await client.push("a.job", [], queue=q, retry=ojs.RetryPolicy(on_exhaustion="discard"))
    no_period = ojs.new_job("a.job", [], queue=q, unique=ojs.UniquePolicy(keys=("type",)))
    with pytest.raises(ojs.UsageError, match="needs a 'period'"):
        await client.push_job(no_period)
    replace = ojs.UniquePolicy(period="PT1M", on_conflict="replace")
    with pytest.raises(ojs.UsageError, match="cannot be taken back out"):
        await client.push_job(ojs.new_job("a.job", [], queue=q, unique=replace))
    assert await job_count(raw, client.names.job_queue(q)) == 1  # only the first went out


@pytest.mark.anyio
async def test_4_idempotency_key_deduplicates_across_clients(
    client: ojs.Client, raw: amqp.Connection, q: str, cleanup: Any
) -> None:
    """Two clients (two connections) push the same key: one job is enqueued, the other push
    raises DuplicateJobError and publishes nothing; once the window has passed the key is free."""
    key, fresh = f"order-{uuid.uuid4().hex}", f"order-{uuid.uuid4().hex}"
    cleanup.queue(lock_queue("", key))
    cleanup.queue(lock_queue("", fresh))
    first = await client.push("a.job", [1], queue=q, idempotency_key=key)
    async with ojs.connect(current_url()) as other:
        with pytest.raises(
            ojs.DuplicateJobError, match=f"idempotency key '{key}' was already used"
        ) as caught:
            await other.push("a.job", [2], queue=q, idempotency_key=key)
        assert caught.value.code == "DUPLICATE" and caught.value.key == key
        # The scope is the key alone: another window is the same key.
        with pytest.raises(ojs.DuplicateJobError):
            await other.push("a.job", [2], queue=q, idempotency_key=key, idempotency_window=0.5)
        # Concurrent pushes of a fresh key (short window): exactly one wins.
        results: list[str] = []

        async def push(c: ojs.Client, n: int) -> None:
            try:
                await c.push("a.job", [n], queue=q, idempotency_key=fresh, idempotency_window=0.5)
                results.append("ok")
            except ojs.DuplicateJobError:
                results.append("duplicate")

        async with anyio.create_task_group() as tg:
            for n in range(3):
                tg.start_soon(push, client, n)
                tg.start_soon(push, other, 10 + n)
    assert sorted(results) == ["duplicate"] * 5 + ["ok"]
    assert await job_count(raw, client.names.job_queue(q)) == 2
    msg = None
    async with raw.channel(confirms=False) as ch:
        msg = await ch.get(client.names.job_queue(q))
        assert msg is not None
        assert (msg.properties.headers or {})["x-ojs-idempotency-key"] == key
        assert msg.properties.message_id == first.id
        await msg.ack()
    # The window (0.5 s) passes: the marker expires and the key can be used again, with
    # another window too (its lock is declared again).
    with anyio.fail_after(WAIT):
        while True:
            try:
                await client.push("a.job", [3], queue=q, idempotency_key=fresh, idempotency_window=60)
                break
            except ojs.DuplicateJobError:
                await anyio.sleep(0.1)  # waiting on the broker's TTL: there is no event for it
    with pytest.raises(ojs.DuplicateJobError):
        await client.push("a.job", [4], queue=q, idempotency_key=fresh, idempotency_window=0.5)


@pytest.mark.anyio
async def test_4_a_failed_push_frees_its_idempotency_key(client: ojs.Client, cleanup: Any) -> None:
    key = f"k-{uuid.uuid4().hex}"
    cleanup.queue(lock_queue("", key))
    missing = f"t{uuid.uuid4().hex[:10]}"
    await client.declare_queue(missing)
    ch = await client.channel()
    await ch.queue_delete(client.names.job_queue(missing))  # the push will be unroutable
    cleanup.ojs(missing)
    with pytest.raises(ojs.UnroutableJobError):
        await client.push("a.job", [], queue=missing, idempotency_key=key)
    await client.declare_queue(missing)
    client.declarer.declared_queues.discard(missing)
    await client.push("a.job", [], queue=missing, idempotency_key=key)  # not a duplicate


# ---------------------------------------------------------------- 5. arguments


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("args", "where", "fix"),
    [
        (["a", datetime(2026, 1, 1, tzinfo=UTC)], "args\\[1\\]", "isoformat"),
        ([b"\x00"], "args\\[0\\]", "b64encode"),
        ([{"tags": {"x"}}], "args\\[0\\]\\['tags'\\]", "sorted"),
        ([object()], "args\\[0\\]", "plain JSON values"),
        ([Money(1, "EUR")], "args\\[0\\]", "dataclasses.asdict"),
        ([float("nan")], "args\\[0\\]", "null"),
        ([{1: "a"}], "args\\[0\\]", "str keys"),
    ],
)
async def test_5_push_refuses_values_json_cannot_carry(
    client: ojs.Client, raw: amqp.Connection, q: str, args: list[Any], where: str, fix: str
) -> None:
    await client.declare_queue(q)
    with pytest.raises(TypeError, match=f"{where}.*{fix}"):
        await client.push("a.job", args, queue=q)
    with pytest.raises(TypeError, match=where):
        await client.push_batch([ojs.new_job("a.job", args, queue=q)])
    assert await job_count(raw, client.names.job_queue(q)) == 0


@pytest.mark.anyio
async def test_5_annotated_parameters_are_converted_and_validated(client: ojs.Client, q: str) -> None:
    worker = ojs.Worker(queues=[q])
    outcomes = Outcomes(worker)
    got: list[Any] = []

    @worker.handler("ship.order")
    async def ship(ctx: ojs.JobContext, when: datetime, order: uuid.UUID, to: Address, price: Money) -> None:
        got.extend([when, order, to, price])

    when = datetime(2026, 2, 15, 10, 30, tzinfo=UTC)
    order = uuid.uuid4()
    async with running(worker, client):
        good = await client.push(
            "ship.order",
            [
                when.isoformat(),
                str(order),
                {"street": "Main 1", "zip": "1000"},
                {"amount": 5, "currency": "EUR"},
            ],
            queue=q,
        )
        bad = await client.push("ship.order", [when.isoformat(), "not-a-uuid", {}, {}], queue=q)
        assert (await outcomes.wait_final(good.id)).outcome == "completed"
        final = await outcomes.wait_final(bad.id)
    assert got == [when, order, Address("Main 1", "1000"), Money(5, "EUR")]
    assert (final.outcome, final.attempt, final.error_code) == ("dead_lettered", 1, "INVALID_ARGS")
    assert final.error_message is not None and "parameter 'order' (args[1])" in final.error_message


# ------------------------------------------------------ 6. constructor checks


def test_6_constructors_validate_their_arguments() -> None:
    with pytest.raises(TypeError, match=r"must be a list of queue names, not a string: write \['email'\]"):
        ojs.Worker(queues="email")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one queue"):
        ojs.Worker(queues=[])
    with pytest.raises(ojs.TopologyError, match="not an OJS queue name"):
        ojs.Worker(queues=["Email"])
    with pytest.raises(ValueError, match="names a queue twice"):
        ojs.Worker(queues=["a", "a"])
    with pytest.raises(ValueError, match="concurrency"):
        ojs.Worker(queues=["a"], concurrency=0)
    with pytest.raises(ValueError, match="concurrency"):
        ojs.Worker(queues=["a"], concurrency="4")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="retry must be"):
        ojs.Worker(queues=["a"], retry={"max_attempts": 5})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="grace_period"):
        ojs.Worker(queues=["a"], grace_period="5s")
    with pytest.raises(TypeError, match="job_type"):
        ojs.Worker(queues=["a"]).register("", lambda ctx: None)
    worker = ojs.Worker(queues=["a"])
    worker.register("a.job", lambda ctx: None)
    with pytest.raises(ValueError, match="already registered"):
        worker.register("a.job", lambda ctx: None)  # not silently replaced


@pytest.mark.anyio
async def test_6_connect_validates_retry(broker_url: str) -> None:
    with pytest.raises(TypeError, match="retry must be"):
        async with ojs.connect(broker_url, retry=5):  # type: ignore[arg-type]
            pass


# ------------------------------------------------------------------ 7. logging


@pytest.mark.anyio
async def test_7_startup_line_warning_and_error_with_tracebacks_and_extras(
    client: ojs.Client, q: str, caplog: pytest.LogCaptureFixture, anyio_backend_name: str
) -> None:
    caplog.set_level(logging.INFO, logger="ojs_anyio.worker")
    policy = ojs.RetryPolicy(max_attempts=2, initial_interval=0.1)
    worker = ojs.Worker(queues=[q], concurrency=3, retry=policy)
    outcomes = Outcomes(worker)

    @worker.handler("doomed.job")
    async def handler(ctx: ojs.JobContext) -> None:
        raise PaymentDeclined(f"declined on attempt {ctx.attempt}")

    async with running(worker, client):
        job = await client.push("doomed.job", [], queue=q)
        await outcomes.wait_final(job.id)
    records = [r for r in caplog.records if r.name == "ojs_anyio.worker"]
    start = next(r for r in records if "starting" in r.getMessage())
    text = start.getMessage()
    assert f"queues={q}" in text and "concurrency=3" in text
    assert f"backend={anyio_backend_name}" in text
    where = "127.0.0.1:5672" if current_url().startswith("amqp") else "memory://"
    assert where in text and "guest:***@" in text and "guest:guest" not in text
    retried = [r for r in records if "outcome=retried" in r.getMessage()]
    dead = [r for r in records if "outcome=dead_lettered" in r.getMessage()]
    assert [r.levelno for r in retried] == [logging.WARNING]
    assert [r.levelno for r in dead] == [logging.ERROR]
    for record, attempt in ((retried[0], 1), (dead[0], 2)):
        assert record.exc_info is not None and record.exc_info[0] is PaymentDeclined
        assert (record.job_id, record.job_type, record.queue, record.attempt) == (  # type: ignore[attr-defined]
            job.id, "doomed.job", q, attempt,
        )  # fmt: skip
    assert "Traceback" in caplog.text and "declined on attempt 1" in caplog.text


@pytest.mark.anyio
async def test_7_the_error_object_travels_with_the_retry_and_info_shows_it(
    client: ojs.Client, q: str
) -> None:
    worker = ojs.Worker(queues=[q], retry=ojs.RetryPolicy(initial_interval=timedelta(milliseconds=100)))
    outcomes = Outcomes(worker)
    second_attempt = anyio.Event()
    release = anyio.Event()
    seen: list[dict[str, Any]] = []

    @worker.handler("charge.card")
    async def handler(ctx: ojs.JobContext) -> None:
        if ctx.attempt == 1:
            raise PaymentDeclined("insufficient funds")
        seen.append(dict(ctx.message.properties.headers or {}))
        second_attempt.set()
        await release.wait()

    async with running(worker, client):
        job = await client.push("charge.card", [], queue=q)
        with anyio.fail_after(WAIT):
            await second_attempt.wait()
        info = await client.info(job.id, queue=q, timeout=WAIT)
        release.set()
        await outcomes.wait_final(job.id)
        after = await client.info(job.id, queue=q, timeout=WAIT)
    h = seen[0]
    assert h["x-ojs-error-type"] == "billing.errors.PaymentDeclined"
    assert h["x-ojs-error-message"] == "billing.errors.PaymentDeclined: insufficient funds"
    assert "in handler: raise PaymentDeclined" in h["x-ojs-error-backtrace"]
    assert info.state == "active" and info.attempt == 2 and info.error is not None
    assert info.error.type == "billing.errors.PaymentDeclined"
    assert isinstance(info.error.backtrace, tuple) and "raise PaymentDeclined" in info.error.backtrace[-1]
    assert after.state == "completed" and after.error is None
    retried = outcomes.matching(lambda o: o.outcome == "retried")
    assert retried[0].error is not None and retried[0].error["message"] == "insufficient funds"


def test_7_backtraces_are_capped() -> None:
    from ojs_anyio.jobs._failures import MAX_BACKTRACE_CHARS, MAX_BACKTRACE_FRAMES, backtrace

    def deep(n: int) -> None:
        if n == 0:
            raise ValueError("bottom " + "x" * 500)
        deep(n - 1)

    try:
        deep(200)
    except ValueError as exc:
        frames = backtrace(exc)
    assert 0 < len(frames) <= MAX_BACKTRACE_FRAMES
    assert sum(len(f) + 1 for f in frames) <= MAX_BACKTRACE_CHARS
    assert "in deep" in frames[-1]  # the innermost frame is kept


# ----------------------------------------------------------------- 10. durations


def test_10_durations_in_three_forms_everywhere() -> None:
    for form in (2.5, timedelta(seconds=2.5), "PT2.5S"):
        assert duration_seconds(form, "x") == 2.5
        worker = ojs.Worker(queues=["a"], grace_period=form, heartbeat_interval=form, default_timeout=form)
        assert (worker.grace_period, worker.heartbeat_interval, worker.default_timeout) == (2.5, 2.5, 2.5)
        assert ojs.RetryPolicy(initial_interval=form).initial_interval == "PT2.5S"
    assert ojs.Retry("busy", delay="PT1M").delay == ojs.Retry(delay=timedelta(minutes=1)).delay == 60.0
    assert ojs.Scheduler(token_refresh="PT30S", misfire_grace=60).misfire_grace == timedelta(minutes=1)
    for bad in (True, -1, float("inf"), "2.5s", "P1M", [1]):
        with pytest.raises((TypeError, ValueError), match="x"):
            duration_seconds(bad, "x")


@pytest.mark.anyio
async def test_10_push_delay_and_timeout_take_the_same_forms(client: ojs.Client, q: str) -> None:
    a = client.build("a.job", [], queue=q, delay="PT30S", timeout=timedelta(minutes=1))
    b = client.build("a.job", [], queue=q, delay=timedelta(seconds=30), timeout="PT1M")
    assert a.timeout == b.timeout == 60
    assert isinstance(a.scheduled_at, str) and isinstance(b.scheduled_at, str)
    with pytest.raises(ValueError, match="whole seconds"):
        client.build("a.job", [], queue=q, timeout=1.5)
    worker = ojs.Worker(queues=[q])
    outcomes = Outcomes(worker)

    @worker.handler("a.job")
    async def handler(ctx: ojs.JobContext) -> None:
        pass

    async with running(worker, client):
        job = await client.push("a.job", [], queue=q, delay="PT0.2S")
        assert (await outcomes.wait_final(job.id)).outcome == "completed"


# ----------------------------------------------------------------- 9. the example


@pytest.mark.anyio
@pytest.mark.rabbitmq_only("the example runs in a subprocess: a memory:// broker lives in this process")
async def test_9_the_job_layer_example_runs(anyio_backend_name: str, new_queue: Any) -> None:
    root = ROOT
    queue = new_queue()
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{root / 'codec'}", "OJS_AMQP_URL": URL}
    with anyio.fail_after(60):
        result = await anyio.run_process(
            [sys.executable, str(root / "docs" / "examples" / "jobs_quickstart.py"), "--backend",
             anyio_backend_name, "--queue", queue],
            env=env, check=False, stderr=subprocess.STDOUT,
        )  # fmt: skip
    out = result.stdout.decode()
    assert result.returncode == 0, out
    assert "welcome email sent to user@example.com" in out
    assert "invoice 7 failed, as expected: dead-lettered" in out
