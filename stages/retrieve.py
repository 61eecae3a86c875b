"""Stage `retrieve`: for every MEDIQA question, the MedQuAD questions it entails (BM25 → RQE cross-encoder).

Writes data/processed/rqe_candidates.parquet (every candidate, scored), data/processed/retrieved.parquet
(top `n_candidates` with score >= `rqe_threshold`, else top-1) and metrics/retrieve.json (coverage per T).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from medrank.runner import run

log = logging.getLogger("stages.retrieve")
OUT_DIR = Path("data/processed")
METRICS = Path("metrics/retrieve.json")


def main(params_path: str = "params.yaml") -> None:
    from medrank.encoders.cross_encoder import CrossEncoder
    from medrank.encoders.base import set_threads
    from medrank.encoders.extract import cached_extract, choose_precision, label_index, open_cache
    from medrank.errors import MedrankError
    from medrank.io import read_parquet, write_json, write_parquet
    from medrank.params import load_params
    from medrank.retrieval import CANDIDATES, bm25_candidates, coverage, medquad_documents, retrieved_schema, select_entailed

    p = load_params(params_path)
    rp = p.retrieve
    if p.n_candidates > rp.bm25_top_k:
        raise MedrankError(f"n_candidates ({p.n_candidates}) > retrieve.bm25_top_k ({rp.bm25_top_k}): nothing to choose from")
    t0 = time.perf_counter()
    threads = set_threads()
    qcol = "question_norm" if rp.question_text == "normalized" else "question"
    answers = read_parquet(Path(rp.normalized_dir) / "answers.parquet", columns=["split", "qid", "question", "question_norm"])
    questions = answers.drop_duplicates(["split", "qid"]).sort_values(["split", "qid"], kind="stable")
    if rp.max_questions_per_split:
        questions = questions.groupby("split", sort=True).head(rp.max_questions_per_split)
    questions = questions.reset_index(drop=True)
    medquad = read_parquet(Path(rp.normalized_dir) / "medquad.parquet")
    docs = medquad_documents(medquad, qcol, "answer_norm")
    log.info("%d MEDIQA questions, %d MedQuAD question-answer pairs", len(questions), len(docs))

    idx, bm25 = bm25_candidates(questions[qcol].tolist(), docs[qcol].tolist(), rp.bm25_top_k)
    k = idx.shape[1]
    cands = questions.loc[np.repeat(np.arange(len(questions)), k), ["split", "qid", qcol]].reset_index(drop=True)
    cands["bm25_rank"] = np.tile(np.arange(1, k + 1), len(questions)).astype(np.int16)
    cands["bm25_score"] = bm25.reshape(-1)
    cands["doc"] = idx.reshape(-1)
    cands["qa_id"] = docs["qa_id"].to_numpy()[cands["doc"]]
    pairs = list(zip(cands[qcol], docs[qcol].to_numpy()[cands["doc"]]))
    t_bm25 = time.perf_counter() - t0

    model = CrossEncoder.load(rp.rqe_model, device=p.device, precision=rp.precision)
    precision = choose_precision(model, rp.precision, rp.cache_dir, "rqe", pairs)
    cache = open_cache(model, "rqe", rp.cache_dir, precision)
    out, stats = cached_extract(model, pairs, cache, precision, batch_size=rp.batch_size, shard_size=rp.shard_size, desc="rqe")
    ent = label_index(model.label_names, "entail", 1)
    cands["rqe_score"] = out["probs"][:, ent]
    cands["_cls"] = list(out["cls"])
    write_parquet(cands[CANDIDATES.names], OUT_DIR / "rqe_candidates.parquet", CANDIDATES)

    chosen = select_entailed(cands, p.n_candidates, p.rqe_threshold)
    d = docs.iloc[chosen["doc"].to_numpy()]
    chosen = chosen.assign(
        question=chosen[qcol],
        entailed_question=d[qcol].to_numpy(),
        entailed_answer=d["answer_norm"].to_numpy(),
        entailed_sentences=[list(s) for s in d["answer_sentences"]],
        entailed_collection=d["collection"].to_numpy(),
        rqe_cls=chosen["_cls"],
    )
    hidden = int(model.model.config.hidden_size)
    schema = retrieved_schema(hidden)
    write_parquet(chosen[schema.names], OUT_DIR / "retrieved.parquet", schema)

    per_q = chosen.groupby(["split", "qid"]).size()
    metrics = {
        "n_candidates": p.n_candidates,
        "rqe_threshold": p.rqe_threshold,
        "bm25_top_k": k,
        "questions": int(len(questions)),
        "medquad_pairs": int(len(docs)),
        "coverage": coverage(cands, rp.coverage_thresholds),
        "retrieved_per_question_mean": round(float(per_q.mean()), 3),
        "fallback_questions": int((~chosen["passes_threshold"]).sum()),
        "rqe_model_fingerprint": model.fingerprint,
        "precision": precision,
        "precision_probe": model.precision_report.as_dict() if model.precision_report else None,
        "threads": model.threads or threads,
        "extract": stats.as_dict(),
        "seconds": {"bm25": round(t_bm25, 2), "total": round(time.perf_counter() - t0, 2)},
    }
    write_json(METRICS, metrics)
    cov = metrics["coverage"]["all"]
    log.info("retrieve: %s; %d fallbacks, in %.1fs", ", ".join(f"{t} {v['covered']}/{v['questions']}" for t, v in cov.items()),
             metrics["fallback_questions"], metrics["seconds"]["total"])  # fmt: skip


if __name__ == "__main__":
    run(main)
