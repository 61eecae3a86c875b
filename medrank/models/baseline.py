"""Feature-engineered baseline (paper §4.4): logistic-regression filter + pairwise rank SVM (or, baseline.filter_model
gbdt / baseline.ranker lambdamart, a LightGBM binary classifier / lambdarank model on the same features).

`fit_baseline` trains both on an answer table (medrank.task3.features.answer_table); the decision threshold is
chosen on question-grouped out-of-fold probabilities of the training rows (not fixed at 0.5), and an
optional EM re-estimation of the positive rate on the unlabelled target rows (Saerens et al. 2002)
adjusts the probabilities for label shift. Its evaluation protocols (CV, LOSO, ablations): medrank.models.baseline_protocols.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import scipy.sparse as sp
from sklearn.linear_model import LogisticRegression
from sklearn.svm import LinearSVC

from medrank.selection.decision import accuracy_at, em_prior_shift, keep_labels, select_threshold, submission_score
from medrank.selection.experiment import grouped_folds
from medrank.core.errors import MedrankError
from medrank.task3.features import FeatureBuilder, builder_from_json, builder_to_json
from medrank.params import BaselineParams
from medrank.params.rankers import GbdtParams


# data/processed/baseline/predictions.parquet: per-answer predictions for ensembling / error analysis
PREDICTIONS = pa.schema(
    [
        ("part", pa.string()),  # oof (CV over train+val) | val (train-only model) | test (train+val model)
        ("split", pa.string()),
        ("qid", pa.string()),
        ("aid", pa.string()),
        ("fold", pa.int16()),  # CV fold (oof), -1 otherwise
        ("prob", pa.float64()),  # filter probability (after the prior shift, if any)
        ("rank_score", pa.float64()),  # rank-SVM (or LambdaMART) score (or prob with the LR ranker)
        ("threshold", pa.float64()),
        ("label", pa.int8()),  # kept (1) or filtered out (0)
        ("score", pa.float64()),  # submission order key within the question (higher = earlier)
    ]
)


RESTORE_BASELINE = "re-run `dvc repro baseline`, or `dvc checkout baseline`"


@dataclass(frozen=True)
class BaselineConfig:
    """One baseline run: the params.yaml `baseline` section as is, plus what a run fixes beside it."""

    params: BaselineParams
    groups: tuple[str, ...]  # feature groups (params.features, or an ablation row)
    n_candidates: int = 3
    seed: int = 13
    # order kept answers by the rank model's score (params.ranker: the rank SVM or LambdaMART) or by filter probability
    ranker: Literal["svm", "lr"] = "svm"

    @property
    def inner_folds(self) -> int:
        return self.params.cv_folds

    @property
    def ranker_groups(self) -> tuple[str, ...]:
        """The groups the rank model reads: `groups` less `params.filter_only` (all of them where that leaves none)."""
        return tuple(g for g in self.groups if g not in self.params.filter_only) or self.groups


# ---------------------------------------------------------------- pieces


def fit_filter(X: sp.spmatrix, y: np.ndarray, c: float, seed: int) -> LogisticRegression:
    """L2 logistic regression (liblinear: deterministic, fast on a few thousand sparse rows)."""
    y = np.asarray(y, dtype=int)
    if len(np.unique(y)) < 2:
        raise MedrankError("filter training rows hold a single class")
    return LogisticRegression(C=c, solver="liblinear", max_iter=1000, random_state=seed).fit(X, y)


GRADE_CUTS = (2.0, 3.0, 4.0)  # MEDIQA's ReferenceScore 1-4; correct (the filter's label) = grade >= 3


def fit_graded_filter(X: sp.spmatrix, grades: np.ndarray, c: float, seed: int) -> LogisticRegression:
    """Ordinal (all-threshold) logistic regression on the 1-4 grades: one weight vector shared by the cuts grade >= 2,
    >= 3, >= 4, a bias per cut, fitted on the rows stacked once per cut (C divided by the cuts, so the penalty weighs
    as much per answer as the binary filter's). Returned as the binary filter P(grade >= 3), the cut that is the label,
    so prediction, threshold and saving are the binary filter's."""
    grades = np.asarray(grades, dtype=float)
    if np.isnan(grades).any():
        raise MedrankError("filter_target grade: training rows without a reference_score")
    n, d = X.shape
    k = len(GRADE_CUTS)
    cut_columns = sp.kron(sp.identity(k, format="csr"), sp.csr_matrix(np.ones((n, 1))), format="csr")
    stacked = sp.hstack([sp.vstack([sp.csr_matrix(X)] * k), cut_columns], format="csr")
    target = np.concatenate([(grades >= cut).astype(int) for cut in GRADE_CUTS])
    if len(np.unique(target[n : 2 * n])) < 2:
        raise MedrankError("filter training rows hold a single class")
    ordinal = LogisticRegression(C=c / k, solver="liblinear", fit_intercept=False, max_iter=1000, random_state=seed)
    ordinal.fit(stacked, target)
    out = LogisticRegression(C=c, solver="liblinear", max_iter=1000, random_state=seed)
    out.coef_ = ordinal.coef_[:, :d].copy()
    out.intercept_ = ordinal.coef_[0, d + GRADE_CUTS.index(3.0) : d + GRADE_CUTS.index(3.0) + 1].copy()
    out.classes_ = np.array([0, 1])
    out.n_features_in_ = d
    return out


def pairwise_differences(
    X: sp.spmatrix, relevance: np.ndarray, gid: np.ndarray, seed: int, labels: np.ndarray | None = None
) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray]:
    """Rows x_i - x_j for answer pairs of one question with different relevance; target +1 if i is better; and which
    pairs cross the label (one answer correct, the other not; all False without `labels`).

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
    crossing = np.zeros(len(left_a), dtype=bool) if labels is None else labels[left_a] != labels[right_a]
    return X[first] - X[second], np.where(flip, -1, 1), crossing


class RankSVM:
    """Pairwise ranking SVM (Joachims 2002 style): a linear SVM on within-question feature differences."""

    def __init__(self, c: float = 0.1, seed: int = 13) -> None:
        self.c = c
        self.seed = seed
        self.coef_: np.ndarray | None = None

    def fit(
        self,
        X: sp.spmatrix,
        relevance: np.ndarray,
        gid: np.ndarray,
        labels: np.ndarray | None = None,
        label_pair_weight: float = 1.0,
    ) -> "RankSVM":
        """`label_pair_weight`: the weight of a pair that crosses the label (`labels`), every other pair's being 1."""
        Xd, yd, crossing = pairwise_differences(X, relevance, gid, self.seed, labels)
        weight = None if label_pair_weight == 1.0 else np.where(crossing, label_pair_weight, 1.0)
        svm = LinearSVC(C=self.c, fit_intercept=False, max_iter=20000, random_state=self.seed, dual=True)
        svm.fit(Xd, yd, sample_weight=weight)
        self.coef_ = svm.coef_.ravel()
        return self

    def decision_function(self, X: sp.spmatrix) -> np.ndarray:
        if self.coef_ is None:
            raise MedrankError("RankSVM used before fit")
        return np.asarray(X @ self.coef_).ravel()


# ---------------------------------------------------------------- LightGBM (baseline.filter_model gbdt, ranker lambdamart)


def _lgb_params(gbdt: GbdtParams, seed: int, objective: str) -> dict:
    """LightGBM parameters pinned for bit-identical runs on a machine: seeded, deterministic, row-wise, one thread."""
    return {
        "objective": objective,
        "learning_rate": gbdt.learning_rate,
        "num_leaves": gbdt.num_leaves,
        "min_data_in_leaf": gbdt.min_child_samples,
        "bagging_fraction": gbdt.subsample,
        "bagging_freq": 0 if gbdt.subsample == 1.0 else 1,
        "feature_fraction": gbdt.feature_fraction,
        "seed": seed,
        "deterministic": True,
        "force_row_wise": True,
        "num_threads": 1,
        "verbose": -1,
    }


def _booster(text: str):
    """A LightGBM booster from its text (`model_to_string`): a fitted model is read back from its text at once, so
    the one that predicts after fitting is the one `FittedBaseline.load` rebuilds, bit for bit."""
    import lightgbm as lgb

    return lgb.Booster(model_str=text)


def _train_booster(params: dict, X: sp.spmatrix, y: np.ndarray, n_rounds: int, group: np.ndarray | None = None) -> str:
    import lightgbm as lgb

    data = lgb.Dataset(sp.csr_matrix(X, dtype=np.float64), label=y, group=group)
    return lgb.train(params, data, num_boost_round=n_rounds).model_to_string()


class GbdtFilter:
    """The filter as a LightGBM binary classifier; `predict_proba(X)[:, 1]` is P(correct), as the LR's."""

    def __init__(self, model_str: str) -> None:
        self.model_str = model_str
        self.booster = _booster(model_str)

    @classmethod
    def fit(cls, X: sp.spmatrix, y: np.ndarray, gbdt: GbdtParams, seed: int) -> "GbdtFilter":
        y = np.asarray(y, dtype=int)
        if len(np.unique(y)) < 2:
            raise MedrankError("filter training rows hold a single class")
        return cls(_train_booster(_lgb_params(gbdt, seed, "binary"), X, y, gbdt.n_estimators))

    def predict_proba(self, X: sp.spmatrix) -> np.ndarray:
        p = np.asarray(self.booster.predict(sp.csr_matrix(X, dtype=np.float64), num_threads=1), dtype=np.float64)
        return np.column_stack([1.0 - p, p])


class LambdaMART:
    """A LightGBM lambdarank model over the answers of each question (integer relevance: `lambdarank_relevance`)."""

    def __init__(self, model_str: str) -> None:
        self.model_str = model_str
        self.booster = _booster(model_str)

    @classmethod
    def fit(cls, X: sp.spmatrix, relevance: np.ndarray, gid: np.ndarray, gbdt: GbdtParams, seed: int) -> "LambdaMART":
        """Query groups: the questions (`gid`), in the order each first appears; where a question's rows are not
        contiguous, the rows are handed to LightGBM sorted by it (stably; lambdarank reads pairs within a group only)."""
        codes = pd.factorize(np.asarray(gid))[0]  # a question's index in order of first appearance
        order = np.argsort(codes, kind="stable")  # the identity where every question's rows are contiguous
        rel = np.asarray(relevance, dtype=np.int32)[order]
        sizes = np.bincount(codes)
        spread = pd.Series(rel).groupby(codes[order]).nunique()
        if not (spread > 1).any():
            raise MedrankError("no answer pair with different relevance to train the LambdaMART ranker")
        X = sp.csr_matrix(X)[order]
        return cls(_train_booster(_lgb_params(gbdt, seed, "lambdarank"), X, rel, gbdt.n_estimators, sizes))

    def decision_function(self, X: sp.spmatrix) -> np.ndarray:
        return np.asarray(self.booster.predict(sp.csr_matrix(X, dtype=np.float64), num_threads=1), dtype=np.float64)


MAX_LAMBDARANK_GAIN = 30  # LightGBM's default label_gain (2^i - 1) has 31 entries: relevance 0..30


def lambdarank_relevance(table: pd.DataFrame, target: str) -> np.ndarray:
    """LambdaMART's integer relevance (0 = worst): grade - 1 (rank_target reference_score, and the judged rows, as
    `_relevance`); with reference_rank, per question max(reference_rank) - reference_rank, clipped to [0, 30]."""
    rel = _relevance(table, target)  # higher = better: -reference_rank, or the grade
    graded = _judged(table) | (target == "reference_score")
    worst = pd.Series(np.where(graded, np.nan, rel)).groupby(table["gid"].to_numpy(), sort=False).transform("min")
    gain = np.where(graded, rel - 1.0, rel - worst.to_numpy())
    return np.clip(np.rint(gain), 0, MAX_LAMBDARANK_GAIN).astype(np.int32)


# ---------------------------------------------------------------- the recipe


def _relevance(table: pd.DataFrame, target: str) -> np.ndarray:
    """Higher = better within an answer list. The judged LiveQA lists have grades only (no ReferenceRank): their
    pairs come from the grades (pairs never cross lists, so the two scales never meet)."""
    judged = _judged(table)
    if table.loc[~judged, target].isna().any():
        raise MedrankError(f"rank SVM training rows lack {target}")
    v = table[target].to_numpy(dtype=float)
    v = -v if target == "reference_rank" else v
    return np.where(judged, table["reference_score"].to_numpy(dtype=float), v)


def _judged(table: pd.DataFrame) -> np.ndarray:
    """Rows that only train (the judged LiveQA answers, medrank.data.judged): never scored, never pick a threshold."""
    return table["judged"].to_numpy(dtype=bool) if "judged" in table.columns else np.zeros(len(table), dtype=bool)


def _filter_rows(table: pd.DataFrame, cfg: BaselineConfig) -> np.ndarray:
    """Rows the filter trains on: all, or (judged_rows: ranker) the MEDIQA rows only."""
    return ~_judged(table) if cfg.params.judged_rows == "ranker" else np.ones(len(table), dtype=bool)


def _trained_filter(X: sp.spmatrix, table: pd.DataFrame, cfg: BaselineConfig) -> LogisticRegression | GbdtFilter:
    """The filter on `table`'s filter rows (`X` their features): on the label, or (filter_target: grade) the grades;
    filter_model gbdt: LightGBM on the label (BaselineParams refuses it with the grades)."""
    rows = _filter_rows(table, cfg)
    if cfg.params.filter_model == "gbdt":
        return GbdtFilter.fit(X[rows], _labels(table)[rows], cfg.params.gbdt, cfg.seed)
    if cfg.params.filter_target == "grade":
        return fit_graded_filter(
            X[rows], table["reference_score"].to_numpy(dtype=float)[rows], cfg.params.lr_c, cfg.seed
        )
    return fit_filter(X[rows], _labels(table)[rows], cfg.params.lr_c, cfg.seed)


def scored_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The rows a protocol scores: the MEDIQA answers."""
    return table[~_judged(table)]


def question_ids(table: pd.DataFrame) -> np.ndarray:
    """The fold key: a question (its judged answers' list goes with it)."""
    return table["qkey" if "qkey" in table.columns else "gid"].to_numpy()


def _labels(table: pd.DataFrame) -> np.ndarray:
    if table["label"].isna().any():
        raise MedrankError("training rows without a label (test rows cannot be used for training)")
    return table["label"].to_numpy(dtype=int)


@dataclass
class FittedBaseline:
    """A trained filter + ranker with its feature builder, threshold and training positive rate."""

    config: BaselineConfig
    builder: FeatureBuilder
    filter: LogisticRegression | GbdtFilter
    ranker: RankSVM | LambdaMART | None
    threshold: float
    train_prior: float
    info: dict = field(default_factory=dict)
    ranker_builder: FeatureBuilder | None = None  # the rank model's own, where it reads fewer groups (filter_only)

    def predict(self, table: pd.DataFrame) -> pd.DataFrame:
        """gid, qid, aid, prob, label, rank_score, score (submission order key) for `table`'s rows."""
        X = self.builder.transform(table)
        prob = self.filter.predict_proba(X)[:, 1]
        target_prior = None
        if self.config.params.prior_shift == "em":
            target_prior, prob = em_prior_shift(prob, self.train_prior)
        gid = table["gid"].to_numpy()
        labels = keep_labels(prob, self.threshold, gid, self.config.params.min_keep)
        rank_score = prob
        if self.ranker is not None:
            X_rank = X if self.ranker_builder is None else self.ranker_builder.transform(table)
            rank_score = self.ranker.decision_function(X_rank)
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

    # ------------------------------------------------------------ persistence (plain JSON: no pickles)
    def save(self, path: str | Path) -> None:
        """One JSON file: the run's params, feature builder state, LR and rank-SVM weights, threshold, prior; sealed
        (`record_sha256`): an edited coefficient or threshold is refused at load. A LightGBM filter is saved as
        {"gbdt": its text} under "filter", a LambdaMART ranker as its text under "lambdamart" (a key only then: the
        LR + rank SVM layout is unchanged)."""
        from medrank.core.io import write_sealed_json

        cfg = self.config
        lambdamart = isinstance(self.ranker, LambdaMART)
        if isinstance(self.filter, GbdtFilter):
            filter_state = {"gbdt": self.filter.model_str}
        else:
            filter_state = {
                "coef": self.filter.coef_.tolist(),
                "intercept": self.filter.intercept_.tolist(),
                "classes": self.filter.classes_.tolist(),
            }
        rank_svm = (
            None if self.ranker is None or lambdamart else {"c": self.ranker.c, "coef": self.ranker.coef_.tolist()}
        )
        write_sealed_json(
            path,
            {
                "config": {
                    "params": cfg.params.model_dump(mode="json"),
                    "groups": list(cfg.groups),
                    "n_candidates": cfg.n_candidates,
                    "seed": cfg.seed,
                    "ranker": cfg.ranker,
                },
                "builder": builder_to_json(self.builder),
                "ranker_builder": None if self.ranker_builder is None else builder_to_json(self.ranker_builder),
                "filter": filter_state,
                "rank_svm": rank_svm,
                **({"lambdamart": self.ranker.model_str} if lambdamart else {}),
                "threshold": self.threshold,
                "train_prior": self.train_prior,
                "info": self.info,
            },
        )

    @classmethod
    def load(cls, path: str | Path) -> "FittedBaseline":
        """The model `save` wrote (predictions equal the saved model's bit for bit), its seal verified."""
        from medrank.core.io import read_sealed_json

        path = Path(path)
        if not path.is_file():
            raise MedrankError(f"{path}: no trained baseline model (run the baseline stage)")
        d = read_sealed_json(path, RESTORE_BASELINE)
        try:
            c = d["config"]
            cfg = BaselineConfig(
                BaselineParams.model_validate(c["params"]),
                tuple(c["groups"]),
                int(c["n_candidates"]),
                int(c["seed"]),
                c["ranker"],
            )
            if "gbdt" in d["filter"]:
                clf = GbdtFilter(str(d["filter"]["gbdt"]))
            else:
                clf = LogisticRegression(C=cfg.params.lr_c, solver="liblinear", max_iter=1000, random_state=cfg.seed)
                clf.coef_ = np.asarray(d["filter"]["coef"], dtype=np.float64)
                clf.intercept_ = np.asarray(d["filter"]["intercept"], dtype=np.float64)
                clf.classes_ = np.asarray(d["filter"]["classes"])
                clf.n_features_in_ = clf.coef_.shape[1]
            ranker = None
            if d.get("lambdamart") is not None:
                ranker = LambdaMART(str(d["lambdamart"]))
            elif d["rank_svm"] is not None:
                ranker = RankSVM(float(d["rank_svm"]["c"]), cfg.seed)
                ranker.coef_ = np.asarray(d["rank_svm"]["coef"], dtype=np.float64)
            return cls(
                cfg,
                builder_from_json(d["builder"]),
                clf,
                ranker,
                float(d["threshold"]),
                float(d["train_prior"]),
                dict(d.get("info", {})),
                None if d["ranker_builder"] is None else builder_from_json(d["ranker_builder"]),
            )
        except (ValueError, KeyError, TypeError) as e:
            raise MedrankError(
                f"{path}: not a baseline model written by this version ({type(e).__name__}: {e})"
            ) from None


def _fit_core(
    table: pd.DataFrame, cfg: BaselineConfig, tfidf
) -> tuple[FeatureBuilder, LogisticRegression | GbdtFilter, RankSVM | LambdaMART | None, FeatureBuilder | None]:
    """(the filter's builder, the filter, the rank model, the rank model's own builder where it reads fewer groups)."""
    builder = FeatureBuilder(cfg.groups, n_candidates=cfg.n_candidates, tfidf=tfidf)
    X = builder.fit_transform(table)
    clf = _trained_filter(X, table, cfg)
    ranker, ranker_builder = None, None
    if cfg.ranker == "svm":
        X_rank = X
        if cfg.ranker_groups != cfg.groups:
            ranker_builder = FeatureBuilder(cfg.ranker_groups, n_candidates=cfg.n_candidates, tfidf=tfidf)
            X_rank = ranker_builder.fit_transform(table)
        if cfg.params.ranker == "lambdamart":  # label_pair_weight is the rank SVM's (pair weights) only
            ranker = LambdaMART.fit(
                X_rank,
                lambdarank_relevance(table, cfg.params.rank_target),
                table["gid"].to_numpy(),
                cfg.params.gbdt,
                cfg.seed,
            )
        else:
            ranker = RankSVM(cfg.params.svm_c, cfg.seed).fit(
                X_rank,
                _relevance(table, cfg.params.rank_target),
                table["gid"].to_numpy(),
                _labels(table),
                cfg.params.label_pair_weight,
            )
    return builder, clf, ranker, ranker_builder


def oof_probabilities(table: pd.DataFrame, cfg: BaselineConfig, tfidf, k: int, seed: int) -> np.ndarray:
    """Out-of-fold filter probabilities over question-grouped folds (builder refitted per fold); a fold whose training
    rows hold one class (a handful of questions: nested LOSO's inner folds on a tiny profile) gets that class's rate."""
    folds = grouped_folds(question_ids(table), k, seed)
    p = np.zeros(len(table))
    for f in range(k):
        tr, te = folds != f, folds == f
        y_tr = _labels(table[tr])[_filter_rows(table[tr], cfg)]
        if len(np.unique(y_tr)) < 2:
            p[te] = float(y_tr.mean()) if len(y_tr) else 0.0
            continue
        builder = FeatureBuilder(cfg.groups, n_candidates=cfg.n_candidates, tfidf=tfidf)
        clf = _trained_filter(builder.fit_transform(table[tr]), table[tr], cfg)
        p[te] = clf.predict_proba(builder.transform(table[te]))[:, 1]
    return p


def fit_baseline(table: pd.DataFrame, cfg: BaselineConfig, tfidf=None) -> FittedBaseline:
    """Train the filter and ranker on labelled rows; pick the threshold by inner grouped CV unless fixed."""
    y = _labels(table)
    threshold = cfg.params.threshold
    info: dict = {}
    scored = ~_judged(table)  # the threshold and the prior are the MEDIQA rows' (judged rows only train)
    if threshold is None:
        p = oof_probabilities(table, cfg, tfidf, cfg.inner_folds, cfg.seed + 1)
        threshold = select_threshold(y[scored], p[scored])
        info["oof_accuracy"] = accuracy_at(y[scored], p[scored], threshold)
    builder, clf, ranker, ranker_builder = _fit_core(table, cfg, tfidf)
    return FittedBaseline(cfg, builder, clf, ranker, float(threshold), float(y[scored].mean()), info, ranker_builder)
