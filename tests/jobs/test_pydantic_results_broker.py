"""pydantic models as typed results (issue 27): a handler annotated to return a model (or a
list of them) gives that model back from ``PendingResult.result()`` and from a typed
handle's ``result(client, job_id)`` read by another client, validated with the model's own
rules.  RabbitMQ and memory://, asyncio and Trio."""

from __future__ import annotations

from datetime import date
from decimal import Decimal

import pydantic
import pytest

import ojs_anyio as ojs

from .broker_support import Outcomes, running

pytestmark = pytest.mark.anyio


class Order(pydantic.BaseModel):
    sku: str
    qty: int = pydantic.Field(gt=0)


class Invoice(pydantic.BaseModel):
    number: str
    issued: date
    total: Decimal = pydantic.Field(ge=0)
    currency: str

    @pydantic.field_validator("currency")
    @classmethod
    def upper(cls, value: str) -> str:
        return value.upper()


def _worker(q: str) -> tuple[ojs.Worker, ojs.JobHandle[..., Invoice], ojs.JobHandle[..., list[Invoice]]]:
    worker = ojs.Worker(queues=[q], retry=ojs.RetryPolicy(max_attempts=1))

    @worker.job("invoice.make", queue=q)
    async def make(ctx: ojs.JobContext, order: Order, day: date) -> Invoice:
        if order.sku == "broken":
            # Built without validation: a total its own model refuses.
            return Invoice.model_construct(number="x", issued=day, total=Decimal(-1), currency="EUR")
        return Invoice(
            number=f"INV-{order.sku}", issued=day, total=Decimal("2.50") * order.qty, currency="eur"
        )

    @worker.job("invoice.batch", queue=q)
    async def batch(ctx: ojs.JobContext, n: int) -> list[Invoice]:
        return [
            Invoice(number=str(i), issued=date(2026, 1, 1), total=Decimal(i), currency="usd")
            for i in range(n)
        ]

    return worker, make, batch


async def test_a_pydantic_result_comes_back_as_the_model(client: ojs.Client, q: str) -> None:
    worker, make, batch = _worker(q)
    async with running(worker, client):
        pending = await make.push_for_result(client, Order(sku="pen", qty=3), date(2026, 11, 25))
        invoice = await pending.result(timeout=30)
        many = await (await batch.push_for_result(client, 2)).result(timeout=30)
    assert invoice == Invoice(
        number="INV-pen", issued=date(2026, 11, 25), total=Decimal("7.50"), currency="EUR"
    )
    assert isinstance(invoice, Invoice) and isinstance(invoice.total, Decimal)
    assert [type(i) for i in many] == [Invoice, Invoice] and [i.currency for i in many] == ["USD", "USD"]


async def test_the_model_rules_apply_when_the_result_is_read(client: ojs.Client, q: str) -> None:
    """A result the model refuses (here built with ``model_construct``) raises pydantic's
    ValidationError at ``result()``, naming the field."""
    worker, make, _ = _worker(q)
    async with running(worker, client):
        pending = await make.push_for_result(client, Order(sku="broken", qty=1), date(2026, 11, 25))
        with pytest.raises(pydantic.ValidationError, match="total"):
            await pending.result(timeout=30)


async def test_another_client_reads_the_typed_result_by_id(
    client: ojs.Client, broker_url: str, q: str
) -> None:
    """``handle.result(other_client, job_id)``: the result from any process (INFO), as the model."""
    worker, make, batch = _worker(q)
    outcomes = Outcomes(worker)
    async with running(worker, client), ojs.connect(broker_url) as other:
        job = await make.push(client, Order(sku="ink", qty=2), date(2026, 12, 1))
        listed = await batch.push(client, 1)
        await outcomes.wait_final(job.id)
        invoice = await make.result(other, job.id, timeout=30)
        [only] = await batch.result(other, listed.id, timeout=30)
        # client.result without a handle: the JSON form the worker sent
        raw = await other.result(job.id, queue=q, timeout=30)
    assert invoice == Invoice(
        number="INV-ink", issued=date(2026, 12, 1), total=Decimal("5.00"), currency="EUR"
    )
    assert only.number == "0" and isinstance(only, Invoice)
    assert raw == {"number": "INV-ink", "issued": "2026-12-01", "total": "5.00", "currency": "EUR"}
