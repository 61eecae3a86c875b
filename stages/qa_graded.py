"""DVC stage `qa_graded` (analysis/dvc.yaml): the qa cross-encoder fine-tuned further on the judged LiveQA answers'
grades (MEDIQA's 1-4 scale), cross-fitted over the questions, then a score for every MEDIQA answer (group qa_graded).

The judged answers belong to the train_liveqa questions, whose MEDIQA answers are training rows of the baseline and
the MTL: a model that learned a question's grades must never score that question. So the questions of every split
are dealt into `qa_graded.folds` folds; fold model f starts from models/qa, learns the judged answers of the
train_liveqa questions outside fold f, and scores the MEDIQA answers of the questions in fold f (every split: the
other splits' questions need no holding out, but each is scored by one fold model like the rest, so the score has the
same distribution everywhere). The held-out judged answers of fold f measure each fold model before and after.
Writes data/processed/qa_graded_scores.parquet (split, qid, aid, qa_graded_score), metrics/qa_graded.json,
plots/qa_graded (dvclive curves per fold).
"""

from __future__ import annotations

import logging
import time

from medrank.core import layout
from medrank.core.io import read_parquet, write_json, write_parquet
from medrank.core.live import stage_live
from medrank.stage.runner import run
from medrank.models import qa_graded as G
from medrank.params import load_params
from medrank.task3.answer_scores import QA_GRADED_SCORES

log = logging.getLogger("stages.qa_graded")


def main(params_path: str = "params.yaml") -> None:
    p = load_params(params_path)
    gp = p.qa_graded
    t0 = time.perf_counter()
    answers, judged = G.read_inputs(p)
    with stage_live("qa_graded", gp) as live:
        fit = G.cross_fit(answers, judged, p, live)
    scores = answers[["split", "qid", "aid"]].assign(qa_graded_score=fit["score"])
    write_parquet(scores, layout.QA_GRADED_SCORES, QA_GRADED_SCORES)
    metrics = G.report(answers, judged, fit, read_parquet(layout.QA_SCORES), gp)
    write_json(layout.metrics_file("qa_graded"), {**metrics, "seconds": round(time.perf_counter() - t0, 1)})
    held = metrics["held_out_judged"]
    log.info(
        "qa_graded: held-out judged AUC %s -> %s (%.0fs)",
        held["before"]["auc"],
        held["after"]["auc"],
        time.perf_counter() - t0,
    )


if __name__ == "__main__":
    run(main)
