"""The clients users really run, against a live `medrank serve` app on 127.0.0.1 (uvicorn, the tiny project): the
`cohere` SDK (ClientV2 and Client, base_url = the server) and Haystack's HuggingFaceTEIRanker. Each ranks in
medrank's submission order, its kept answers /rank's kept ones in /rank's order, and an error reaches it as ours."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from medrank.serving.app import ServeConfig, create_app
from tests.serving.test_rerank_api import QUERY, TEXTS, submission_order

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def server(ranker):
    """The app on uvicorn on a free loopback port, for the module; its base URL."""
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(
        create_app(ServeConfig(threads=1, max_queue=4), ranker), host="127.0.0.1", port=port, log_config=None
    )
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline and thread.is_alive(), "server not ready"
        time.sleep(0.05)
    yield url
    srv.should_exit = True
    thread.join(30)


def _kept_of_rank(url: str) -> list[int]:
    body = {"question": QUERY, "answers": [{"id": str(i), "text": t} for i, t in enumerate(TEXTS)]}
    return [int(a["id"]) for a in httpx.post(f"{url}/rank", json=body, timeout=60).json()["answers"] if a["kept"]]


def test_the_cohere_sdk_v2_and_v1_rank_through_medrank(server, ranker):
    import cohere

    order, kept = submission_order(ranker)
    assert _kept_of_rank(server) == kept == order[: len(kept)]
    v2 = cohere.ClientV2(api_key="unused", base_url=server)
    res = v2.rerank(model="medrank", query=QUERY, documents=TEXTS)
    assert [r.index for r in res.results] == order
    assert [r.relevance_score > 0.5 for r in res.results] == [i in kept for i in order]
    top = v2.rerank(model="medrank", query=QUERY, documents=TEXTS, top_n=2)
    assert [r.index for r in top.results] == order[:2]
    v1 = cohere.Client(api_key="unused", base_url=server)
    res1 = v1.rerank(model="medrank", query=QUERY, documents=TEXTS, return_documents=True)
    assert [r.index for r in res1.results] == order
    assert [r.document.text for r in res1.results] == [TEXTS[i] for i in order]
    with pytest.raises(cohere.core.ApiError) as e:  # our one-line message reaches the caller
        v2.rerank(model="medrank", query=QUERY, documents=TEXTS, top_n=0)
    assert e.value.status_code == 422 and "'top_n' must be a positive integer" in json.dumps(e.value.body)


def test_haystack_tei_ranker_ranks_through_medrank(server, ranker):
    from haystack import Document
    from haystack.components.rankers import HuggingFaceTEIRanker

    order, kept = submission_order(ranker)
    docs = [Document(content=t, meta={"position": i}) for i, t in enumerate(TEXTS)]
    out = HuggingFaceTEIRanker(url=server, top_k=len(docs)).run(query=QUERY, documents=docs)["documents"]
    assert [d.meta["position"] for d in out] == order
    assert [d.score > 0.5 for d in out] == [i in kept for i in order]
    top = HuggingFaceTEIRanker(url=server, top_k=2).run(query=QUERY, documents=docs)["documents"]
    assert [d.meta["position"] for d in top] == order[:2]


def test_metrics_are_scraped_from_the_live_server(server):
    from prometheus_client.parser import text_string_to_metric_families

    def scrape() -> dict:
        text = httpx.get(f"{server}/metrics", timeout=10).text
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
        }

    key = ("medrank_requests_total", (("route", "/rerank"), ("status", "200")))
    before = scrape().get(key, 0)
    assert httpx.post(f"{server}/rerank", json={"query": QUERY, "texts": TEXTS}, timeout=60).status_code == 200
    after = scrape()
    assert after[key] == before + 1 and after[("medrank_queue_depth", ())] == 0
    assert after[("medrank_vector_cache_hits_total", ())] > 0  # the passage windows reuse the vectors bienc computed
