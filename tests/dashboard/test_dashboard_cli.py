"""``ojs-anyio dashboard`` as a command: its options are checked before anything starts
(one line on stderr, the documented exit code), it serves on asyncio and Trio, and
SIGTERM stops it cleanly."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import urllib.request
import uuid
from pathlib import Path

import pytest
from cli.cli_support import cli_cmd, cli_env, run_many

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("rabbitmq_url")]


def test_bad_options_are_one_line_and_exit_2_or_6(tmp_path: Path) -> None:
    cases = {
        ("--bind", "nonsense"): (2, "--bind: 'nonsense' is not HOST:PORT"),
        ("--bind", "127.0.0.1:70000"): (2, "is not HOST:PORT"),
        ("--token", "short"): (2, "the token must be at least 12 characters"),
        ("--read-only", "--token", "long-enough-token"): (2, "give --read-only or a token"),
        ("--queues", "dlx.email"): (2, "dlx.email"),
        ("--refresh", "0"): (2, "--refresh: between 0.2 s and 1 h"),
        ("--url", "memory://"): (2, "in-process memory broker"),
        ("--app", "nosuchmodule:worker"): (6, "cannot import 'nosuchmodule'"),
        ("--queues", "a", "--app", "x:y"): (2, "not allowed with argument"),
    }
    results = run_many([["dashboard", "--bind", "127.0.0.1:0", *args] for args in cases])
    for (args, (code, says)), result in zip(cases.items(), results, strict=True):
        assert result.returncode == code, (args, result.stderr)
        assert says in result.stderr, (args, result.stderr)
        assert result.stderr.count("\n") == 1 and result.stdout == "", (args, result.stderr)


def test_a_port_in_use_is_refused() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        (result,) = run_many([["dashboard", "--bind", f"127.0.0.1:{port}"]])
    assert result.returncode == 2
    assert f"--bind: cannot listen on 127.0.0.1:{port}: Address already in use" in result.stderr


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_serves_a_workers_queues_and_stops_on_sigterm(backend: str, tmp_path: Path) -> None:
    q = f"tdash{uuid.uuid4().hex[:10]}"
    (tmp_path / "app.py").write_text(f"import ojs_anyio as ojs\nworker = ojs.Worker(queues=['{q}'])\n")
    proc = subprocess.Popen(
        cli_cmd(
            "dashboard",
            "--app",
            "app:worker",
            "--bind",
            "127.0.0.1:0",
            "--read-only",
            "--backend",
            backend,
            *(["--json"] if backend == "trio" else []),
        ),
        cwd=tmp_path,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        if backend == "trio":  # --json: the same facts, for scripts
            said = json.loads(proc.stdout.readline())
            assert said["queues"] == [q] and said["actions"] == "read-only", said
            url = said["url"]
        else:
            line = proc.stdout.readline()
            assert line.endswith(f"/ (queues: {q}; actions: read-only)\n"), line
            url = line.split()[2]
        assert url.startswith("http://127.0.0.1:"), url
        with urllib.request.urlopen(url, timeout=30) as response:
            page = response.read().decode()
        assert f'<tr data-queue="{q}">' in page and "no such queue yet" in page
        assert "Read-only dashboard" in page
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "received SIGTERM: stopping the dashboard" in err
    assert "Traceback" not in err
