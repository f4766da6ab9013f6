"""Two source trees, the same jobs.py scenarios, one run: rounds interleave the trees.

::

    git worktree add --detach /work/wt/base17 4b02ffe
    (cd /work/wt/base17 && python3 setup.py build_ext --inplace)
    python3 benchmarks/compare_trees.py /work/wt/base17 . --rounds 3 -- --n 10000

Each round runs ``benchmarks/jobs.py --json`` once per tree, in a subprocess whose working
directory is the tree and whose ``PYTHONPATH`` starts with the tree and its ``codec/`` (so
that tree's ``ojs_anyio`` and built codec are imported, whatever is installed).  The order
alternates from round to round (A B, B A, A B, ...), so a drift in the machine's load
hits both alike.  The table gives each scenario's median over the rounds, and B / A.

Arguments after ``--`` go to jobs.py (both trees); ``--peers none`` is always added, and
``--memory none --cli-processes ''`` for a tree whose jobs.py knows those options (older
ones do not), so only the scenarios both trees measure are run.  By default each tree runs
its own jobs.py; ``--script`` runs one file for both (against each tree's library).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path


def _help(script: Path, cwd: Path, env: dict[str, str]) -> str:
    return subprocess.run(
        [sys.executable, str(script), "--help"], cwd=cwd, env=env, capture_output=True, text=True, check=True
    ).stdout


def _env(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), str(tree / "codec"), env.get("PYTHONPATH", "")])
    return env


def _check_imports(tree: Path, env: dict[str, str]) -> None:
    """The subprocess imports ``tree``'s library, not an installed copy."""
    where = subprocess.run(
        [sys.executable, "-c", "import ojs_anyio, ojs_codec; print(ojs_anyio.__file__, ojs_codec.__file__)"],
        cwd=tree, env=env, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    for path in where:
        if not Path(path).resolve().is_relative_to(tree):
            sys.exit(f"{tree}: imports {path}, not its own copy (is the codec built there?)")


def run_once(tree: Path, script: Path, extra: list[str]) -> dict[str, float]:
    """One jobs.py run on ``tree``: {"<backend> <scenario>": jobs/s}, and, from a jobs.py that
    measures it, {"<backend> <scenario> CPU µs/job": client CPU per job} (lower is better)."""
    env = _env(tree)
    args = ["--peers", "none", *extra]
    known = _help(script, tree, env)
    if "--memory" in known:
        args += ["--memory", "none"]
    if "--cli-processes" in known:
        args += ["--cli-processes", ""]
    if "--repeat" in known and "--repeat" not in extra:
        args += ["--repeat", "1"]  # the rounds are this script's
    # --json with no path prints the JSON object on stdout (the only form older trees know).
    stdout = subprocess.run(
        [sys.executable, str(script), "--json", *args],
        cwd=tree, env=env, check=True, stdout=subprocess.PIPE, text=True,
    ).stdout  # fmt: skip
    data = json.loads(next(line for line in reversed(stdout.splitlines()) if line.startswith("{")))
    rates: dict[str, float] = {}
    for backend, entry in data["ours"].items():
        for scenario, rate in entry["rates"].items():
            rates[f"{backend} {scenario}"] = rate
        for scenario, us in entry.get("cpu_us", {}).items():
            rates[f"{backend} {scenario} CPU µs/job"] = us
    return rates


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        usage="%(prog)s A B [--rounds R] [--script PATH] [-- jobs.py args]",
    )
    ap.add_argument("a", type=Path, nargs="?", help="tree A (the baseline)")
    ap.add_argument("b", type=Path, nargs="?", help="tree B")
    ap.add_argument("--smoke", action="store_true", help="this tree against itself, jobs.py --smoke")
    ap.add_argument("--rounds", type=int, default=3, help="runs per tree (default 3; the median is shown)")
    ap.add_argument("--script", type=Path, help="one jobs.py for both trees (default: each tree's own)")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args = ap.parse_args(argv[:cut])
    args.jobs_args = argv[cut + 1 :]  # after --: arguments for jobs.py
    if args.smoke:
        here = Path(__file__).resolve().parent.parent
        args.a, args.b, args.rounds = args.a or here, args.b or here, 1
        args.jobs_args.append("--smoke")
    elif args.a is None or args.b is None:
        ap.error("two trees are needed: A B")
    trees = [args.a.resolve(), args.b.resolve()]
    for tree in trees:
        _check_imports(tree, _env(tree))
    runs: list[list[dict[str, float]]] = [[], []]
    for rnd in range(args.rounds):
        order = (0, 1) if rnd % 2 == 0 else (1, 0)
        for i in order:
            script = args.script.resolve() if args.script else trees[i] / "benchmarks" / "jobs.py"
            rates = run_once(trees[i], script, args.jobs_args)
            runs[i].append(rates)
            shown = ", ".join(f"{k} {v:,.0f}" for k, v in rates.items())
            print(f"round {rnd + 1}, {'AB'[i]} ({trees[i].name}): {shown}", file=sys.stderr, flush=True)
    scenarios = [k for k in runs[0][0] if all(k in r for r in runs[0] + runs[1])]
    print(f"A = {trees[0]}\nB = {trees[1]}\njobs.py {' '.join(args.jobs_args)}; median of {args.rounds} "
          "interleaved rounds, jobs/s (CPU rows: µs per job, lower is better)\n")  # fmt: skip
    print("| scenario | A | B | B / A | A rounds | B rounds |")
    print("|---|---:|---:|---:|---|---|")
    for key in scenarios:
        a = [r[key] for r in runs[0]]
        b = [r[key] for r in runs[1]]
        ma, mb = statistics.median(a), statistics.median(b)
        each_a = " ".join(f"{v:,.0f}" for v in a)
        each_b = " ".join(f"{v:,.0f}" for v in b)
        print(f"| {key} | {ma:,.0f} | {mb:,.0f} | {mb / ma:.2f} | {each_a} | {each_b} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
