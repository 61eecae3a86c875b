"""DVC stage `embed`: NLI sentence grids ([CLS] vectors + probabilities) and ANLI (paper 4.4-4.5).

For every candidate answer A and each entailed answer E of its question (retrieved MedQuAD answers, plus
higher-ranked candidates on train splits), writes data/processed/embeddings/nli_grid.parquet and
metrics/embed.json. Sentence pairs go through the content-addressed cache: only unseen pairs are computed.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from medrank import layout
from medrank.encoders.runtime import runtime_info, set_threads
from medrank.encoders.cross_encoder import CrossEncoder
from medrank.encoders.distributed import extraction_backend
from medrank.encoders.extract import cached_precision_check
from medrank.encoders.sentence_encoder import SentenceEncoder
from medrank.grids import NLI_GRID, answer_grids, candidate_answers
from medrank.io import read_parquet, write_json, write_parquet
from medrank.params import load_params
from medrank.runner import run

log = logging.getLogger("stages.embed")


def main(params_path: str = "params.yaml") -> None:
    p = load_params(params_path)
    ep = p.embed
    t0 = time.perf_counter()
    threads = set_threads()
    retrieved = read_parquet(layout.RETRIEVED).rename(columns={"entailed_sentences": "sentences"})
    answers = read_parquet(layout.ANSWERS, columns=["split", "qid", "aid", "reference_rank", "answer_sentences"])
    answers = candidate_answers(
        answers.rename(columns={"answer_sentences": "sentences"}), retrieved, ep.max_answers_per_question
    )
    backend = extraction_backend(ep.backend, ep.ray, ep.workers)
    model = CrossEncoder.load(layout.NLI_MODEL, device=p.device, precision=ep.precision)
    bi = SentenceEncoder(ep.bi_encoder, device=p.device) if ep.prefilter_top_k is not None else None
    grids = answer_grids(
        answers,
        retrieved,
        model,
        layout.CACHE_EMBED,
        max_sentences=ep.max_sentences,
        prefilter_top_k=ep.prefilter_top_k,
        bi=bi,
        augment_top=ep.augment_top,
        precision=ep.precision,
        batch_size=ep.batch_size,
        bi_batch_size=ep.bi_batch_size,
        shard_size=ep.shard_size,
        backend=backend,
    )
    grid, cells = grids.rows, grids.plan.cells
    write_parquet(grid, layout.NLI_GRID, NLI_GRID)

    # the check's sample: cells of each question's first entailed answer, the same for any N and T (so an experiment
    # reads the check back from the cache: cached_precision_check)
    first = np.flatnonzero(((grid["entailed_kind"] == "rqe") & (grid["entailed_rank"] == 1)).to_numpy())
    offsets = grids.plan.offsets
    pool = np.concatenate([np.arange(offsets[r], offsets[r + 1]) for r in first]) if len(first) else np.zeros(0, int)
    rng = np.random.default_rng(p.seed)
    sample_idx = rng.choice(pool, size=min(ep.precision_check_pairs, len(pool)), replace=False) if len(pool) else []
    check = cached_precision_check(
        model, [cells[i] for i in sample_idx], grids.precision, layout.CACHE_EMBED, ep.batch_size
    )
    by_kind = grid.groupby(["split", "entailed_kind"])["anli"].agg(["count", "mean"]).round(4)
    metrics = {
        "answer_pairs": int(len(grid)),
        "answer_pairs_by_kind": grid["entailed_kind"].value_counts().to_dict(),
        "grid_cells": int(len(cells)),
        "max_sentences": ep.max_sentences,
        "prefilter_top_k": ep.prefilter_top_k,
        "nli_model_fingerprint": model.fingerprint,
        "precision": grids.precision,
        "precision_probe": model.precision_report.as_dict() if model.precision_report else None,
        "precision_check_vs_fp32": check,
        "threads": model.threads or threads,
        "workers": getattr(
            backend, "workers", None
        ),  # backend local: processes of 1 thread each (only with >= 2 shards)
        # bf16 outputs agree bit for bit only between CPUs with the same bf16 kernels (flags, ATen level)
        "runtime": runtime_info(model.device, precision=grids.precision),
        "extract": {k: v.as_dict() for k, v in grids.stats.items()},
        "anli": {f"{s}/{k}": {"pairs": int(r["count"]), "mean": float(r["mean"])} for (s, k), r in by_kind.iterrows()},
        "seconds": round(time.perf_counter() - t0, 2),
    }
    write_json(layout.metrics_file("embed"), metrics)
    log.info(
        "embed: %d answer pairs, %d cells (%d computed) at %s in %.1fs",
        len(grid),
        len(cells),
        grids.stats["nli"].computed,
        grids.precision,
        metrics["seconds"],
    )


if __name__ == "__main__":
    run(main)
