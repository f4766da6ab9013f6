"""``ojs-anyio worker`` (one process, and the supervisor) and ``ojs-anyio cron``, as subprocesses."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import anyio
import pytest

import ojs_anyio as ojs
from ojs_anyio._cli._worker import Supervisor
from ojs_anyio.jobs._cron import leader_queue_name

from .cli_support import delete_queues, lines, queue_count, reaped, run_cli, spawn_cli, wait_for


def push_jobs(q: str, n: int, seconds: float) -> list[str]:
    async def go() -> list[str]:
        async with ojs.connect() as client:
            await client.declare_queue(q)
            results = await client.push_batch([client.build("t.work", [seconds], queue=q) for _ in range(n)])
            assert all(r.ok for r in results)
            return [r.job.id for r in results]

    ids: list[str] = anyio.run(go)
    return ids


def events(log: Path, kind: str) -> list[tuple[str, int]]:
    out = []
    for line in lines(log):
        k, job_id, pid = line.split(":")
        if k == kind:
            out.append((job_id, int(pid)))
    return out


def test_supervisor_sigterm_loses_nothing_and_runs_nothing_twice(app_dir: Path, q: str) -> None:
    log = app_dir / "jobs.log"
    out = app_dir / "sup.out"
    ids = push_jobs(q, 60, 0.5)  # one process alone would need 15 s: both get jobs
    sup = spawn_cli("worker", "app:worker", "--processes", "2", "--concurrency", "2", cwd=app_dir, log=out)
    with reaped(sup):
        wait_for(lambda: len({pid for _, pid in events(log, "start")}) == 2, 60, "both processes to run jobs")
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(timeout=45) == 0, out.read_text()
    done_first = [job_id for job_id, _ in events(log, "done")]
    started_first = {job_id for job_id, _ in events(log, "start")}
    # Graceful: every job that started also completed (within the grace period).
    assert started_first == set(done_first)
    assert len(done_first) == len(set(done_first))
    left = queue_count(f"ojs.queue.{q}")
    assert left == 60 - len(done_first), "the rest is back in the queue, nothing lost"
    # Run the rest: nothing completed runs again, nothing is missing.
    again = spawn_cli("worker", "app:worker", cwd=app_dir)
    with reaped(again):
        wait_for(lambda: len(events(log, "done")) >= 60, 90, "all 60 jobs done")
        again.send_signal(signal.SIGTERM)
        assert again.wait(timeout=30) == 0
    done = [job_id for job_id, _ in events(log, "done")]
    assert sorted(done) == sorted(ids)


def test_kill_9_of_a_child_restarts_it_and_its_jobs_are_redelivered(app_dir: Path, q: str) -> None:
    log = app_dir / "jobs.log"
    out = app_dir / "sup.out"
    ids = push_jobs(q, 4, 2.0)
    sup = spawn_cli("worker", "app:worker", "--processes", "2", "--concurrency", "2", cwd=app_dir, log=out)
    with reaped(sup):
        starts = wait_for(
            lambda: len(events(log, "start")) >= 4 and events(log, "start"), 60, "4 jobs running"
        )
        pids = {pid for _, pid in starts}
        victim = starts[0][1]
        victim_jobs = {job_id for job_id, pid in starts if pid == victim}
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: "killed by SIGKILL; restarting" in out.read_text(), 30, "the supervisor to notice")
        wait_for(lambda: {j for j, _ in events(log, "done")} == set(ids), 60, "every job to complete")
        new_pids = {pid for _, pid in events(log, "start")} - pids
        redelivered = {job_id for job_id, pid in events(log, "start") if pid != victim} & victim_jobs
        assert redelivered == victim_jobs, "the killed child's unacked jobs ran elsewhere"
        assert new_pids or redelivered
        wait_for(lambda: out.read_text().count("started (pid") >= 3, 30, "the restarted child")
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(timeout=45) == 0, out.read_text()
    assert victim not in {pid for _, pid in events(log, "done")}


def test_worker_single_process_trio_from_a_script_outside_the_app_dir(
    app_dir: Path, q: str, tmp_path: Path
) -> None:
    """The current directory is on the import path even when ``ojs-anyio`` is a console
    script living elsewhere (sys.path[0] is then the script's directory, not the cwd)."""
    launcher = tmp_path / "bin" / "ojs-anyio"
    launcher.parent.mkdir()
    launcher.write_text("import sys\nfrom ojs_anyio.cli import main\nsys.exit(main())\n")
    ids = push_jobs(q, 3, 0.0)
    import subprocess

    from .cli_support import cli_env

    # The app's Worker names another queue: --queues overrides it.
    proc = subprocess.Popen(
        [
            sys.executable,
            str(launcher),
            "worker",
            "app:worker",
            "--backend",
            "trio",
            "--log-format",
            "json",
            "--queues",
            q,
        ],
        cwd=app_dir,
        env=cli_env(APP_QUEUE="not-this-one"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    with reaped(proc):
        wait_for(
            lambda: len(events(app_dir / "jobs.log", "done")) >= 3 or proc.poll() is not None, 60, "jobs"
        )
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert sorted(j for j, _ in events(app_dir / "jobs.log", "done")) == sorted(ids)
    import json

    records = [json.loads(line) for line in err.splitlines() if line.strip()]
    assert any("SIGINT" in r["message"] for r in records)
    assert all({"time", "level", "logger", "message", "pid"} <= set(r) for r in records)


def test_cron_runs_a_scheduler_and_stops_on_sigterm(app_dir: Path, q: str) -> None:
    push_jobs(q, 0, 0)  # declares the queue
    out = app_dir / "cron.out"
    proc = spawn_cli("cron", "app:sched", cwd=app_dir, log=out)
    try:
        wait_for(lambda: (queue_count(f"ojs.queue.{q}") or 0) >= 1, 30, "a fired job in the queue")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
        delete_queues([leader_queue_name(ojs.Names(), f"g{q}")])


def test_reload_restarts_the_workers_on_a_source_change(app_dir: Path, q: str) -> None:
    pytest.importorskip("watchfiles", reason="--reload needs the cli extra (watchfiles)")
    out = app_dir / "sup.out"
    push_jobs(q, 0, 0)
    sup = spawn_cli("worker", "app:worker", "--reload", cwd=app_dir, log=out)
    with reaped(sup):
        wait_for(lambda: "queues " + q in out.read_text(), 60, "the worker to start")
        (app_dir / "app.py").write_text((app_dir / "app.py").read_text() + "\n# changed\n")
        wait_for(lambda: "app.py changed" in out.read_text(), 30, "the change to be seen")
        wait_for(lambda: out.read_text().count("worker 0 started") >= 2, 60, "the restarted worker")
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(timeout=45) == 0, out.read_text()


def test_worker_errors_are_one_line(app_dir: Path) -> None:
    (app_dir / "broken.py").write_text("import os\nraise RuntimeError('boom at import')\n")
    (app_dir / "notworker.py").write_text("worker = 42\n")
    cases = {
        "nosuchmodule:worker": "no module named 'nosuchmodule'",
        "broken:worker": "RuntimeError: boom at import",
        "app:nosuch": "has no attribute 'nosuch'",
        "notworker:worker": "not an ojs_anyio.Worker",
        "app": "expected module:attribute",
    }
    for spec, text in cases.items():
        r = run_cli("worker", spec, cwd=app_dir)
        assert r.returncode == (2 if spec == "app" else 6), (spec, r.stderr)
        assert text in r.stderr and "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
    r = run_cli("worker", "broken:worker", "--traceback", cwd=app_dir)
    assert r.returncode == 6 and "Traceback" in r.stderr
    # The supervisor does not restart a child that cannot import: it stops with code 6.
    r = run_cli(
        "worker", "app:worker", "--processes", "2", "--url", "amqp://guest:wrongpw@127.0.0.1/", cwd=app_dir
    )
    assert r.returncode == 4, r.stderr
    assert "wrongpw" not in r.stderr + r.stdout


# ------------------------------------------------------------- the supervisor in-process


@pytest.mark.anyio
async def test_supervisor_gives_up_on_a_crash_loop() -> None:
    sup = Supervisor([sys.executable, "-c", "import sys; sys.exit(3)"], 2, max_restarts=3, window=60)
    with anyio.fail_after(30):
        assert await sup.run() == 8


@pytest.mark.anyio
async def test_supervisor_does_not_restart_a_permanent_failure() -> None:
    sup = Supervisor([sys.executable, "-c", "import sys; sys.exit(6)"], 1)
    with anyio.fail_after(30):
        assert await sup.run() == 6


@pytest.mark.anyio
async def test_supervisor_passes_sigterm_on() -> None:
    child = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    sup = Supervisor([sys.executable, "-c", child], 2)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            result: list[int] = []

            async def run() -> None:
                result.append(await sup.run())

            tg.start_soon(run)
            while len(sup._procs) < 2:  # noqa: ASYNC110 - the children's pids are the observable state
                await anyio.sleep(0.05)
            os.kill(os.getpid(), signal.SIGTERM)
    assert result == [0]


async def _wait_file(path: Path) -> None:
    while not await anyio.Path(path).exists():  # noqa: ASYNC110 - the child's marker is the observable state
        await anyio.sleep(0.02)


async def _signal_twice(sup: Supervisor, marks: Path) -> int:
    """Run ``sup``; SIGTERM this process once its child is ready, again once the child saw
    the first one (children write ``ready`` / ``first`` marker files)."""
    result: list[int] = []
    async with anyio.create_task_group() as tg:

        async def run() -> None:
            result.append(await sup.run())

        tg.start_soon(run)
        await _wait_file(marks / "ready")
        os.kill(os.getpid(), signal.SIGTERM)
        await _wait_file(marks / "first")
        os.kill(os.getpid(), signal.SIGTERM)
    return result[0]


CHILD = """
import pathlib, signal, sys, time
marks = pathlib.Path(sys.argv[1])
seen = []
def on(*a):
    seen.append(1)
    (marks / ("first" if len(seen) == 1 else "second")).touch()
    if len(seen) == 2 and sys.argv[2] == "second":
        sys.exit(0)
signal.signal(signal.SIGTERM, on)
(marks / "ready").touch()
time.sleep(60)
"""


@pytest.mark.anyio
@pytest.mark.parametrize("child", ["second", "stubborn"])
async def test_supervisor_second_signal_is_passed_on_then_kills_what_is_left(
    tmp_path: Path, child: str
) -> None:
    """The first SIGTERM is passed on (the child notes it and keeps running), the second
    too; a child still running ``kill_after`` seconds later is killed."""
    sup = Supervisor([sys.executable, "-c", CHILD, str(tmp_path), child], 1, kill_after=1.0)
    with anyio.fail_after(30):
        assert await _signal_twice(sup, tmp_path) == 0
    assert (tmp_path / "second").exists(), "the second signal reached the child"
