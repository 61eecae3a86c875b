"""The rerank shapes (Cohere /v1/rerank, /v2/rerank; TEI /rerank), /metrics and the timing headers, on the tiny
project: the order is medrank's submission order, the scores map it to [0, 1] with the keep decision at 0.5, every
refusal is one line naming the field, and a TEI client gets TEI's codes."""

from __future__ import annotations

import json
import threading
import time

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from medrank.serving import rerank_api
from medrank.serving.app import ServeConfig, create_app
from medrank.serving.protocol import RequestError
from medrank.serving.rank import as_input
from tests.helpers.tiny_project import FIXTURES

pytestmark = pytest.mark.usefixtures("one_thread")

FIXTURE_INPUT = json.loads((FIXTURES / "rank_input.json").read_text())
QUERY = FIXTURE_INPUT["question"]
TEXTS = [a["text"] for a in FIXTURE_INPUT["answers"]]
URLS = [a.get("url", "") for a in FIXTURE_INPUT["answers"]]


def _wait_ready(c: TestClient, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while c.get("/readyz").status_code != 200:
        assert time.monotonic() < deadline, c.get("/readyz").json()
        time.sleep(0.05)


@pytest.fixture(scope="module")
def client(ranker):
    with TestClient(create_app(ServeConfig(threads=1, max_queue=4), ranker)) as c:
        _wait_ready(c)
        yield c


def submission_order(ranker, urls=None) -> tuple[list[int], list[int]]:
    """(every position in the submission order, the kept positions) of the fixture's texts, computed in-process."""
    result = ranker.rank(as_input(QUERY, [(str(i), t, (urls or [""] * len(TEXTS))[i]) for i, t in enumerate(TEXTS)]))
    order = result.sort_values("score", ascending=False, kind="stable")
    return [int(i) for i in order["id"]], [int(i) for i in order.loc[order["kept"], "id"]]


def _error(r, status: int, *parts: str) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert "\n" not in body["error"] and "Traceback" not in body["error"], body
    for p in parts:
        assert p in body["error"], (p, body)
    return body


# ---------------------------------------------------------------- the shapes


@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])
def test_cohere_lists_every_document_in_the_submission_order(client, ranker, path):
    order, kept = submission_order(ranker)
    r = client.post(path, json={"model": "medrank", "query": QUERY, "documents": TEXTS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [x["index"] for x in body["results"]] == order
    assert body["meta"]["api_version"]["version"] == path[2] and body["meta"]["n_kept"] == len(kept) >= 1
    scores = [x["relevance_score"] for x in body["results"]]
    assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)
    for x in body["results"]:  # the keep decision at 0.5, and the filter's probability beside it
        assert x["kept"] == (x["index"] in kept) == (x["relevance_score"] > 0.5)
        assert 0 <= x["filter_score"] <= 1 and "document" not in x
    # /rank's kept answers, in /rank's order, are the first ones here (the ids differ: /rank's are the client's)
    ranked = client.post(
        "/rank", json={"question": QUERY, "answers": [{"id": str(i), "text": t} for i, t in enumerate(TEXTS)]}
    )
    assert [int(a["id"]) for a in ranked.json()["answers"] if a["kept"]] == kept == order[: len(kept)]


def test_cohere_objects_top_n_documents_and_kept_only(client, ranker):
    docs = [
        {"text": t, "url": u, "title": f"doc {i}"} if u else {"text": t} for i, (t, u) in enumerate(zip(TEXTS, URLS))
    ]
    order, kept = submission_order(ranker, URLS)  # the URLs are read (the source feature), as /rank reads them
    body = client.post(
        "/v1/rerank", json={"query": QUERY, "documents": docs, "top_n": 2, "return_documents": True}
    ).json()
    assert [x["index"] for x in body["results"]] == order[:2]
    assert [x["document"] for x in body["results"]] == [docs[i] for i in order[:2]]  # every field, as Cohere keeps them
    only = client.post("/v2/rerank", json={"query": QUERY, "documents": docs, "kept_only": True}).json()
    assert [x["index"] for x in only["results"]] == kept
    by_query = client.post("/v2/rerank?kept_only=true", json={"query": QUERY, "documents": docs}).json()
    assert [x["index"] for x in by_query["results"]] == kept
    _error(client.post("/v2/rerank?kept_only=maybe", json={"query": QUERY, "documents": docs}), 422, "?kept_only")
    empty = client.post("/v2/rerank", json={"query": QUERY, "documents": []})
    assert empty.status_code == 200 and empty.json()["results"] == []


def test_tei_scores_raw_scores_and_texts(client, ranker):
    order, kept = submission_order(ranker)
    r = client.post("/rerank", json={"query": QUERY, "texts": TEXTS})
    assert r.status_code == 200, r.text
    assert [x["index"] for x in r.json()] == order and all(
        set(x) == {"index", "score", "kept", "filter_score"} for x in r.json()
    )
    raw = client.post("/rerank", json={"query": QUERY, "texts": TEXTS, "raw_scores": True, "return_text": True}).json()
    assert [round(x["score"] / 2, 6) for x in raw] == pytest.approx([x["score"] for x in r.json()], abs=1e-6)
    assert [x["text"] for x in raw] == [TEXTS[i] for i in order] and raw[0]["score"] > 1  # kept: above 1 unhalved
    truncated = client.post(
        "/rerank", json={"query": QUERY, "texts": TEXTS, "truncate": True, "truncation_direction": "Right"}
    )
    assert truncated.json() == r.json()  # no effect: each encoder reads its recipe's first tokens


def test_rank_and_rerank_responses_carry_timing_headers(client):
    for r in (
        client.post("/rank", json=FIXTURE_INPUT),
        client.post("/rerank", json={"query": QUERY, "texts": TEXTS}),
        client.post("/v2/rerank", json={"query": QUERY, "documents": TEXTS}),
    ):
        assert r.status_code == 200
        parts = dict(p.strip().split(";dur=") for p in r.headers["server-timing"].split(","))
        assert set(parts) == {"queue", "compute", "total"} and float(parts["total"]) >= float(parts["compute"]) > 0
        assert int(r.headers["x-total-time"]) >= int(r.headers["x-inference-time"]) >= 0


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "path, body, status, parts",
    [
        ("/v2/rerank", b"{nope", 400, ["body: not valid JSON"]),
        ("/v2/rerank", {"query": "", "documents": ["a"]}, 422, ["'query' must be a non-empty string"]),
        ("/v2/rerank", {"query": "q", "documents": "a"}, 422, ["'documents' must be a list"]),
        ("/v2/rerank", {"query": "q", "documents": [{"title": "x"}]}, 422, ["documents[0]: an object needs 'text'"]),
        ("/v2/rerank", {"query": "q", "documents": [" "]}, 422, ["documents[0]: 'text' must be a non-empty string"]),
        ("/v2/rerank", {"query": "q", "documents": ["a"], "top_n": 0}, 422, ["'top_n' must be a positive integer"]),
        ("/v2/rerank", {"query": "q", "documents": ["a"], "rank_fields": ["title"]}, 422, ["'rank_fields'"]),
        ("/v2/rerank", {"query": "q", "documents": ["a"], "temperature": 1}, 422, ["unknown key(s) ['temperature']"]),
        ("/v1/rerank", {"query": "q", "documents": ["a"] * 101}, 422, ["101 documents; at most 100"]),
        ("/rerank", {"query": "q", "texts": []}, 422, ["'texts' cannot be empty"]),
        ("/rerank", {"query": "q", "texts": [{"text": "a"}]}, 422, ["texts[0]: expected one of strings"]),
        ("/rerank", {"query": "q", "texts": ["a"], "truncation_direction": "Left"}, 422, ["only 'Right'"]),
        ("/rerank", {"query": "q", "texts": ["a"], "raw_scores": "yes"}, 422, ["'raw_scores' must be true or false"]),
    ],
)
def test_bad_rerank_input_is_one_line_naming_the_field(client, path, body, status, parts):
    r = client.post(path, content=body) if isinstance(body, bytes) else client.post(path, json=body)
    got = _error(r, status, *parts)
    if path == "/rerank":
        assert got["error_type"] == "Validation"  # TEI's error body
    else:
        assert set(got) == {"error"}


def test_parsers_read_only_the_api_keys():
    with pytest.raises(RequestError, match="'model' must be a string"):
        rerank_api.parse_cohere(b'{"model": 3, "query": "q", "documents": ["a"]}', 2)
    req = rerank_api.parse_cohere(b'{"model": "x", "query": "q", "documents": ["a"], "priority": 0}', 2, True)
    assert req.kept_only and req.inp.answers[0].id == "0" and req.top_n is None
    assert rerank_api.relevance(1.5) == 0.75 and rerank_api.relevance(-1) == 0.0


def test_tei_overload_is_429_with_retry_after(ranker):
    class Gate:
        def __init__(self):
            self.open, self.entered = threading.Event(), threading.Semaphore(0)

        def rank_many(self, inputs):
            self.entered.release()
            assert self.open.wait(30)
            return ranker.rank_many(inputs)

        def __getattr__(self, name):
            return getattr(ranker, name)

    gate = Gate()
    with TestClient(create_app(ServeConfig(threads=1, max_queue=1, warmup=False), gate)) as c:
        _wait_ready(c)
        out: list = []
        body = {"query": QUERY, "texts": TEXTS}
        threads = [threading.Thread(target=lambda: out.append(c.post("/rerank", json=body))) for _ in range(2)]
        threads[0].start()
        assert gate.entered.acquire(timeout=30)
        threads[1].start()
        deadline = time.monotonic() + 30
        while c.get("/readyz").json()["queued"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        refused = c.post("/rerank", json=body)
        assert _error(refused, 429, "at capacity")["error_type"] == "Overloaded"
        assert int(refused.headers["retry-after"]) >= 1
        _error(c.post("/v2/rerank", json={"query": QUERY, "documents": TEXTS}), 503, "at capacity")  # Cohere: as /rank
        gate.open.set()
        for t in threads:
            t.join(30)
        assert [r.status_code for r in out] == [200, 200]
        metrics = _scrape(c)
        assert metrics[("medrank_requests_total", (("route", "/rerank"), ("status", "429")))] == 1
        assert metrics[("medrank_questions_rejected_total", ())] == 2


# ---------------------------------------------------------------- /metrics


def _scrape(c: TestClient) -> dict:
    r = c.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(r.text)
        for s in fam.samples
    }


def test_metrics_count_requests_latency_queue_and_cache(ranker):
    with TestClient(create_app(ServeConfig(threads=1, max_queue=4), ranker)) as c:
        _wait_ready(c)
        before = _scrape(c)
        assert before[("medrank_ready", ())] == 1 and before[("medrank_queue_depth", ())] == 0
        for _ in range(2):
            assert c.post("/v2/rerank", json={"query": QUERY, "documents": TEXTS}).status_code == 200
        assert c.post("/rank", json={"question": "q", "answers": "no"}).status_code == 422
        assert c.get("/no-such-path").status_code == 404
        m = _scrape(c)
    assert m[("medrank_requests_total", (("route", "/v2/rerank"), ("status", "200")))] == 2
    assert m[("medrank_requests_total", (("route", "/rank"), ("status", "422")))] == 1
    assert m[("medrank_requests_total", (("route", "unmatched"), ("status", "404")))] == 1  # no raw paths as labels
    assert m[("medrank_request_seconds_count", (("route", "/v2/rerank"),))] == 2
    assert m[("medrank_compute_seconds_count", ())] == m[("medrank_queue_seconds_count", ())] == 2  # requests only
    assert m[("medrank_questions_completed_total", ())] == 3  # the warm-up question too
    # the second request's question and answers were all computed by the first: every lookup a hit
    hits, misses = m[("medrank_vector_cache_hits_total", ())], m[("medrank_vector_cache_misses_total", ())]
    assert hits >= len(TEXTS) + 1 and misses >= len(TEXTS) + 1 and m[("medrank_vector_cache_bytes", ())] > 0
    info = [k for k in m if k[0] == "medrank_model_info"]
    assert len(info) == 1 and ("system", "baseline") in info[0][1] and ("fit", "final") in info[0][1]
    assert any(name == "fp_system_json" for name, _ in info[0][1])


def test_a_cached_vector_gives_the_same_answer(ranker):
    """Ranked again from the vectors the first request left in memory: the same bits (they are the stored float16s)."""
    with TestClient(create_app(ServeConfig(threads=1, max_queue=4, warmup=False), ranker)) as c:
        _wait_ready(c)
        stats = c.app.state.service.memo.stats
        first = c.post("/rank", json=FIXTURE_INPUT).json()
        misses, hits = stats.misses, stats.hits  # hits already: the passage step reads the vectors bienc computed
        again = c.post("/rank", json=FIXTURE_INPUT).json()
        assert stats.misses == misses and stats.hits > hits and again == first  # nothing encoded twice
    with TestClient(create_app(ServeConfig(threads=1, max_queue=4, warmup=False, vector_cache_mb=0), ranker)) as c:
        _wait_ready(c)
        assert c.post("/rank", json=FIXTURE_INPUT).json() == first
        assert c.app.state.service.memo.stats.bytes == 0


def test_example_is_a_validation_question_where_the_folder_has_them(ranker, tmp_path):
    import pandas as pd

    rows = [
        {
            "split": s,
            "qid": q,
            "question": f"question {q}",
            "aid": f"{q}{i}",
            "answer": f"answer {i}",
            "url": "",
            "system_rank": 3 - i,
        }
        for s, q in (("val", "v1"), ("val", "v2"), ("test", "x1"))
        for i in (1, 2)
    ]
    path = tmp_path / "answers.parquet"
    pd.DataFrame(rows).to_parquet(path)
    with TestClient(create_app(ServeConfig(threads=1, warmup=False, examples=str(path)), ranker)) as c:
        _wait_ready(c)
        first = c.get("/example").json()
        assert first == {
            "index": 0,
            "of": 2,
            "qid": "v1",
            "question": "question v1",
            "answers": [{"id": "v12", "text": "answer 2", "url": ""}, {"id": "v11", "text": "answer 1", "url": ""}],
        }  # CHiQA's order; validation only
        assert c.get("/example?index=3").json()["qid"] == "v2"
        _error(c.get("/example?index=two"), 422, "index: expected an integer, got 'two'")
        assert c.post("/rank", json={k: first[k] for k in ("question", "answers")}).status_code == 200
    with TestClient(create_app(ServeConfig(threads=1, warmup=False, examples=str(tmp_path / "none")), ranker)) as c:
        _wait_ready(c)
        _error(c.get("/example"), 404, "no examples:", "no cleaned answers here")
