"""The service as a Ray Serve deployment with 2 replicas on this machine (slow set; skipped without ray[serve]):
both replicas load the tiny models and answer, with the very JSON `medrank rank` prints."""

from __future__ import annotations

import json
import socket
import time

import pytest

from tests.helpers.tiny_project import FIXTURES

pytestmark = pytest.mark.slow


def test_two_replicas_answer_as_medrank_rank(tiny_project, monkeypatch, capsys):
    serve = pytest.importorskip("ray.serve", reason="needs ray[serve] (pip install 'ray[serve]')")
    import httpx
    import ray

    from medrank.cli import main
    from medrank.serving.app import ServeConfig
    from medrank.serving.ray_app import deployment

    monkeypatch.chdir(tiny_project)  # the replicas work from the driver's folder
    assert main(["rank", str(FIXTURES / "rank_input.json"), "--all"]) == 0
    want = json.loads(capsys.readouterr().out)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(deployment(ServeConfig(threads=1, max_queue=4), replicas=2), route_prefix="/", name="medrank")
        url = f"http://127.0.0.1:{port}"
        pids: set[int] = set()
        deadline = time.monotonic() + 300
        while len(pids) < 2:  # Ray's proxy spreads requests over the replicas: both must come up ready
            assert time.monotonic() < deadline, f"ready replicas: {pids}"
            r = httpx.get(f"{url}/readyz", timeout=30)
            if r.status_code == 200:
                pids.add(r.json()["pid"])
            time.sleep(0.2)
        for _ in range(4):
            r = httpx.post(f"{url}/rank", content=(FIXTURES / "rank_input.json").read_bytes(), timeout=60)
            assert r.status_code == 200 and r.json() == want
        bad = httpx.post(f"{url}/rank", content=b"{", timeout=30)
        assert bad.status_code == 400 and bad.json() == {
            "error": "body: not valid JSON (Expecting property name enclosed in double quotes at line 1 column 2)"
        }
    finally:
        serve.shutdown()
        ray.shutdown()
