"""The workflow chaos run at CI size (``benchmarks/workflow_chaos.py --smoke``): a batch of
200 jobs on two worker processes behind a fault-injecting proxy, two SIGKILLs and two cuts
of every connection at random points; every job runs, each callback exactly once with all
200 results.  The full size (2,000 jobs, 10 runs) and its figures: docs/workflows.md."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.usefixtures("rabbitmq_url")]

ROOT = Path(__file__).resolve().parents[2]


def test_batch_survives_kills_and_connection_cuts() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "workflow_chaos.py"), "--smoke"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "PASS jobs=200 distinct_done=200" in done.stdout
    assert "on_complete=1 on_success=1 callbacks_ok=True" in done.stdout
