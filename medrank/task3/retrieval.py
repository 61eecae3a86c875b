"""RQE retrieval of entailed MedQuAD questions (paper Section 4.3): BM25 candidates, cross-encoder scores,
the top `n_candidates` with score >= `rqe_threshold`, else the top-1 (the paper's fallback, Section 4.6).

Every BM25 candidate is scored once and cached, so changing N or T re-selects without recomputing.
`score_candidates` -> `select_entailed` -> `attach_entailed` is the one way from questions to entailed MedQuAD
pairs: the retrieve stage and `medrank rank` (with a read-only cache) both take it.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from medrank.encoders.cross_encoder import CrossEncoder, label_index
from medrank.encoders.distributed import LocalPool, RayBackend
from medrank.encoders.extract import ExtractStats, cached_extract, choose_precision, open_cache
from medrank.core.errors import MedrankError

if TYPE_CHECKING:
    from medrank.params import Params

log = logging.getLogger(__name__)

# data/processed/rqe_candidates.parquet: every BM25 candidate with its RQE score (what N/T select from)
CANDIDATES = pa.schema(
    [
        ("split", pa.string()),
        ("qid", pa.string()),
        ("bm25_rank", pa.int16()),  # 1 = best BM25 score
        ("bm25_score", pa.float32()),
        ("qa_id", pa.string()),  # MedQuAD pair (medrank.data.schemas.MEDQUAD)
        (
            "rqe_score",
            pa.float32(),
        ),  # P(question entails the MedQuAD question): the RQE scorer's (stacked if its recipe is)
        ("rqe_ce", pa.float32()),  # the cross-encoder's own P (= rqe_score unless stacked)
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
    df = cands.sort_values(
        ["split", "qid", "rqe_score", "bm25_rank"], ascending=[True, True, False, True], kind="stable"
    )
    df = df.assign(passes_threshold=True if threshold is None else df["rqe_score"] >= threshold)
    df["_pos"] = df.groupby(["split", "qid"], sort=False).cumcount()
    keep = (
        df["passes_threshold"] & (df.groupby(["split", "qid"], sort=False)["passes_threshold"].cumsum() <= n_candidates)
    ) | ((df["_pos"] == 0) & ~df.groupby(["split", "qid"], sort=False)["passes_threshold"].transform("any"))
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


def saved_documents(docs: pd.DataFrame, question_col: str) -> pd.DataFrame:
    """The columns of `medquad_documents` that retrieval reads (search text, ids, the entailed answer; focus, type and
    question for an RQE stack with the question-type feature, `stacked_rqe_scores`), as the retrieve step saves them."""
    qtype = [
        c for c in ("focus", "question_type", "question") if c in docs.columns
    ]  # MedQuAD's; fixtures may lack them
    cols = ["qa_id", "collection", *qtype, question_col, "answer_norm", "answer_sentences"]
    return docs[list(dict.fromkeys(cols))].reset_index(drop=True)


def questions_table(answers: pd.DataFrame, question_col: str, max_questions_per_split: int | None) -> pd.DataFrame:
    """One row per (split, qid) with its text as `question` (from `question_col`), sorted; the first
    `max_questions_per_split` questions of each split (tiny profiles), None = all."""
    questions = answers.drop_duplicates(["split", "qid"]).sort_values(["split", "qid"], kind="stable")
    if max_questions_per_split:
        questions = questions.groupby("split", sort=True).head(max_questions_per_split)
    return questions[["split", "qid", question_col]].rename(columns={question_col: "question"}).reset_index(drop=True)


@dataclass
class ScoredCandidates:
    """What `score_candidates` made: every BM25 candidate with its RQE score and [CLS] vector, the precision used."""

    table: pd.DataFrame  # split, qid, question, bm25_rank, bm25_score, doc (row of docs), qa_id, rqe_score, rqe_cls
    precision: str
    extract: ExtractStats
    bm25_seconds: float


def score_candidates(
    questions: pd.DataFrame,
    docs: pd.DataFrame,
    rqe: CrossEncoder,
    cache_root: str | os.PathLike,
    *,
    question_col: str,
    bm25_top_k: int,
    precision: str = "auto",
    batch_size: int = 64,
    shard_size: int = 4096,
    read_only: bool = False,
    show_progress: bool = True,
    backend: LocalPool | RayBackend | None = None,
) -> ScoredCandidates:
    """The `bm25_top_k` MedQuAD candidates of each question (split, qid, question), each scored by the RQE
    cross-encoder: P(question entails the MedQuAD question `docs[question_col]`) and its [CLS] vector (float16);
    when the model's recipe is a stack (its metadata `recipe.stack`), `rqe_score` is the stacked probability
    (`stacked_rqe_scores`) and `rqe_ce` the cross-encoder's own.

    `docs` come from `medquad_documents`. `precision` is a request (auto | fp32 | bf16 | int8): auto reuses the
    precision cached for this model under `cache_root`, else probes (`choose_precision`). `read_only`: nothing is
    written under `cache_root`; missing pairs are computed in memory. `backend`: forked processes or a Ray actor pool compute them.
    """
    t0 = time.perf_counter()
    idx, bm25 = bm25_candidates(questions["question"].tolist(), docs[question_col].tolist(), bm25_top_k)
    k = idx.shape[1]
    cands = questions.loc[np.repeat(np.arange(len(questions)), k), ["split", "qid", "question"]].reset_index(drop=True)
    cands["bm25_rank"] = np.tile(np.arange(1, k + 1), len(questions)).astype(np.int16)
    cands["bm25_score"] = bm25.reshape(-1)
    cands["doc"] = idx.reshape(-1)
    cands["qa_id"] = docs["qa_id"].to_numpy()[cands["doc"]]
    pairs = list(zip(cands["question"], docs[question_col].to_numpy()[cands["doc"]]))
    bm25_seconds = time.perf_counter() - t0
    chosen = choose_precision(rqe, precision, cache_root, "rqe", pairs)
    cache = open_cache(rqe, "rqe", cache_root, chosen, read_only)
    out, stats = cached_extract(
        rqe,
        pairs,
        cache,
        chosen,
        batch_size=batch_size,
        shard_size=shard_size,
        desc="rqe",
        show_progress=show_progress,
        backend=backend,
    )
    cands["rqe_score"] = cands["rqe_ce"] = out["probs"][:, label_index(rqe.label_names, "entail", 1)]
    cands["rqe_cls"] = list(out["cls"])
    stack = (getattr(rqe, "meta", {}).get("recipe") or {}).get("stack")
    if stack:  # the model's recipe stacks it with the bi-encoder cosine (stage finetune_rqe chose it by CV)
        cands["rqe_score"] = stacked_rqe_scores(
            cands,
            docs,
            question_col,
            stack,
            rqe.path,
            device=str(rqe.device),
            medquad=docs,
            cache_root=cache_root,
            read_only=read_only,
        )
    return ScoredCandidates(cands, chosen, stats, bm25_seconds)


def attach_entailed(chosen: pd.DataFrame, docs: pd.DataFrame, question_col: str) -> pd.DataFrame:
    """Selected candidates (`select_entailed`) with the entailed MedQuAD pair: entailed_question, entailed_answer,
    entailed_sentences, entailed_collection (from `docs` row `doc`)."""
    d = docs.iloc[chosen["doc"].to_numpy()]
    return chosen.assign(
        entailed_question=d[question_col].to_numpy(),
        entailed_answer=d["answer_norm"].to_numpy(),
        entailed_sentences=[list(s) for s in d["answer_sentences"]],
        entailed_collection=d["collection"].to_numpy(),
    )


RELEVANT_GRADE = 3  # MEDIQA's rule (ReferenceScore >= 3): a judged answer graded 3-4 answers the question


def judged_retrieval(
    cands: pd.DataFrame,
    chosen: pd.DataFrame,
    qrels: pd.DataFrame,
    liveqa: pd.DataFrame,
    ks: Sequence[int] = (1, 3, 5, 10),
) -> dict:
    """Retrieval quality where judgments exist: the TREC 2017 LiveQA-Med questions (= MEDIQA train_liveqa) have
    MedQuAD answers judged 1-4; a MedQuAD question is relevant when its answer is graded >= RELEVANT_GRADE (a pair
    judged twice: its best grade); unjudged candidates count as not relevant (the TREC convention).

    Over the questions with at least one relevant answer in our MedQuAD table: MRR and recall@k of the BM25
    candidates ordered by RQE score and, for reference, by BM25 rank (a relevant answer outside the BM25 top-k scores
    0), and of the selected entailed questions (`chosen`: N/T applied): hit rate, precision and MRR.
    """
    rel = qrels[(qrels["source"] == "medquad") & qrels["medquad_qa_id"].notna()]
    rel = rel.groupby(["number", "medquad_qa_id"], as_index=False)["grade"].max()
    rel = rel[rel["grade"] >= RELEVANT_GRADE]
    qid_of = dict(zip(liveqa["number"].astype(int), liveqa["mediqa_qid"].astype(str)))
    relevant: dict[str, set[str]] = {}
    for n, qa in zip(rel["number"].astype(int), rel["medquad_qa_id"]):
        if n in qid_of:
            relevant.setdefault(qid_of[n], set()).add(qa)
    c = cands[(cands["split"] == "train_liveqa") & cands["qid"].astype(str).isin(relevant)]
    s = chosen[(chosen["split"] == "train_liveqa") & chosen["qid"].astype(str).isin(relevant)]
    out: dict = {
        "questions_judged": len(relevant),
        "questions_scored": int(c["qid"].nunique()),
        "relevant_grade": RELEVANT_GRADE,
        "relevant_pairs": int(sum(len(v) for v in relevant.values())),
    }
    if c.empty:
        return out

    def ranking_scores(order_col: str, ascending: bool) -> dict:
        rr, rec = [], {k: [] for k in ks}
        for qid, g in c.groupby(c["qid"].astype(str)):
            ids = g.sort_values([order_col, "bm25_rank"], ascending=[ascending, True])["qa_id"].tolist()
            hits = [i for i, qa in enumerate(ids) if qa in relevant[qid]]
            rr.append(1.0 / (hits[0] + 1) if hits else 0.0)
            for k in ks:
                rec[k].append(sum(h < k for h in hits) / len(relevant[qid]))
        return {
            "mrr": round(float(np.mean(rr)), 4),
            **{f"recall@{k}": round(float(np.mean(v)), 4) for k, v in rec.items()},
        }

    out["by_rqe"] = ranking_scores("rqe_score", False)
    out["by_bm25"] = ranking_scores("bm25_rank", True)
    if not s.empty:
        is_rel = np.array([qa in relevant[str(q)] for q, qa in zip(s["qid"], s["qa_id"])])
        per_q = pd.DataFrame({"qid": s["qid"].astype(str).to_numpy(), "rank": s["rank"].to_numpy(), "rel": is_rel})
        first = per_q[per_q["rel"]].groupby("qid")["rank"].min()
        n_q = per_q["qid"].nunique()
        out["selected"] = {
            "questions": int(n_q),
            "hit_rate": round(float(len(first) / n_q), 4),
            "precision": round(float(is_rel.mean()), 4),
            "mrr": round(float((1.0 / first).sum() / n_q), 4),
            "per_question": round(float(len(per_q) / n_q), 3),
        }
    return out


def check_candidate_depth(p: Params) -> None:
    """`n_candidates` entailed questions are chosen among the `retrieve.bm25_top_k` BM25 candidates: never more."""
    if p.n_candidates > p.retrieve.bm25_top_k:
        raise MedrankError(
            f"n_candidates ({p.n_candidates}) > retrieve.bm25_top_k ({p.retrieve.bm25_top_k}): nothing to choose from"
        )


def retrieval_metrics(
    step: Any,  # steps.retrieve_step.RetrieveStep (a layer above: read for its .p, .rqe and .docs only)
    scored: ScoredCandidates,
    chosen: pd.DataFrame,
    *,
    n_questions: int,
    qrels: pd.DataFrame,
    judged_questions: pd.DataFrame,
    threads: int,
    workers: int | None,
    seconds_total: float,
) -> dict:
    """metrics/retrieve.json of `step` (its params, MedQuAD documents and RQE model): coverage per T, what N and T
    selected, the retrieval quality against the judged LiveQA answers (`qrels` of `judged_questions`:
    `judged_retrieval`), the RQE model's fingerprint and recipe (as saved with it), and where and how fast the RQE
    scores were computed."""
    from medrank.encoders.runtime import runtime_info

    p, model, n_docs = step.p, step.rqe, len(step.docs)
    rp = p.retrieve
    per_q = chosen.groupby(["split", "qid"]).size()
    return {
        "n_candidates": p.n_candidates,
        "rqe_threshold": p.rqe_threshold,
        "bm25_top_k": min(rp.bm25_top_k, n_docs),  # candidates per question (bm25_candidates caps at the corpus)
        "questions": int(n_questions),
        "medquad_pairs": int(n_docs),
        "coverage": coverage(scored.table, rp.coverage_thresholds),
        "retrieved_per_question_mean": round(float(per_q.mean()), 3),
        "fallback_questions": int((~chosen["passes_threshold"]).sum()),
        "judged": judged_retrieval(scored.table, chosen, qrels, judged_questions),
        "rqe_model_fingerprint": model.fingerprint,
        # its training sources: a model trained on the LiveQA summaries has seen the judged questions (`judged` flatters)
        "rqe_recipe": model.meta.get("recipe"),
        "precision": scored.precision,
        "precision_probe": model.precision_report.as_dict() if model.precision_report else None,
        "threads": model.threads or threads,
        "workers": workers,  # forked processes of 1 thread each (distributed.forked_workers)
        "runtime": runtime_info(model.device, precision=scored.precision),
        "extract": scored.extract.as_dict(),
        "seconds": {"bm25": round(scored.bm25_seconds, 2), "total": round(seconds_total, 2)},
    }


@functools.lru_cache(maxsize=2)
def _stack_encoder(name: str, device: str, max_length: int, saved: bool = False):
    """The stack's bi-encoder, loaded once per process (`medrank rank` scores one question after another); `saved`: the
    fine-tuned one finetune_rqe wrote, verified against its recorded fingerprint."""
    from medrank.encoders.sentence_encoder import SentenceEncoder

    return SentenceEncoder(name, device=device, max_length=max_length, saved=saved)


def stacked_rqe_scores(
    cands: pd.DataFrame,
    docs: pd.DataFrame,
    question_col: str,
    stack: dict,
    model_dir: str | os.PathLike,
    device: str = "auto",
    medquad: pd.DataFrame | None = None,
    cache_root: str | os.PathLike | None = None,
    read_only: bool = False,
) -> np.ndarray:
    """P(entailed) of a stacked RQE scorer (models/rqe metadata `recipe.stack`, chosen by stage finetune_rqe): logistic
    regression over its `features`: the cross-encoder's logit (`cands.rqe_ce`), the cosine of (question, MedQuAD
    question) under its bi-encoder (a fine-tuned one saved inside the cross-encoder's folder `model_dir`, or the
    zero-shot one) and the question-type agreement (classifier refit on `medquad`, seeded). With `cache_root` the
    bi-encoder's vectors are cached (float32, questions and MedQuAD questions apart): a fresh cache gives the bits of
    the uncached call, and an experiment that keeps the candidates encodes nothing."""
    from medrank.encoders.runtime import fixed_blas_threads
    from medrank.task3.qtype import QuestionTypes
    from medrank.task3.rqe_stack import stack_features

    feats = list(stack["features"])
    q_texts = cands["question"].astype(str).to_numpy()
    d_texts = docs[question_col].astype(str).to_numpy()[cands["doc"].to_numpy()]
    columns = {"ce": cands["rqe_ce"].to_numpy()}
    if "cosine" in feats:
        name = os.path.join(model_dir, stack["bi_encoder"]) if stack.get("bi_encoder_local") else stack["bi_encoder"]
        bi = _stack_encoder(str(name), device, int(stack.get("max_length", 256)), bool(stack.get("bi_encoder_local")))
        uq, q_inv = np.unique(q_texts, return_inverse=True)
        ud, d_inv = np.unique(d_texts, return_inverse=True)

        def encode(texts: np.ndarray, side: str) -> np.ndarray:
            if cache_root is None:
                return bi.encode(list(texts))
            from medrank.encoders.extract import cached_sentence_embeddings

            return cached_sentence_embeddings(
                bi,
                list(texts),
                cache_root,
                "fp32",
                shard_size=None,
                read_only=read_only,
                dtype=np.float32,
                kind=f"stack-{side}",
            )[0]

        columns["cosine"] = (encode(uq, "q")[q_inv] * encode(ud, "doc")[d_inv]).sum(1)
    if "qtype" in feats:
        if medquad is None:
            raise MedrankError("the RQE stack uses the question type: give the MedQuAD table to refit its classifier")
        columns["qtype"] = QuestionTypes(medquad, int(stack["seed"])).agreement(q_texts, d_texts)
    with fixed_blas_threads():  # the stack's dot products sum by BLAS thread (QuestionTypes fixes its own)
        z = stack_features(columns, feats) @ np.asarray(stack["coef"]) + float(stack["intercept"])
    return 1.0 / (1.0 + np.exp(-z))
