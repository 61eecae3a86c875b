"""The NLI sentence-pair grids of the paper (Section 4.5): each candidate answer A against each entailed answer E
of its question (retrieved MedQuAD answers, plus higher-ranked candidates on train splits), one NLI cross-encoder
output per (sentence of E, sentence of A) cell, and ANLI.

`answer_grids` is the one way from (candidate answers, entailed answers) to NLI_GRID rows: the embed stage and
`medrank rank` both call it (the latter with a read-only cache).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from medrank.core import layout
from medrank.encoders.cross_encoder import CrossEncoder, label_index
from medrank.encoders.distributed import LocalPool, RayBackend
from medrank.encoders.extract import (
    ExtractStats,
    cached_extract,
    cached_precision_check,
    cached_sentence_embeddings,
    choose_precision,
    open_cache,
)
from medrank.encoders.sentence_encoder import SentenceEncoder
from medrank.core.errors import MedrankError

log = logging.getLogger(__name__)

Pair = tuple[str, str]

# data/processed/embeddings/nli_grid.parquet: one row per (candidate answer A, entailed answer E).
# Cell (i, j) of the n_rows x n_cols grid pairs sentence i of A (hypothesis) with sentence e_index[i, j] of E
# (premise): "does the entailed answer support this sentence of the candidate". Lists are row-major flat.
NLI_GRID = pa.schema(
    [
        ("split", pa.string()),
        ("qid", pa.string()),
        ("aid", pa.string()),
        (
            "entailed_kind",
            pa.string(),
        ),  # rqe (MedQuAD answer of an entailed question) | augment (higher-ranked candidate)
        ("entailed_rank", pa.int16()),  # rqe: retrieval rank 1..N; augment: reference rank of the entailed candidate
        ("entailed_id", pa.string()),  # rqe: MedQuAD qa_id; augment: aid
        ("n_sentences_a", pa.int16()),  # sentences in A before the max_sentences cap
        ("n_sentences_e", pa.int16()),
        ("n_rows", pa.int16()),  # sentences of A in the grid (<= max_sentences)
        ("n_cols", pa.int16()),  # sentences of E per row (<= prefilter_top_k, <= max_sentences)
        ("e_index", pa.list_(pa.int16())),  # n_rows*n_cols: which sentence of E each cell holds (ascending per row)
        ("p_entail", pa.list_(pa.float32())),  # n_rows*n_cols NLI probabilities
        ("p_neutral", pa.list_(pa.float32())),
        ("p_contradiction", pa.list_(pa.float32())),
        ("nli_cls", pa.list_(pa.float16())),  # n_rows*n_cols*hidden pooled [CLS] vectors
        ("anli", pa.float32()),  # mean over rows of max over the row of p_entail (0 when A has no sentence)
    ]
)


def select_columns(emb_a: np.ndarray, emb_e: np.ndarray, top_k: int | None) -> np.ndarray:
    """For each sentence of A, the indices (ascending) of its `top_k` most cosine-similar sentences of E.

    top_k None (or >= |E|) keeps every sentence of E: the full grid. Ties go to the earlier sentence.
    """
    a, e = len(emb_a), len(emb_e)
    k = e if top_k is None else min(int(top_k), e)
    if a == 0 or k == 0:
        return np.zeros((a, k), dtype=np.int64)
    if k == e:
        return np.tile(np.arange(e), (a, 1))
    sim = emb_a @ emb_e.T
    top = np.argsort(-sim, axis=1, kind="stable")[:, :k]
    return np.sort(top, axis=1)


def anli_score(p_entail: np.ndarray) -> float:
    """ANLI(A, E) = mean over sentences of A of the max over (selected) sentences of E of P(entail)."""
    p = np.asarray(p_entail, dtype=np.float64)
    if p.size == 0:
        return 0.0
    return float(p.max(axis=1).mean())


def answer_pairs(answers: pd.DataFrame, retrieved: pd.DataFrame, augment_top: int) -> pd.DataFrame:
    """Every (candidate answer, entailed answer) pair: each candidate with each retrieved MedQuAD answer of its
    question, plus (train splits only) the paper's augmentation: each of a question's `augment_top` best
    reference-ranked candidates as the entailed answer of every lower-ranked candidate.

    `answers` needs split, qid, aid, sentences (+ reference_rank); `retrieved` split, qid, rank, qa_id, sentences.
    """
    cols = ["split", "qid", "aid", "entailed_kind", "entailed_rank", "entailed_id", "sentences_a", "sentences_e"]
    cand = answers[["split", "qid", "aid", "sentences"]].rename(columns={"sentences": "sentences_a"})
    ret = retrieved[["split", "qid", "rank", "qa_id", "sentences"]].rename(
        columns={"rank": "entailed_rank", "qa_id": "entailed_id", "sentences": "sentences_e"}
    )
    rqe = cand.merge(ret, on=["split", "qid"], how="inner", sort=False)
    rqe["entailed_kind"] = "rqe"
    parts = [rqe[cols]]
    if augment_top > 0:
        train = answers[answers["split"].isin(layout.TRAIN_SPLITS)]
        rows = []
        for (split, qid), g in train.groupby(["split", "qid"], sort=True):
            g = g.sort_values(["reference_rank", "aid"], kind="stable")
            aids, sents, ranks = g["aid"].tolist(), g["sentences"].tolist(), g["reference_rank"].tolist()
            for lo in range(1, len(g)):
                for hi in range(min(lo, augment_top)):
                    rows.append((split, qid, aids[lo], "augment", int(ranks[hi]), aids[hi], sents[lo], sents[hi]))
        parts.append(pd.DataFrame(rows, columns=cols))
    out = pd.concat(parts, ignore_index=True)
    return out.sort_values(["split", "qid", "aid", "entailed_kind", "entailed_rank"], kind="stable", ignore_index=True)


@dataclass
class GridPlan:
    """The cells of every answer pair's grid: (premise, hypothesis) texts and where each grid starts."""

    cells: list[Pair]  # premise = sentence of E, hypothesis = sentence of A
    offsets: np.ndarray  # grid r's cells are cells[offsets[r]:offsets[r+1]]
    shapes: np.ndarray  # (n_pairs, 2): n_rows, n_cols
    e_index: list[np.ndarray]


def plan_grids(
    pairs: pd.DataFrame, max_sentences: int, top_k: int | None, sentence_vectors: dict[str, np.ndarray] | None
) -> GridPlan:
    """Cap both sides at `max_sentences` (leading sentences) and keep each A-sentence's top_k E-sentences."""
    from medrank.encoders.runtime import fixed_blas_threads

    cells: list[Pair] = []
    offsets = [0]
    shapes = np.zeros((len(pairs), 2), dtype=np.int64)
    e_index: list[np.ndarray] = []
    with fixed_blas_threads():  # the prefilter's cosine sums split by BLAS thread: fixed, the same on any machine
        for r, (sa, se) in enumerate(zip(pairs["sentences_a"], pairs["sentences_e"])):
            sa, se = list(sa)[:max_sentences], list(se)[:max_sentences]
            if top_k is not None and top_k < len(se) and sa:
                if sentence_vectors is None:
                    raise MedrankError("plan_grids: prefilter_top_k needs sentence vectors")
                sel = select_columns(
                    np.stack([sentence_vectors[s] for s in sa]), np.stack([sentence_vectors[s] for s in se]), top_k
                )
            else:
                sel = select_columns(np.zeros((len(sa), 1)), np.zeros((len(se), 1)), None)
            for i, row in enumerate(sel):
                cells.extend((se[j], sa[i]) for j in row)
            shapes[r] = sel.shape
            e_index.append(sel)
            offsets.append(len(cells))
    return GridPlan(cells, np.asarray(offsets, dtype=np.int64), shapes, e_index)


def grid_table(
    pairs: pd.DataFrame, plan: GridPlan, probs: np.ndarray, cls: np.ndarray, label_names: Sequence[str]
) -> pd.DataFrame:
    """Assemble NLI_GRID rows from the plan and the per-cell outputs (probs (n_cells, 3), cls (n_cells, H))."""
    ie = label_index(label_names, "entail", 0)
    ine = label_index(label_names, "neutral", 1)
    ic = label_index(label_names, "contradict", 2)
    rows: dict[str, list] = {k: [] for k in ("e_index", "p_entail", "p_neutral", "p_contradiction", "nli_cls", "anli")}
    for r in range(len(pairs)):
        s, e = plan.offsets[r], plan.offsets[r + 1]
        n_rows, n_cols = plan.shapes[r]
        pe = probs[s:e, ie]
        rows["e_index"].append(plan.e_index[r].reshape(-1).astype(np.int16))
        rows["p_entail"].append(pe)
        rows["p_neutral"].append(probs[s:e, ine])
        rows["p_contradiction"].append(probs[s:e, ic])
        rows["nli_cls"].append(cls[s:e].reshape(-1))
        rows["anli"].append(anli_score(pe.reshape(n_rows, n_cols)) if e > s else 0.0)
    out = pairs[["split", "qid", "aid", "entailed_kind", "entailed_rank", "entailed_id"]].copy()
    out["n_sentences_a"] = pairs["sentences_a"].map(len).astype(np.int16)
    out["n_sentences_e"] = pairs["sentences_e"].map(len).astype(np.int16)
    out["n_rows"] = plan.shapes[:, 0].astype(np.int16)
    out["n_cols"] = plan.shapes[:, 1].astype(np.int16)
    for k, v in rows.items():
        out[k] = v
    out["anli"] = out["anli"].astype(np.float32)
    return out.reset_index(drop=True)


def nli_grids(
    pairs: pd.DataFrame,
    model: CrossEncoder,
    precision: str,
    cache_root: str | os.PathLike,
    *,
    max_sentences: int,
    top_k: int | None,
    bi: SentenceEncoder | None = None,
    batch_size: int = 64,
    bi_batch_size: int = 128,
    shard_size: int = 4096,
    read_only: bool = False,
    show_progress: bool = True,
    backend: LocalPool | RayBackend | None = None,
) -> tuple[pd.DataFrame, GridPlan, dict[str, ExtractStats]]:
    """NLI_GRID rows for answer pairs (from `answer_pairs`): prefilter, plan, cached extraction, assembly.

    `read_only`: the cache under `cache_root` is only read; missing pairs are computed in memory. `backend`: the
    cells are computed on forked processes or a Ray actor pool (same cache content)."""
    stats: dict[str, ExtractStats] = {}
    vectors = None
    if top_k is not None:
        if bi is None:
            raise MedrankError("nli_grids: prefilter_top_k needs a bi-encoder")
        sents = sorted(
            {s for col in ("sentences_a", "sentences_e") for ss in pairs[col] for s in list(ss)[:max_sentences]}
        )
        # the prefilter only ranks sentences, so the cross-encoder's precision is good enough for it
        emb, stats["bi_encoder"] = cached_sentence_embeddings(
            bi, sents, cache_root, precision, bi_batch_size, read_only=read_only
        )
        vectors = dict(zip(sents, emb))
    plan = plan_grids(pairs, max_sentences, top_k, vectors)
    log.info("%d grid cells (%.1f per answer pair)", len(plan.cells), len(plan.cells) / max(len(pairs), 1))
    cache = open_cache(model, "nli", cache_root, precision, read_only)
    out, stats["nli"] = cached_extract(
        model,
        plan.cells,
        cache,
        precision,
        batch_size=batch_size,
        shard_size=shard_size,
        desc="nli",
        show_progress=show_progress,
        backend=backend,
    )
    cache.release()
    return grid_table(pairs, plan, out["probs"], out["cls"], model.label_names), plan, stats


@dataclass
class Grids:
    """What `answer_grids` made: the NLI_GRID rows, the answer pairs and grid plan behind them, the precision used."""

    rows: pd.DataFrame  # NLI_GRID
    pairs: pd.DataFrame  # answer_pairs: one row per (candidate answer, entailed answer), in the order of `rows`
    plan: GridPlan
    precision: str
    stats: dict[str, ExtractStats]  # "nli", and "bi_encoder" with the prefilter


def answer_grids(
    answers: pd.DataFrame,
    retrieved: pd.DataFrame,
    nli: CrossEncoder,
    cache_root: str | os.PathLike,
    *,
    prefilter_top_k: int | None,
    augment_top: int = 0,
    precision: str = "auto",
    **grid_kw: Any,
) -> Grids:
    """NLI_GRID rows of every (candidate answer, entailed answer) pair (see `answer_pairs` for the two tables).

    `precision` is a request (auto | fp32 | bf16 | int8): auto reuses the precision cached for this model under
    `cache_root`, else probes on real sentence pairs (`choose_precision`). `grid_kw` go to `nli_grids`
    (max_sentences, bi: the prefilter, needed when `prefilter_top_k` is set, batch sizes, read_only, show_progress).
    """
    pairs = answer_pairs(answers, retrieved, augment_top)
    log.info(
        "%d answer pairs (%d rqe, %d augment) over %d candidate answers",
        len(pairs),
        int((pairs.entailed_kind == "rqe").sum()),
        int((pairs.entailed_kind == "augment").sum()),
        len(answers),
    )
    sample = [(e[0], a[0]) for a, e in zip(pairs["sentences_a"], pairs["sentences_e"]) if len(a) and len(e)]
    chosen = choose_precision(nli, precision, cache_root, "nli", sample[:: max(1, len(sample) // 256)])
    rows, plan, stats = nli_grids(pairs, nli, chosen, cache_root, top_k=prefilter_top_k, **grid_kw)
    return Grids(rows, pairs, plan, chosen, stats)


def check_sample(grids: Grids, n: int, seed: int) -> list[Pair]:
    """`n` cells for the precision check, drawn from each question's first entailed answer: the same for any N and T,
    so an experiment reads the check back from the cache (`cached_precision_check`)."""
    rows = grids.rows
    first = np.flatnonzero(((rows["entailed_kind"] == "rqe") & (rows["entailed_rank"] == 1)).to_numpy())
    off = grids.plan.offsets
    pool = np.concatenate([np.arange(off[r], off[r + 1]) for r in first]) if len(first) else np.zeros(0, int)
    if not len(pool):
        return []
    idx = np.random.default_rng(seed).choice(pool, size=min(n, len(pool)), replace=False)
    return [grids.plan.cells[i] for i in idx]


def precision_check(grids: Grids, model: CrossEncoder, ep, seed: int, cache_root: str | os.PathLike) -> dict:
    """The grids' precision against fp32 on `ep.precision_check_pairs` cells (`check_sample`), kept under
    `cache_root` (`cached_precision_check`: an experiment with the same sample reads it back)."""
    sample = check_sample(grids, ep.precision_check_pairs, seed)
    return cached_precision_check(model, sample, grids.precision, cache_root, ep.batch_size)


def grid_metrics(grids: Grids, model: CrossEncoder, check: dict, ep, **extra: Any) -> dict:
    """metrics/embed.json: the grids' size, `ep`'s (the embed section's) sentence cap and prefilter, the precision and its
    check against fp32, where they were computed, the extraction passes' cache hits and speed, ANLI per split (+
    `extra`: threads, workers, seconds)."""
    from medrank.encoders.runtime import runtime_info

    grid = grids.rows
    by_kind = grid.groupby(["split", "entailed_kind"])["anli"].agg(["count", "mean"]).round(4)
    return {
        "answer_pairs": int(len(grid)),
        "answer_pairs_by_kind": grid["entailed_kind"].value_counts().to_dict(),
        "grid_cells": int(len(grids.plan.cells)),
        "max_sentences": ep.max_sentences,
        "prefilter_top_k": ep.prefilter_top_k,
        "nli_model_fingerprint": model.fingerprint,
        "precision": grids.precision,
        "precision_probe": model.precision_report.as_dict() if model.precision_report else None,
        "precision_check_vs_fp32": check,
        # bf16 outputs agree bit for bit only between CPUs with the same bf16 kernels (flags, ATen level)
        "runtime": runtime_info(model.device, precision=grids.precision),
        "extract": {k: v.as_dict() for k, v in grids.stats.items()},
        "anli": {f"{s}/{k}": {"pairs": int(r["count"]), "mean": float(r["mean"])} for (s, k), r in by_kind.iterrows()},
        **extra,
    }


def candidate_answers(
    answers: pd.DataFrame, retrieved: pd.DataFrame, max_answers_per_question: int | None
) -> pd.DataFrame:
    """The answers of the questions that went through retrieval (all, unless a tiny profile capped them), at most
    `max_answers_per_question` each (None = all)."""
    answers = answers.merge(retrieved[["split", "qid"]].drop_duplicates(), on=["split", "qid"])
    if max_answers_per_question:
        answers = answers.groupby(["split", "qid"], sort=False).head(max_answers_per_question)
    return answers
