"""The baseline's evaluation protocols: holdout, question-grouped CV, leave-one-source-out, the seed spread, the
paper's ablation tables (Tables 1-2 and 4), each over `fit_baseline` (medrank.models.baseline) with its variants."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Sequence

import pandas as pd

from medrank.decision import grouped_folds
from medrank.evaluation import evaluate, summarize
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
    folds = grouped_folds(question_ids(table), k, seed)
    results: dict[str, list[dict]] = {"base": [], **{name: [] for name in variants or {}}}
    thresholds, oof = [], []
    for f in range(k):
        tr, te = table[folds != f], scored_rows(table[folds == f])
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
        return out, pd.concat(oof).loc[scored_rows(table).index].reset_index(drop=True)
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
        tr, te = table[table["split"] != split], scored_rows(table[table["split"] == split])
        if te.empty:
            continue
        r, pred = holdout(tr, te, cfg, tfidf, variants, with_predictions=True)
        r["positive_rate"] = float(te["label"].astype(float).mean())
        r["train_positive_rate"] = float(scored_rows(tr)["label"].astype(float).mean())
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
    target = scored_rows(table[table["gid"].isin(set(outer))])
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
    from medrank.evaluation import rounded_scores, rounded_summary

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
