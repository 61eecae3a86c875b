"""DVC stage `retrieve`: for every MEDIQA question, the MedQuAD questions it entails (BM25 -> RQE cross-encoder).

Writes data/processed/rqe_candidates.parquet (every candidate, scored), data/processed/retrieved.parquet
(top `n_candidates` with score >= `rqe_threshold`, else top-1) and metrics/retrieve.json (coverage per T, and
retrieval quality against the TREC 2017 LiveQA-Med judgments of MedQuAD answers: `judged`).
"""

from __future__ import annotations

import logging
import time

from medrank import layout
from medrank.encoders.models import read_json
from medrank.encoders.runtime import runtime_info, set_threads
from medrank.encoders.cross_encoder import META_FILE, CrossEncoder
from medrank.encoders.distributed import extraction_backend
from medrank.errors import MedrankError
from medrank.io import read_parquet, write_json, write_parquet
from medrank.params import load_params
from medrank.retrieval import (
    CANDIDATES,
    attach_entailed,
    coverage,
    judged_retrieval,
    medquad_documents,
    questions_table,
    retrieved_schema,
    score_candidates,
    select_entailed,
)
from medrank.runner import run

log = logging.getLogger("stages.retrieve")


def main(params_path: str = "params.yaml") -> None:
    p = load_params(params_path)
    rp = p.retrieve
    if p.n_candidates > rp.bm25_top_k:
        raise MedrankError(
            f"n_candidates ({p.n_candidates}) > retrieve.bm25_top_k ({rp.bm25_top_k}): nothing to choose from"
        )
    t0 = time.perf_counter()
    threads = set_threads()
    qcol = "question_norm" if rp.question_text == "normalized" else "question"
    answers = read_parquet(layout.ANSWERS, columns=["split", "qid", "question", "question_norm"])
    questions = questions_table(answers, qcol, p.max_questions_per_split)
    docs = medquad_documents(read_parquet(layout.MEDQUAD), qcol, "answer_norm")
    log.info("%d MEDIQA questions, %d MedQuAD question-answer pairs", len(questions), len(docs))
    backend = extraction_backend(rp.backend, rp.ray, rp.workers)
    model = CrossEncoder.load(layout.RQE_MODEL, device=p.device, precision=rp.precision, lazy=True)
    scored = score_candidates(
        questions,
        docs,
        model,
        layout.CACHE_RQE,
        question_col=qcol,
        bm25_top_k=rp.bm25_top_k,
        precision=rp.precision,
        batch_size=rp.batch_size,
        shard_size=rp.shard_size,
        backend=backend,
    )
    cands = scored.table
    write_parquet(cands[CANDIDATES.names], layout.RQE_CANDIDATES, CANDIDATES)
    chosen = attach_entailed(select_entailed(cands, p.n_candidates, p.rqe_threshold), docs, qcol)
    schema = retrieved_schema(model.hidden_size)
    write_parquet(chosen[schema.names], layout.RETRIEVED, schema)

    per_q = chosen.groupby(["split", "qid"]).size()
    metrics = {
        "n_candidates": p.n_candidates,
        "rqe_threshold": p.rqe_threshold,
        "bm25_top_k": min(rp.bm25_top_k, len(docs)),  # candidates per question (bm25_candidates caps at the corpus)
        "questions": int(len(questions)),
        "medquad_pairs": int(len(docs)),
        "coverage": coverage(cands, rp.coverage_thresholds),
        "retrieved_per_question_mean": round(float(per_q.mean()), 3),
        "fallback_questions": int((~chosen["passes_threshold"]).sum()),
        "judged": judged_retrieval(
            cands, chosen, read_parquet(layout.CLEAN_LIVEQA_QRELS), read_parquet(layout.CLEAN_LIVEQA_QUESTIONS)
        ),
        "rqe_model_fingerprint": model.fingerprint,
        # its training sources: a model trained on the LiveQA summaries has seen the judged questions (`judged` flatters)
        "rqe_recipe": read_json(layout.RQE_MODEL / META_FILE).get("recipe"),
        "precision": scored.precision,
        "precision_probe": model.precision_report.as_dict() if model.precision_report else None,
        "threads": model.threads or threads,
        "workers": getattr(
            backend, "workers", None
        ),  # backend local: processes of 1 thread each (only with >= 2 shards)
        "runtime": runtime_info(model.device, precision=scored.precision),
        "extract": scored.extract.as_dict(),
        "seconds": {"bm25": round(scored.bm25_seconds, 2), "total": round(time.perf_counter() - t0, 2)},
    }
    write_json(layout.metrics_file("retrieve"), metrics)
    cov = metrics["coverage"]["all"]
    log.info(
        "retrieve: %s; %d fallbacks, in %.1fs",
        ", ".join(f"{t} {v['covered']}/{v['questions']}" for t, v in cov.items()),
        metrics["fallback_questions"],
        metrics["seconds"]["total"],
    )


if __name__ == "__main__":
    run(main)
