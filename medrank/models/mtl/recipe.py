"""The mtl stage's recipe: the MTL system's CV and LOSO (medrank.selection.experiment), its decision-rule variants, thresholds
and the train-only / train+val models, in one batch of fits. Decisions: medrank.models.mtl.ensembling."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import torch

from medrank.selection.decision import ENSEMBLE_MODES, choose_threshold, decide
from medrank.selection.evaluation import evaluate_rows
from medrank.selection.experiment import CV, LOSO, collect, plan
from medrank.models.mtl.data import MTLData
from medrank.models.mtl.ensembling import ensembled
from medrank.models.mtl.fits import FitJob, fit_many, labelled_gids
from medrank.models.mtl.system import REFIT_SEED_OFFSET, MTLSystem
from medrank.models.mtl.training import MTLBag
from medrank.params import MtlParams

log = logging.getLogger(__name__)

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
    from medrank.task3.features import FeatureBuilder

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
    decision = cfg
    # labelled questions in table order (the baseline's CV sees them in this order: same folds for one seed)
    labelled = labelled_gids(data, train_gids, val_gids)
    system = MTLSystem(data, cfg, make_builder, device, workers, variants=_variants(decision))
    protocols = [CV(cfg.cv_folds, seed)] + ([LOSO(tuple(sources), seed)] if sources is not None else [])
    plans = plan(protocols, system.questions(labelled))
    tasks = [t for _, ts in plans for t in ts]
    jobs = system.jobs(tasks)
    # the LOSO fold that trains on exactly the training questions is the train-only model
    val_fold = next(
        (
            i
            for i, t in enumerate(tasks)
            if t.protocol == "loso" and set(t.test) == set(val_gids) and set(t.train) == set(train_gids)
        ),
        None,
    )
    if val_fold is not None:
        jobs[val_fold] = replace(
            jobs[val_fold], keep_model=True, label=f"{jobs[val_fold].label} = the train-only model"
        )
    models = [FitJob(cfg, make_builder, tuple(labelled), None, seed + REFIT_SEED_OFFSET, "final model")]
    if val_fold is None:
        models.insert(
            0, FitJob(cfg, make_builder, tuple(train_gids), None, seed + 101, "train-only (validation) model")
        )
    t0 = time.perf_counter()
    results = fit_many(data, jobs + models, device=device, workers=workers)
    fit_seconds = time.perf_counter() - t0
    got = collect(system, plans, results[: len(jobs)])
    val_fit = results[val_fold if val_fold is not None else len(jobs)]
    final_fit = results[-1]
    val_model, final = val_fit.model, final_fit.model

    cv = got["cv"].info
    variants = {name: got["cv"].summary[name] for name in system.variants}
    cv_summary, oof = got["cv"].summary["base"], got["cv"].rows
    loso_result, loso_rows = (got["loso"].summary["base"], got["loso"].rows) if "loso" in got else (None, None)

    def _threshold(rows: pd.DataFrame) -> float:
        if decision.threshold is not None:
            return float(decision.threshold)
        return choose_threshold(rows, rows["label_true"].to_numpy(), decision.ensemble)

    oof_train = oof[oof["gid"].isin(set(train_gids))]
    t_val, t_final = _threshold(oof_train), _threshold(oof)
    prior_train = float(oof_train["label_true"].mean())
    prior_all = float(oof["label_true"].mean())

    ens_val = ensembled(*val_model.predict(data, val_gids, device=device), data.cand, decision.ensemble)
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
        ens_test = ensembled(*final.predict(data, test_gids, device=device), data.cand, decision.ensemble)
        parts.append(_rows("test", decide(ens_test, t_final, decision, prior_all), t_final))

    if live is not None:
        runs = {f"fold{f + 1}": h for f, h in enumerate(cv["histories"])}
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
        "best_epochs": {
            "cv_folds": cv["best_epochs"],
            "val_model": val_model.best_epoch,
            "final_model": final.best_epoch,
        },
        # fit seconds (each in its own process when workers > 1) and the wall time of all fits side by side
        "seconds": {
            "fits_wall": round(fit_seconds, 1),
            "fits_sum": round(sum(r.seconds for r in results), 1),
            "workers": workers,
            "cv_folds": cv["seconds"],
            "val_model": val_fit.seconds,
            "final_model": final_fit.seconds,
        },
        "n_pairs": {"all": int(len(data.pairs)), "augmented": int(data.pairs["augmented"].sum())},
        "questions": {"train": len(train_gids), "val": len(val_gids), "test": len(test_gids)},
    }
    return RecipeReport(final, val_model, pd.concat(parts, ignore_index=True), metrics, decisions)
