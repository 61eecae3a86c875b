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

import numpy as np
import pyarrow as pa

from medrank.core import layout
from medrank.task3.answer_scores import qa_pairs
from medrank.data.tasks import QA_LABELS, qa_task
from medrank.encoders.cross_encoder_training import classification_metrics
from medrank.encoders.curves import fine_tune
from medrank.task3.features import cap_questions
from medrank.core.io import read_parquet, write_json, write_parquet
from medrank.params import load_params
from medrank.core.runner import run

log = logging.getLogger("stages.qa")
QA_SCORES = pa.schema([("split", pa.string()), ("qid", pa.string()), ("aid", pa.string()), ("qa_score", pa.float64())])


def main(params_path: str = "params.yaml") -> None:
    p = load_params(params_path)
    qp = p.qa
    t0 = time.perf_counter()
    medquad = read_parquet(layout.MEDQUAD, columns=["focus", "question_type", "question", "answer_norm"])
    data = qa_task(medquad, qp.train_pairs, qp.eval_pairs, qp.eval_focus_frac, np.random.default_rng(p.seed))
    model, history, train_seconds = fine_tune(
        qp,
        QA_LABELS,
        (data.train_pairs, data.train_labels),
        (data.eval_pairs, data.eval_labels),
        seed=p.seed,
        device=p.device,
        live_dir=layout.plots_dir("qa"),
    )
    val = classification_metrics(data.eval_labels, model.predict(data.eval_pairs, batch_size=qp.eval_batch_size))
    fingerprint = model.save(layout.QA_MODEL, extra_meta={"task": "qa"})

    answers = read_parquet(layout.ANSWERS, columns=["split", "qid", "aid", "question_norm", "answer_norm"])
    answers = cap_questions(answers, p.max_questions_per_split)
    pairs = qa_pairs(answers)
    score = model.predict(pairs, batch_size=qp.eval_batch_size)[:, 1] if pairs else np.zeros(0)
    speed = dict(model.last_predict_stats) if pairs else {}
    write_parquet(answers[["split", "qid", "aid"]].assign(qa_score=score), layout.QA_SCORES, QA_SCORES)
    write_json(
        layout.metrics_file("qa"),
        {
            "base_model": qp.base_model,
            "base_fingerprint": model.base_fingerprint,
            "model_fingerprint": fingerprint,
            "n_train_pairs": len(data.train_pairs),
            "train_seconds": round(train_seconds, 1),
            "train_precision": model.train_precision,
            "threads": model.threads,
            "val_heldout_foci": val,
            "history": history,
            "mediqa_answers_scored": len(pairs),
            "predict_speed": speed,
            "seconds": round(time.perf_counter() - t0, 1),
        },
    )
    log.info(
        "qa: held-out MedQuAD accuracy %.3f; %d MEDIQA answers scored (%.0fs)",
        val["accuracy"],
        len(pairs),
        time.perf_counter() - t0,
    )


if __name__ == "__main__":
    run(main)
