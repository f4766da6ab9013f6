"""``ojs-anyio dashboard``: check the options, bind, and run :mod:`ojs_anyio.dashboard`."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
from typing import Any

import anyio

from .. import Worker
from ._app import load_object
from ._common import EXIT_OK, EXIT_USAGE, CLIError, fail, parse_duration, resolve_url
from ._registry import command

log = logging.getLogger("ojs_anyio.cli")

#: A shorter token is refused: it is the only thing between a page and a purge.
MIN_TOKEN_LENGTH = 12


def _bind(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        fail(f"--bind: {text!r} is not HOST:PORT (e.g. 127.0.0.1:8080)", EXIT_USAGE)
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port)


def _token(args: Any) -> str | None:
    token: str | None = args.token or os.environ.get("OJS_DASHBOARD_TOKEN") or None
    if token is None:
        return None
    if args.read_only:
        fail("give --read-only or a token (--token, $OJS_DASHBOARD_TOKEN), not both", EXIT_USAGE)
    if len(token) < MIN_TOKEN_LENGTH:
        fail(
            f"the token must be at least {MIN_TOKEN_LENGTH} characters; make one with "
            "python3 -c 'import secrets; print(secrets.token_urlsafe())'",
            EXIT_USAGE,
        )
    return token


def _dashboard_arguments(db: argparse.ArgumentParser) -> None:
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


@command(
    "dashboard",
    help="serve a web page of queues, workers, dead letters and cron (docs/dashboard.md)",
    description="Serve the operators' dashboard (needs the dashboard extra).  It binds to localhost; cancel, "
    "requeue and purge need --token (or $OJS_DASHBOARD_TOKEN), and --read-only removes them.",
    arguments=_dashboard_arguments,
    logging="service",
)
async def cmd_dashboard(args: Any) -> int:
    try:
        from .. import dashboard
    except ImportError as exc:
        raise CLIError(
            f"the dashboard needs Starlette and Hypercorn ({exc}): pip install 'ojs-anyio[dashboard]'",
            EXIT_USAGE,
        ) from None
    queues: list[str] = []
    if args.queues:
        queues = [q.strip() for q in args.queues.split(",") if q.strip()]
    if args.app:
        queues += [
            q for q in load_object(args.app, Worker, show_traceback=args.traceback).queues if q not in queues
        ]
    if logging.getLogger().getEffectiveLevel() >= logging.INFO:
        # Each passive declare of a queue not there yet (a retry queue, a delay level) is
        # a channel the broker closes, which the AMQP layer logs at INFO: not news here.
        logging.getLogger("ojs_anyio.amqp").setLevel(logging.WARNING)
    refresh = parse_duration(args.refresh, "--refresh").total_seconds()
    if not 0.2 <= refresh <= 3600:
        fail(f"--refresh: between 0.2 s and 1 h, got {args.refresh!r}", EXIT_USAGE)
    token = _token(args)
    host, port = _bind(args.bind)
    allowed = set(dashboard.LOOPBACK_NAMES) | {h.strip().lower() for h in args.allow_host or []}
    if host not in ("0.0.0.0", "::"):
        allowed.add(host.lower())
    settings = dashboard.Settings(
        token=token,
        read_only=args.read_only,
        show_backtraces=args.show_backtraces,
        allowed_hosts=frozenset(allowed),
    )
    try:
        sock = dashboard.listen(host, port)
    except OSError as exc:
        raise CLIError(f"--bind: cannot listen on {args.bind}: {exc.strerror or exc}", EXIT_USAGE) from None
    address = _address(sock)
    if not dashboard.is_loopback(host):
        sys.stderr.write(
            f"ojs-anyio: warning: listening on {address}, which other machines may reach: whoever reaches it "
            "sees the queues, jobs and workers; put it behind a TLS proxy that authenticates\n"
        )
    stop = anyio.Event()

    def ready() -> None:
        mode = settings.actions
        shown = ", ".join(queues) if queues else "those the workers announce"
        if args.json:  # one line, so that a script can read it while the server runs
            print(json.dumps({"url": f"http://{address}/", "queues": queues, "actions": mode}), flush=True)
        else:
            print(f"dashboard at http://{address}/ (queues: {shown}; actions: {mode})", flush=True)

    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for signum in signals:
                    if not stop.is_set():
                        log.warning("received %s: stopping the dashboard", signal.Signals(signum).name)
                        stop.set()
                    else:
                        tg.cancel_scope.cancel()
                        return

        tg.start_soon(watch)
        await dashboard.run(
            resolve_url(args.url), sock, settings,
            prefix=args.prefix, queues=queues, refresh=refresh, stop=stop, on_ready=ready,
        )  # fmt: skip
        tg.cancel_scope.cancel()
    return EXIT_OK


def _address(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
