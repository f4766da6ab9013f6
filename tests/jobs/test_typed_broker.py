"""Typed job handles (``Worker.job``): pushes bound to the handler's signature, checked by mypy."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from uuid import UUID

import msgspec
import pytest

import ojs_anyio as ojs

from .broker_support import Outcomes, running

ROOT = Path(__file__).resolve().parents[2]
TYPING = ROOT / "tests" / "typing"


@pytest.mark.anyio
async def test_typed_push_binds_keywords_and_defaults(client: ojs.Client, q: str) -> None:
    worker = ojs.Worker(queues=[q], concurrency=2)
    seen: list[tuple[str, str, int]] = []

    @worker.job("email.send")
    async def send_email(ctx: ojs.JobContext, to: str, template: str = "welcome", retries: int = 0) -> None:
        seen.append((to, template, retries))

    outcomes = Outcomes(worker)
    async with running(worker, client):
        a = await send_email.push(client, "a@b.c", retries=3)  # template skipped: its default travels
        b = await send_email.options(priority=7, meta={"k": "v"}).push(client, "b@c.d", "hello")
        await outcomes.wait_final(a.id)
        await outcomes.wait_final(b.id)
    assert a.type == "email.send" and a.queue == q and a.args == ["a@b.c", "welcome", 3]
    assert b.args == ["b@c.d", "hello", 0] and b.priority == 7 and b.meta == {"k": "v"}
    assert sorted(seen) == [("a@b.c", "welcome", 3), ("b@c.d", "hello", 0)]


@pytest.mark.anyio
async def test_typed_push_refuses_wrong_arguments_before_sending(client: ojs.Client, q: str) -> None:
    worker = ojs.Worker(queues=[q])

    @worker.job("email.send")
    async def send_email(ctx: ojs.JobContext, to: str) -> None:
        pass

    with pytest.raises(TypeError, match=r"email\.send.*unexpected keyword argument 'too'"):
        await send_email.push(client, "a@b.c", too="x")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="missing a required argument: 'to'"):
        await send_email.push(client)  # type: ignore[call-arg]


def test_handler_shapes_that_cannot_travel_are_refused() -> None:
    worker = ojs.Worker(queues=["a"])
    with pytest.raises(TypeError, match="'template' is keyword-only"):

        @worker.job("x")
        async def kw_only(ctx: ojs.JobContext, to: str, *, template: str) -> None:
            pass

    two = ojs.Worker(queues=["a", "b"])
    with pytest.raises(TypeError, match="consumes 2 queues; say which one"):
        two.job("x")
    with pytest.raises(TypeError, match="unknown push option"):
        worker.job("x", delya=3)


def test_handle_calls_the_handler_directly() -> None:
    worker = ojs.Worker(queues=["a"])

    @worker.job("add")
    def add(ctx: ojs.JobContext, a: int, b: int) -> int:
        return a + b

    assert add(None, 2, 3) == 5  # type: ignore[arg-type]
    assert add.type == "add" and add.args_for(1, b=2) == [1, 2]


def _mypy(path: Path) -> tuple[str, int]:
    """mypy --strict on one file, with the project's config (run from the project root)."""
    from mypy import api

    out, err, status = api.run(["--strict", "--config-file", str(ROOT / "pyproject.toml"), str(path)])
    return out + err, status


def test_mypy_accepts_correct_typed_calls() -> None:
    out, status = _mypy(TYPING / "typed_ok.py")
    assert status == 0, out


def test_mypy_rejects_wrong_typed_calls() -> None:
    out, status = _mypy(TYPING / "typed_bad.py")
    assert status == 1, out
    errors = [line for line in out.splitlines() if ": error:" in line]
    lines = {int(line.split(":")[1]) for line in errors}
    assert lines == {20, 21, 22, 26, 27, 32, 37}, out
    # push() is overloaded (Client: a coroutine; SyncClient: blocking), so mypy names the
    # arguments that match no variant and prints the handler's own parameter list
    assert 'matches argument types "Client", "int"' in out
    assert 'Unexpected keyword argument "templat"' in out
    assert 'matches argument type "Client"' in out
    assert "def push(self, client: Client, to: str, template: str = ...) -> Coroutine[Any, Any, Job]" in out
    assert 'matches argument types "SyncClient", "date"' in out
    assert 'Incompatible types in assignment (expression has type "Coroutine[Any, Any, Job]"' in out


@dataclasses.dataclass
class Order:
    sku: str
    qty: int
    price: Decimal


class Summary(msgspec.Struct, frozen=True):
    day: date
    ref: UUID
    total: Decimal


@pytest.mark.anyio
async def test_typed_push_carries_the_types_its_handler_declares(client: ojs.Client, q: str) -> None:
    """date, UUID, Decimal, dataclasses and Structs travel as JSON and come back as the
    handler's annotations say, arguments and result alike."""
    worker = ojs.Worker(queues=[q])
    seen: list[tuple[date, Order, UUID, datetime]] = []

    @worker.job("report.build")
    async def build(ctx: ojs.JobContext, day: date, order: Order, ref: UUID, at: datetime) -> Summary:
        seen.append((day, order, ref, at))
        return Summary(day=day + timedelta(days=1), ref=ref, total=order.price * order.qty)

    ref = uuid.uuid4()
    at = datetime(2026, 11, 25, 8, 30, tzinfo=UTC)
    order = Order("pen", 3, Decimal("2.50"))
    async with running(worker, client):
        job = await build.push(client, date(2026, 11, 25), order, ref, at)
        pending = await build.push_for_result(client, date(2026, 11, 25), order, ref, at)
        summary = await pending.result(timeout=30)
    assert job.args == [
        "2026-11-25",
        {"sku": "pen", "qty": 3, "price": "2.50"},
        str(ref),
        "2026-11-25T08:30:00Z",
    ]
    assert seen == [(date(2026, 11, 25), order, ref, at)] * 2
    assert summary == Summary(day=date(2026, 11, 26), ref=ref, total=Decimal("7.50"))


def test_typed_push_refuses_a_value_with_no_json_form() -> None:
    worker = ojs.Worker(queues=["a"])

    @worker.job("x")
    async def handler(ctx: ojs.JobContext, value: object) -> None:
        pass

    with pytest.raises(TypeError, match=r"argument value of job 'x'.*"):
        handler.args_for(object())


def test_registration_refuses_a_job_type_that_push_would_refuse() -> None:
    worker = ojs.Worker(queues=["a"])
    for bad in ("Email.Send", "email..send", "email send", "x" * 256):
        with pytest.raises(ojs.InvalidJobError, match="not an OJS job type"):
            worker.register(bad, lambda ctx: None)
        with pytest.raises(ojs.InvalidJobError):

            @worker.job(bad)
            async def handler(ctx: ojs.JobContext) -> None:
                pass
