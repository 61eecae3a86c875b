"""Stage `bienc`: zero-shot bi-encoder cosines of every MEDIQA answer and of its heading with the question.

One pass of the packaged MiniLM (mean pooling, unit vectors) over the normalized questions, answers
(truncated to `bienc.max_length` tokens) and answer headings (`features.answer_heading`: the "focus (aspect)"
title a CHiQA answer starts with). Vectors go through a content-addressed cache (`bienc.cache_dir`, persist),
so a re-run encodes only texts it has not seen. Writes data/processed/bienc.parquet (split, qid, aid,
bienc_cos, heading_cos), read by the baseline and mtl stages (feature groups `bienc`, `heading`), and
metrics/bienc.json.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from medrank.runner import run

log = logging.getLogger("stages.bienc")
OUT = Path("data/processed/bienc.parquet")
METRICS = Path("metrics/bienc.json")


def main(params_path: str = "params.yaml") -> None:
    import pyarrow as pa

    from medrank.features import answer_heading, bienc_cosines, cap_questions
    from medrank.io import read_parquet, write_json, write_parquet
    from medrank.params import load_params

    p = load_params(params_path)
    bp = p.bienc
    t0 = time.perf_counter()
    answers = read_parquet(Path(bp.normalized_dir) / "answers.parquet", columns=["split", "qid", "aid", "question_norm", "answer_norm"])
    answers = cap_questions(answers, bp.max_questions_per_split)
    Path(bp.cache_dir).mkdir(parents=True, exist_ok=True)  # a declared (persist) out, even with no answers
    answer = answers["answer_norm"].fillna("").astype(str)
    cos, stats = bienc_cosines(
        answers["question_norm"].fillna("").tolist(), {"bienc_cos": answer.tolist(), "heading_cos": answer.map(answer_heading).tolist()},
        bp.model, cache_root=bp.cache_dir, max_length=bp.max_length, batch_size=bp.batch_size, device=p.device,
    )  # fmt: skip
    schema = pa.schema([("split", pa.string()), ("qid", pa.string()), ("aid", pa.string()), ("bienc_cos", pa.float64()), ("heading_cos", pa.float64())])
    write_parquet(answers[["split", "qid", "aid"]].assign(**cos), OUT, schema)
    write_json(
        METRICS,
        {
            "answers": int(len(answers)),
            "model": bp.model,
            "max_length": bp.max_length,
            "encode": stats,
            "cos_mean": {name: round(float(v.mean()), 4) if len(v) else None for name, v in cos.items()},
            "seconds": round(time.perf_counter() - t0, 1),
        },
    )
    log.info("bienc: %d answers in %.1fs (%s)", len(answers), time.perf_counter() - t0, stats)


if __name__ == "__main__":
    run(main)
