"""`medrank serve`: every endpoint, every bad-input class, overload, timeout, graceful shutdown, and equality with
`medrank rank`, on the tiny project (the decided system's shape: a baseline on metadata + bienc + passage)."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time

import pytest
from fastapi.testclient import TestClient

from medrank.serving.rank import MAX_ANSWERS, Ranker
from medrank.serving.app import ServeConfig, create_app
from tests.helpers.tiny_project import FIXTURES

pytestmark = pytest.mark.usefixtures("one_thread")  # the 2 cores are shared

FIXTURE_INPUT = json.loads((FIXTURES / "rank_input.json").read_text())


@pytest.fixture(scope="module")
def client(ranker):
    with TestClient(create_app(ServeConfig(threads=1, max_queue=4), ranker)) as c:
        _wait_ready(c)
        yield c


def _wait_ready(c: TestClient, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = c.get("/readyz")
        if r.status_code == 200:
            return r.json()
        assert r.json()["status"] == "loading", r.json()
        time.sleep(0.05)
    raise AssertionError("not ready in time")


def _one_line_error(r, status: int, *parts: str) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error"} and "\n" not in body["error"] and "Traceback" not in body["error"], body
    for p in parts:
        assert p in body["error"], (p, body["error"])
    return body["error"]


# ---------------------------------------------------------------- the endpoints


def test_rank_answers_exactly_what_medrank_rank_prints(client, tiny_project, monkeypatch, capsys):
    from medrank.cli import main

    monkeypatch.chdir(tiny_project)
    assert main(["rank", str(FIXTURES / "rank_input.json"), "--all"]) == 0
    want = json.loads(capsys.readouterr().out)
    r = client.post("/rank", content=json.dumps(FIXTURE_INPUT))
    assert r.status_code == 200, r.text
    assert r.json() == want
    kept = [a for a in want["answers"] if a["kept"]]
    assert want["n_kept"] == len(kept) >= 1 and want["answers"][: len(kept)] == kept  # kept first, then dropped
    assert [a["rank"] for a in kept] == list(range(1, len(kept) + 1))
    assert all(a["rank"] is None for a in want["answers"][len(kept) :])


def test_batch_answers_each_question_as_rank_does(client):
    other = {"question": "How is the flu treated?", "answers": [{"text": "Rest and fluids."}, {"text": "Antivirals."}]}
    empty = {"question": "Anything?", "answers": []}
    r = client.post("/rank/batch", json={"questions": [FIXTURE_INPUT, other, empty]})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert results[0] == client.post("/rank", json=FIXTURE_INPUT).json()
    assert results[1] == client.post("/rank", json=other).json()
    assert results[2] == {"question": "Anything?", "n_answers": 0, "n_kept": 0, "answers": []}


def test_health_ready_version_and_schema(client, tiny_project):
    from medrank.core.io import sha256_file

    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz").json()
    assert ready["status"] == "ready" and ready["warmup_s"] is not None and ready["max_queue"] == 4
    v = client.get("/version").json()
    assert v["system"]["system"] == "baseline" and v["system"]["mtl_weight"] == 0.0 and v["fit"] == "final"
    assert v["models"]["system.json"] == sha256_file(tiny_project / "models" / "system.json")
    assert v["models"]["baseline/final.json"] == sha256_file(tiny_project / "models" / "baseline" / "final.json")
    assert {"steps/normalize", "steps/answer_scores", "steps/passages", "encoders.zero_shot"} <= set(v["models"])
    assert not {"steps/retrieve", "steps/grids", "rqe", "nli"} & set(v["models"])  # not read, not loaded
    schema = client.get("/openapi.json").json()
    body = schema["paths"]["/rank"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["properties"]["answers"]["maxItems"] == MAX_ANSWERS and "/rank/batch" in schema["paths"]
    assert client.get("/docs").status_code == 200


def test_the_page_is_self_contained(client):
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    html = r.text
    assert '<form id="form">' in html and 'id="question"' in html and 'fetch("rank"' in html
    assert "http://" not in html and "https://" not in html and "src=" not in html  # no external asset
    assert "default-src 'none'" in r.headers["content-security-policy"]


# ---------------------------------------------------------------- bad input: one line of JSON, 4xx


@pytest.mark.parametrize(
    "body, status, parts",
    [
        ("{", 400, ["body: not valid JSON"]),
        ("", 400, ["body: empty input"]),
        (b"\xff\xfe", 400, ["not UTF-8"]),
        ("[1]", 422, ["expected a JSON object with 'question' and 'answers'"]),
        ('{"question": 5, "answers": []}', 422, ["'question' must be a non-empty string"]),
        ('{"question": "q", "answers": {"text": "a"}}', 422, ["'answers' must be a list"]),
        ('{"question": "q", "answers": [{"text": 5}]}', 422, ["answers[0]: 'text' must be a non-empty string"]),
        ('{"question": "q", "answers": [{"text": "  "}]}', 422, ["answers[0]: 'text' must be a non-empty string"]),
        ('{"question": "q", "answers": [{"text": "a", "url": 3}]}', 422, ["answers[0]: 'url' must be a string"]),
        ('{"question": "q", "answers": [{"text": "a", "id": true}]}', 422, ["'id' must be a non-empty string"]),
        ('{"question": "q", "answers": [], "x": 1}', 422, ["unknown key(s) ['x']"]),
        (
            json.dumps({"question": "q", "answers": [{"text": "a"}] * (MAX_ANSWERS + 1)}),
            422,
            [f"{MAX_ANSWERS + 1} answers; at most {MAX_ANSWERS} per question"],
        ),
    ],
)
def test_bad_input_is_a_4xx_with_one_line(client, body, status, parts):
    _one_line_error(client.post("/rank", content=body), status, *parts)


@pytest.mark.parametrize(
    "body, status, parts",
    [
        ("nope", 400, ["body: not valid JSON"]),
        ('{"questions": []}', 422, ["'questions' must be a non-empty list"]),
        ('{"question": "q", "answers": []}', 422, ["one key, 'questions'"]),
        ('{"questions": [{"question": "q", "answers": [{"text": 1}]}]}', 422, ["questions[0]: answers[0]: 'text'"]),
        (json.dumps({"questions": [FIXTURE_INPUT] * 5}), 422, ["5 questions; at most 4 per call"]),
    ],
)
def test_bad_batch_input_is_a_4xx_with_one_line(client, body, status, parts):
    _one_line_error(client.post("/rank/batch", content=body), status, *parts)


def test_an_oversize_body_is_refused_before_it_is_read(ranker):
    with TestClient(create_app(ServeConfig(threads=1, max_body_bytes=1000), ranker)) as c:
        _wait_ready(c)
        big = json.dumps({"question": "q", "answers": [{"text": "a" * 2000}]})
        _one_line_error(c.post("/rank", content=big), 413, f"body: {len(big)} bytes; at most 1000 per request")

        def chunks():  # no Content-Length: counted while it streams
            for _ in range(5):
                yield b" " * 400

        _one_line_error(c.post("/rank", content=chunks()), 413, "more than 1000 bytes")
        assert c.post("/rank", json={"question": "q", "answers": [{"text": "short"}]}).status_code == 200


def test_unknown_paths_and_methods_are_one_line_too(client):
    _one_line_error(client.get("/nope"), 404, "/nope")
    _one_line_error(client.get("/rank"), 405, "/rank")


# ---------------------------------------------------------------- load: queue bound, 503, timeout, micro-batches


class Gate:
    """Holds every pass until opened (the tiny models are too fast to see a queue otherwise); the real ranking runs
    after it."""

    def __init__(self, ranker: Ranker) -> None:
        self.ranker, self.open, self.entered = ranker, threading.Event(), threading.Semaphore(0)
        self.batches: list[int] = []

    def rank_many(self, inputs):
        self.batches.append(len(inputs))
        self.entered.release()
        assert self.open.wait(30)
        return self.ranker.rank_many(inputs)

    def __getattr__(self, name):
        return getattr(self.ranker, name)


def _post_in_thread(c: TestClient, body: dict, out: list) -> threading.Thread:
    t = threading.Thread(target=lambda: out.append(c.post("/rank", json=body)))
    t.start()
    return t


def test_overload_is_503_with_retry_after_then_recovers(ranker, caplog):
    gate = Gate(ranker)
    with TestClient(create_app(ServeConfig(threads=1, max_queue=2, warmup=False), gate)) as c:
        _wait_ready(c)
        results: list = []
        threads = [_post_in_thread(c, FIXTURE_INPUT, results)]
        assert gate.entered.acquire(timeout=30)  # one running
        threads += [_post_in_thread(c, FIXTURE_INPUT, results) for _ in range(2)]  # two waiting: the queue is full
        deadline = time.monotonic() + 30
        while c.get("/readyz").json()["queued"] < 2:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        with caplog.at_level(logging.INFO, logger="medrank.serving.access"):
            refused = c.post("/rank", json=FIXTURE_INPUT)
            _one_line_error(refused, 503, "at capacity (2 questions waiting)")
            assert int(refused.headers["retry-after"]) >= 1
            _one_line_error(c.post("/rank/batch", json={"questions": [FIXTURE_INPUT]}), 503, "at capacity")
        log = [json.loads(r.getMessage()) for r in caplog.records if r.name == "medrank.serving.access"]
        assert [(x["path"], x["status"]) for x in log] == [("/rank", 503), ("/rank/batch", 503)]
        assert c.get("/healthz").status_code == 200  # the process is fine
        gate.open.set()
        for t in threads:
            t.join(30)
        assert [r.status_code for r in results] == [200, 200, 200]
        assert len({r.text for r in results}) == 1
        assert c.get("/readyz").json()["stats"]["rejected"] == 2


def test_waiting_questions_are_ranked_together_with_max_batch(ranker):
    gate = Gate(ranker)
    other = {"question": "How is the flu treated?", "answers": [{"text": "Rest and fluids."}, {"text": "Antivirals."}]}
    with TestClient(create_app(ServeConfig(threads=1, max_batch=4, max_queue=8, warmup=False), gate)) as c:
        _wait_ready(c)
        results: list = []
        first = _post_in_thread(c, FIXTURE_INPUT, results)
        assert gate.entered.acquire(timeout=30)
        rest = [_post_in_thread(c, body, results) for body in (FIXTURE_INPUT, other, other)]
        deadline = time.monotonic() + 30
        while c.get("/readyz").json()["queued"] < 3:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        gate.open.set()
        for t in [first, *rest]:
            t.join(30)
        assert gate.batches == [1, 3]  # the three that waited went in one pass
        assert all(r.status_code == 200 for r in results)
        alone = {json.dumps(b): c.post("/rank", json=b).json() for b in (FIXTURE_INPUT, other)}
        for r in results:  # the same decisions as alone (scores may move by rounding only)
            want = alone[json.dumps(FIXTURE_INPUT if r.json()["n_answers"] == 4 else other)]
            assert [(a["id"], a["kept"]) for a in r.json()["answers"]] == [
                (a["id"], a["kept"]) for a in want["answers"]
            ]


def test_a_request_past_its_timeout_is_504_and_never_computed(ranker):
    gate = Gate(ranker)
    with TestClient(create_app(ServeConfig(threads=1, timeout_s=0.3, warmup=False), gate)) as c:
        _wait_ready(c)
        results: list = []
        first = _post_in_thread(c, FIXTURE_INPUT, results)
        assert gate.entered.acquire(timeout=30)
        _one_line_error(c.post("/rank", json=FIXTURE_INPUT), 504, "not ranked within the server's 0.3 s timeout")
        gate.open.set()
        first.join(30)
        assert results[0].status_code == 504  # it ran past its timeout too; its result was dropped
        assert gate.batches == [1]  # the second one timed out in the queue: never computed
        assert c.get("/readyz").json()["stats"]["timed_out"] == 2


def test_not_ready_is_503_and_a_broken_model_says_why(tmp_path):
    with TestClient(create_app(ServeConfig(models=str(tmp_path / "none"), threads=1))) as c:
        assert c.get("/healthz").status_code == 200
        deadline = time.monotonic() + 30
        while (r := c.get("/readyz")).json()["status"] == "loading":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert r.status_code == 503 and "no trained system (run `dvc repro score`)" in r.json()["error"]
        _one_line_error(c.post("/rank", json=FIXTURE_INPUT), 503, "models not loaded", "no trained system")


# ---------------------------------------------------------------- graceful shutdown, a real server


def test_shutdown_lets_in_flight_requests_finish(ranker):
    """uvicorn told to stop (what SIGTERM does) while a question is being ranked and one waits: both are answered,
    then the server exits; afterwards nothing listens."""
    import httpx
    import uvicorn

    gate = Gate(ranker)
    app = create_app(ServeConfig(threads=1, warmup=False), gate)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None, access_log=False))
    loop_thread = threading.Thread(target=lambda: asyncio.run(server.serve()))
    loop_thread.start()
    deadline = time.monotonic() + 30
    while not (server.started and server.servers):
        assert time.monotonic() < deadline and loop_thread.is_alive()
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    while httpx.get(f"{url}/readyz").status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    results: list = []
    posts = [
        threading.Thread(target=lambda: results.append(httpx.post(f"{url}/rank", json=FIXTURE_INPUT, timeout=60)))
        for _ in range(2)
    ]
    posts[0].start()
    assert gate.entered.acquire(timeout=30)
    posts[1].start()
    while app.state.service.scheduler.queued < 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    server.should_exit = True  # uvicorn's SIGTERM / SIGINT handler does just this
    time.sleep(0.3)
    gate.open.set()
    for t in posts:
        t.join(60)
    loop_thread.join(60)
    assert not loop_thread.is_alive()
    assert [r.status_code for r in results] == [200, 200] and results[0].json() == results[1].json()
    assert gate.batches == [1, 1]
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/healthz", timeout=2)


# ---------------------------------------------------------------- the models on disk


def test_models_damaged_on_disk_after_start_change_nothing_until_a_restart(tiny_project, tmp_path, monkeypatch):
    """docs/serving.md: the models are read and verified once, at start (issue 64: damage on disk while serving left
    /readyz ready). What runs is what was verified: the same answers, /readyz and /version; the next start refuses."""
    import shutil

    from medrank.core.errors import MedrankError

    shutil.copytree(tiny_project / "models", tmp_path / "models")
    monkeypatch.chdir(tmp_path)
    with TestClient(create_app(ServeConfig(threads=1, warmup=False))) as c:
        _wait_ready(c)
        before, version = c.post("/rank", json=FIXTURE_INPUT).json(), c.get("/version").json()
        for name in ("system.json", "baseline/final.json", "steps/passages/step.json"):
            f = tmp_path / "models" / name
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
        assert c.post("/rank", json=FIXTURE_INPUT).json() == before
        assert c.get("/readyz").json()["status"] == "ready" and c.get("/version").json() == version
    with pytest.raises(MedrankError, match="models/system.json"):
        Ranker.load("models")
