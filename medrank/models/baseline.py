"""Feature-engineered baseline (paper §4.4): logistic-regression filter + pairwise rank SVM.

`fit_baseline` trains both on an answer table (medrank.features.answer_table); the decision threshold is
chosen on question-grouped out-of-fold probabilities of the training rows (not fixed at 0.5), and an
optional EM re-estimation of the positive rate on the unlabelled target rows (Saerens et al. 2002)
adjusts the probabilities for label shift. `cross_validate` runs the whole recipe in question-grouped folds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import scipy.sparse as sp
from sklearn.linear_model import LogisticRegression
from sklearn.svm import LinearSVC

from medrank.errors import MedrankError
from medrank.features import FeatureBuilder
from medrank.metrics import gold_from_answers, score_task3

log = logging.getLogger(__name__)

METRICS = ("accuracy", "precision", "mrr", "spearman", "spearman_true")
THRESHOLD_GRID = np.round(np.arange(0.05, 0.951, 0.01), 2)

# data/processed/baseline/predictions.parquet: per-answer predictions for ensembling / error analysis
PREDICTIONS = pa.schema(
    [
        ("part", pa.string()),  # oof (CV over train+val) | val (train-only model) | test (train+val model)
        ("split", pa.string()),
        ("qid", pa.string()),
        ("aid", pa.string()),
        ("fold", pa.int16()),  # CV fold (oof), -1 otherwise
        ("prob", pa.float64()),  # filter probability (after the prior shift, if any)
        ("rank_score", pa.float64()),  # rank-SVM score (or prob with the LR ranker)
        ("threshold", pa.float64()),
        ("label", pa.int8()),  # kept (1) or filtered out (0)
        ("score", pa.float64()),  # submission order key within the question (higher = earlier)
    ]
)


@dataclass(frozen=True)
class BaselineConfig:
    """Knobs of one baseline run (the stage fills them from params.yaml `baseline`)."""

    groups: tuple[str, ...]
    n_candidates: int = 3
    lr_c: float = 1.0
    svm_c: float = 0.001
    ranker: Literal["svm", "lr"] = "svm"  # order kept answers by rank-SVM score or by filter probability
    rank_target: Literal["reference_rank", "reference_score"] = "reference_rank"
    threshold: float | None = None  # None = chosen by inner question-grouped CV on the training rows
    prior_shift: Literal["none", "em"] = "none"
    min_keep: int = 0  # keep at least this many answers per question (highest probability)
    inner_folds: int = 5
    seed: int = 13


# ---------------------------------------------------------------- pieces


def grouped_folds(gid: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Fold index per row; all rows of a question share a fold; questions shuffled with `seed`."""
    questions = pd.unique(pd.Series(np.asarray(gid)))
    if k < 2 or k > len(questions):
        raise MedrankError(f"{k} folds for {len(questions)} questions")
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(questions))
    fold_of = {q: int(i % k) for i, q in zip(range(len(questions)), questions[perm])}
    return np.array([fold_of[q] for q in gid], dtype=np.int64)


def fit_filter(X: sp.spmatrix, y: np.ndarray, c: float, seed: int) -> LogisticRegression:
    """L2 logistic regression (liblinear: deterministic, fast on a few thousand sparse rows)."""
    y = np.asarray(y, dtype=int)
    if len(np.unique(y)) < 2:
        raise MedrankError("filter training rows hold a single class")
    return LogisticRegression(C=c, solver="liblinear", max_iter=1000, random_state=seed).fit(X, y)


def pairwise_differences(
    X: sp.spmatrix, relevance: np.ndarray, gid: np.ndarray, seed: int
) -> tuple[sp.csr_matrix, np.ndarray]:
    """Rows x_i - x_j for answer pairs of one question with different relevance; target +1 if i is better.

    Half of the pairs are flipped (x_j - x_i, -1) at random so both classes are present and balanced.
    """
    X = sp.csr_matrix(X)
    rel = np.asarray(relevance, dtype=float)
    gid = np.asarray(gid)
    left: list[int] = []
    right: list[int] = []
    for rows in pd.Series(np.arange(len(gid))).groupby(gid, sort=False).indices.values():
        rows = np.sort(rows)
        for a in range(len(rows)):
            for b in range(a + 1, len(rows)):
                i, j = rows[a], rows[b]
                if rel[i] == rel[j]:
                    continue
                better, worse = (i, j) if rel[i] > rel[j] else (j, i)
                left.append(better)
                right.append(worse)
    if not left:
        raise MedrankError("no answer pair with different relevance to train the rank SVM")
    left_a, right_a = np.array(left), np.array(right)
    flip = np.random.default_rng(seed).random(len(left_a)) < 0.5
    first = np.where(flip, right_a, left_a)
    second = np.where(flip, left_a, right_a)
    return X[first] - X[second], np.where(flip, -1, 1)


class RankSVM:
    """Pairwise ranking SVM (Joachims 2002 style): a linear SVM on within-question feature differences."""

    def __init__(self, c: float = 0.1, seed: int = 13) -> None:
        self.c = c
        self.seed = seed
        self.coef_: np.ndarray | None = None

    def fit(self, X: sp.spmatrix, relevance: np.ndarray, gid: np.ndarray) -> "RankSVM":
        Xd, yd = pairwise_differences(X, relevance, gid, self.seed)
        svm = LinearSVC(C=self.c, fit_intercept=False, max_iter=20000, random_state=self.seed, dual=True)
        svm.fit(Xd, yd)
        self.coef_ = svm.coef_.ravel()
        return self

    def decision_function(self, X: sp.spmatrix) -> np.ndarray:
        if self.coef_ is None:
            raise MedrankError("RankSVM used before fit")
        return np.asarray(X @ self.coef_).ravel()


def accuracy_at(y: np.ndarray, p: np.ndarray, t: float) -> float:
    return float(np.mean((np.asarray(p) >= t).astype(int) == np.asarray(y, dtype=int)))


def select_threshold(y: np.ndarray, p: np.ndarray, grid: np.ndarray = THRESHOLD_GRID) -> float:
    """Threshold with the best accuracy on (y, p); ties -> the middle of the best run of grid points."""
    acc = np.array([accuracy_at(y, p, t) for t in grid])
    best = np.flatnonzero(np.isclose(acc, acc.max()))
    # the middle of the longest stretch of consecutive best points is the most stable choice
    runs = np.split(best, np.flatnonzero(np.diff(best) != 1) + 1)
    run = max(runs, key=len)
    return float(grid[run[len(run) // 2]])


def em_prior_shift(p: np.ndarray, train_prior: float, max_iter: int = 200, tol: float = 1e-6) -> tuple[float, np.ndarray]:
    """Saerens et al. (2002) EM: positive rate of the unlabelled rows and their prior-adjusted probabilities."""
    p = np.clip(np.asarray(p, dtype=float), 1e-6, 1 - 1e-6)
    pi0 = float(np.clip(train_prior, 1e-6, 1 - 1e-6))
    pi = pi0
    adj = p
    for _ in range(max_iter):
        num = (pi / pi0) * p
        adj = num / (num + ((1 - pi) / (1 - pi0)) * (1 - p))
        new = float(adj.mean())
        if abs(new - pi) < tol:
            pi = new
            break
        pi = new
    num = (pi / pi0) * p
    adj = num / (num + ((1 - pi) / (1 - pi0)) * (1 - p))
    return pi, adj


def keep_labels(p: np.ndarray, t: float, gid: np.ndarray, min_keep: int = 0) -> np.ndarray:
    """1 where p >= t; with min_keep, also each question's top-min_keep answers by p."""
    labels = (np.asarray(p) >= t).astype(int)
    if min_keep > 0:
        rank = pd.Series(p).groupby(np.asarray(gid), sort=False).rank(ascending=False, method="first").to_numpy()
        labels[rank <= min_keep] = 1
    return labels


def submission_score(labels: np.ndarray, rank_score: np.ndarray, gid: np.ndarray) -> np.ndarray:
    """Order key: kept answers first (the official MRR counts every submitted row), each part by rank score.

    = label + (within-question rank of rank_score, in (0, 1)); higher = earlier.
    """
    s = pd.Series(np.asarray(rank_score, dtype=float))
    g = np.asarray(gid)
    r = s.groupby(g, sort=False).rank(ascending=True, method="first")
    n = s.groupby(g, sort=False).transform("size")
    return np.asarray(labels, dtype=float) + (r / (n + 1)).to_numpy()


# ---------------------------------------------------------------- the recipe


def _relevance(table: pd.DataFrame, target: str) -> np.ndarray:
    if table[target].isna().any():
        raise MedrankError(f"rank SVM training rows lack {target}")
    v = table[target].to_numpy(dtype=float)
    return -v if target == "reference_rank" else v


def _labels(table: pd.DataFrame) -> np.ndarray:
    if table["label"].isna().any():
        raise MedrankError("training rows without a label (test rows cannot be used for training)")
    return table["label"].to_numpy(dtype=int)


@dataclass
class FittedBaseline:
    """A trained filter + ranker with its feature builder, threshold and training positive rate."""

    config: BaselineConfig
    builder: FeatureBuilder
    filter: LogisticRegression
    ranker: RankSVM | None
    threshold: float
    train_prior: float
    info: dict = field(default_factory=dict)

    def predict(self, table: pd.DataFrame) -> pd.DataFrame:
        """gid, qid, aid, prob, label, rank_score, score (submission order key) for `table`'s rows."""
        X = self.builder.transform(table)
        prob = self.filter.predict_proba(X)[:, 1]
        target_prior = None
        if self.config.prior_shift == "em":
            target_prior, prob = em_prior_shift(prob, self.train_prior)
        gid = table["gid"].to_numpy()
        labels = keep_labels(prob, self.threshold, gid, self.config.min_keep)
        rank_score = self.ranker.decision_function(X) if self.ranker is not None else prob
        self.info["target_prior"] = target_prior
        return pd.DataFrame(
            {
                "gid": gid,
                "qid": table["qid"].to_numpy(),
                "aid": table["aid"].to_numpy(),
                "prob": prob,
                "label": labels,
                "rank_score": rank_score,
                "score": submission_score(labels, rank_score, gid),
            }
        )


def _fit_core(table: pd.DataFrame, cfg: BaselineConfig, tfidf) -> tuple[FeatureBuilder, LogisticRegression, RankSVM | None]:
    builder = FeatureBuilder(cfg.groups, n_candidates=cfg.n_candidates, tfidf=tfidf)
    X = builder.fit_transform(table)
    clf = fit_filter(X, _labels(table), cfg.lr_c, cfg.seed)
    ranker = None
    if cfg.ranker == "svm":
        ranker = RankSVM(cfg.svm_c, cfg.seed).fit(X, _relevance(table, cfg.rank_target), table["gid"].to_numpy())
    return builder, clf, ranker


def oof_probabilities(table: pd.DataFrame, cfg: BaselineConfig, tfidf, k: int, seed: int) -> np.ndarray:
    """Out-of-fold filter probabilities over question-grouped folds (builder refitted per fold)."""
    folds = grouped_folds(table["gid"].to_numpy(), k, seed)
    p = np.zeros(len(table))
    for f in range(k):
        tr, te = folds != f, folds == f
        builder = FeatureBuilder(cfg.groups, n_candidates=cfg.n_candidates, tfidf=tfidf)
        X = builder.fit_transform(table[tr])
        clf = fit_filter(X, _labels(table[tr]), cfg.lr_c, cfg.seed)
        p[te] = clf.predict_proba(builder.transform(table[te]))[:, 1]
    return p


def fit_baseline(table: pd.DataFrame, cfg: BaselineConfig, tfidf=None) -> FittedBaseline:
    """Train the filter and ranker on labelled rows; pick the threshold by inner grouped CV unless fixed."""
    y = _labels(table)
    threshold = cfg.threshold
    info: dict = {}
    if threshold is None:
        p = oof_probabilities(table, cfg, tfidf, cfg.inner_folds, cfg.seed + 1)
        threshold = select_threshold(y, p)
        info["oof_accuracy"] = accuracy_at(y, p, threshold)
    builder, clf, ranker = _fit_core(table, cfg, tfidf)
    return FittedBaseline(cfg, builder, clf, ranker, float(threshold), float(y.mean()), info)


# ---------------------------------------------------------------- evaluation


def gold_of(table: pd.DataFrame) -> pd.DataFrame:
    """Official-style gold (qid = split-unique question key) of labelled rows."""
    return gold_from_answers(table.assign(qid=table["gid"]))


def ranked_rows(pred: pd.DataFrame, key: str = "gid") -> pd.DataFrame:
    """Rows as a submission file lists them: question order kept, then descending score (stable)."""
    q_order = pd.Series(range(pred[key].nunique()), index=pd.unique(pred[key]))
    out = pred.assign(_q=pred[key].map(q_order).to_numpy(), _s=-pred["score"].to_numpy(), _i=np.arange(len(pred)))
    return out.sort_values(["_q", "_s", "_i"]).drop(columns=["_q", "_s", "_i"]).reset_index(drop=True)


def evaluate(pred: pd.DataFrame, table: pd.DataFrame) -> dict:
    """Official Task 3 metrics of predictions on labelled rows."""
    sub = ranked_rows(pred)[["gid", "aid", "label"]].rename(columns={"gid": "qid"})
    return score_task3(gold_of(table), sub)


def summarize(per_fold: list[dict]) -> dict:
    """Mean and sd (ddof=1) of each metric over folds."""
    out: dict = {}
    for m in METRICS:
        v = np.array([f[m] for f in per_fold], dtype=float)
        out[m] = {"mean": float(v.mean()), "sd": float(v.std(ddof=1)) if len(v) > 1 else 0.0}
    return out


def rounded_scores(m: dict) -> dict:
    """The official metrics (+ true Spearman) of one scoring, rounded for a diff-friendly metrics file."""
    return {k: round(float(m[k]), 4) for k in METRICS}


def rounded_summary(m: dict) -> dict:
    """`summarize` output rounded the same way."""
    return {k: {"mean": round(float(m[k]["mean"]), 4), "sd": round(float(m[k]["sd"]), 4)} for k in METRICS}


def with_variant(model: FittedBaseline, variant: dict) -> FittedBaseline:
    """The same fitted model with prediction-time overrides: prior_shift, min_keep, threshold, ranker='lr'."""
    over = {k: v for k, v in variant.items() if k in ("prior_shift", "min_keep")}
    out = replace(model, config=replace(model.config, **over), info=dict(model.info))
    if "threshold" in variant:
        out = replace(out, threshold=float(variant["threshold"]))
    if variant.get("ranker") == "lr":
        out = replace(out, ranker=None)
    return out


def holdout(train: pd.DataFrame, test: pd.DataFrame, cfg: BaselineConfig, tfidf, variants: dict[str, dict] | None = None) -> dict:
    """Train on `train`, score labelled `test`: official metrics per variant ('base' = cfg as is)."""
    model = fit_baseline(train, cfg, tfidf)
    out = {"base": evaluate(model.predict(test), test)}
    for name, v in (variants or {}).items():
        m = with_variant(model, v)
        out[name] = evaluate(m.predict(test), test)
        if m.info.get("target_prior") is not None:
            out[name]["target_prior"] = m.info["target_prior"]
    out["base"]["threshold"] = model.threshold
    return out


def cross_validate(
    table: pd.DataFrame,
    cfg: BaselineConfig,
    tfidf,
    k: int,
    seed: int,
    variants: dict[str, dict] | None = None,
    with_predictions: bool = False,
) -> dict | tuple[dict, pd.DataFrame]:
    """Question-grouped K-fold CV of the full recipe (threshold chosen inside each training part).

    Returns, per variant ('base' + `variants`, see `with_variant`), the mean and sd over folds of each
    official metric; variants share the fold's fit. With `with_predictions`, also the out-of-fold rows of
    the base model (FittedBaseline.predict columns + fold, threshold) in table order.
    """
    folds = grouped_folds(table["gid"].to_numpy(), k, seed)
    results: dict[str, list[dict]] = {"base": [], **{name: [] for name in variants or {}}}
    thresholds, oof = [], []
    for f in range(k):
        tr, te = table[folds != f], table[folds == f]
        model = fit_baseline(tr, cfg, tfidf)
        thresholds.append(model.threshold)
        pred = model.predict(te)
        results["base"].append(evaluate(pred, te))
        oof.append(pred.set_index(te.index).assign(fold=f, threshold=model.threshold))
        for name, v in (variants or {}).items():
            results[name].append(evaluate(with_variant(model, v).predict(te), te))
    out = {name: summarize(r) for name, r in results.items()}
    out["base"]["thresholds"] = thresholds
    if with_predictions:
        return out, pd.concat(oof).loc[table.index].reset_index(drop=True)
    return out


def source_transfer(table: pd.DataFrame, cfg: BaselineConfig, tfidf, variants: dict[str, dict]) -> dict:
    """Leave-one-training-set-out: train on the other labelled splits, score this one (real label shift)."""
    out = {}
    for split in sorted(table["split"].unique()):
        tr, te = table[table["split"] != split], table[table["split"] == split]
        r = holdout(tr, te, cfg, tfidf, variants)
        r["positive_rate"] = float(te["label"].astype(float).mean())
        r["train_positive_rate"] = float(tr["label"].astype(float).mean())
        out[split] = r
    return out
