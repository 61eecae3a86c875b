"""Stage `embed`: NLI sentence grids ([CLS] vectors + probabilities), ANLI, and RQE vectors (paper 4.4–4.5).

For every candidate answer A and each entailed answer E of its question (retrieved MedQuAD answers, plus
higher-ranked candidates on train splits), writes data/processed/embeddings/{nli_grid,rqe}.parquet and
metrics/embed.json. Sentence pairs go through the content-addressed cache: only unseen pairs are computed.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from medrank.runner import run

log = logging.getLogger("stages.embed")
OUT_DIR = Path("data/processed/embeddings")
RETRIEVED = Path("data/processed/retrieved.parquet")
METRICS = Path("metrics/embed.json")


def main(params_path: str = "params.yaml") -> None:
    from medrank.encoders.cross_encoder import CrossEncoder
    from medrank.encoders.extract import (
        NLI_GRID,
        SentenceEncoder,
        answer_pairs,
        choose_precision,
        embeddings_rqe_schema,
        nli_grids,
        precision_check,
    )
    from medrank.encoders.base import set_threads
    from medrank.io import read_parquet, write_json, write_parquet
    from medrank.params import load_params

    p = load_params(params_path)
    ep = p.embed
    t0 = time.perf_counter()
    threads = set_threads()
    retrieved = read_parquet(RETRIEVED).rename(columns={"entailed_sentences": "sentences"})
    answers = read_parquet(
        Path(ep.normalized_dir) / "answers.parquet", columns=["split", "qid", "aid", "reference_rank", "answer_sentences"]
    ).rename(columns={"answer_sentences": "sentences"})
    # only questions that went through retrieval (all of them, unless a tiny profile capped it)
    answers = answers.merge(retrieved[["split", "qid"]].drop_duplicates(), on=["split", "qid"])
    if ep.max_answers_per_question:
        answers = answers.groupby(["split", "qid"], sort=False).head(ep.max_answers_per_question)
    pairs = answer_pairs(answers, retrieved, ep.augment_top)
    log.info("%d answer pairs (%d rqe, %d augment) over %d candidate answers", len(pairs),
             int((pairs.entailed_kind == "rqe").sum()), int((pairs.entailed_kind == "augment").sum()), len(answers))  # fmt: skip

    model = CrossEncoder.load(ep.nli_model, device=p.device, precision=ep.precision)
    # precision (and CPU threads) from a probe on real sentence pairs, or from an existing cache for this model
    sample = [(e[0], a[0]) for a, e in zip(pairs["sentences_a"], pairs["sentences_e"]) if len(a) and len(e)]
    precision = choose_precision(model, ep.precision, ep.cache_dir, "nli", sample[:: max(1, len(sample) // 256)])
    bi = SentenceEncoder(ep.bi_encoder, device=p.device) if ep.prefilter_top_k is not None else None
    grid, plan, stats = nli_grids(
        pairs, model, precision, ep.cache_dir, max_sentences=ep.max_sentences, top_k=ep.prefilter_top_k, bi=bi,
        batch_size=ep.batch_size, bi_batch_size=ep.bi_batch_size, shard_size=ep.shard_size,
    )  # fmt: skip
    write_parquet(grid, OUT_DIR / "nli_grid.parquet", NLI_GRID)

    hidden = len(retrieved["rqe_cls"].iloc[0]) if len(retrieved) else 0
    rqe_schema = embeddings_rqe_schema(hidden)
    write_parquet(retrieved[rqe_schema.names], OUT_DIR / "rqe.parquet", rqe_schema)

    rng = np.random.default_rng(p.seed)
    sample_idx = rng.choice(len(plan.cells), size=min(ep.precision_check_pairs, len(plan.cells)), replace=False) if plan.cells else []
    check = precision_check(model, [plan.cells[i] for i in sample_idx], precision, ep.batch_size)
    by_kind = grid.groupby(["split", "entailed_kind"])["anli"].agg(["count", "mean"]).round(4)
    metrics = {
        "answer_pairs": int(len(grid)),
        "answer_pairs_by_kind": grid["entailed_kind"].value_counts().to_dict(),
        "grid_cells": int(len(plan.cells)),
        "max_sentences": ep.max_sentences,
        "prefilter_top_k": ep.prefilter_top_k,
        "nli_model_fingerprint": model.fingerprint,
        "precision": precision,
        "precision_probe": model.precision_report.as_dict() if model.precision_report else None,
        "precision_check_vs_fp32": check,
        "threads": model.threads or threads,
        "extract": {k: v.as_dict() for k, v in stats.items()},
        "anli": {f"{s}/{k}": {"pairs": int(r["count"]), "mean": float(r["mean"])} for (s, k), r in by_kind.iterrows()},
        "seconds": round(time.perf_counter() - t0, 2),
    }
    write_json(METRICS, metrics)
    log.info("embed: %d answer pairs, %d cells (%d computed) at %s in %.1fs", len(grid), len(plan.cells),
             stats["nli"].computed, precision, metrics["seconds"])  # fmt: skip


if __name__ == "__main__":
    run(main)
