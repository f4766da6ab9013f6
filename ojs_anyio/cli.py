"""``ojs-anyio``: the command line for operators (see docs/cli.md).

Commands: ``worker``, ``queues``, ``dlq peek|requeue|purge|prune``, ``push``, ``cancel``,
``info``, ``cron``, ``topology declare|check``, ``dashboard``, ``demo``.  Expected failures print one line
on stderr and exit with a documented code (``ojs_anyio._cli._common``); ``--traceback``
adds the traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from collections.abc import Callable, Coroutine
from typing import Any, NoReturn

import anyio

# The modules that declare the commands (importing them declares them).
from . import demo as _demo  # noqa: F401
from ._cli import _dashboard, _events, _ops, _worker, _workflow  # noqa: F401
from ._cli._common import (
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    error_for,
    redact,
    refuse_memory,
    resolve_url,
    setup_logging,
)
from ._cli._registry import COMMANDS, GROUPS, Command

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
    """The parser of every declared command (``_cli._registry.COMMANDS``), sorted."""
    common = _common()
    parser = _Parser(
        prog="ojs-anyio",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # The sub-parsers of each group, made the first time one of its commands is added.
    subparsers: dict[tuple[str, ...], Any] = {(): sub}

    def under(prefix: tuple[str, ...]) -> Any:
        if prefix not in subparsers:
            g = GROUPS[prefix]
            gp = under(prefix[:-1]).add_parser(prefix[-1], help=g.help, description=g.help, parents=[common])
            subparsers[prefix] = gp.add_subparsers(
                dest="_".join(prefix) + "_command", required=True, metavar=g.metavar
            )
        return subparsers[prefix]

    for words, cmd in sorted(COMMANDS.items()):
        parents = [common] if cmd.broker else []
        description = cmd.description or cmd.help
        p = under(words[:-1]).add_parser(words[-1], help=cmd.help, description=description, parents=parents)
        cmd.arguments(p)
        p.set_defaults(declared=cmd)
    return parser


def _leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _dispatch(args: argparse.Namespace) -> Callable[[], Coroutine[Any, Any, int]] | int:
    cmd: Command = args.declared
    if cmd.logging == "service":
        setup_logging(args.log_level, args.log_format)
    elif cmd.logging == "quiet":
        # A one-shot command reports what went wrong in its one error line; the library's
        # log lines on the way (a lost connection...) would only repeat it.
        logging.getLogger("ojs_anyio").addHandler(logging.NullHandler())
    return cmd.run(args)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    url = resolve_url(getattr(args, "url", None)) if args.declared.broker else ""
    try:
        if not args.declared.broker:  # self-contained (demo, events asyncapi): no broker URL
            code = args.declared.run(args)
            assert isinstance(code, int)
            return code
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
