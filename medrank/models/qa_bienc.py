"""The question -> answer bi-encoder of group qa_bienc (analysis stage qa_bienc): step one fine-tunes the base model on
mined MedQuAD triplets (in-batch negatives), step two is cross-fitted on the labelled MEDIQA and judged LiveQA answers of
the other question folds, so no answer is scored by a model that learned it."""

from __future__ import annotations

import copy
import logging
import time

import numpy as np
import pandas as pd

from medrank.core import layout
from medrank.task3.answer_scores import auc_by_source, qa_pairs
from medrank.task3.crossfit import crossfit, folds_by_source
from medrank.data.judged import question_folds
from medrank.data.mining import medquad_qa_triplets
from medrank.encoders.sentence_encoder import SentenceEncoder
from medrank.core.errors import MedrankError
from medrank.core.io import read_parquet

log = logging.getLogger(__name__)


def cosines(model: SentenceEncoder, pairs: list[tuple[str, str]], batch_size: int) -> np.ndarray:
    """cos(question, answer) of each pair (unit vectors; fp32)."""
    if not pairs:
        return np.zeros(0)
    q = model.encode([a for a, _ in pairs], "fp32", batch_size)
    a = model.encode([b for _, b in pairs], "fp32", batch_size)
    return np.einsum("ij,ij->i", q, a).astype(float)


def cross_fitted_cosines(answers: pd.DataFrame, judged: pd.DataFrame, p, live) -> dict:
    """The zero-shot, step-one and cross-fitted cosines of every answer (in `answers` order), the number of triplets,
    per-fold facts and seconds; losses go to `live`."""
    qp = p.qa_bienc
    a_pairs = qa_pairs(answers)
    labelled = answers["reference_score"].notna().to_numpy()
    a_label = (answers["reference_score"].fillna(0).to_numpy(dtype=float) >= 3).astype(int)
    keys = answers[["split", "qid"]].drop_duplicates()
    folds = (
        folds_by_source(keys, layout.LABELLED_SPLITS, p.seed)
        if qp.fold_by == "source"
        else question_folds(keys, qp.folds, p.seed)
    )
    n_folds = int(folds.max()) + 1
    fold_of = dict(zip(zip(keys["split"], keys["qid"]), folds))
    a_fold = np.array([fold_of[k] for k in zip(answers["split"], answers["qid"])])
    j_fold = np.array([fold_of[("train_liveqa", q)] for q in judged["qid"]], dtype=int)
    j_pairs, j_label = qa_pairs(judged), (judged["reference_score"].to_numpy(dtype=float) >= 3).astype(int)
    seconds: dict[str, float] = {}
    knobs = dict(
        warmup_ratio=qp.warmup_ratio, weight_decay=qp.weight_decay, precision=qp.train_precision, show_progress=True
    )

    base = SentenceEncoder(qp.base_model, device=p.device, max_length=qp.max_length)
    zero_shot = cosines(base, a_pairs, qp.batch_size_encode)
    triplets = medquad_qa_triplets(read_parquet(layout.MEDQUAD), qp.medquad_triplets, np.random.default_rng(p.seed))
    if triplets:
        ts = time.perf_counter()
        q, pos, neg = (list(x) for x in zip(*triplets))
        hist = base.fit_ranking(q, pos, neg, epochs=qp.epochs, lr=qp.lr, batch_size=qp.batch_size, seed=p.seed, **knobs)
        for h in hist:
            live.log_metric("medquad/train/loss", h["train_loss"], plot=False)
        seconds["step one (MedQuAD)"] = round(time.perf_counter() - ts, 1)
    step_one = cosines(base, a_pairs, qp.batch_size_encode)
    fold_stats: list[dict] = []

    def fit_fold(f: int, train: list[np.ndarray]) -> SentenceEncoder:
        ts = time.perf_counter()
        a_train, j_train = np.intersect1d(train[0], np.flatnonzero(labelled)), train[1]
        pairs = [a_pairs[i] for i in a_train] + [j_pairs[i] for i in j_train]
        y = np.concatenate([a_label[a_train], j_label[j_train]])
        if len(np.unique(y)) < 2:
            raise MedrankError(f"qa_bienc: fold {f} leaves {len(y)} training answers of one class (use fewer folds)")
        model = copy.deepcopy(base)
        for h in model.fit(
            pairs,
            y,
            epochs=qp.crossfit_epochs,
            lr=qp.crossfit_lr,
            batch_size=qp.batch_size,
            seed=p.seed + f,
            **knobs,
        ):
            live.log_metric(f"fold{f}/train/loss", h["train_loss"], plot=False)
        fold_stats.append(
            {
                "fold": f,
                "n_mediqa_learned": int(len(a_train)),
                "n_judged_learned": int(len(j_train)),
                "n_scored": int((a_fold == f).sum()),
                "seconds": round(time.perf_counter() - ts, 1),
            }
        )
        log.info(
            "qa_bienc fold %d: learned %d MEDIQA + %d judged answers (%.0fs)",
            f,
            len(a_train),
            len(j_train),
            time.perf_counter() - ts,
        )
        return model

    def score_fold(model: SentenceEncoder, rows: np.ndarray) -> np.ndarray:
        return cosines(model, [a_pairs[i] for i in rows], qp.batch_size_encode)

    score = crossfit(n_folds, a_fold, [a_fold, j_fold], fit_fold, score_fold) if qp.crossfit_epochs else step_one
    return {
        "zero_shot": zero_shot,
        "step_one": step_one,
        "score": score,
        "n_triplets": len(triplets),
        "folds": fold_stats,
        "seconds": seconds,
    }


def report(answers: pd.DataFrame, fit: dict, qp) -> dict:
    """metrics/qa_bienc.json (without seconds): the AUC of each step's cosine on each labelled source beside the
    zero-shot bi-encoder's, and the fit's triplets, folds, precision and threads."""
    # stage bienc's cosine (the default model) is beside these in RESULTS, from metrics/bienc.json: not read here, so a
    # bienc option does not re-run this stage
    columns = {
        f"zero-shot {qp.base_model}": fit["zero_shot"],
        "step one (MedQuAD)": fit["step_one"],
        "cross-fitted (qa_bienc_cos)": fit["score"],
    }
    return {
        "auc": auc_by_source(answers, columns),
        "n_triplets": fit["n_triplets"],
        "fold_by": qp.fold_by,
        "folds": fit["folds"],
        "train_precision": qp.train_precision,
        "threads": qp.threads,
    }
