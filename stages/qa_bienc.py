"""DVC stage `qa_bienc` (analysis/dvc.yaml): a question -> answer bi-encoder fine-tuned for relevance, cross-fitted,
then cos(question, answer) of every MEDIQA answer (feature group qa_bienc): Task 3's counterpart of the RQE bi-encoder.

Step one learns MedQuAD: (question, its answer, an answer of the same focus and another question type) triplets
with in-batch negatives (`qa_bienc.medquad_triplets`; no MEDIQA text). Step two is cross-fitted: with `fold_by:
source` (default) each labelled source is a fold and the test questions are dealt over the folds; fold model f starts
from step one, learns the labelled MEDIQA answers outside fold f (label: reference score >= 3) and, with
`qa_bienc.judged`, the judged LiveQA answers of the train_liveqa questions outside fold f (grade >= 3), and scores the
answers of the questions in fold f. So no question is scored by a model that learned it, and no labelled source by a
model that saw any of its labels (what LOSO and nested LOSO assume: with random question folds, `fold_by: question`,
a source's other questions' labels reach its scores). Writes data/processed/qa_bienc_scores.parquet (split, qid, aid,
qa_bienc_cos), metrics/qa_bienc.json (AUC of each step's cosine on each labelled source beside the zero-shot
bi-encoder's) and plots/qa_bienc (dvclive: training loss per step and fold).
"""

from __future__ import annotations

import logging
import time

from medrank.core import layout
from medrank.core.io import read_parquet, write_json, write_parquet
from medrank.core.live import stage_live
from medrank.stage.runner import run
from medrank.data.judged import judged_answers
from medrank.encoders.runtime import set_threads
from medrank.models import qa_bienc as B
from medrank.params import load_params
from medrank.task3.answer_scores import QA_BIENC_SCORES
from medrank.task3.features import cap_questions

log = logging.getLogger("stages.qa_bienc")


def main(params_path: str = "params.yaml") -> None:
    p = load_params(params_path)
    qp = p.qa_bienc
    t0 = time.perf_counter()
    set_threads(qp.threads)
    answers = cap_questions(read_parquet(layout.ANSWERS), p.max_questions_per_split)
    judged = judged_answers(read_parquet(layout.JUDGED), answers) if qp.judged else answers.iloc[:0]
    with stage_live("qa_bienc", qp) as live:
        fit = B.cross_fitted_cosines(answers, judged, p, live)
    scores = answers[["split", "qid", "aid"]].assign(qa_bienc_cos=fit["score"])
    write_parquet(scores, layout.QA_BIENC_SCORES, QA_BIENC_SCORES)
    metrics = B.report(answers, fit, qp)
    write_json(
        layout.metrics_file("qa_bienc"),
        {**metrics, "seconds": {**fit["seconds"], "total": round(time.perf_counter() - t0, 1)}},
    )
    log.info("qa_bienc: %s (%.0fs)", {k: v.get("pooled") for k, v in metrics["auc"].items()}, time.perf_counter() - t0)


if __name__ == "__main__":
    run(main)
