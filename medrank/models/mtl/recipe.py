"""The mtl stage's recipe: ensembling over the N entailed answers, question-grouped CV, thresholds and the
train-only / train+val fits, ablation rows. Decisions go through medrank.decision, scores through medrank.evaluation."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Callable, Literal, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import torch

from medrank.decision import ENSEMBLE_MODES, choose_threshold, decide
from medrank.errors import MedrankError
from medrank.evaluation import evaluate_rows, loso_summary, seed_spread, summarize
from medrank.models.mtl.data import MTLData
from medrank.models.mtl.fits import (
    CVResult,
    FitJob,
    cv_jobs,
    cv_result,
    fit_many,
    labelled_gids,
    source_fold_of,
)
from medrank.models.mtl.training import MTLBag
from medrank.params import MtlParams

log = logging.getLogger(__name__)

EnsembleMode = Literal["sum", "mean", "max"]


# ---------------------------------------------------------------- ensembling over entailed answers


def ensemble(filter_df: pd.DataFrame, pair_df: pd.DataFrame, mode: EnsembleMode = "sum") -> pd.DataFrame:
    """Per candidate, combining its N entailed answers by `mode`:

    prob = mode_e P_e(valid); pair_score = Σ_j mode_e P_e(i above j) (0 for a single candidate);
    expected_score = p_i Σ_j [p_j P(i above j) + (1 - p_j)] with p = mean_e P_e(valid): the expected number of
    answers i outranks when valid answers precede invalid ones. Rows in first-appearance order of (gid, aid).
    """
    if mode not in ENSEMBLE_MODES:
        raise MedrankError(f"ensemble mode '{mode}': expected one of {', '.join(ENSEMBLE_MODES)}")
    by_c = filter_df.groupby(["gid", "aid"], sort=False)
    out = getattr(by_c["prob"], mode)().rename("prob").reset_index()
    p_mean = by_c["prob"].mean()
    out["prob_mean"] = p_mean.to_numpy()
    out["n_entailed"] = by_c["entailed"].nunique().to_numpy()
    out["pair_score"] = 0.0
    out["expected_score"] = p_mean.to_numpy()  # a lone candidate: its own probability
    if len(pair_df):
        pe = getattr(pair_df.groupby(["gid", "aid_i", "aid_j"], sort=False)["prob"], mode)()
        pm = pair_df.groupby(["gid", "aid_i", "aid_j"], sort=False)["prob"].mean().reset_index()
        s = pe.groupby(level=[0, 1], sort=False).sum()
        key = pd.MultiIndex.from_frame(out[["gid", "aid"]])
        out["pair_score"] = s.reindex(key).fillna(0.0).to_numpy(dtype=float)
        pi = p_mean.reindex(pd.MultiIndex.from_frame(pm[["gid", "aid_i"]])).to_numpy()
        pj = p_mean.reindex(pd.MultiIndex.from_frame(pm[["gid", "aid_j"]])).to_numpy()
        wins = pd.Series(
            pi * (pj * pm["prob"].to_numpy() + (1 - pj)), index=pd.MultiIndex.from_frame(pm[["gid", "aid_i"]])
        )
        w = wins.groupby(level=[0, 1], sort=False).sum()
        out["expected_score"] = w.reindex(key).fillna(0.0).to_numpy(dtype=float) + 1e-3 * p_mean.reindex(key).to_numpy()
    return out


# ---------------------------------------------------------------- the CV recipe


def with_truth(ens: pd.DataFrame, cand: pd.DataFrame) -> pd.DataFrame:
    """Attach label / reference columns of the candidate table to ensembled rows (by gid, aid)."""
    cols = ["gid", "aid", "split", "qid", "label", "reference_rank", "reference_score", "n_sentences", "chiqa_rank"]
    return ens.merge(cand[[c for c in cols if c in cand.columns]], on=["gid", "aid"], how="left")


def cv_metrics(
    cv: CVResult, cand: pd.DataFrame, decision: MtlParams, sources: Sequence[str] | None = None
) -> tuple[dict, pd.DataFrame]:
    """Per-fold official metrics (threshold for fold f chosen on the out-of-fold rows of the other folds,
    unless fixed) → (mean/sd summary with thresholds, decided OOF rows). With `sources` (the folds are
    leave-one-source-out: fold i holds out sources[i]) the summary is evaluation.loso_summary's."""
    ens = with_truth(ensemble(cv.filter_df, cv.pair_df, decision.ensemble), cand)
    ens = ens.rename(columns={"label": "label_true"})
    ens["fold"] = ens["gid"].map(cv.folds)
    per_fold, thresholds, decided = [], [], []
    for f in sorted(ens["fold"].unique()):
        rest, part = ens[ens["fold"] != f], ens[ens["fold"] == f]
        t = (
            decision.threshold
            if decision.threshold is not None
            else choose_threshold(rest, rest["label_true"].to_numpy(), decision.ensemble)
        )
        d = decide(part, t, decision, float(rest["label_true"].mean()))
        per_fold.append(evaluate_rows(d))
        thresholds.append(float(t))
        decided.append(d)
    out = (
        summarize(per_fold)
        if sources is None
        else loso_summary({sources[f]: m for f, m in zip(sorted(ens["fold"].unique()), per_fold)})
    )
    out["thresholds"] = thresholds
    return out, pd.concat(decided, ignore_index=True)


# ---------------------------------------------------------------- the stage recipe

PREDICTIONS_SCHEMA = pa.schema(
    [
        ("part", pa.string()),  # oof (CV over train+val) | val (train-only model) | test (final model)
        ("split", pa.string()),
        ("qid", pa.string()),
        ("aid", pa.string()),
        ("fold", pa.int16()),  # CV fold (oof), -1 otherwise
        ("prob", pa.float64()),  # ensembled filter probability (sum: on the 0..N scale)
        ("prob_mean", pa.float64()),  # mean over the entailed answers (0..1 whatever the ensemble mode)
        ("pair_score", pa.float64()),  # Σ_j P(i above j), ensembled
        ("rank_key", pa.float64()),  # the ranking key of the decision rule (pair_score | expected_score | prob)
        ("n_entailed", pa.int16()),
        ("threshold", pa.float64()),
        ("label", pa.int8()),  # kept (1) or filtered out (0)
        ("score", pa.float64()),  # submission order key within the question (higher = earlier)
    ]
)


def builder_factory(groups: Sequence[str], n_candidates: int, tfidf=None) -> Callable[[], object]:
    """A function returning a fresh (unfitted) FeatureBuilder for each fit."""
    from medrank.features import FeatureBuilder

    return lambda: FeatureBuilder(tuple(groups), n_candidates=n_candidates, tfidf=tfidf)


# the decision rule's keys of MtlParams (reported in metrics/mtl.json and saved with each model)
DECISION_FIELDS = ("ensemble", "rank_by", "threshold", "prior_shift", "min_keep")


def decision_of(mp: MtlParams) -> dict:
    return {k: getattr(mp, k) for k in DECISION_FIELDS}


@dataclass
class RecipeReport:
    final_model: MTLBag
    val_model: MTLBag  # trained on the training sets only: what the validation submission comes from
    predictions: pd.DataFrame
    metrics: dict
    decisions: dict[str, dict]  # "final" / "val": the decision rule with the threshold and training prior used


def _variants(decision: MtlParams) -> dict[str, MtlParams]:
    out = {}
    for mode in ENSEMBLE_MODES:
        for rank_by in ("pairwise", "expected", "filter"):
            out[f"{mode}/{rank_by}"] = decision.model_copy(update={"ensemble": mode, "rank_by": rank_by})
    out["mean/pairwise/em"] = decision.model_copy(
        update={"ensemble": "mean", "rank_by": "pairwise", "prior_shift": "em"}
    )
    return out


def _rows(part: str, d: pd.DataFrame, threshold: float | np.ndarray, fold: np.ndarray | int = -1) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "part": part,
            "split": d["split"].to_numpy(),
            "qid": d["qid"].to_numpy(),
            "aid": d["aid"].to_numpy(),
            "fold": np.broadcast_to(np.asarray(fold, dtype=np.int16), (len(d),)),
            "prob": d["prob"].to_numpy(dtype=float),
            "prob_mean": d["prob_mean"].to_numpy(dtype=float),
            "pair_score": d["pair_score"].to_numpy(dtype=float),
            "rank_key": d["rank_key"].to_numpy(dtype=float),
            "n_entailed": d["n_entailed"].to_numpy(dtype=np.int16),
            "threshold": np.broadcast_to(np.asarray(threshold, dtype=float), (len(d),)),
            "label": d["label"].to_numpy(dtype=np.int8),
            "score": d["score"].to_numpy(dtype=float),
        }
    )


def _log_curves(live, runs: dict[str, list[dict]]) -> None:
    """dvclive: one curve per run and metric, x = epoch."""
    n = max((len(h) for h in runs.values()), default=0)
    for e in range(n):
        for name, hist in runs.items():
            if e < len(hist):
                for k, v in hist[e].items():
                    if k not in ("epoch", "seconds"):
                        live.log_metric(f"{name}/{k}", float(v), plot=True)
        live.next_step()


def run_recipe(
    data: MTLData,
    train_gids: Sequence[str],
    val_gids: Sequence[str],
    test_gids: Sequence[str],
    cfg: MtlParams,
    make_builder: Callable[[], object],
    *,
    seed: int,
    device: str | torch.device = "cpu",
    live=None,
    sources: Sequence[str] | None = None,
    workers: int = 1,
) -> RecipeReport:
    """CV over train+val → thresholds and mean ± sd; train-only model → validation check; train+val model → test.
    `cfg` is the whole recipe (network, training, decision rule, cv_folds). `sources`: the labelled sources (splits)
    of the leave-one-source-out folds (None: no LOSO); the LOSO fold that holds out exactly the validation questions
    trains on exactly the training questions, so it is the train-only model (one fit fewer). Every fit (CV, LOSO, the
    models) is one FitJob, run `workers` side by side (ablation rows: `ablation_cv`; the seed spread:
    `spread_over_seeds`, stage noise_band)."""
    decision, k = cfg, cfg.cv_folds
    # labelled questions in table order (the baseline's CV sees them in this order: same folds for one seed)
    labelled = labelled_gids(data, train_gids, val_gids)
    plans: dict[str, tuple[dict[str, int], list[FitJob]]] = {"cv": cv_jobs(labelled, cfg, make_builder, k=k, seed=seed)}
    val_fold = None  # the LOSO job that trains on exactly the training questions: it is the train-only model
    if sources is not None:
        source_folds = source_fold_of(data.cand, sources)
        fold, loso = cv_jobs(labelled, cfg, make_builder, k=k, seed=seed, folds=source_folds)
        for f, job in enumerate(loso):
            if set(job.predict or ()) == set(val_gids) and set(job.train) == set(train_gids):
                val_fold, loso[f] = f, replace(job, keep_model=True, label=f"{job.label} = the train-only model")
        plans["loso"] = (fold, loso)
    models = [FitJob(cfg, make_builder, tuple(labelled), None, seed + 202, "final model")]
    if val_fold is None:
        models.insert(
            0, FitJob(cfg, make_builder, tuple(train_gids), None, seed + 101, "train-only (validation) model")
        )
    jobs = [j for _, js in plans.values() for j in js] + models
    t0 = time.perf_counter()
    results = fit_many(data, jobs, device=device, workers=workers)
    fit_seconds = time.perf_counter() - t0
    cvs, at, firsts = {}, 0, {}
    for name, (fold, js) in plans.items():
        cvs[name] = cv_result(fold, results[at : at + len(js)])
        firsts[name] = at
        at += len(js)
    val_fit = results[firsts["loso"] + val_fold] if val_fold is not None else results[at]
    final_fit = results[-1]
    val_model, final = val_fit.model, final_fit.model

    cv = cvs["cv"]
    variants = {}
    for name, dv in _variants(decision).items():
        variants[name], _ = cv_metrics(cv, data.cand, dv)
    cv_summary, oof = cv_metrics(cv, data.cand, decision)
    loso_result, loso_rows = None, None
    if sources is not None:
        loso_result, loso_rows = cv_metrics(cvs["loso"], data.cand, decision, sources)

    def _threshold(rows: pd.DataFrame) -> float:
        if decision.threshold is not None:
            return float(decision.threshold)
        return choose_threshold(rows, rows["label_true"].to_numpy(), decision.ensemble)

    oof_train = oof[oof["gid"].isin(set(train_gids))]
    t_val, t_final = _threshold(oof_train), _threshold(oof)
    prior_train = float(oof_train["label_true"].mean())
    prior_all = float(oof["label_true"].mean())

    ens_val = with_truth(ensemble(*val_model.predict(data, val_gids, device=device), decision.ensemble), data.cand)
    ens_val = ens_val.rename(columns={"label": "label_true"})
    dec_val = decide(ens_val, t_val, decision, prior_train)
    val_metrics = evaluate_rows(dec_val)

    parts = [
        _rows(
            "oof", oof, oof["fold"].map(dict(enumerate(cv_summary["thresholds"]))).to_numpy(), oof["fold"].to_numpy()
        ),
        _rows("val", dec_val, t_val),
    ]
    if loso_rows is not None:
        parts.append(
            _rows(
                "loso",
                loso_rows,
                loso_rows["fold"].map(dict(enumerate(loso_result["thresholds"]))).to_numpy(),
                loso_rows["fold"].to_numpy(),
            )
        )
    if test_gids:
        ens_test = with_truth(ensemble(*final.predict(data, test_gids, device=device), decision.ensemble), data.cand)
        parts.append(_rows("test", decide(ens_test, t_final, decision, prior_all), t_final))

    if live is not None:
        runs = {f"fold{f + 1}": h for f, h in enumerate(cv.histories)}
        runs["val_model"] = val_model.history
        runs["final_model"] = final.history
        with live:
            live.log_params({"config": cfg.model_dump(mode="json"), "seed": seed})
            _log_curves(live, runs)

    decisions = {
        "final": {**decision_of(decision), "threshold_used": t_final, "train_prior": prior_all},
        "val": {**decision_of(decision), "threshold_used": t_val, "train_prior": prior_train},
    }
    metrics = {
        "decision": {**decision_of(decision), "threshold_val_model": t_val, "threshold_final_model": t_final},
        "cv": cv_summary,
        "loso": loso_result,
        "cv_variants": variants,
        "val": {m: val_metrics[m] for m in ("accuracy", "precision", "mrr", "spearman", "spearman_true")},
        "val_counts": {
            m: val_metrics[m]
            for m in (
                "n_questions",
                "n_gold_rows",
                "n_predicted_positive",
                "n_correct_positive",
                "n_spearman_questions",
            )
        },
        "best_epochs": {"cv_folds": cv.best_epochs, "val_model": val_model.best_epoch, "final_model": final.best_epoch},
        # fit seconds (each in its own process when workers > 1) and the wall time of all fits side by side
        "seconds": {
            "fits_wall": round(fit_seconds, 1),
            "fits_sum": round(sum(r.seconds for r in results), 1),
            "workers": workers,
            "cv_folds": cv.seconds,
            "val_model": val_fit.seconds,
            "final_model": final_fit.seconds,
        },
        "n_pairs": {"all": int(len(data.pairs)), "augmented": int(data.pairs["augmented"].sum())},
        "questions": {"train": len(train_gids), "val": len(val_gids), "test": len(test_gids)},
    }
    return RecipeReport(final, val_model, pd.concat(parts, ignore_index=True), metrics, decisions)


def spread_over_seeds(
    data: MTLData,
    labelled: Sequence[str],
    cfg: MtlParams,
    make_builder: Callable[[], object],
    *,
    seeds: Sequence[int],
    sources: Sequence[str],
    device: str | torch.device = "cpu",
    workers: int = 1,
) -> dict:
    """`evaluation.seed_spread` of the recipe's CV and LOSO under each of `seeds` (folds and initialisation): the same
    jobs as `run_recipe`'s CV and LOSO for each seed, all run `workers` side by side."""
    source_folds = source_fold_of(data.cand, sources)
    plans = [
        cv_jobs(labelled, cfg, make_builder, k=cfg.cv_folds, seed=s, folds=f, name=f"seed {s}")
        for s in seeds
        for f in (None, source_folds)
    ]
    results = fit_many(data, [j for _, js in plans for j in js], device=device, workers=workers)
    summaries, at = [], 0
    for i, (fold, js) in enumerate(plans):
        summaries.append(
            cv_metrics(cv_result(fold, results[at : at + len(js)]), data.cand, cfg, sources if i % 2 else None)[0]
        )
        at += len(js)
    return seed_spread(list(zip(summaries[::2], summaries[1::2])))


def ablation_cv(
    data: MTLData,
    labelled: Sequence[str],
    rows: dict[str, tuple[MtlParams, Callable[[], object]]],
    *,
    k: int,
    seed: int,
    device: str | torch.device = "cpu",
    sources: Sequence[str] | None = None,
    workers: int = 1,
) -> dict[str, dict]:
    """CV mean ± sd of each ablation row (its params and feature builder), on the folds of the mtl stage's own CV
    (same questions, same seed), so rows compare with the default and with each other; with `sources`, LOSO too.
    Every row's folds are FitJobs run `workers` side by side."""
    plans: list[tuple[str, str, dict[str, int], list[FitJob]]] = []
    for name, (cfg, make_builder) in rows.items():
        plans.append((name, "cv", *cv_jobs(labelled, cfg, make_builder, k=k, seed=seed, name=name)))
        if sources is not None:
            folds = source_fold_of(data.cand, sources)
            plans.append((name, "loso", *cv_jobs(labelled, cfg, make_builder, k=k, seed=seed, folds=folds, name=name)))
    results = fit_many(data, [j for *_, js in plans for j in js], device=device, workers=workers)
    out: dict[str, dict] = {}
    at = 0
    for name, kind, fold, js in plans:
        part = results[at : at + len(js)]
        at += len(js)
        cfg = rows[name][0]
        if kind == "cv":
            out[name], _ = cv_metrics(cv_result(fold, part), data.cand, cfg)
            out[name]["seconds"] = 0.0
        else:
            out[name]["loso"], _ = cv_metrics(cv_result(fold, part), data.cand, cfg, sources)
        out[name]["seconds"] = round(
            out[name]["seconds"] + sum(r.seconds for r in part), 1
        )  # fit seconds (summed over processes)
        if kind == "cv":
            log.info(
                "ablation %s: CV accuracy %.3f ± %.3f", name, out[name]["accuracy"]["mean"], out[name]["accuracy"]["sd"]
            )
    return out


def held_out_rows(
    data: MTLData,
    inner: Sequence[str],
    inner_sources: Sequence[str],
    outer: Sequence[str],
    cfg: MtlParams,
    make_builder: Callable[[], object],
    *,
    seed: int,
    device: str | torch.device = "cpu",
    workers: int = 1,
) -> pd.DataFrame:
    """Rows for a nested selection (medrank.nested): part oof (question-grouped CV over the `inner` questions),
    loso (leave one of `inner_sources` out; fold = its index) and test (the `outer` questions, by a model trained
    on every inner question); columns part, gid, aid, fold, prob_mean, rank_key. No fit sees an outer question."""
    split_of = data.cand.drop_duplicates("gid").set_index("gid")["split"]
    fold_cv, cv_js = cv_jobs(inner, cfg, make_builder, k=cfg.cv_folds, seed=seed)
    by_source = {g: list(inner_sources).index(split_of[g]) for g in inner}
    fold_lo, lo_js = cv_jobs(inner, cfg, make_builder, k=cfg.cv_folds, seed=seed, folds=by_source)
    final = FitJob(cfg, make_builder, tuple(inner), tuple(outer), seed + 202, "nested: inner final model")
    res = fit_many(data, [*cv_js, *lo_js, final], device=device, workers=workers)
    _, oof = cv_metrics(cv_result(fold_cv, res[: len(cv_js)]), data.cand, cfg)
    _, loso = cv_metrics(cv_result(fold_lo, res[len(cv_js) : -1]), data.cand, cfg, inner_sources)
    ens = with_truth(ensemble(res[-1].filter_df, res[-1].pair_df, cfg.ensemble), data.cand).rename(
        columns={"label": "label_true"}
    )
    test = decide(ens, 0.5, cfg).assign(fold=-1)  # the threshold is the keep rule's business downstream: rank_key only
    cols = ["part", "gid", "aid", "fold", "prob_mean", "rank_key"]
    return pd.concat(
        [oof.assign(part="oof")[cols], loso.assign(part="loso")[cols], test.assign(part="test")[cols]],
        ignore_index=True,
    )
