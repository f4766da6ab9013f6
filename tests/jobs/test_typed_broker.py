"""Typed job handles (``Worker.job``): pushes bound to the handler's signature, checked by mypy."""

from __future__ import annotations

from pathlib import Path

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
    assert lines == {16, 17, 18}, out
    assert 'incompatible type "int"; expected "str"' in out
    assert 'Unexpected keyword argument "templat"' in out
    assert "Missing positional argument" in out or 'Too few arguments' in out

