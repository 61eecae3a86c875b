"""DVC stage `retrieve`: for every MEDIQA question, the MedQuAD questions it entails (BM25 -> RQE cross-encoder).

Writes data/processed/rqe_candidates.parquet (every candidate, scored), data/processed/retrieved.parquet
(top `n_candidates` with score >= `rqe_threshold`, else top-1) and metrics/retrieve.json (coverage per T, and
retrieval quality against the TREC 2017 LiveQA-Med judgments of MedQuAD answers: `judged`).
"""

from __future__ import annotations

import logging
import time

from medrank.core import layout
from medrank.encoders.runtime import set_threads
from medrank.encoders.cross_encoder import CrossEncoder
from medrank.encoders.distributed import extraction_backend, forked_workers
from medrank.core.io import read_parquet, write_json, write_parquet
from medrank.steps.retrieve_step import RetrieveStep
from medrank.params import load_params
from medrank.task3 import retrieval as R
from medrank.stage.runner import run

log = logging.getLogger("stages.retrieve")


def main(params_path: str = "params.yaml") -> None:
    p = load_params(params_path)
    rp = p.retrieve
    t0 = time.perf_counter()
    threads = set_threads()
    answers = read_parquet(layout.ANSWERS, columns=["split", "qid", "question", "question_norm"])
    questions = R.questions_table(answers, rp.question_column, p.max_questions_per_split)
    model = CrossEncoder.load(layout.RQE_MODEL, device=p.device, precision=rp.precision, lazy=True, task="rqe")
    step = RetrieveStep.fit(p, read_parquet(layout.MEDQUAD), model)
    log.info("%d MEDIQA questions, %d MedQuAD question-answer pairs", len(questions), len(step.docs))
    backend = extraction_backend(rp.backend, rp.ray, rp.workers)
    scored = step.score(questions, layout.CACHE_RQE, shard_size=rp.shard_size, backend=backend)
    write_parquet(scored.table[R.CANDIDATES.names], layout.RQE_CANDIDATES, R.CANDIDATES)
    chosen = step.entailed(scored.table)
    schema = R.retrieved_schema(model.hidden_size)
    write_parquet(chosen[schema.names], layout.RETRIEVED, schema)
    step.save()
    metrics = R.retrieval_metrics(
        step,
        scored,
        chosen,
        n_questions=len(questions),
        qrels=read_parquet(layout.CLEAN_LIVEQA_QRELS),
        judged_questions=read_parquet(layout.CLEAN_LIVEQA_QUESTIONS),
        threads=threads,
        workers=forked_workers(backend, scored.precision),
        seconds_total=time.perf_counter() - t0,
    )
    write_json(layout.metrics_file("retrieve"), metrics)
    cov = ", ".join(f"{t} {v['covered']}/{v['questions']}" for t, v in metrics["coverage"]["all"].items())
    log.info("retrieve: %s; %d fallbacks, in %.1fs", cov, metrics["fallback_questions"], metrics["seconds"]["total"])


if __name__ == "__main__":
    run(main)
