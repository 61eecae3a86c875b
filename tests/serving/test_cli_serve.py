"""`medrank serve` as a command: bad options and missing models are one error line before any port opens; with
--workers 2, two processes each load the models and answer (slow set)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, error_lines
from tests.helpers.tiny_project import FIXTURES


@pytest.mark.parametrize(
    "args, line",
    [
        (["--models", "none"], "error: none/system.json: no trained system (run `dvc repro score`)"),
        (["--port", "0"], "error: --port must be in 1..65535, got 0"),
        (["--workers", "0"], "error: --workers must be at least 1, got 0"),
        # issue 64: --threads 0 once meant the default, and --timeout inf reached the server (the models did load)
        (["--threads", "0"], "error: --threads must be at least 1, got 0"),
        (["--threads", "-2"], "error: --threads must be at least 1, got -2"),
        (["--max-batch", "0"], "error: --max-batch must be at least 1, got 0"),
        (["--max-queue", "0"], "error: --max-queue must be at least 1, got 0"),
        (["--timeout", "0"], "error: --timeout must be a positive number of seconds, got 0.0"),
        (["--timeout", "-1"], "error: --timeout must be a positive number of seconds, got -1.0"),
        (["--timeout", "inf"], "error: --timeout must be a positive number of seconds, got inf"),
        (["--timeout", "nan"], "error: --timeout must be a positive number of seconds, got nan"),
    ],
)
def test_bad_options_and_missing_models_are_one_line(tmp_path, monkeypatch, capsys, args, line):
    from medrank.cli import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["serve", *args])
    assert e.value.code == 2 and error_lines(capsys.readouterr().err) == [line]


@pytest.mark.slow
def test_two_workers_each_load_the_models_and_answer(tiny_project, tmp_path, monkeypatch, capsys):
    import httpx

    from medrank.cli import main

    monkeypatch.chdir(tiny_project)
    assert main(["rank", str(FIXTURES / "rank_input.json"), "--all"]) == 0
    want = json.loads(capsys.readouterr().out)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "server.log"
    cmd = [sys.executable, "-m", "medrank.cli", "serve", "--port", str(port), "--workers", "2", "--threads", "1"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, cwd=tiny_project, env=env, stdout=subprocess.DEVNULL, stderr=log.open("w"))
    url = f"http://127.0.0.1:{port}"
    try:
        pids: set[int] = set()
        deadline = time.monotonic() + 180
        while len(pids) < 2:
            assert proc.poll() is None, log.read_text()[-2000:]
            assert time.monotonic() < deadline, f"ready workers: {pids}"
            try:
                with httpx.Client() as c:  # a new connection each time: the kernel spreads them over the workers
                    r = c.get(f"{url}/readyz", timeout=5)
                if r.status_code == 200:
                    pids.add(r.json()["pid"])
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        assert httpx.post(f"{url}/rank", content=(FIXTURES / "rank_input.json").read_bytes(), timeout=60).json() == want
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    assert code in (0, -signal.SIGTERM), log.read_text()[-2000:]
