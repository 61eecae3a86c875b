"""DVC stage `bienc`: zero-shot bi-encoder cosines of every MEDIQA answer (with `bienc.judged`, every judged LiveQA
answer too: medrank.data.judged) and of its heading with the question, and the question-type agreement of the
question and the heading.

One pass of the packaged MiniLM (mean pooling, unit vectors) over the normalized questions, answers
(truncated to `bienc.max_length` tokens) and answer headings (`answer_scores.answer_heading`: the "focus (aspect)"
title a CHiQA answer starts with). Vectors go through a content-addressed cache (data/cache/bienc, persist),
so a re-run encodes only texts it has not seen. The question types come from a classifier fitted on the clean
MedQuAD table (seed `seed`; `answer_scores.answer_qtype_scores`). Writes data/processed/bienc.parquet (split, qid,
aid, bienc_cos, heading_cos, qtype_agree, qtype_match), read by the baseline and mtl stages (feature groups `bienc`,
`heading`, `qtype`), and metrics/bienc.json.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import pyarrow as pa

from medrank import layout
from medrank.answer_scores import auc_by_source, score_answers
from medrank.data.judged import judged_answers, with_judged
from medrank.encoders.hardware import resolve_device
from medrank.encoders.runtime import BLAS_THREADS, runtime_info
from medrank.encoders.sentence_encoder import SentenceEncoder
from medrank.features import cap_questions
from medrank.io import read_parquet, write_json, write_parquet
from medrank.params import load_params
from medrank.runner import run

log = logging.getLogger("stages.bienc")
BIENC_SCORES = pa.schema(
    [("split", pa.string()), ("qid", pa.string()), ("aid", pa.string())]
    + [(c, pa.float64()) for c in ("bienc_cos", "heading_cos", "qtype_agree", "qtype_match")]
)


def _means(columns: dict) -> dict:
    return {name: round(float(v.mean()), 4) if len(v) else None for name, v in columns.items()}


CHECK_ANSWERS = 64  # answers whose cosines are recomputed in fp32 (uncached) to report the chosen precision's error


def main(params_path: str = "params.yaml") -> None:
    p = load_params(params_path)
    bp = p.bienc
    t0 = time.perf_counter()
    answers = labelled = cap_questions(read_parquet(layout.ANSWERS), p.max_questions_per_split)
    # bienc.judged: the judged LiveQA answers too (baseline.judged_rows trains on them)
    judged = judged_answers(read_parquet(layout.JUDGED), answers) if bp.judged else None
    answers = with_judged(answers, judged)[["split", "qid", "aid", "question_norm", "answer_norm", "judged"]]
    mediqa = ~answers["judged"].to_numpy(dtype=bool)  # the metrics' means describe the MEDIQA answers
    bi = SentenceEncoder(bp.model, device=p.device, max_length=bp.max_length)
    table, stats = score_answers(answers, p, bi)
    write_parquet(table, layout.BIENC, BIENC_SCORES)
    # the chosen precision's error: fp32 cosines of a seeded sample, computed uncached (the cache stores float16)
    sample = np.random.default_rng(p.seed).choice(len(answers), size=min(CHECK_ANSWERS, len(answers)), replace=False)
    q32 = bi.encode(answers["question_norm"].fillna("").iloc[sample].tolist(), "fp32", bp.batch_size)
    a32 = bi.encode(answers["answer_norm"].fillna("").iloc[sample].tolist(), "fp32", bp.batch_size)
    check = (
        float(np.abs(np.einsum("ij,ij->i", q32, a32) - table["bienc_cos"].to_numpy()[sample]).max())
        if len(sample)
        else None
    )
    write_json(
        layout.metrics_file("bienc"),
        {
            "answers": int(mediqa.sum()),
            "judged_answers": int((~mediqa).sum()),
            "model": bp.model,
            "max_length": bp.max_length,
            "encode": stats,
            "precision_check_vs_fp32": {
                "answers": int(len(sample)),
                "max_abs_diff_bienc_cos": None if check is None else round(check, 6),
            },
            "cos_mean": _means({k: table[k].to_numpy()[mediqa] for k in ("bienc_cos", "heading_cos")}),
            # against the label (reference score >= 3), per labelled source: what qa_bienc's rows are set beside
            "auc": auc_by_source(labelled, {k: table[k].to_numpy()[mediqa] for k in ("bienc_cos", "heading_cos")}),
            "qtype_mean": _means({k: table[k].to_numpy()[mediqa] for k in ("qtype_agree", "qtype_match")}),
            "runtime": runtime_info(
                resolve_device(p.device), precision=stats.get("precision"), blas_threads=BLAS_THREADS
            ),
            "seconds": round(time.perf_counter() - t0, 1),
        },
    )
    log.info("bienc: %d answers in %.1fs (%s)", len(answers), time.perf_counter() - t0, stats)


if __name__ == "__main__":
    run(main)
