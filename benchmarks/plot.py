"""Plot a ``benchmarks/jobs.py --json`` result: per scenario, the raw-socket ceiling, ours
(asyncio and Trio) and every peer, in jobs per second.

    python3 benchmarks/jobs.py --json out.json        # or: --json > out.json
    python3 benchmarks/plot.py out.json docs/benchmarks.png

Needs matplotlib (``pip install 'ojs-anyio[bench]'``).  Bars are labelled with their rate;
ours are also labelled with their share of the ceiling measured in the same run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any

SCENARIOS = (
    ("push_batch", "enqueue\npush_batch", "enqueue"),
    ("push_concurrent", "enqueue\npush x100 tasks", "enqueue"),
    ("worker_c1", "worker\nconcurrency 1", "worker_c1"),
    ("worker_c10", "worker\nconcurrency 10", "worker_c10"),
    ("worker_c100", "worker\nconcurrency 100", "worker_c100"),
)
# ours: the scenario key; peers: their enqueue is one figure for both enqueue scenarios.
PEER_KEY = {"push_batch": "enqueue", "push_concurrent": "enqueue"}


def series(result: dict[str, Any]) -> list[tuple[str, list[float | None]]]:
    """``[(label, [rate per scenario or None])]``: ceiling, ours per backend, then peers."""
    out: list[tuple[str, list[float | None]]] = []
    ceiling = result.get("ceiling", {}).get("rates", {})
    out.append(("raw-socket ceiling", [ceiling.get(ckey) for _key, _label, ckey in SCENARIOS]))
    for backend, entry in result.get("ours", {}).items():
        rates = entry.get("rates", {})
        out.append((f"ojs-anyio/{backend}", [rates.get(key) for key, _label, _c in SCENARIOS]))
    for name, entry in result.get("peers", {}).items():
        rates = entry.get("rates")
        if not rates:
            continue
        out.append((name, [rates.get(PEER_KEY.get(key, key)) for key, _label, _c in SCENARIOS]))
    return out


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = series(result)
    ceiling = rows[0][1]
    n_groups, n_bars = len(SCENARIOS), len(rows)
    width = 0.8 / n_bars
    fig, ax = plt.subplots(figsize=(12, 5.5), dpi=110)
    colors = {"raw-socket ceiling": "#bbbbbb", "ojs-anyio/asyncio": "#1f77b4", "ojs-anyio/trio": "#2ca02c"}
    # (cycled: with the @parity rows there are more peers than colours)
    others = itertools.cycle(
        ["#ff7f0e", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]
    )
    for i, (label, values) in enumerate(rows):
        xs = [g - 0.4 + width * (i + 0.5) for g in range(n_groups)]
        heights = [v or 0.0 for v in values]
        color = colors.get(label) or next(others)
        bars = ax.bar(xs, heights, width, label=label, color=color, edgecolor="white", linewidth=0.5)
        for bar, value, cap in zip(bars, values, ceiling, strict=True):
            if value is None:
                continue
            text = f"{value:,.0f}"
            if label.startswith("ojs-anyio") and cap:
                text += f"\n{value / cap:.0%}"
            ax.annotate(
                text,
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=6.5,
                rotation=90 if not label.startswith("ojs-anyio") else 0,
                xytext=(0, 2),
                textcoords="offset points",
            )
    ax.set_xticks(range(n_groups), [label for _key, label, _c in SCENARIOS])
    ax.set_ylabel("jobs per second (higher is better)")
    ax.set_ylim(0, max((v or 0.0) for _label, values in rows for v in values) * 1.25 or 1)
    n = result.get("n")
    ax.set_title(
        f"Job throughput on one RabbitMQ broker, N={n:,} no-op jobs"
        + (f", {result.get('cpus')} CPUs" if result.get("cpus") else "")
        + " — ours labelled with their share of the ceiling"
    )
    ax.legend(ncols=4, fontsize=8, loc="upper left")
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("result", nargs="?", help="JSON written by benchmarks/jobs.py --json ('-' for stdin)")
    ap.add_argument("output", nargs="?", help="the PNG to write")
    ap.add_argument("--smoke", action="store_true", help="CI: plot a made-up result into a temp file")
    args = ap.parse_args(argv)
    if args.smoke:
        import tempfile

        made_up = {
            "benchmark": "jobs",
            "n": 10,
            "ceiling": {"rates": {"enqueue": 100.0, "worker_c1": 50.0, "worker_c10": 80.0}},
            "ours": {"asyncio": {"rates": {key: 40.0 for key, _l, _c in SCENARIOS}}},
            "peers": {},
        }
        with tempfile.TemporaryDirectory() as tmp:
            plot(made_up, Path(tmp) / "smoke.png")
        print("smoke OK")
        return 0
    if args.result is None or args.output is None:
        ap.error("give the JSON result and the PNG to write")
    text = sys.stdin.read() if args.result == "-" else Path(args.result).read_text()
    result = json.loads(text.strip().splitlines()[-1])
    if result.get("benchmark") != "jobs":
        ap.error(f"{args.result} is not a benchmarks/jobs.py --json result")
    plot(result, Path(args.output))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
