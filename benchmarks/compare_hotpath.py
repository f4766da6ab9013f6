"""Two source trees, hotpath.py and codec_bench.py, interleaved: the method of compare_trees.py.

::

    git worktree add --detach /tmp/before <base>
    (cd /tmp/before && python3 setup.py build_ext --inplace)
    python3 benchmarks/compare_hotpath.py /tmp/before . --rounds 9 --n 20000

Each round runs ``codec_bench.py --json`` and ``hotpath.py --json --no-memory --repeat 1``
(raw-socket, ojs-anyio/asyncio, ojs-anyio/trio) once per tree, each in a subprocess whose
working directory is the tree and whose ``PYTHONPATH`` starts with the tree and its
``codec/``; the order alternates from round to round (A B, B A, ...).  The table gives each
path's median over the rounds, B / A of the medians, and the median of the per-round
ratios (drift between rounds cancels out of the latter).  ``raw-socket`` runs the codec
only, none of the client: on a shared machine its spread is the noise to read the client's
figures against.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path


def _env(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), str(tree / "codec")])
    return env


def _run(tree: Path, *args: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, *args],
        cwd=tree,
        env=_env(tree),
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


def run_once(tree: Path, n: int, smoke: bool = False) -> dict[str, float]:
    """One round on ``tree``: {path: operations per second}."""
    rates: dict[str, float] = {}
    codec = _run(tree, "benchmarks/codec_bench.py", "--json", *(["--smoke"] if smoke else []))
    for name, op in codec["ops"].items():  # type: ignore[attr-defined]
        rates[f"codec {name}"] = 1e6 / op["fast_us"]
        if "pure_us" in op:
            rates[f"codec {name} (pure Python)"] = 1e6 / op["pure_us"]
    rates["codec receive_data (deliveries)"] = 1e6 / codec["receive_data_us_per_delivery"]  # type: ignore[operator]
    only = ["--only", "raw-socket", "--only", "ojs-anyio/asyncio", "--only", "ojs-anyio/trio"]
    hot = _run(tree, "benchmarks/hotpath.py", "--json", "--no-memory", "--repeat", "1", "--n", str(n), *only)
    for client, r in hot["results"].items():  # type: ignore[attr-defined]
        for what in ("publish", "consume"):
            rate = r.get(f"{what}_msgs_per_s")
            if rate:
                rates[f"hotpath {client} {what}"] = rate
    return rates


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", type=Path, nargs="?", help="tree A (the baseline)")
    ap.add_argument("b", type=Path, nargs="?", help="tree B")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=20000, help="messages per hotpath workload")
    ap.add_argument("--smoke", action="store_true", help="this tree against itself, tiny counts, one round")
    args = ap.parse_args()
    if args.smoke:
        here = Path(__file__).resolve().parent.parent
        args.a, args.b, args.rounds, args.n = args.a or here, args.b or here, 1, 200
    elif args.a is None or args.b is None:
        ap.error("two trees are needed: A B")
    trees = [args.a.resolve(), args.b.resolve()]
    runs: list[list[dict[str, float]]] = [[], []]
    for rnd in range(args.rounds):
        for i in (0, 1) if rnd % 2 == 0 else (1, 0):
            rates = run_once(trees[i], args.n, args.smoke)
            runs[i].append(rates)
            shown = ", ".join(f"{k} {v:,.0f}" for k, v in rates.items())
            print(f"round {rnd + 1}, {'AB'[i]}: {shown}", file=sys.stderr, flush=True)
    keys = [k for k in runs[0][0] if all(k in r for r in runs[0] + runs[1])]
    print(f"A = {trees[0]}\nB = {trees[1]}\nmedian of {args.rounds} interleaved rounds, operations/s\n")
    print("| path | A | B | B / A | median of per-round B / A |")
    print("|---|---:|---:|---:|---:|")
    for key in keys:
        a = statistics.median(r[key] for r in runs[0])
        b = statistics.median(r[key] for r in runs[1])
        paired = statistics.median(rb[key] / ra[key] for ra, rb in zip(runs[0], runs[1], strict=True))
        print(f"| {key} | {a:,.0f} | {b:,.0f} | {b / a:.3f} | {paired:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
