"""``ojs-anyio worker``: one worker in this process, or a supervisor of N worker processes."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from .. import Worker
from ._app import load_object
from ._common import (
    EXIT_APP,
    EXIT_AUTH,
    EXIT_CRASHING,
    EXIT_OK,
    EXIT_USAGE,
    CLIError,
    count_arg,
    open_client,
    resolve_url,
    setup_logging,
)
from ._registry import sync_command

__all__ = ["Supervisor", "run_worker"]

log = logging.getLogger("ojs_anyio.cli")

#: Set in a child's environment: the supervisor's pid.  The child stops gracefully when
#: its parent is gone (the supervisor was killed), so no worker outlives it.
ENV_SUPERVISOR = "OJS_CLI_SUPERVISOR_PID"
ENV_INDEX = "OJS_CLI_WORKER_INDEX"
#: Exit codes after which restarting a child cannot help: stop everything instead.
PERMANENT_EXIT = frozenset({EXIT_USAGE, EXIT_AUTH, EXIT_APP})


async def run_worker(worker: Worker, url: str | None, prefix: str) -> int:
    """Run ``worker`` until SIGTERM/SIGINT: the first stops it gracefully (no new jobs;
    running ones get the grace period, then are cancelled and left unacked), a second
    cancels at once (running jobs left unacked for the broker to redeliver)."""
    stopping = False
    async with (
        open_client(url, prefix, recovery=True, role="worker") as client,
        anyio.create_task_group() as tg,
    ):

        async def watch_signals() -> None:
            nonlocal stopping
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for signum in signals:
                    name = signal.Signals(signum).name
                    if not stopping:
                        stopping = True
                        log.warning("received %s: stopping gracefully (again to stop at once)", name)
                        worker.stop()
                    else:
                        log.warning("received %s again: stopping now, running jobs left unacked", name)
                        tg.cancel_scope.cancel()
                        return

        async def watch_parent(parent: int) -> None:
            nonlocal stopping
            # No event tells a process that its parent died: poll (cheap, once a second).
            while os.getppid() == parent:  # noqa: ASYNC110
                await anyio.sleep(1.0)
            if not stopping:
                stopping = True
                log.warning("the supervisor (pid %d) is gone: stopping gracefully", parent)
                worker.stop()

        tg.start_soon(watch_signals)
        parent = os.environ.get(ENV_SUPERVISOR)
        if parent and parent.isdigit():
            tg.start_soon(watch_parent, int(parent))
        log.info(
            "worker %s: queues %s, concurrency %d, broker %s",
            worker.worker_id,
            ",".join(worker.queues),
            worker.concurrency,
            client.conn.url.redacted(),
        )
        await worker.run(client)
        tg.cancel_scope.cancel()
    return EXIT_OK


def describe_exit(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exited with code {rc}"


class Supervisor:
    """Starts ``processes`` copies of ``command`` and keeps them running.

    * A child that exits unasked is restarted after a backoff (0.5 s, doubling per failure
      in a row, at most 30 s; a child that ran 30 s or more starts the count again).
    * Rate limit: more than ``max_restarts`` restarts within ``window`` seconds means the
      workers keep crashing; the supervisor stops the others and exits with code 8.
    * A child exiting with 2 (usage), 4 (auth) or 6 (app import) is not restarted: the
      supervisor stops the others and exits with that code.
    * SIGTERM/SIGINT are passed on to every child (graceful stop); a second one is passed
      on too (the children stop at once); children still alive ``kill_after`` seconds after
      that get SIGKILL.
    * ``reload_dirs``: on a change to a ``.py`` file there, children are restarted (SIGTERM,
      then started again at once); needs ``watchfiles``.
    """

    def __init__(
        self,
        command: Sequence[str],
        processes: int,
        *,
        env: dict[str, str] | None = None,
        reload_dirs: Sequence[str] = (),
        max_restarts: int = 10,
        window: float = 60.0,
        kill_after: float = 10.0,
    ) -> None:
        self.command = list(command)
        self.processes = processes
        self.env = dict(os.environ if env is None else env)
        self.reload_dirs = list(reload_dirs)
        self.max_restarts = max_restarts
        self.window = window
        self.kill_after = kill_after
        self.exit_code = EXIT_OK
        self._procs: dict[int, anyio.abc.Process] = {}
        self._reloading: set[int] = set()
        self._restarts: deque[float] = deque()
        self._signals_seen = 0
        self._stop = anyio.Event()
        self._all_exited = anyio.Event()

    async def run(self) -> int:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._watch_signals)
            if self.reload_dirs:
                tg.start_soon(self._watch_files)
            async with anyio.create_task_group() as slots:
                for i in range(self.processes):
                    slots.start_soon(self._slot, i)
            tg.cancel_scope.cancel()
        log.info("supervisor: all workers stopped")
        return self.exit_code

    def _stop_all(self, signum: signal.Signals = signal.SIGTERM) -> None:
        self._stop.set()
        for proc in list(self._procs.values()):
            if proc.returncode is None:
                try:
                    proc.send_signal(signum)
                except ProcessLookupError:
                    pass

    async def _slot(self, index: int) -> None:
        failures = 0
        env = {**self.env, ENV_SUPERVISOR: str(os.getpid()), ENV_INDEX: str(index)}
        while not self._stop.is_set():
            started = time.monotonic()
            proc = await anyio.open_process(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=None,
                stderr=None,
                env=env,
                start_new_session=True,  # a terminal's Ctrl-C reaches the supervisor only
            )
            self._procs[index] = proc
            log.info("supervisor: worker %d started (pid %d)", index, proc.pid)
            if self._stop.is_set():  # a signal came while it was starting: pass it on too
                proc.send_signal(signal.SIGTERM)
            try:
                rc = await proc.wait()
            finally:
                del self._procs[index]
                if not self._procs and self._stop.is_set():
                    self._all_exited.set()
            if self._stop.is_set():
                log.info("supervisor: worker %d (pid %d) %s", index, proc.pid, describe_exit(rc))
                return
            if index in self._reloading:
                self._reloading.discard(index)
                continue
            if rc in PERMANENT_EXIT:
                log.error(
                    "supervisor: worker %d (pid %d) %s, which restarting cannot fix: stopping",
                    index,
                    proc.pid,
                    describe_exit(rc),
                )
                self.exit_code = rc
                self._stop_all()
                return
            now = time.monotonic()
            failures = 1 if now - started >= 30.0 else failures + 1
            self._restarts.append(now)
            while self._restarts and self._restarts[0] < now - self.window:
                self._restarts.popleft()
            if len(self._restarts) > self.max_restarts:
                log.error(
                    "supervisor: %d restarts within %.0fs, the workers keep crashing: stopping",
                    len(self._restarts),
                    self.window,
                )
                self.exit_code = EXIT_CRASHING
                self._stop_all()
                return
            delay = min(0.5 * 2 ** (failures - 1), 30.0)
            log.warning(
                "supervisor: worker %d (pid %d) %s; restarting in %.1fs",
                index,
                proc.pid,
                describe_exit(rc),
                delay,
            )
            with anyio.move_on_after(delay):
                await self._stop.wait()

    async def _watch_signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                signum = signal.Signals(signum)
                self._signals_seen += 1
                name = signal.Signals(signum).name
                if self._signals_seen == 1:
                    log.warning("supervisor: received %s: stopping the workers gracefully", name)
                    self._stop_all(signum)
                else:
                    log.warning("supervisor: received %s again: the workers stop at once", name)
                    self._stop_all(signum)
                    with anyio.move_on_after(self.kill_after):
                        await self._all_exited.wait()
                    for proc in list(self._procs.values()):
                        log.error("supervisor: worker pid %d still running: SIGKILL", proc.pid)
                        proc.kill()

    async def _watch_files(self) -> None:
        try:
            from watchfiles import PythonFilter, awatch
        except ImportError:  # checked before the supervisor starts; kept for mypy
            return
        async for changes in awatch(*self.reload_dirs, watch_filter=PythonFilter()):
            if self._stop.is_set():
                return
            changed = sorted({Path(path).name for _, path in changes})
            log.warning("supervisor: %s changed: restarting the workers", ", ".join(changed[:5]))
            for index, proc in list(self._procs.items()):
                if proc.returncode is None:
                    self._reloading.add(index)
                    proc.send_signal(signal.SIGTERM)


def check_reload_available() -> None:
    try:
        import watchfiles  # noqa: F401
    except ImportError:
        raise CLIError(
            "--reload needs the watchfiles package: pip install 'ojs-anyio[cli]'", EXIT_USAGE
        ) from None


def child_command(args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "ojs_anyio.cli", *args]


# ------------------------------------------------------------------ the command


def _worker_arguments(w: argparse.ArgumentParser) -> None:
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


@sync_command(
    "worker",
    help="run a Worker defined in your code",
    description="Run an ojs_anyio.Worker.  SIGTERM/SIGINT stop it gracefully (running jobs get the grace "
    "period, then are left unacked for redelivery); a second signal stops at once.",
    arguments=_worker_arguments,
)
def cmd_worker(args: argparse.Namespace) -> Callable[[], Coroutine[Any, Any, int]]:
    """One worker in this process, or a supervisor of ``--processes`` (or ``--reload``) children."""
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
