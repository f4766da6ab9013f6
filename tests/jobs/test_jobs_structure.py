"""The shape of ojs_anyio.jobs and ojs_anyio.events, checked (issue 25's measured targets).

* no module of ``jobs/`` over :data:`MAX_MODULE_LINES` lines, no class of ``jobs/`` or
  ``events/`` over :data:`MAX_CLASS_LINES`;
* no ``obj._private`` access across ``jobs`` modules: ``x._name`` (``x`` not ``self`` or
  ``cls``) only for a ``_name`` its own module defines, and no private name imported from
  a sibling module;
* no call with more than five positional arguments in ``jobs/``;
* no function in ``ojs_anyio`` graded worse than D by radon's cyclomatic complexity;
* the push path builds the message after declaring what the route needs, and nothing
  slices a list of entities by position;
* one consume pool (``ojs_anyio/_consume_pool.py``) runs the pull tasks of both layers;
* no ``global`` statement in ``ojs_anyio`` or ``ojs_codec``: a memo or a probe keeps its
  state in a named object (``_common.utc_second``'s, the id clock, the tracing probe).

Files not yet split are listed with the figure they have now, so the lists can only
shrink: lower or remove an entry when the file is split.  Pure: no broker.
"""

from __future__ import annotations

import ast
import tempfile
from collections import Counter
from pathlib import Path

from radon.complexity import cc_rank, cc_visit

import ojs_anyio
import ojs_anyio.events
import ojs_anyio.jobs
import ojs_codec

LIBRARY = Path(ojs_anyio.__file__).parent
JOBS = Path(ojs_anyio.jobs.__file__).parent
EVENTS = Path(ojs_anyio.events.__file__).parent
CODEC = Path(ojs_codec.__file__).parent

MAX_MODULE_LINES = 450
MAX_CLASS_LINES = 400
MAX_POSITIONAL_ARGUMENTS = 5

#: Modules of jobs/ over the line limit (none: the worker and the workflows are split too).
MODULES_NOT_YET_SPLIT: dict[str, int] = {}
#: Classes over the limit: (file, class) -> lines (none).
CLASSES_NOT_YET_SPLIT: dict[tuple[str, str], int] = {}
#: Calls with more than five positional arguments, per file (none).
POSITIONAL_CALLS_NOT_YET_CHANGED: dict[str, int] = {}
#: ``x._name`` across jobs modules: "file.py: expr._name" -> count (none today).
PRIVATE_ACCESSES_ALLOWED: dict[str, int] = {}


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def long_classes(folder: Path, limit: int) -> dict[tuple[str, str], int]:
    found = {}
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ClassDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > limit:
                    found[(path.name, node.name)] = size
    return found


def _own_private_names(tree: ast.Module) -> set[str]:
    """The private names a module defines: functions, classes, module and class
    variables, and attributes it assigns (``self._x = ...``, ``obj._x = ...``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("_"):
            names.add(node.value)  # __slots__ entries
    return {n for n in names if n.startswith("_")}


def private_accesses_across_modules(folder: Path) -> Counter[str]:
    """``{"file.py: expr._name": count}``: ``_name`` read or written on an object other than
    ``self``/``cls`` although the file does not define it, or imported from a sibling."""
    found: Counter[str] = Counter()
    for path in sorted(folder.glob("*.py")):
        tree = _tree(path)
        own = _own_private_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level >= 1:
                for alias in node.names:
                    private = alias.name.startswith("_") and not alias.name.startswith("__")
                    if private and node.module:
                        found[f"{path.name}: from .{node.module} import {alias.name}"] += 1
                continue
            if not isinstance(node, ast.Attribute):
                continue
            name = node.attr
            if not name.startswith("_") or name.startswith("__") or name in own:
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if isinstance(owner, ast.Name) and (folder / f"{owner.id}.py").exists():
                continue  # a private module's public name, spelled _tracing.x: not this
            found[f"{path.name}: {ast.unparse(owner)}.{name}"] += 1
    return found


def positional_calls(folder: Path, limit: int) -> Counter[str]:
    found: Counter[str] = Counter()
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Call) and len(node.args) > limit:
                found[path.name] += 1
    return found


# ------------------------------------------------------------------ sizes


def test_no_module_of_jobs_is_over_the_line_limit() -> None:
    for path in sorted(JOBS.glob("*.py")):
        lines = _lines(path)
        bound = MODULES_NOT_YET_SPLIT.get(path.name, MAX_MODULE_LINES)
        assert lines <= bound, (
            f"jobs/{path.name} has {lines} lines (limit {bound}): split it by responsibility"
        )


def test_no_class_of_jobs_or_events_is_over_the_line_limit() -> None:
    for folder in (JOBS, EVENTS):
        for (file, name), size in long_classes(folder, MAX_CLASS_LINES).items():
            bound = CLASSES_NOT_YET_SPLIT.get((file, name), MAX_CLASS_LINES)
            assert size <= bound, f"{folder.name}/{file}: class {name} has {size} lines (limit {bound})"


def test_the_lists_of_files_not_yet_split_are_not_stale() -> None:
    """An entry that no longer exceeds the limit goes, so the limit applies to it again."""
    for name in MODULES_NOT_YET_SPLIT:
        path = JOBS / name
        assert path.exists() and _lines(path) > MAX_MODULE_LINES, f"remove {name} from MODULES_NOT_YET_SPLIT"
    longs = long_classes(JOBS, MAX_CLASS_LINES)
    for key in CLASSES_NOT_YET_SPLIT:
        assert key in longs, f"remove {key} from CLASSES_NOT_YET_SPLIT"


# ------------------------------------------------------------------ coupling


def test_no_private_access_across_jobs_modules() -> None:
    found = private_accesses_across_modules(JOBS)
    extra = {k: n for k, n in found.items() if n > PRIVATE_ACCESSES_ALLOWED.get(k, 0)}
    listing = "\n".join(f"{n:3} {where}" for where, n in sorted(extra.items()))
    assert not extra, f"private names reached across jobs modules (give them a public name):\n{listing}"


def test_no_call_has_more_than_five_positional_arguments() -> None:
    found = positional_calls(JOBS, MAX_POSITIONAL_ARGUMENTS)
    for file, count in found.items():
        bound = POSITIONAL_CALLS_NOT_YET_CHANGED.get(file, 0)
        assert count <= bound, (
            f"jobs/{file}: {count} calls with > 5 positional arguments: pass them by keyword"
        )


def test_no_function_is_graded_worse_than_d() -> None:
    worse = []
    for path in sorted(LIBRARY.rglob("*.py")):
        for block in cc_visit(path.read_text(encoding="utf-8")):
            if cc_rank(block.complexity) in ("E", "F"):
                where = path.relative_to(LIBRARY.parent)
                worse.append(f"{where}:{block.lineno} {block.name} ({block.complexity})")
    assert not worse, "functions graded worse than D by radon:\n" + "\n".join(worse)


# ------------------------------------------------------------------ the push path


def _method(path: Path, cls: str, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name == name:
                    return item
    raise AssertionError(f"{path.name}: no {cls}.{name}")


def _first_call_line(fn: ast.AST, name: str) -> int:
    """The first line of ``fn`` that calls ``name`` (a function, or ``.name``)."""
    calls = [node for node in ast.walk(fn) if isinstance(node, ast.Call)]
    lines = [node.lineno for node in calls if _called_name(node) == name]
    assert lines, f"no call to {name}"
    return min(lines)


def test_push_is_route_then_ensure_then_message_then_publish() -> None:
    """The message is built after the route's needs were declared, in one place
    (``_push.enqueued_message``, a plain function over ``_wire.job_message``: neither can
    await), which every path that publishes a job calls."""
    push = JOBS / "_push.py"
    assert isinstance(_method(push, "Pusher", "resolve_route"), ast.AsyncFunctionDef)
    resolve = _method(push, "Pusher", "resolve_route")
    assert _first_call_line(resolve, "ensure") > 0  # the declarer's, before anything is built
    for name in ("publish", "batch"):
        fn = _method(push, "Pusher", name)
        route_at = _first_call_line(fn, "resolve_route")
        message_at = _first_call_line(fn, "enqueued_message")
        publish_at = _first_call_line(fn, "publish")
        assert route_at < message_at < publish_at, name
    (builder,) = [
        node for node in _tree(push).body if getattr(node, "name", None) == "enqueued_message"
    ]
    assert isinstance(builder, ast.FunctionDef), "enqueued_message is plain: it cannot await"
    assert _first_call_line(builder, "job_message") > 0
    callers = {
        path.name
        for path in JOBS.glob("*.py")
        for node in ast.walk(_tree(path))
        if isinstance(node, ast.Call) and _called_name(node) == "job_message"
    }
    assert callers == {"_push.py"}, "a job's message is built by _push.enqueued_message only"
    for node in ast.walk(_tree(JOBS / "_wire.py")):
        assert not isinstance(node, ast.AsyncFunctionDef | ast.Await), "_wire.py builds messages: no I/O"


def test_nothing_slices_a_list_of_entities_by_position() -> None:
    """``exchanges(names)[:3]`` depends on the list's order: name what is meant instead."""
    listing = {"exchanges", "base_exchanges", "delay_level_exchanges", "delay_level_bindings"}
    for path in sorted(JOBS.glob("*.py")):
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Call):
                func = node.value.func
                called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
                assert called not in listing, f"{path.name}:{node.lineno}: {ast.unparse(node)}"


def _called_name(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")


def test_one_consume_pool_serves_both_layers() -> None:
    """The worker's queues and the bus's subscriptions run their pull tasks, and stop them
    with a grace period, through the one ``ojs_anyio._consume_pool.ConsumePool``: each layer
    makes its pools in one place, and no module starts a pull loop as a task of its own."""
    pull_loops = {"_pull_loop", "pull"}  # JobRunner._pull_loop, Subscription.pull
    made: dict[str, list[str]] = {"jobs": [], "events": []}
    for layer, folder in (("jobs", JOBS), ("events", EVENTS)):
        for path in sorted(folder.glob("*.py")):
            for node in ast.walk(_tree(path)):
                if not isinstance(node, ast.Call):
                    continue
                if _called_name(node) == "ConsumePool":
                    made[layer].append(path.name)
                if _called_name(node) in ("start_soon", "start"):
                    started = {getattr(n, "attr", None) for arg in node.args for n in ast.walk(arg)}
                    assert not started & pull_loops, f"{path.name}:{node.lineno}: {ast.unparse(node)}"
    assert made == {"jobs": ["_runner.py"], "events": ["_bus.py"]}


def global_statements(folder: Path) -> list[str]:
    """``"file.py:line"`` of every ``global`` statement under ``folder``."""
    return [
        f"{path.relative_to(folder)}:{node.lineno}"
        for path in sorted(folder.rglob("*.py"))
        for node in ast.walk(_tree(path))
        if isinstance(node, ast.Global)
    ]


def test_no_module_rebinds_a_global() -> None:
    """Module state of the library (memos, the id clock, probes, lazily made instruments)
    lives in named objects, one per rule, not in ``global`` rebinding scattered over the
    fast paths."""
    assert global_statements(LIBRARY) == []
    assert global_statements(CODEC) == []


# ------------------------------------------------------------------ the checks themselves


def test_the_checks_count() -> None:
    source = (
        "class _Mine:\n"
        "    def __init__(self):\n"
        "        self._x = 1\n"
        "def f(a, b):\n"
        "    a._x; b._theirs; self._y; _tracing.span\n"
        "    g(1, 2, 3, 4, 5)\n"
        "    g(1, 2, 3, 4, 5, 6)\n"
        "from ._other import _hidden\n"
        "def h():\n"
        "    global _state\n"
    )
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "m.py").write_text(source)
        (folder / "_tracing.py").write_text("")
        assert private_accesses_across_modules(folder) == Counter(
            {"m.py: b._theirs": 1, "m.py: from ._other import _hidden": 1}
        )
        assert positional_calls(folder, 5) == Counter({"m.py": 1})
        assert long_classes(folder, 2) == {("m.py", "_Mine"): 3}
        assert global_statements(folder) == ["m.py:10"]
