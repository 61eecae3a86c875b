"""Feature-engineered baseline (paper §4.4): logistic-regression filter + pairwise rank SVM.

`fit_baseline` trains both on an answer table (medrank.features.answer_table); the decision threshold is
chosen on question-grouped out-of-fold probabilities of the training rows (not fixed at 0.5), and an
optional EM re-estimation of the positive rate on the unlabelled target rows (Saerens et al. 2002)
adjusts the probabilities for label shift. `cross_validate` runs the whole recipe in question-grouped folds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import scipy.sparse as sp
from sklearn.linear_model import LogisticRegression
from sklearn.svm import LinearSVC

from medrank.decision import accuracy_at, em_prior_shift, grouped_folds, keep_labels, select_threshold, submission_score
from medrank.errors import MedrankError
from medrank.evaluation import evaluate, summarize
from medrank.features import FeatureBuilder, builder_from_json, builder_to_json
from medrank.params import BaselineParams

log = logging.getLogger(__name__)

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
    """One baseline run: the params.yaml `baseline` section as is, plus what a run fixes beside it."""

    params: BaselineParams
    groups: tuple[str, ...]  # feature groups (params.features, or an ablation row)
    n_candidates: int = 3
    seed: int = 13
    ranker: Literal["svm", "lr"] = "svm"  # order kept answers by rank-SVM score or by filter probability

    @property
    def inner_folds(self) -> int:
        return self.params.cv_folds


# ---------------------------------------------------------------- pieces


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


def _scored(table: pd.DataFrame) -> pd.DataFrame:
    """The rows a protocol scores: the MEDIQA answers."""
    return table[~_judged(table)]


def _questions(table: pd.DataFrame) -> np.ndarray:
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
        if self.config.params.prior_shift == "em":
            target_prior, prob = em_prior_shift(prob, self.train_prior)
        gid = table["gid"].to_numpy()
        labels = keep_labels(prob, self.threshold, gid, self.config.params.min_keep)
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

    # ------------------------------------------------------------ persistence (plain JSON: no pickles)
    def save(self, path: str | Path) -> None:
        """One JSON file: the run's params, feature builder state, LR and rank-SVM weights, threshold, prior."""
        from medrank.io import write_json

        cfg = self.config
        write_json(
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
                "filter": {
                    "coef": self.filter.coef_.tolist(),
                    "intercept": self.filter.intercept_.tolist(),
                    "classes": self.filter.classes_.tolist(),
                },
                "rank_svm": None if self.ranker is None else {"c": self.ranker.c, "coef": self.ranker.coef_.tolist()},
                "threshold": self.threshold,
                "train_prior": self.train_prior,
                "info": self.info,
            },
        )

    @classmethod
    def load(cls, path: str | Path) -> "FittedBaseline":
        """The model `save` wrote (predictions equal the saved model's bit for bit)."""
        import json

        path = Path(path)
        if not path.is_file():
            raise MedrankError(f"{path}: no trained baseline model (run the baseline stage)")
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
            c = d["config"]
            cfg = BaselineConfig(
                BaselineParams.model_validate(c["params"]),
                tuple(c["groups"]),
                int(c["n_candidates"]),
                int(c["seed"]),
                c["ranker"],
            )
            lr = LogisticRegression(C=cfg.params.lr_c, solver="liblinear", max_iter=1000, random_state=cfg.seed)
            lr.coef_ = np.asarray(d["filter"]["coef"], dtype=np.float64)
            lr.intercept_ = np.asarray(d["filter"]["intercept"], dtype=np.float64)
            lr.classes_ = np.asarray(d["filter"]["classes"])
            lr.n_features_in_ = lr.coef_.shape[1]
            ranker = None
            if d["rank_svm"] is not None:
                ranker = RankSVM(float(d["rank_svm"]["c"]), cfg.seed)
                ranker.coef_ = np.asarray(d["rank_svm"]["coef"], dtype=np.float64)
            return cls(
                cfg,
                builder_from_json(d["builder"]),
                lr,
                ranker,
                float(d["threshold"]),
                float(d["train_prior"]),
                dict(d.get("info", {})),
            )
        except (ValueError, KeyError, TypeError) as e:
            raise MedrankError(
                f"{path}: not a baseline model written by this version ({type(e).__name__}: {e})"
            ) from None


def _fit_core(
    table: pd.DataFrame, cfg: BaselineConfig, tfidf
) -> tuple[FeatureBuilder, LogisticRegression, RankSVM | None]:
    builder = FeatureBuilder(cfg.groups, n_candidates=cfg.n_candidates, tfidf=tfidf)
    X = builder.fit_transform(table)
    rows = _filter_rows(table, cfg)
    clf = fit_filter(X[rows], _labels(table)[rows], cfg.params.lr_c, cfg.seed)
    ranker = None
    if cfg.ranker == "svm":
        ranker = RankSVM(cfg.params.svm_c, cfg.seed).fit(
            X, _relevance(table, cfg.params.rank_target), table["gid"].to_numpy()
        )
    return builder, clf, ranker


def oof_probabilities(table: pd.DataFrame, cfg: BaselineConfig, tfidf, k: int, seed: int) -> np.ndarray:
    """Out-of-fold filter probabilities over question-grouped folds (builder refitted per fold); a fold whose training
    rows hold one class (a handful of questions: nested LOSO's inner folds on a tiny profile) gets that class's rate."""
    folds = grouped_folds(_questions(table), k, seed)
    p = np.zeros(len(table))
    for f in range(k):
        tr, te = folds != f, folds == f
        y_tr = _labels(table[tr])[_filter_rows(table[tr], cfg)]
        if len(np.unique(y_tr)) < 2:
            p[te] = float(y_tr.mean()) if len(y_tr) else 0.0
            continue
        builder = FeatureBuilder(cfg.groups, n_candidates=cfg.n_candidates, tfidf=tfidf)
        X = builder.fit_transform(table[tr])
        rows = _filter_rows(table[tr], cfg)
        clf = fit_filter(X[rows], y_tr, cfg.params.lr_c, cfg.seed)
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
    builder, clf, ranker = _fit_core(table, cfg, tfidf)
    return FittedBaseline(cfg, builder, clf, ranker, float(threshold), float(y[scored].mean()), info)


# ---------------------------------------------------------------- evaluation


def with_variant(model: FittedBaseline, variant: dict) -> FittedBaseline:
    """The same fitted model with prediction-time overrides: prior_shift, min_keep, threshold, ranker='lr'."""
    over = {k: v for k, v in variant.items() if k in ("prior_shift", "min_keep")}
    out = replace(
        model, config=replace(model.config, params=model.config.params.model_copy(update=over)), info=dict(model.info)
    )
    if "threshold" in variant:
        out = replace(out, threshold=float(variant["threshold"]))
    if variant.get("ranker") == "lr":
        out = replace(out, ranker=None)
    return out


def holdout(
    train: pd.DataFrame,
    test: pd.DataFrame,
    cfg: BaselineConfig,
    tfidf,
    variants: dict[str, dict] | None = None,
    with_predictions: bool = False,
) -> dict | tuple[dict, pd.DataFrame]:
    """Train on `train`, score labelled `test`: official metrics per variant ('base' = cfg as is, with its threshold);
    with `with_predictions`, also the base model's rows (FittedBaseline.predict columns + threshold) in `test`'s index."""
    model = fit_baseline(train, cfg, tfidf)
    pred = model.predict(test)
    out = {"base": evaluate(pred, test)}
    for name, v in (variants or {}).items():
        m = with_variant(model, v)
        out[name] = evaluate(m.predict(test), test)
        if m.info.get("target_prior") is not None:
            out[name]["target_prior"] = m.info["target_prior"]
    out["base"]["threshold"] = model.threshold
    if with_predictions:
        return out, pred.set_index(test.index).assign(threshold=model.threshold)
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
    folds = grouped_folds(_questions(table), k, seed)
    results: dict[str, list[dict]] = {"base": [], **{name: [] for name in variants or {}}}
    thresholds, oof = [], []
    for f in range(k):
        tr, te = table[folds != f], _scored(table[folds == f])
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
        return out, pd.concat(oof).loc[_scored(table).index].reset_index(drop=True)
    return out


def leave_one_source_out(
    table: pd.DataFrame, cfg: BaselineConfig, tfidf, sources: Sequence[str], variants: dict[str, dict] | None = None
) -> tuple[dict, pd.DataFrame]:
    """Train on the other labelled sources, score the held-out one (real question and label shift), per source.

    -> ({source: {variant: official metrics (base: + threshold), "positive_rate", "train_positive_rate"}}, the base
    model's held-out rows (FittedBaseline.predict columns + fold = the source's index, threshold) in table order).
    """
    out, rows = {}, []
    for f, split in enumerate(sources):
        tr, te = table[table["split"] != split], _scored(table[table["split"] == split])
        if te.empty:
            continue
        r, pred = holdout(tr, te, cfg, tfidf, variants, with_predictions=True)
        r["positive_rate"] = float(te["label"].astype(float).mean())
        r["train_positive_rate"] = float(_scored(tr)["label"].astype(float).mean())
        out[split] = r
        rows.append(pred.assign(fold=f))
    held_out = pd.concat(rows)
    return out, held_out.loc[table.index[table.index.isin(held_out.index)]].reset_index(drop=True)


def protocols(
    table: pd.DataFrame, cfg: BaselineConfig, tfidf, sources: Sequence[str], variants: dict[str, dict] | None = None
) -> dict:
    """The recipe under both protocols: question-grouped CV (mean ± sd) and LOSO (per source, mean, worst), per
    variant ('base' + `variants`), with both protocols' held-out rows ("oof", "loso")."""
    from medrank.evaluation import loso_summary

    cv, oof = cross_validate(table, cfg, tfidf, cfg.params.cv_folds, cfg.seed, variants, with_predictions=True)
    per_source, loso_rows = leave_one_source_out(table, cfg, tfidf, sources, variants)
    loso = {name: loso_summary({s: r[name] for s, r in per_source.items()}) for name in ["base", *(variants or {})]}
    return {"cv": cv, "loso": loso, "per_source": per_source, "oof": oof, "loso_rows": loso_rows}


def held_out_rows(
    table: pd.DataFrame,
    cfg: BaselineConfig,
    tfidf,
    inner: Sequence[str],
    inner_sources: Sequence[str],
    outer: Sequence[str],
) -> pd.DataFrame:
    """Rows for a nested selection (medrank.nested): part oof / loso (`protocols` over the `inner` questions and
    `inner_sources` only) and test (the `outer` questions, by a model trained on every inner question); columns
    part, gid, aid, fold, prob, rank_score. No fit sees an outer question."""
    inner_table = table[table["gid"].isin(set(inner))].reset_index(drop=True)
    proto = protocols(inner_table, cfg, tfidf, inner_sources)
    target = _scored(table[table["gid"].isin(set(outer))])
    test = fit_baseline(inner_table, cfg, tfidf).predict(target).assign(fold=-1)
    cols = ["part", "gid", "aid", "fold", "prob", "rank_score"]
    return pd.concat(
        [
            proto["oof"].assign(part="oof")[cols],
            proto["loso_rows"].assign(part="loso")[cols],
            test.assign(part="test")[cols],
        ],
        ignore_index=True,
    )


def spread_over_seeds(table: pd.DataFrame, cfg: BaselineConfig, tfidf, sources: Sequence[str], n: int) -> dict:
    """`evaluation.seed_spread` of the recipe over `n` seeds from cfg.seed (folds, inner-CV folds, rank-SVM pair flips)."""
    from medrank.evaluation import seed_spread

    runs = [protocols(table, replace(cfg, seed=cfg.seed + i), tfidf, sources) for i in range(n)]
    return seed_spread([(r["cv"]["base"], r["loso"]["base"]) for r in runs])


# ---------------------------------------------------------------- the baseline stage's tables

LR_RANK = {"lr_rank": {"ranker": "lr"}}
# prediction-time variants of the configured model reported beside it (label-shift EM, fixed 0.5, keep-one)
VARIANTS = {
    "prior_shift_none": {"prior_shift": "none"},
    "prior_shift_em": {"prior_shift": "em"},
    "threshold_0.5": {"threshold": 0.5},
    "min_keep_1": {"min_keep": 1},
}


def ablation_tables(
    labelled: pd.DataFrame,
    train: pd.DataFrame,
    val: pd.DataFrame,
    configs: dict[str, BaselineConfig],
    tfidf,
    sources: Sequence[str],
) -> tuple[dict, dict]:
    """Paper Table 1 (+ extras) and Table 4: each row's CV and LOSO on train+val and train -> val, by filter and by
    ranker, and the written rule's selection score (mean of CV and LOSO mean accuracy)."""
    from medrank.evaluation import rounded_scores, rounded_summary, selection_score

    table1, table4 = {}, {}
    for name, cfg in configs.items():
        r = protocols(labelled, cfg, tfidf, sources, LR_RANK)
        cv, loso = r["cv"], r["loso"]
        ho = holdout(train, val, cfg, tfidf, LR_RANK)
        table1[name] = {
            "groups": list(cfg.groups),
            "cv": rounded_summary(cv["base"]),
            "loso": loso["base"],
            "selection_score": round(selection_score(cv["base"], loso["base"], "accuracy"), 4),
            "val": rounded_scores(ho["base"]),
            "val_threshold": ho["base"]["threshold"],
        }
        table4[name] = {
            ranker: {
                "cv_spearman": rounded_summary(cv[key])["spearman"],
                "cv_spearman_true": rounded_summary(cv[key])["spearman_true"],
                "cv_mrr": rounded_summary(cv[key])["mrr"],
                "loso_spearman": loso[key]["spearman"],
                "loso_mrr": loso[key]["mrr"],
                "val_spearman": rounded_scores(ho[key])["spearman"],
                "val_spearman_true": rounded_scores(ho[key])["spearman_true"],
                "val_mrr": rounded_scores(ho[key])["mrr"],
            }
            for ranker, key in (("lr_filter_score", "lr_rank"), ("rank_svm", "base"))
        }
        log.info(
            "%-40s cv acc %.3f±%.3f | loso acc %.3f (worst %.3f %s) | val acc %.3f",
            name,
            cv["base"]["accuracy"]["mean"],
            cv["base"]["accuracy"]["sd"],
            loso["base"]["accuracy"]["mean"],
            loso["base"]["accuracy"]["worst"],
            loso["base"]["accuracy"]["worst_source"],
            ho["base"]["accuracy"],
        )
    return table1, table4


def transfer_report(transfer: dict) -> dict:
    """`leave_one_source_out` per-source output (prior shift none vs em) rounded for metrics/baseline.json."""
    from medrank.evaluation import rounded_scores

    return {
        split: {
            "positive_rate": round(r["positive_rate"], 4),
            "train_positive_rate": round(r["train_positive_rate"], 4),
            "em_estimated_rate": round(r["prior_shift_em"]["target_prior"], 4),
            "none": rounded_scores(r["prior_shift_none"]),
            "em": rounded_scores(r["prior_shift_em"]),
        }
        for split, r in transfer.items()
    }
