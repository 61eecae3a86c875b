"""The MTL's decision over its rows: ensembling over the N entailed answers (paper §4.6), the truth attached, and
each CV / LOSO fold decided with a threshold chosen on the other folds (medrank.selection.decision)."""

from __future__ import annotations

from typing import Literal

import pandas as pd

from medrank.selection.decision import ENSEMBLE_MODES, choose_threshold, decide
from medrank.core.errors import MedrankError
from medrank.selection.evaluation import evaluate_rows
from medrank.models.mtl.fits import CVResult
from medrank.params import MtlParams

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


def with_truth(ens: pd.DataFrame, cand: pd.DataFrame) -> pd.DataFrame:
    """Attach label / reference columns of the candidate table to ensembled rows (by gid, aid)."""
    cols = ["gid", "aid", "split", "qid", "label", "reference_rank", "reference_score", "n_sentences", "chiqa_rank"]
    return ens.merge(cand[[c for c in cols if c in cand.columns]], on=["gid", "aid"], how="left")


def ensembled(filter_df: pd.DataFrame, pair_df: pd.DataFrame, cand: pd.DataFrame, mode: str) -> pd.DataFrame:
    """`ensemble` over the entailed answers with the truth attached (label_true)."""
    return with_truth(ensemble(filter_df, pair_df, mode), cand).rename(columns={"label": "label_true"})


def decide_folds(cv: CVResult, cand: pd.DataFrame, decision: MtlParams) -> tuple[dict[int, dict], list, pd.DataFrame]:
    """Each fold decided with a threshold chosen on the other folds' out-of-fold rows (unless fixed) -> (official
    scores per fold, the thresholds, the decided rows)."""
    ens = ensembled(cv.filter_df, cv.pair_df, cand, decision.ensemble)
    ens["fold"] = ens["gid"].map(cv.folds)
    per_fold, thresholds, decided = {}, [], []
    for f in sorted(ens["fold"].unique()):
        rest, part = ens[ens["fold"] != f], ens[ens["fold"] == f]
        t = (
            decision.threshold
            if decision.threshold is not None
            else choose_threshold(rest, rest["label_true"].to_numpy(), decision.ensemble)
        )
        d = decide(part, t, decision, float(rest["label_true"].mean()))
        per_fold[int(f)] = evaluate_rows(d)
        thresholds.append(float(t))
        decided.append(d)
    return per_fold, thresholds, pd.concat(decided, ignore_index=True)
