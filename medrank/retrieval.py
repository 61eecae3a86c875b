"""RQE retrieval of entailed MedQuAD questions (paper Section 4.3): BM25 candidates, cross-encoder scores,
the top `n_candidates` with score >= `rqe_threshold`, else the top-1 (the paper's fallback, Section 4.6).

Every BM25 candidate is scored once and cached, so changing N or T re-selects without recomputing.
"""

from __future__ import annotations

import logging
from typing import Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from medrank.errors import MedrankError

log = logging.getLogger(__name__)

# data/processed/rqe_candidates.parquet: every BM25 candidate with its RQE score (what N/T select from)
CANDIDATES = pa.schema(
    [
        ("split", pa.string()),
        ("qid", pa.string()),
        ("bm25_rank", pa.int16()),  # 1 = best BM25 score
        ("bm25_score", pa.float32()),
        ("qa_id", pa.string()),  # MedQuAD pair (medrank.data.schemas.MEDQUAD)
        ("rqe_score", pa.float32()),  # P(question entails the MedQuAD question)
    ]
)


def retrieved_schema(hidden: int) -> pa.Schema:
    """data/processed/retrieved.parquet: the selected entailed questions, rank 1..N per MEDIQA question."""
    return pa.schema(
        [
            ("split", pa.string()),
            ("qid", pa.string()),
            ("question", pa.string()),  # the text the RQE model saw
            ("rank", pa.int16()),  # 1 = highest RQE score
            ("qa_id", pa.string()),
            ("rqe_score", pa.float32()),
            ("bm25_rank", pa.int16()),
            ("passes_threshold", pa.bool_()),  # False only for a top-1 fallback below the threshold
            ("entailed_question", pa.string()),
            ("entailed_answer", pa.string()),
            ("entailed_sentences", pa.list_(pa.string())),
            ("entailed_collection", pa.string()),
            ("rqe_cls", pa.list_(pa.float16(), hidden)),  # pooled [CLS] vector of the RQE cross-encoder
        ]
    )


def bm25_candidates(queries: Sequence[str], docs: Sequence[str], top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k document indices (n_queries, k) and BM25 scores for each query (English stopwords removed).

    Ties and queries that share no term with any document still return k indices (score 0), so every
    question gets candidates for the cross-encoder to judge.
    """
    import bm25s

    if not docs:
        raise MedrankError("bm25: no documents to index")
    k = min(int(top_k), len(docs))
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(list(docs), stopwords="en", show_progress=False), show_progress=False)
    vocab = retriever.vocab_dict
    q_tokens = bm25s.tokenize(list(queries), stopwords="en", show_progress=False, return_ids=False)
    idx = np.zeros((len(queries), k), dtype=np.int64)
    scores = np.zeros((len(queries), k), dtype=np.float32)
    for i, toks in enumerate(q_tokens):
        known = [vocab[t] for t in toks if t in vocab]
        s = retriever.get_scores(known) if known else np.zeros(len(docs), dtype=np.float32)
        # stable sort on -score: equal scores keep document order, so results are deterministic
        order = np.argsort(-s, kind="stable")[:k]
        idx[i], scores[i] = order, s[order]
    return idx, scores


def select_entailed(cands: pd.DataFrame, n_candidates: int, threshold: float | None) -> pd.DataFrame:
    """Per (split, qid): up to N candidates with rqe_score >= T by descending score; if none passes, the top-1.

    Ties in score go to the better BM25 rank. Adds `rank` (1..) and `passes_threshold`.
    """
    if n_candidates < 1:
        raise MedrankError(f"n_candidates must be >= 1 (got {n_candidates})")
    if cands.empty:
        return cands.assign(rank=pd.Series(dtype="int16"), passes_threshold=pd.Series(dtype=bool))
    df = cands.sort_values(["split", "qid", "rqe_score", "bm25_rank"], ascending=[True, True, False, True], kind="stable")
    df = df.assign(passes_threshold=True if threshold is None else df["rqe_score"] >= threshold)
    df["_pos"] = df.groupby(["split", "qid"], sort=False).cumcount()
    keep = (df["passes_threshold"] & (df.groupby(["split", "qid"], sort=False)["passes_threshold"].cumsum() <= n_candidates)) | (
        (df["_pos"] == 0) & ~df.groupby(["split", "qid"], sort=False)["passes_threshold"].transform("any")
    )
    out = df[keep].drop(columns="_pos").copy()
    out["rank"] = out.groupby(["split", "qid"], sort=False).cumcount().add(1).astype(np.int16)
    return out.reset_index(drop=True)


def coverage(cands: pd.DataFrame, thresholds: Sequence[float]) -> dict[str, dict[str, dict[str, float]]]:
    """Questions with at least one candidate at score >= T, per split and overall (the paper's Table 3)."""
    best = cands.groupby(["split", "qid"], sort=True)["rqe_score"].max().reset_index()
    out: dict[str, dict[str, dict[str, float]]] = {}
    groups = [("all", best)] + [(s, g) for s, g in best.groupby("split", sort=True)]
    for name, g in groups:
        out[name] = {}
        for t in thresholds:
            n = int((g["rqe_score"] >= t).sum())
            out[name][f"T={t:g}"] = {"covered": n, "questions": int(len(g)), "fraction": round(n / max(len(g), 1), 4)}
    return out


def medquad_documents(medquad: pd.DataFrame, question_col: str, answer_col: str) -> pd.DataFrame:
    """MedQuAD pairs with an answer, one per distinct (question, answer) text, in a stable order."""
    df = medquad[medquad[answer_col].fillna("").str.strip() != ""]
    df = df.sort_values("qa_id", kind="stable").drop_duplicates([question_col, answer_col], keep="first")
    return df.reset_index(drop=True)
