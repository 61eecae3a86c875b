"""Cross-fitted grade learning for group qa_graded (analysis stage qa_graded): fold model f starts from models/qa,
learns the judged LiveQA answers of the train_liveqa questions outside fold f, and scores the MEDIQA answers of the
questions in fold f, so no question is scored by a model that learned its grades."""

from __future__ import annotations

import logging
import time

import numpy as np
import pandas as pd

from medrank.core import layout
from medrank.task3.answer_scores import qa_pairs
from medrank.data.judged import graded_targets, judged_answers, question_folds
from medrank.encoders.cross_encoder import CrossEncoder
from medrank.encoders.curves import CURVES, live_step_logger
from medrank.core.errors import MedrankError

log = logging.getLogger(__name__)


def read_inputs(p) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The MEDIQA answers (capped as every feature stage caps them) and the judged LiveQA answers of their train_liveqa
    questions, which the grades are learned from (none: a MedrankError)."""
    from medrank.core.io import read_parquet
    from medrank.task3.features import cap_questions

    answers = cap_questions(read_parquet(layout.ANSWERS), p.max_questions_per_split)
    judged = judged_answers(read_parquet(layout.JUDGED), answers)
    if judged.empty:
        raise MedrankError(
            f"{layout.JUDGED}: no judged answer of a train_liveqa question in {layout.ANSWERS} (nothing to learn the grades from)"
        )
    return answers, judged


def graded_metrics(score: np.ndarray, grade: np.ndarray, qid: np.ndarray) -> dict:
    """How a score orders judged answers: AUC of grade >= 3, Spearman with the grade pooled and within questions."""
    import scipy.stats

    within = []
    for q in pd.unique(qid):
        m = qid == q
        if m.sum() >= 3 and len(np.unique(grade[m])) > 1 and len(np.unique(score[m])) > 1:
            within.append(float(scipy.stats.spearmanr(score[m], grade[m])[0]))
    return {
        "n": int(len(score)),
        "auc": _auc((grade >= 3).astype(float), score),
        "spearman": round(float(scipy.stats.spearmanr(score, grade)[0]), 4)
        if len(score) > 2 and np.ptp(score) > 0 and np.ptp(grade) > 0
        else None,
        "spearman_within_question": round(float(np.mean(within)), 4) if within else None,
        "n_questions_within": len(within),
    }


def _auc(label: np.ndarray, score: np.ndarray) -> float | None:
    """AUC of the 0/1 `label` (NaN = unlabelled, skipped); None without both classes."""
    from sklearn.metrics import roc_auc_score

    ok = ~np.isnan(label)
    label, score = label[ok], score[ok]
    return round(float(roc_auc_score(label, score)), 4) if 0 < label.sum() < len(label) else None


def cross_fit(answers: pd.DataFrame, judged: pd.DataFrame, p, live) -> dict:
    """Every MEDIQA answer's qa_graded_score (`score`, in `answers` order), each judged answer's held-out score before
    (models/qa) and after its fold's fine-tune, the grades, and per-fold facts (`folds`); curves go to `live`."""
    gp = p.qa_graded
    keys = answers[["split", "qid"]].drop_duplicates()
    fold_of = dict(zip(zip(keys["split"], keys["qid"]), question_folds(keys, gp.folds, p.seed)))
    a_fold = np.array([fold_of[k] for k in zip(answers["split"], answers["qid"])])
    j_fold = np.array([fold_of[("train_liveqa", q)] for q in judged["qid"]])
    grade = judged["reference_score"].to_numpy(dtype=float)
    target = graded_targets(grade, gp.target)
    j_pairs = qa_pairs(judged)
    a_pairs = qa_pairs(answers)

    score = np.full(len(answers), np.nan)
    held_before, held_after = np.full(len(judged), np.nan), np.full(len(judged), np.nan)
    folds = []
    base = CrossEncoder.load(layout.QA_MODEL, device=p.device, precision=gp.predict_precision, task="qa")
    for f in range(gp.folds):
        tf = time.perf_counter()
        train, held = np.flatnonzero(j_fold != f), np.flatnonzero(j_fold == f)
        if len(train) == 0:
            raise MedrankError(
                f"qa_graded.folds: fold {f} leaves no judged answer to train on ({len(judged)} judged answers; use fewer folds)"
            )
        model = CrossEncoder.load(layout.QA_MODEL, device=p.device, precision=gp.predict_precision, task="qa")
        eval_pairs = [j_pairs[i] for i in held] if len(held) else None
        eval_labels = (grade[held] >= 3).astype(int) if len(held) else None
        model.fit(
            [j_pairs[i] for i in train],
            target[train],
            epochs=gp.epochs,
            lr=gp.lr,
            batch_size=gp.batch_size,
            warmup_ratio=gp.warmup_ratio,
            weight_decay=gp.weight_decay,
            eval_pairs=eval_pairs,
            eval_labels=eval_labels,
            seed=p.seed + f,
            precision=gp.train_precision,
            threads=gp.threads,
            eval_every=gp.eval_every,
            soft_targets=gp.target == "grade",
            step_callback=live_step_logger(live, {k: f"fold{f}/{v}" for k, v in CURVES.items()}),
        )
        if len(held):
            held_after[held] = model.predict(eval_pairs, batch_size=gp.eval_batch_size, show_progress=False)[:, 1]
            held_before[held] = base.predict(eval_pairs, batch_size=gp.eval_batch_size, show_progress=False)[:, 1]
        rows = np.flatnonzero(a_fold == f)
        if len(rows):
            score[rows] = model.predict([a_pairs[i] for i in rows], batch_size=gp.eval_batch_size, show_progress=False)[
                :, 1
            ]
        folds.append(
            {
                "fold": f,
                "n_train_judged": int(len(train)),
                "n_held_judged": int(len(held)),
                "n_answers_scored": int(len(rows)),
                "train_precision": model.train_precision,
                "seconds": round(time.perf_counter() - tf, 1),
            }
        )
        log.info(
            "qa_graded fold %d: %d judged answers learned, %d MEDIQA answers scored (%.0fs)",
            f,
            len(train),
            len(rows),
            time.perf_counter() - tf,
        )
    return {"score": score, "before": held_before, "after": held_after, "grade": grade, "folds": folds}


def report(answers: pd.DataFrame, judged: pd.DataFrame, fit: dict, qa: pd.DataFrame, gp) -> dict:
    """metrics/qa_graded.json (without seconds): the held-out judged answers before/after, and on MEDIQA's labels
    the qa_score (`qa`: data/processed/qa_scores.parquet) beside the qa_graded_score, per split."""
    score, held_before, held_after, grade, folds = (fit[k] for k in ("score", "before", "after", "grade", "folds"))
    qid = judged["qid"].to_numpy()
    ok = ~np.isnan(held_after)
    by_split = {}
    qa = qa.merge(answers[["split", "qid", "aid", "label"]], on=["split", "qid", "aid"])
    graded = answers[["split", "qid", "aid"]].assign(qa_graded_score=score).merge(qa, on=["split", "qid", "aid"])
    for split, g in graded.groupby("split"):
        lab = g["label"].to_numpy(dtype=float)
        by_split[split] = {
            "qa_auc": _auc(lab, g["qa_score"].to_numpy()),
            "qa_graded_auc": _auc(lab, g["qa_graded_score"].to_numpy()),
        }
    held = {
        "before": graded_metrics(held_before[ok], grade[ok], qid[ok]),
        "after": graded_metrics(held_after[ok], grade[ok], qid[ok]),
    }
    return {
        "target": gp.target,
        "folds": folds,
        "n_judged": int(len(judged)),
        "n_judged_questions": int(judged["qid"].nunique()),
        # every judged answer scored by the fold model that never saw its question: before (models/qa) and after
        "held_out_judged": held,
        # zero-shot on MEDIQA's labels (train_alexa, val: no judged answers behind them), qa_score vs qa_graded_score
        "mediqa_auc": by_split,
        "mediqa_answers_scored": int(len(answers)),
    }
