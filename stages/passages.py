"""DVC stage `passages`: group passage, an encoder's best cosine between the question and a
window of the answer.

Stage bienc reads an answer's first `max_length` tokens (of its encoder); half the MEDIQA answers are longer, and for a
quarter the best-matching window is past the first. Here each answer's sentences are packed into windows of up to
`passages.window_tokens` tokens (its first `passages.max_passages` windows) and encoded by the encoder
`passages.encoder` names in the encoders table (by default bienc's), at its precision, through a content-addressed
cache (data/cache/passages, persist: a re-run encodes only unseen
texts). Writes data/processed/passage_scores.parquet (split, qid, aid, passage_max_cos, n_passages), read by the
baseline's filter (`baseline.filter_only`), medrank rank's passage step (the params it ran with) and
metrics/passages.json (windows, encoding, the score's AUC per labelled source beside bienc_cos, seconds).
"""

from __future__ import annotations

import logging
import time

from medrank.core import layout
from medrank.task3.answer_scores import PASSAGE_SCORES, auc_by_source, passage_scores
from medrank.encoders.sentence_encoder import SentenceEncoder
from medrank.task3.features import cap_questions
from medrank.core.io import read_parquet, write_json, write_parquet
from medrank.params import load_params, step_params
from medrank.stage.runner import run
from medrank.steps import save_step

log = logging.getLogger("stages.passages")


def main(params_path: str = "params.yaml") -> None:
    p = load_params(params_path)
    t0 = time.perf_counter()
    answers = cap_questions(read_parquet(layout.ANSWERS), p.max_questions_per_split)
    enc = p.encoder_of("passages")
    bi = SentenceEncoder(enc.model, device=p.device, max_length=enc.max_length)
    layout.CACHE_PASSAGES.mkdir(parents=True, exist_ok=True)  # a declared (persist) out, even with no answers
    table, stats = passage_scores(answers, bi, cache_root=layout.CACHE_PASSAGES, pp=p.passages, bp=enc)
    write_parquet(table, layout.PASSAGE_SCORES, PASSAGE_SCORES)
    save_step("passages", step_params(p, "passages"), {})
    bienc = read_parquet(layout.BIENC).merge(table[["split", "qid", "aid"]], on=["split", "qid", "aid"], how="right")
    columns = {"bienc_cos": bienc["bienc_cos"].to_numpy(), "passage_max_cos": table["passage_max_cos"].to_numpy()}
    metrics = {
        "answers": len(table),
        "model": enc.model,
        "windows": stats.pop("windows"),
        "answers_read_past_the_first_window": int((table["n_passages"] > 1).sum()),
        "encode": stats,
        "auc": auc_by_source(answers, columns),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    write_json(layout.metrics_file("passages"), metrics)
    log.info("passages: %d answers, %d windows in %.1fs", len(table), metrics["windows"], metrics["seconds"])


if __name__ == "__main__":
    run(main)
