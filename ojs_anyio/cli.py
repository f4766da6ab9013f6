"""``ojs-anyio``: run workers and the demo from the command line.

::

    ojs-anyio worker myapp.jobs:worker --url amqp://guest:guest@localhost/ --backend trio
    ojs-anyio demo

``worker`` imports ``module:attribute`` (an :class:`ojs_anyio.Worker`) and runs it until
SIGTERM or SIGINT, which stop it gracefully: no new jobs are taken, running jobs get the
worker's grace period to finish, and jobs still running after that are cancelled and left
unacked for the broker to redeliver.  A second signal cancels at once.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import signal
import sys
from typing import Any

import anyio

from .jobs._client import connect
from .jobs._worker import Worker

__all__ = ["main"]

log = logging.getLogger("ojs_anyio.cli")


def load_worker(spec: str) -> Worker:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise SystemExit(f"ojs-anyio: expected module:attribute, got {spec!r}")
    module = importlib.import_module(module_name)
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part)
    if callable(obj) and not isinstance(obj, Worker):
        obj = obj()
    if not isinstance(obj, Worker):
        raise SystemExit(f"ojs-anyio: {spec} is {type(obj).__name__}, not an ojs_anyio.Worker")
    return obj


async def run_worker(worker: Worker, url: str | None, prefix: str) -> None:
    async with connect(url, prefix=prefix) as client, anyio.create_task_group() as tg:

        async def watch_signals(scope: anyio.CancelScope) -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for signum in signals:
                    if not worker.stopping:
                        log.warning("received %s: stopping gracefully", signal.Signals(signum).name)
                        worker.stop()
                    else:
                        log.warning("received %s again: cancelling now", signal.Signals(signum).name)
                        scope.cancel()
                        return

        tg.start_soon(watch_signals, tg.cancel_scope)
        await worker.run(client)
        tg.cancel_scope.cancel()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ojs-anyio", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("worker", help="run a Worker defined in your code")
    w.add_argument("worker", help="module:attribute of an ojs_anyio.Worker (or a factory returning one)")
    w.add_argument(
        "--url", default=None, help="AMQP URL (default: $OJS_AMQP_URL or amqp://guest:guest@localhost/)"
    )
    w.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    w.add_argument("--prefix", default="", help="tenant prefix for every entity name, e.g. 'tenant1.'")
    w.add_argument("--log-level", default="INFO")
    d = sub.add_parser("demo", help="push and process a few hundred demo jobs")
    d.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import main as demo_main

        return demo_main(args.rest)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    worker = load_worker(args.worker)
    anyio.run(run_worker, worker, args.url, args.prefix, backend=args.backend)
    return 0


if __name__ == "__main__":
    sys.exit(main())
