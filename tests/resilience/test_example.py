"""docs/examples/failure_handling.py runs as documented, through a proxy that cuts it."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import anyio
import pytest
from harness import FaultProxy

from .resilience_helpers import observer, wait_until

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.rabbitmq_only("the example cuts TCP connections through a FaultProxy"),
]

EXAMPLE = Path(__file__).parents[2] / "docs" / "examples" / "failure_handling.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("failure_handling_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_example_survives_repeated_cuts(
    amqp_url: str, unique: Callable[[str], str], capsys: pytest.CaptureFixture[str]
) -> None:
    example = load_example()
    queue = unique("example")
    try:
        await run_with_cuts(example, queue)
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(10):
            async with observer(amqp_url) as operator:
                await operator.queue_delete(queue)  # durable: don't leave it behind on failure
    out = capsys.readouterr().out
    assert "published 3000, all confirmed" in out
    assert "consumed all 3000" in out
    assert "lost:" in out and "recovered" in out


async def run_with_cuts(example: ModuleType, queue: str) -> None:
    async with FaultProxy() as proxy:

        async def cut_a_few_times() -> None:
            # Each time traffic flows again (so mid-run, never before the setup is done);
            # a few times only, so the example's own backoff (up to 5 s) stays out of play.
            for _ in range(3):
                target = proxy.bytes_down + 10_000
                await wait_until(
                    lambda target=target: proxy.active_connections == 1 and proxy.bytes_down > target,
                    timeout=60,
                )
                proxy.cut_all()

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(cut_a_few_times)
                await example.main(proxy.url(), 3000, queue)
                tg.cancel_scope.cancel()
        assert proxy.connections_cut >= 1
