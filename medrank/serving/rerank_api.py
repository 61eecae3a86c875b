"""The rerank shapes QA frameworks already call, over `medrank rank`'s pipeline: Cohere's `POST /v1/rerank` and
`/v2/rerank` (also Jina's, Infinity's and vLLM's shape) and Hugging Face text-embeddings-inference's `POST /rerank`.

A request becomes one RankInput (the query is the question, the documents its candidate answers, in the client's
order), under `medrank rank`'s caps and checks; its answer lists every document best first in the order medrank's
submissions list them (kept answers in /rank's order, then the dropped ones by the system's order key).
`relevance_score` (Cohere) and `score` (TEI) are that order score mapped to [0, 1]: the submission score (kept: 1 +
within-question rank share; dropped: 0 + the same share, so in (0, 2)) halved. A kept answer scores above 0.5 and a
dropped one below, so a client that thresholds at 0.5 applies medrank's keep decision; TEI's `raw_scores` returns
the unhalved score. Each result also carries `kept` and `filter_score` (extra fields every client here ignores);
`kept_only` (a body field, a `?kept_only=true` query or the server's default) returns the kept answers only.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from typing import Any

from medrank.core.errors import MedrankError
from medrank.serving.protocol import RequestError
from medrank.serving.rank import MAX_ANSWERS, MalformedInput, RankInput, load_json, rank_input

COHERE_V1, COHERE_V2, TEI = "cohere-v1", "cohere-v2", "tei"

# every key each API defines; the ones medrank cannot honour are refused when set, the rest are read or ignored
_COHERE_KEYS = {
    "model",  # any name: one system is served (/version names it)
    "query",
    "documents",
    "top_n",
    "return_documents",
    "rank_fields",  # v1: only ["text"]
    "max_chunks_per_doc",  # v1, ignored: each answer is read whole (the caps bound it)
    "max_tokens_per_doc",  # ignored: each encoder truncates at its own recipe's length
    "relevant_spans",  # refused when set: no spans are computed
    "priority",  # ignored: one FIFO queue
    "kept_only",  # medrank's
}
_TEI_KEYS = {"query", "texts", "raw_scores", "return_text", "truncate", "truncation_direction", "kept_only"}

# TEI's error_type per status (text-embeddings-inference's ErrorType)
TEI_ERROR_TYPES = {400: "Validation", 413: "Validation", 422: "Validation", 429: "Overloaded", 503: "Unhealthy"}


@dataclass(frozen=True)
class RerankRequest:
    shape: str
    inp: RankInput
    documents: tuple[dict, ...]  # each document as given, as an object ({"text": ...} for a string)
    top_n: int | None
    return_documents: bool
    raw_scores: bool
    kept_only: bool


def _flag(obj: dict, key: str, default: bool) -> bool:
    v = obj.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise MedrankError(f"body: '{key}' must be true or false, got {type(v).__name__}")
    return v


def _query(obj: dict) -> str:
    q = obj.get("query")
    if not isinstance(q, str) or not q.strip():
        raise MedrankError("body: 'query' must be a non-empty string")
    return q


def _documents(obj: dict, key: str, objects: bool) -> list[dict]:
    docs = obj.get(key)
    what = "strings or objects with 'text'" if objects else "strings"
    if not isinstance(docs, list):
        raise MedrankError(f"body: '{key}' must be a list of {what} (got {type(docs).__name__})")
    if len(docs) > MAX_ANSWERS:
        raise MedrankError(f"body: {len(docs)} {key}; at most {MAX_ANSWERS} per query")
    out = []
    for i, d in enumerate(docs):
        if isinstance(d, str):
            out.append({"text": d})
        elif objects and isinstance(d, dict):
            if not isinstance(d.get("text"), str):
                raise MedrankError(f"body: {key}[{i}]: an object needs 'text', a string")
            if d.get("url") is not None and not isinstance(d["url"], str):
                raise MedrankError(f"body: {key}[{i}]: 'url' must be a string")
            out.append(d)
        else:
            raise MedrankError(f"body: {key}[{i}]: expected one of {what}, got {type(d).__name__}")
    return out


def _as_input(query: str, docs: list[dict], key: str) -> RankInput:
    """The documents as one question's answers through `medrank rank`'s checks (ids: the positions, from 0), its
    messages naming this API's fields."""
    answers = [
        {"id": str(i), "text": d["text"], **({"url": d["url"]} if d.get("url") else {})} for i, d in enumerate(docs)
    ]
    try:
        return rank_input({"question": query, "answers": answers}, "body")
    except MedrankError as e:
        msg = str(e).replace("answers[", f"{key}[").replace("'question'", "'query'").replace(" answers", f" {key}")
        raise MedrankError(msg) from None


def _top_n(obj: dict) -> int | None:
    n = obj.get("top_n")
    if n is None:
        return None
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise MedrankError(f"body: 'top_n' must be a positive integer, got {n!r}")
    return n


def _decode(body: bytes) -> dict:
    try:
        obj = load_json(body, "body")
    except MalformedInput as e:
        raise RequestError(400, str(e)) from None
    if not isinstance(obj, dict):
        raise RequestError(422, f"body: expected a JSON object, got {type(obj).__name__}")
    return obj


def parse_cohere(body: bytes, version: int, kept_only: bool = False) -> RerankRequest:
    """A Cohere rerank body (v1: documents as strings or objects; v2: strings, objects accepted too): 400 not JSON,
    422 a wrong field, its message naming it."""
    obj = _decode(body)
    try:
        if unknown := sorted(set(obj) - _COHERE_KEYS):
            raise MedrankError(
                f"body: unknown key(s) {unknown} (Cohere's rerank keys: {', '.join(sorted(_COHERE_KEYS))})"
            )
        if obj.get("model") is not None and not isinstance(obj["model"], str):
            raise MedrankError("body: 'model' must be a string")
        if obj.get("rank_fields") not in (None, ["text"]):
            raise MedrankError(
                "body: 'rank_fields': medrank ranks each document's 'text' only (give [\"text\"] or none)"
            )
        if obj.get("relevant_spans") not in (None, False):
            raise MedrankError("body: 'relevant_spans' is not supported (medrank scores whole answers)")
        for key in ("max_chunks_per_doc", "max_tokens_per_doc", "priority"):
            v = obj.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                raise MedrankError(f"body: '{key}' must be an integer")
        query = _query(obj)
        docs = _documents(obj, "documents", objects=True)
        return RerankRequest(
            COHERE_V1 if version == 1 else COHERE_V2,
            _as_input(query, docs, "documents"),
            tuple(docs),
            _top_n(obj),
            _flag(obj, "return_documents", False),
            False,
            _flag(obj, "kept_only", kept_only),
        )
    except MedrankError as e:
        raise RequestError(422, str(e)) from None


def parse_tei(body: bytes, kept_only: bool = False) -> RerankRequest:
    """A TEI rerank body `{query, texts, raw_scores?, return_text?, truncate?, truncation_direction?}`."""
    obj = _decode(body)
    try:
        if unknown := sorted(set(obj) - _TEI_KEYS):
            raise MedrankError(f"body: unknown key(s) {unknown} (TEI's rerank keys: {', '.join(sorted(_TEI_KEYS))})")
        _flag(
            obj, "truncate", False
        )  # no effect: each encoder reads its recipe's first tokens, the caps bound the rest
        direction = obj.get("truncation_direction")
        if direction is not None and str(direction).lower() != "right":
            raise MedrankError(f"body: 'truncation_direction' {direction!r}: only 'Right' (each text's first tokens)")
        query = _query(obj)
        docs = _documents(obj, "texts", objects=False)
        if not docs:
            raise MedrankError("body: 'texts' cannot be empty")
        return RerankRequest(
            TEI,
            _as_input(query, docs, "texts"),
            tuple(docs),
            None,
            _flag(obj, "return_text", False),
            _flag(obj, "raw_scores", False),
            _flag(obj, "kept_only", kept_only),
        )
    except MedrankError as e:
        raise RequestError(422, str(e)) from None


def _finite(x: Any) -> float | None:
    return None if x is None or not math.isfinite(float(x)) else round(float(x), 6)


def ranked_rows(req: RerankRequest, result: Any) -> list[dict]:
    """The documents best first (the submission order: descending order score, ties by position), each with its
    index, order score, keep decision and filter probability; kept_only / top_n applied."""
    rows = [
        {"index": int(i), "score": float(s), "kept": bool(k), "prob": float(p)}
        for i, s, k, p in zip(result["id"], result["score"], result["kept"], result["prob"])
    ]
    rows.sort(key=lambda r: (-r["score"], r["index"]))
    if req.kept_only:
        rows = [r for r in rows if r["kept"]]
    return rows[: req.top_n] if req.top_n is not None else rows


def relevance(score: float) -> float:
    """The order score (in (0, 2): kept ones above 1) mapped to [0, 1]."""
    return min(1.0, max(0.0, score / 2.0))


def cohere_response(req: RerankRequest, result: Any) -> dict:
    """Cohere's rerank answer: {id, results: [{index, relevance_score, document?, kept, filter_score}], meta}."""
    results = []
    for r in ranked_rows(req, result):
        item: dict[str, Any] = {"index": r["index"], "relevance_score": round(relevance(r["score"]), 6)}
        if req.return_documents:
            item["document"] = req.documents[r["index"]]
        item.update(kept=r["kept"], filter_score=_finite(r["prob"]))
        results.append(item)
    version = "1" if req.shape == COHERE_V1 else "2"
    n_kept = int(sum(bool(k) for k in result["kept"]))
    return {
        "id": str(uuid.uuid4()),
        "results": results,
        "meta": {"api_version": {"version": version}, "n_kept": n_kept},
    }


def tei_response(req: RerankRequest, result: Any) -> list[dict]:
    """TEI's rerank answer: [{index, score, text?, kept, filter_score}], best first."""
    out = []
    for r in ranked_rows(req, result):
        item: dict[str, Any] = {
            "index": r["index"],
            "score": round(r["score"] if req.raw_scores else relevance(r["score"]), 6),
        }
        if req.return_documents:
            item["text"] = req.documents[r["index"]]["text"]
        item.update(kept=r["kept"], filter_score=_finite(r["prob"]))
        out.append(item)
    return out


def tei_error(status: int, message: str) -> dict:
    """TEI's error body: {"error": message, "error_type": ...}."""
    return {"error": message, "error_type": TEI_ERROR_TYPES.get(status, "Backend")}
