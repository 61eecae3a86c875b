"""What `medrank serve` reads and answers over HTTP: request bodies through `medrank rank`'s parser and caps (400 not
JSON, 413 too large, 422 a wrong field), the one-line JSON error every refusal becomes, and the JSON schemas of POST
/rank's body and answer (OpenAPI). The app and its queue: medrank.serving.app."""

from __future__ import annotations

from typing import Any

from medrank.core.errors import MedrankError
from medrank.serving.rank import (
    MAX_ANSWER_CHARS,
    MAX_ANSWERS,
    MAX_INPUT_BYTES,
    MAX_QUESTION_CHARS,
    MAX_TOTAL_CHARS,
    MalformedInput,
    RankInput,
    batch_input,
    load_json,
    rank_input,
)

MAX_BATCH_QUESTIONS = 16  # per /rank/batch call, and never more than the queue holds


class RequestError(Exception):
    """An HTTP error answered as {"error": message} (one line), with optional headers."""

    def __init__(
        self, status: int, message: str, headers: dict[str, str] | None = None, overloaded: bool = False
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, " ".join(message.split()), headers or {}
        self.overloaded = overloaded  # at capacity: 503 here, 429 to a TEI client


def parse_one(body: bytes) -> RankInput:
    """POST /rank's body through `medrank rank`'s parser: 400 where it is not JSON, 422 where a field is wrong."""
    try:
        return rank_input(load_json(body, "body"), "body")
    except MalformedInput as e:
        raise RequestError(400, str(e)) from None
    except MedrankError as e:
        raise RequestError(422, str(e)) from None


def parse_batch(body: bytes, max_questions: int) -> list[RankInput]:
    """POST /rank/batch's body `{"questions": [<a /rank body>, ...]}`: each question under `medrank rank`'s caps and all
    of them together under its per-call text cap (MAX_TOTAL_CHARS)."""
    try:
        obj = load_json(body, "body")
    except MalformedInput as e:
        raise RequestError(400, str(e)) from None
    try:
        return batch_input(obj, "body", max_questions, MAX_TOTAL_CHARS)
    except MedrankError as e:
        raise RequestError(422, str(e)) from None


async def read_body(request: Any, limit: int) -> bytes:
    """The body, refused (413) once it passes `limit` bytes: by its Content-Length before a byte is read, else while
    it streams in (chunked), so no more than the limit is ever held."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise RequestError(400, f"Content-Length {declared[:40]!r} is not a number of bytes")
        if int(declared) > limit:
            raise RequestError(413, f"body: {int(declared)} bytes; at most {limit} per request")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(413, f"body: more than {limit} bytes; at most {limit} per request")
        chunks.append(chunk)
    return b"".join(chunks)


# ---------------------------------------------------------------- JSON schemas (OpenAPI)


def rank_body_schema() -> dict:
    """POST /rank's body as JSON schema, its bounds the parser's own caps (medrank.serving.rank.MAX_*)."""
    answer = {
        "type": "object",
        "required": ["text"],
        "additionalProperties": False,
        "properties": {
            "id": {"type": ["string", "integer"], "description": "default: the answer's position, from 1"},
            "text": {"type": "string", "minLength": 1, "maxLength": MAX_ANSWER_CHARS},
            "url": {"type": ["string", "null"]},
        },
    }
    return {
        "type": "object",
        "required": ["question", "answers"],
        "additionalProperties": False,
        "properties": {
            "question": {"type": "string", "minLength": 1, "maxLength": MAX_QUESTION_CHARS},
            "answers": {"type": "array", "maxItems": MAX_ANSWERS, "items": answer},
        },
        "description": f"at most {MAX_TOTAL_CHARS} characters of question and answers, {MAX_INPUT_BYTES} bytes",
    }


def rank_result_schema() -> dict:
    """POST /rank's answer as JSON schema (`medrank rank --all`'s JSON)."""
    item = {
        "type": "object",
        "properties": {
            "rank": {"type": ["integer", "null"], "description": "1.. for kept answers, null for dropped ones"},
            "id": {"type": "string"},
            "kept": {"type": "boolean"},
            "filter_score": {"type": ["number", "null"], "description": "the filter's probability that it is correct"},
            "rank_score": {"type": ["number", "null"], "description": "the ranker's score (higher: earlier)"},
            "url": {"type": "string"},
        },
    }
    return {
        "type": "object",
        "properties": {
            "question": {"type": "string"},
            "n_answers": {"type": "integer"},
            "n_kept": {"type": "integer"},
            "answers": {"type": "array", "items": item, "description": "kept in rank order, then the dropped"},
        },
    }
