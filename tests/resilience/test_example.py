"""docs/examples/failure_handling.py runs as documented, through a proxy that keeps cutting."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import anyio
import pytest
from harness import FaultProxy

pytestmark = pytest.mark.anyio

EXAMPLE = Path(__file__).parents[2] / "docs" / "examples" / "failure_handling.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("failure_handling_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_example_survives_repeated_cuts(
    unique: Callable[[str], str], capsys: pytest.CaptureFixture[str]
) -> None:
    example = load_example()
    async with FaultProxy() as proxy:
        proxy.set_latency(0.002)
        with anyio.fail_after(60):
            async with proxy.cutting_every(0.3):
                await example.main(proxy.url(), 3000, unique("example"))
        assert proxy.connections_cut >= 1
    out = capsys.readouterr().out
    assert "published 3000, all confirmed" in out
    assert "consumed all 3000" in out
    assert "lost:" in out and "recovered" in out
