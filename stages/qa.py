"""DVC stage `qa`: a question-answer relevance cross-encoder, then a score for every MEDIQA answer.

FINDINGS: a cross-encoder fine-tuned on the 1.7k MEDIQA training pairs barely learned; it needs more data.
Here it learns from MedQuAD alone: (question, answer) pairs mined with `medquad_qa_pairs` (positives, same-focus
answers of another question type, answers about another focus), validated on pairs of held-out foci. No MEDIQA
label is used, so its score is a plain feature (group `qa`) for the baseline and mtl stages.
Writes models/qa, data/processed/qa_scores.parquet (split, qid, aid, qa_score), metrics/qa.json, plots/qa.
"""

from __future__ import annotations

import logging
import time

from medrank.core import layout
from medrank.core.io import read_parquet, write_json, write_parquet
from medrank.stage.runner import run
from medrank.models.qa import fit_qa, qa_scores
from medrank.params import load_params
from medrank.task3.answer_scores import QA_SCORES
from medrank.task3.features import cap_questions

log = logging.getLogger("stages.qa")


def main(params_path: str = "params.yaml") -> None:
    p = load_params(params_path)
    t0 = time.perf_counter()
    medquad = read_parquet(layout.MEDQUAD, columns=["focus", "question_type", "question", "answer_norm"])
    model, record = fit_qa(medquad, p, layout.plots_dir("qa"))
    fingerprint = model.save(layout.QA_MODEL, extra_meta={"task": "qa"})

    answers = read_parquet(layout.ANSWERS, columns=["split", "qid", "aid", "question_norm", "answer_norm"])
    answers = cap_questions(answers, p.max_questions_per_split)
    score, speed = qa_scores(model, answers, p.qa.eval_batch_size)
    write_parquet(answers[["split", "qid", "aid"]].assign(qa_score=score), layout.QA_SCORES, QA_SCORES)
    write_json(
        layout.metrics_file("qa"),
        {
            **record,
            "model_fingerprint": fingerprint,
            "mediqa_answers_scored": len(answers),
            "predict_speed": speed,
            "seconds": round(time.perf_counter() - t0, 1),
        },
    )
    log.info(
        "qa: held-out MedQuAD accuracy %.3f; %d MEDIQA answers scored (%.0fs)",
        record["val_heldout_foci"]["accuracy"],
        len(answers),
        time.perf_counter() - t0,
    )


if __name__ == "__main__":
    run(main)
