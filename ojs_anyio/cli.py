"""``ojs-anyio``: the command line for operators (see docs/cli.md).

Commands: ``worker``, ``queues``, ``dlq peek|requeue|purge|prune``, ``push``, ``cancel``,
``info``, ``cron``, ``topology declare|check``, ``dashboard``, ``demo``.  Expected failures print one line
on stderr and exit with a documented code (``ojs_anyio._cli._common``); ``--traceback``
adds the traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Callable, Coroutine
from typing import Any, NoReturn

import anyio

from ._cli._common import (
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    CLIError,
    count_arg,
    error_for,
    redact,
    refuse_memory,
    resolve_url,
    setup_logging,
)

__all__ = ["main"]

DESCRIPTION = """\
Operate ojs-anyio (Open Job Spec over RabbitMQ) from the command line: run workers
and cron schedulers, look at queues and dead letters, push, cancel and inspect jobs,
declare and check the AMQP topology.

Every command takes --url (default: $OJS_AMQP_URL, else amqp://guest:guest@localhost:5672/)
and --prefix (a tenant prefix such as 'tenant1.').  Output is a table; --json prints JSON.

Exit codes: 0 ok, 1 topology check found a difference, 2 bad arguments or URL,
3 broker unreachable, 4 authentication or access refused, 5 queue or job not found,
6 app path does not import, 7 broker refused the operation, 8 workers keep crashing,
9 cancel asked of a synchronous handler (it runs to completion), 130 interrupted.
"""

EPILOG = "Run 'ojs-anyio COMMAND --help' for a command's options.  Docs: docs/cli.md"


class _Parser(argparse.ArgumentParser):
    """argparse with the CLI's error contract: one line on stderr, exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"ojs-anyio: {message} (see '{self.prog} --help')\n")


def _common() -> _Parser:
    common = _Parser(add_help=False)
    g = common.add_argument_group("connection and output")
    g.add_argument(
        "--url", default=None, help="AMQP URL (default: $OJS_AMQP_URL or amqp://guest:guest@localhost/)"
    )
    g.add_argument("--prefix", default="", help="tenant prefix of every entity name, e.g. 'tenant1.'")
    g.add_argument("--json", action="store_true", help="print JSON instead of a table")
    g.add_argument("--traceback", action="store_true", help="print the traceback of an error, too")
    return common


def build_parser() -> argparse.ArgumentParser:
    common = _common()
    parser = _Parser(
        prog="ojs-anyio",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help: str, description: str | None = None, **kw: Any) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=description or help, parents=[common], **kw)

    w = add(
        "worker",
        "run a Worker defined in your code",
        "Run an ojs_anyio.Worker.  SIGTERM/SIGINT stop it gracefully (running jobs get the grace "
        "period, then are left unacked for redelivery); a second signal stops at once.",
    )
    w.add_argument("app", help="module:attribute of an ojs_anyio.Worker, or of a function returning one")
    w.add_argument(
        "--processes",
        type=count_arg(1),
        default=None,
        metavar="N",
        help="run N worker processes under a supervisor that restarts crashed ones",
    )
    w.add_argument(
        "--concurrency", type=count_arg(1), default=None, metavar="C", help="jobs at once per process"
    )
    w.add_argument(
        "--queues", default=None, metavar="A,B", help="comma-separated queues (overrides the Worker's)"
    )
    w.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    w.add_argument("--log-level", default="INFO")
    w.add_argument("--log-format", choices=["text", "json"], default="text")
    w.add_argument(
        "--reload",
        action="store_true",
        help="restart the workers when a .py file under the current directory changes "
        "(development; needs watchfiles: pip install 'ojs-anyio[cli]')",
    )

    q = add(
        "queues",
        "ready jobs, consumers, dead, retrying and scheduled counts per queue",
        "Show, per OJS queue, ready jobs, consumers, and the depths of its dead-letter and retry "
        "queues, read with AMQP passive declares (nothing beyond a plain broker is needed).",
    )
    q.add_argument("queue", nargs="*", help="OJS queue names")
    q.add_argument("--app", default=None, metavar="MODULE:WORKER", help="also the queues of this Worker")

    d = add("dlq", "dead letters: peek, requeue, purge, prune")
    dsub = d.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")

    def dadd(name: str, help: str) -> argparse.ArgumentParser:
        p = dsub.add_parser(name, help=help, description=help, parents=[common])
        p.add_argument("queue", help="OJS queue name (its dead letters are in ojs.queue.dlx.QUEUE)")
        return p

    peek = dadd("peek", "show the oldest dead jobs: id, type, attempt, age, reason (nothing is removed)")
    peek.add_argument("-n", type=count_arg(0), default=20, metavar="N", help="how many (default 20)")
    rq = dadd(
        "requeue",
        "move dead jobs back to their queue (publish, confirm, then ack: never lost; "
        "SIGINT stops after the current job)",
    )
    rq.add_argument("--id", action="append", metavar="ID", help="a job id (repeatable)")
    rq.add_argument("--all", action="store_true", help="every dead job of the queue")
    rq.add_argument("--reset-attempts", action="store_true", help="start the jobs again at attempt 1")
    rq.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    pu = dadd("purge", "delete every dead job of the queue")
    pu.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    pr = dadd("prune", "delete the oldest dead jobs: older than --max-age, or beyond --max-count")
    pr.add_argument("--max-age", default=None, metavar="DURATION", help="e.g. P180D, 30d, 12h")
    pr.add_argument(
        "--max-count", type=count_arg(0), default=None, metavar="N", help="keep at most the newest N"
    )
    pr.add_argument("--yes", action="store_true", help="do not ask for confirmation")

    p = add("push", "push a job and print its id")
    p.add_argument("type", help="job type, e.g. email.send")
    p.add_argument("--queue", required=True)
    p.add_argument("--args", default="[]", metavar="JSON", help="the job's arguments, a JSON array")
    p.add_argument("--meta", default=None, metavar="JSON", help="a JSON object")
    p.add_argument("--delay", default=None, metavar="DURATION", help="run after this long: 30s, 5m, PT1H")
    p.add_argument("--at", default=None, metavar="ISO", help="run at this time: 2026-05-01T09:00:00Z")
    p.add_argument("--priority", type=int, default=None, metavar="P", help="OJS priority")
    p.add_argument("--timeout", default=None, metavar="DURATION", help="the handler's time limit")
    p.add_argument(
        "--retry",
        default=None,
        metavar="N|JSON",
        help='max attempts, or a retry policy: \'{"max_attempts": 5, "initial_interval": "PT2S"}\'',
    )
    p.add_argument("--id", default=None, help="the job id (default: a new UUIDv7)")
    p.add_argument("--declare", action="store_true", help="declare the queue if it does not exist")

    for name, help in (
        ("cancel", "ask the workers of a queue to cancel a job"),
        ("info", "ask the workers of a queue about a job"),
    ):
        c = add(name, help)
        c.add_argument("job_id")
        c.add_argument("--queue", required=True)
        c.add_argument(
            "--timeout", default="2", metavar="DURATION", help="how long to wait for an answer (2s)"
        )

    cr = add("cron", "run a Scheduler (one leader among all instances fires each tick)")
    cr.add_argument("scheduler", help="module:attribute of an ojs_anyio.Scheduler")
    cr.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    cr.add_argument("--log-level", default="INFO")
    cr.add_argument("--log-format", choices=["text", "json"], default="text")

    t = add("topology", "declare or check the AMQP entities of queues")
    tsub = t.add_subparsers(dest="topology_command", required=True, metavar="ACTION")
    td = tsub.add_parser(
        "declare",
        help="declare the exchanges, queue, dead-letter and control queues",
        description="Declare (idempotently) the exchanges, job queue, dead-letter queue "
        "and control queue of each QUEUE, and their bindings.",
        parents=[common],
    )
    td.add_argument("queue", nargs="+")
    tc = tsub.add_parser(
        "check",
        help="compare the broker with the OJS declarations; exit 1 on a difference",
        description="Compare the entities on the broker with the OJS AMQP binding's "
        "declarations (passive declares, then a redeclare that the broker "
        "accepts only when equivalent).  Changes nothing.",
        parents=[common],
    )
    tc.add_argument("queue", nargs="+")

    db = add(
        "dashboard",
        "serve a web page of queues, workers, dead letters and cron (docs/dashboard.md)",
        "Serve the operators' dashboard (needs the dashboard extra).  It binds to localhost; cancel, "
        "requeue and purge need --token (or $OJS_DASHBOARD_TOKEN), and --read-only removes them.",
    )
    dq = db.add_mutually_exclusive_group()
    dq.add_argument("--queues", default=None, metavar="A,B", help="comma-separated OJS queues to show")
    dq.add_argument("--app", default=None, metavar="MODULE:WORKER", help="show this Worker's queues")
    db.add_argument("--bind", default="127.0.0.1:8080", metavar="HOST:PORT", help="default 127.0.0.1:8080")
    db.add_argument("--token", default=None, help="the token actions need (default: $OJS_DASHBOARD_TOKEN)")
    db.add_argument("--read-only", action="store_true", help="no cancel, requeue or purge")
    db.add_argument(
        "--allow-host", action="append", metavar="NAME", help="also answer requests for this host name"
    )
    db.add_argument("--show-backtraces", action="store_true", help="show error backtraces on the page")
    db.add_argument("--refresh", default="2", metavar="DURATION", help="how often the page updates (2s)")
    db.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    db.add_argument("--log-level", default="INFO")
    db.add_argument("--log-format", choices=["text", "json"], default="text")

    wf = add("workflow", "workflows: show one's state, counters and jobs (docs/workflows.md)")
    wsub = wf.add_subparsers(dest="workflow_command", required=True, metavar="ACTION")
    ws = wsub.add_parser(
        "show", help="a workflow's state", description="Show a workflow's state.", parents=[common]
    )
    ws.add_argument("workflow_id", help="the workflow's id (WorkflowHandle.id)")

    from .demo import add_arguments as demo_arguments

    dm = sub.add_parser(
        "demo",
        help="push and process a few hundred demo jobs",
        description="Push and process demo jobs, then report what happened.",
    )
    demo_arguments(dm)
    return parser


def _leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _dispatch(args: argparse.Namespace) -> Callable[[], Coroutine[Any, Any, int]] | int:
    from ._cli import _ops

    command = args.command
    if command == "worker":
        return _worker(args)
    if command in ("cron", "dashboard"):
        setup_logging(args.log_level, args.log_format)
    else:
        # A one-shot command reports what went wrong in its one error line; the library's
        # log lines on the way (a lost connection...) would only repeat it.
        logging.getLogger("ojs_anyio").addHandler(logging.NullHandler())
    table: dict[str, Callable[[Any], Coroutine[Any, Any, int]]] = {
        "queues": _ops.cmd_queues,
        "push": _ops.cmd_push,
        "cancel": _ops.cmd_cancel,
        "info": _ops.cmd_info,
        "cron": _ops.cmd_cron,
        "dlq peek": _ops.cmd_dlq_peek,
        "dlq requeue": _ops.cmd_dlq_requeue,
        "dlq purge": _ops.cmd_dlq_purge,
        "dlq prune": _ops.cmd_dlq_prune,
        "topology declare": _ops.cmd_topology_declare,
        "topology check": _ops.cmd_topology_check,
        "dashboard": _dashboard,
        "workflow show": _workflow_show,
    }
    key = command
    if command == "dlq":
        key = f"dlq {args.dlq_command}"
    elif command == "topology":
        key = f"topology {args.topology_command}"
    elif command == "workflow":
        key = f"workflow {args.workflow_command}"
    fn = table[key]
    return lambda: fn(args)


async def _workflow_show(args: argparse.Namespace) -> int:
    from ._cli._workflow import cmd_workflow_show

    return await cmd_workflow_show(args)


async def _dashboard(args: argparse.Namespace) -> int:
    from ._cli._dashboard import cmd_dashboard

    return await cmd_dashboard(args)


def _worker(args: argparse.Namespace) -> Callable[[], Coroutine[Any, Any, int]]:
    from . import Worker
    from ._cli._app import load_object
    from ._cli._worker import Supervisor, check_reload_available, child_command, run_worker

    setup_logging(args.log_level, args.log_format)
    queues = None
    if args.queues is not None:
        queues = [q.strip() for q in args.queues.split(",") if q.strip()]
        if not queues:
            raise CLIError("--queues: give at least one queue name", 2)
    worker = load_object(args.app, Worker, show_traceback=args.traceback)
    if args.processes is None and not args.reload:
        if queues is not None:
            worker.queues = queues
        if args.concurrency is not None:
            worker.concurrency = args.concurrency
        return lambda: run_worker(worker, args.url, args.prefix)
    if args.reload:
        check_reload_available()
    child = [
        "worker",
        args.app,
        "--backend",
        args.backend,
        "--log-level",
        args.log_level,
        "--log-format",
        args.log_format,
        "--prefix",
        args.prefix,
    ]
    if queues is not None:
        child += ["--queues", ",".join(queues)]
    if args.concurrency is not None:
        child += ["--concurrency", str(args.concurrency)]
    if args.traceback:
        child.append("--traceback")
    env = dict(os.environ)
    env["OJS_AMQP_URL"] = resolve_url(args.url)  # in the environment, not on a command line `ps` shows
    supervisor = Supervisor(
        child_command(child), args.processes or 1, env=env, reload_dirs=[os.getcwd()] if args.reload else []
    )
    return supervisor.run


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import run as run_demo

        return run_demo(args)
    url = resolve_url(getattr(args, "url", None))
    try:
        refuse_memory(url)
        target = _dispatch(args)
        if isinstance(target, int):
            return target
        result: int = anyio.run(target, backend=getattr(args, "backend", "asyncio"))
        return result
    except KeyboardInterrupt:
        sys.stderr.write("ojs-anyio: interrupted\n")
        return EXIT_INTERRUPTED
    except BaseException as exc:
        leaf = _leaf(exc)
        if isinstance(leaf, KeyboardInterrupt):
            sys.stderr.write("ojs-anyio: interrupted\n")
            return EXIT_INTERRUPTED
        if isinstance(leaf, SystemExit):
            raise leaf from None
        error = error_for(leaf, url)  # re-raises what it does not know: a bug deserves a traceback
        if getattr(args, "traceback", False) and leaf is not error:
            traceback.print_exception(leaf)
        sys.stderr.write(f"ojs-anyio: {redact(str(error), url)}\n")
        return error.code


if __name__ == "__main__":
    sys.exit(main())
