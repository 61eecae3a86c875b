"""The baseline's evaluation protocols: holdout, question-grouped CV, leave-one-source-out, the seed spread, the
paper's ablation tables (Tables 1-2 and 4), each over `fit_baseline` (medrank.models.baseline) with its variants."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np
import pandas as pd

from medrank.selection.evaluation import evaluate
from medrank.selection.experiment import (
    CV,
    LOSO,
    Protocol,
    Refit,
    Scored,
    Task,
    experiment,
    questions_of,
    reseeded,
    seed_spread_of,
)
from medrank.models.baseline import (
    PREDICTIONS,
    BaselineConfig,
    FittedBaseline,
    fit_baseline,
    question_ids,
    scored_rows,
)

log = logging.getLogger(__name__)


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
    train: pd.DataFrame, test: pd.DataFrame, cfg: BaselineConfig, tfidf, variants: dict[str, dict] | None = None
) -> dict:
    """Train on `train`, score labelled `test`: official metrics per variant ('base' = cfg as is, with its threshold)."""
    model = fit_baseline(train, cfg, tfidf)
    out = {"base": evaluate(model.predict(test), test)}
    for name, v in (variants or {}).items():
        out[name] = evaluate(with_variant(model, v).predict(test), test)
    out["base"]["threshold"] = model.threshold
    return out


@dataclass
class BaselineSystem:
    """The baseline as a medrank.selection.experiment system: a task fits `fit_baseline` (seed: the protocol's) on its training
    questions' rows (judged rows go with their question) and predicts the held-out questions' MEDIQA rows, as
    configured ("base") and under each prediction-time variant (`with_variant`), which share the task's fit."""

    table: pd.DataFrame
    cfg: BaselineConfig
    tfidf: object
    variants: dict[str, dict] = field(default_factory=dict)

    def questions(self) -> pd.DataFrame:
        return questions_of(self.table, "qkey" if "qkey" in self.table.columns else "gid")

    def run(self, tasks: Sequence[Task]) -> list[dict]:
        from tqdm.auto import tqdm

        key, out = question_ids(self.table), []
        for t in tqdm(tasks, desc="baseline fits", unit="fit", leave=False):
            train, test = self.table[np.isin(key, t.train)], scored_rows(self.table[np.isin(key, t.test)])
            model = fit_baseline(train, replace(self.cfg, seed=t.seed), self.tfidf)
            preds = {"base": model, **{name: with_variant(model, v) for name, v in self.variants.items()}}
            out.append(
                {
                    "test": test,
                    "threshold": model.threshold,
                    "preds": {name: (m.predict(test), m.info.get("target_prior")) for name, m in preds.items()},
                    "train_positive_rate": float(scored_rows(train)["label"].astype(float).mean()),
                }
            )
        return out

    def score(self, protocol: Protocol, tasks: Sequence[Task], results: Sequence[dict]) -> Scored:
        """Per fold and variant the official scores (base: + the fold model's threshold; a label-shift variant: + its
        estimated prior); the base rows (FittedBaseline.predict columns + fold, threshold) in table order; per fold
        the held-out and training positive rates (info)."""
        per_fold: dict[str, dict[int, dict]] = {"base": {}, **{name: {} for name in self.variants}}
        rows, info = [], {"positive_rate": {}, "train_positive_rate": {}}
        for t, r in zip(tasks, results):
            test, labelled = r["test"], not r["test"]["label"].isna().any()
            for name, (pred, prior) in r["preds"].items():
                if labelled:
                    m = evaluate(pred, test)
                    per_fold[name][t.fold] = {**m, "threshold": r["threshold"]} if name == "base" else m
                    if name != "base" and prior is not None:
                        m["target_prior"] = prior
            rows.append(r["preds"]["base"][0].set_index(test.index).assign(fold=t.fold, threshold=r["threshold"]))
            if labelled:
                info["positive_rate"][t.fold] = float(test["label"].astype(float).mean())
            info["train_positive_rate"][t.fold] = r["train_positive_rate"]
        held = pd.concat(rows)
        held = held.loc[self.table.index[self.table.index.isin(held.index)]].reset_index(drop=True)
        extra = {"base": {"thresholds": [r["threshold"] for r in results]}} if isinstance(protocol, CV) else {}
        return Scored(per_fold, held, extra, info)


def protocols(
    table: pd.DataFrame, cfg: BaselineConfig, tfidf, sources: Sequence[str], variants: dict[str, dict] | None = None
) -> dict:
    """The recipe under both protocols (medrank.selection.experiment): question-grouped CV (mean ± sd; base: + the fold
    thresholds) and LOSO (per source, mean, worst), per variant ('base' + `variants`, see `with_variant`), the per-source
    scores (+ positive rates), and both protocols' held-out rows ("oof", "loso")."""
    system = BaselineSystem(table, cfg, tfidf, dict(variants or {}))
    r = experiment(
        {"baseline": system}, system.questions(), [CV(cfg.params.cv_folds, cfg.seed), LOSO(tuple(sources), cfg.seed)]
    )
    cv, loso = r["baseline"]["cv"], r["baseline"]["loso"]
    per_source = {
        sources[f]: {
            **{name: loso.per_fold[name][f] for name in loso.per_fold},
            "positive_rate": loso.info["positive_rate"][f],
            "train_positive_rate": loso.info["train_positive_rate"][f],
        }
        for f in sorted(loso.per_fold["base"])
    }
    return {"cv": cv.summary, "loso": loso.summary, "per_source": per_source, "oof": cv.rows, "loso_rows": loso.rows}


def held_out_rows(
    table: pd.DataFrame,
    cfg: BaselineConfig,
    tfidf,
    inner: Sequence[str],
    inner_sources: Sequence[str],
    outer: Sequence[str],
) -> pd.DataFrame:
    """Rows for a nested selection (medrank.selection.nested): part oof / loso (CV and LOSO over the `inner` questions and
    `inner_sources` only) and test (the `outer` questions, by a model trained on every inner question); columns
    part, gid, aid, fold, prob, rank_score. No fit sees an outer question."""
    r = _inner_experiment(table, cfg, tfidf, inner, outer, [LOSO(tuple(inner_sources), cfg.seed)])
    cols = ["part", "gid", "aid", "fold", "prob", "rank_score"]
    parts = {"oof": r["cv"].rows, "loso": r["loso"].rows, "test": r["test"].rows.assign(fold=-1)}
    return pd.concat([rows.assign(part=part)[cols] for part, rows in parts.items()], ignore_index=True)


STACKED_COLUMNS = {"rank_score": "stacked_rank_score", "prob": "stacked_prob"}  # group stacked (params.groups)


def stacked_scores(
    table: pd.DataFrame, cfg: BaselineConfig, tfidf, train: Sequence[str], test: Sequence[str]
) -> pd.DataFrame:
    """The baseline's scores as another model's input (group stacked: the MTL fed the baseline's score), with no row
    scored by a fit that saw its question: the `train` questions' rows out of fold (question-grouped CV over them
    only, cfg's folds and seed) and the `test` questions' by a model fitted on every `train` question. Fewer training
    questions than that CV needs (tiny profiles) get 0, no information.
    -> gid, aid, stacked_rank_score, stacked_prob (train rows first)."""
    k = cfg.params.cv_folds  # each baseline fit also picks its threshold by a k-fold CV of its own rows
    n_train = len(set(train) & set(table["gid"]))
    zero = lambda gids: table[table["gid"].isin(set(gids))][["gid", "aid"]].assign(prob=0.0, rank_score=0.0)
    if n_train >= 2 * k:
        r = _inner_experiment(table, cfg, tfidf, train, test, [])
        rows = pd.concat([r["cv"].rows, r["test"].rows], ignore_index=True)
    elif n_train >= k:  # too few to hold training questions out (tiny profiles): they get no information, 0
        r = _inner_experiment(table, cfg, tfidf, train, test, [], cv=False)
        rows = pd.concat([zero(train), r["test"].rows], ignore_index=True)
    else:  # too few for any baseline fit
        rows = pd.concat([zero(train), zero(test)], ignore_index=True)
    return rows[["gid", "aid", *STACKED_COLUMNS]].rename(columns=STACKED_COLUMNS)


def _inner_experiment(table, cfg: BaselineConfig, tfidf, inner, outer, more: list[Protocol], cv: bool = True) -> dict:
    """The baseline over the `inner` questions only: question-grouped CV (`cv` False: none),
    `more` protocols, and a refit on every inner question scoring the `outer` ones (key "test")."""
    system = BaselineSystem(table, cfg, tfidf)
    questions = system.questions()
    questions = questions[questions["gid"].isin(set(inner))]
    first = [CV(cfg.params.cv_folds, cfg.seed)] if cv else []
    proto = [*first, *more, Refit(tuple(questions["gid"]), tuple(outer), cfg.seed)]
    return experiment({"baseline": system}, questions, proto)["baseline"]


def spread_over_seeds(table: pd.DataFrame, cfg: BaselineConfig, tfidf, sources: Sequence[str], n: int) -> dict:
    """The seed spread (medrank.selection.experiment.seed_spread_of) of the recipe's CV and LOSO over `n` seeds from cfg.seed
    (folds, inner-CV folds, rank-SVM pair flips)."""
    system = BaselineSystem(table, cfg, tfidf)
    seeds = [cfg.seed + i for i in range(n)]
    protocols_ = reseeded([CV(cfg.params.cv_folds, cfg.seed), LOSO(tuple(sources), cfg.seed)], seeds)
    return seed_spread_of(experiment({"baseline": system}, system.questions(), protocols_)["baseline"], seeds)


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
    from medrank.selection.evaluation import rounded_scores, rounded_summary, selection_score

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
    from medrank.selection.evaluation import rounded_scores

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


def prediction_rows(
    labelled: pd.DataFrame,
    proto: dict,
    val: tuple[pd.DataFrame, FittedBaseline],
    test: tuple[pd.DataFrame, FittedBaseline],
) -> pd.DataFrame:
    """data/processed/baseline_predictions.parquet (PREDICTIONS): the `protocols` out-of-fold and LOSO rows, then the
    train-only model's validation rows and the final model's test rows (each (predictions, model))."""
    scored = labelled[~labelled["judged"]]
    split_of = labelled.drop_duplicates("gid").set_index("gid")["split"]
    parts = [
        proto["oof"].assign(part="oof", split=scored["split"].to_numpy()),
        proto["loso_rows"].assign(part="loso", split=lambda d: d["gid"].map(split_of)),
        val[0].assign(part="val", split="val", fold=-1, threshold=val[1].threshold),
        test[0].assign(part="test", split="test", fold=-1, threshold=test[1].threshold),
    ]
    return pd.concat(parts, ignore_index=True)[PREDICTIONS.names]


def stage_metrics(
    cfg: BaselineConfig,
    labelled: pd.DataFrame,
    proto: dict,
    val_scores: dict,
    val: tuple[pd.DataFrame, FittedBaseline],
    test: tuple[pd.DataFrame, FittedBaseline],
) -> tuple[dict, dict]:
    """(metrics/task3_val_baseline.json, metrics/baseline.json's model section) of stage baseline."""
    from medrank.selection.evaluation import rounded_scores, rounded_summary

    bp, (_, model), (test_pred, final) = cfg.params, val, test
    cv, loso, scored = proto["cv"], proto["loso"], labelled[~labelled["judged"]]
    cv_summary = rounded_summary(cv["base"])
    task3_val = {
        **rounded_scores(val_scores),
        "n_predicted_positive": val_scores["n_predicted_positive"],
        "threshold": model.threshold,
        "features": list(cfg.groups),
        "cv": cv_summary,
        "loso": loso["base"],
        "cv_folds": bp.cv_folds,
        "cv_questions": int(scored["gid"].nunique()),
        "judged_training_rows": int(labelled["judged"].sum()),
        "test_model": {
            "trained_on": sorted(labelled["split"].unique()),
            "threshold": final.threshold,
            "test_predicted_positive_rate": round(float(test_pred["label"].mean()), 4),
        },
    }
    summary = {
        "features": list(cfg.groups),
        "n_features": len(model.builder.feature_names),
        "cv": cv_summary,
        "cv_thresholds": cv["base"]["thresholds"],
        "cv_variants": {k: rounded_summary(cv[k]) for k in VARIANTS},
        "loso": loso["base"],
        "loso_variants": {k: loso[k] for k in VARIANTS},
        "source_transfer": transfer_report(proto["per_source"]),
        "val": rounded_scores(val_scores),
    }
    return task3_val, summary
