"""The job layer's handlers on the shared pipeline (issue 25): pydantic models as argument
types when pydantic is installed, and misuse refused with ``ArgumentTypeError``.  Pure."""

from __future__ import annotations

from typing import Any

import pytest

from ojs_anyio import amqp
from ojs_anyio.jobs._handlers import ArgumentsError, inspect_handler

try:
    import pydantic
except ImportError:  # the optional extra is absent: its test is skipped
    pydantic = None  # type: ignore[assignment]

if pydantic is not None:

    class Customer(pydantic.BaseModel):
        id: int
        email: str


async def welcome(ctx: Any, customer: Customer, note: str = "") -> None:
    return None


def test_a_pydantic_argument_is_validated_and_a_misfit_names_the_field() -> None:
    pytest.importorskip("pydantic")
    spec = inspect_handler("welcome", welcome)
    [customer] = spec.convert([{"id": 3, "email": "a@b.c"}])
    assert isinstance(customer, Customer) and customer.id == 3
    with pytest.raises(ArgumentsError) as misfit:
        spec.convert([{"id": "three", "email": "a@b.c"}])
    assert "'customer'" in str(misfit.value) and "id:" in str(misfit.value)


class _Callable:
    def __call__(self, ctx: Any) -> None:  # a plain __call__ on an instance: refused
        return None


@pytest.mark.parametrize("fn", [_Callable, _Callable(), 42, lambda: None])
def test_what_cannot_be_a_handler_is_an_argument_type_error(fn: Any) -> None:
    with pytest.raises(TypeError) as refused:
        inspect_handler("x", fn)
    assert isinstance(refused.value, amqp.UsageError)
