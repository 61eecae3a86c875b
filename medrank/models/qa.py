"""The qa cross-encoder (stage qa, feature group qa): (question, answer) relevance learned from MedQuAD alone, then a
score for every MEDIQA answer. Its graded refinement on the judged LiveQA answers is medrank.models.qa_graded."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd

from medrank.data.tasks import QA_LABELS, qa_task
from medrank.encoders.cross_encoder import CrossEncoder
from medrank.encoders.cross_encoder_training import classification_metrics
from medrank.encoders.curves import fine_tune, training_record
from medrank.task3.answer_scores import qa_pairs


def fit_qa(medquad: pd.DataFrame, p, live_dir: str | os.PathLike) -> tuple[CrossEncoder, dict]:
    """A fresh cross-encoder fine-tuned on `medquad_qa_pairs` (positives, same-focus answers of another question type,
    answers about another focus) and validated on pairs of held-out foci: (model, its training record)."""
    qp = p.qa
    data = qa_task(medquad, qp.train_pairs, qp.eval_pairs, qp.eval_focus_frac, np.random.default_rng(p.seed))
    model, history, train_seconds = fine_tune(
        qp,
        QA_LABELS,
        (data.train_pairs, data.train_labels),
        (data.eval_pairs, data.eval_labels),
        seed=p.seed,
        device=p.device,
        live_dir=live_dir,
    )
    val = classification_metrics(data.eval_labels, model.predict(data.eval_pairs, batch_size=qp.eval_batch_size))
    return model, {**training_record(qp, model, len(data.train_pairs), history, train_seconds), "val_heldout_foci": val}


def qa_scores(model: CrossEncoder, answers: pd.DataFrame, batch_size: int) -> tuple[np.ndarray, dict]:
    """P(answered) of each answer's (normalized question, normalized answer) and the prediction's speed record."""
    pairs = qa_pairs(answers)
    score = model.predict(pairs, batch_size=batch_size)[:, 1] if pairs else np.zeros(0)
    return score, dict(model.last_predict_stats) if pairs else {}
