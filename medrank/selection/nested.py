"""Nested leave-one-source-out: the estimate of the *selection procedure*, not of the system it picked.

Plain LOSO scores each held-out source with the system that the written rule picked on all three sources, so the
held-out source's labels took part in the pick. Here, for each held-out source s, everything the score stage selects
is selected again on the other two sources only: both models are refitted on them (question-grouped CV over the two,
and leave-one-of-the-two-out), the written rule (evaluation.candidate_systems: MTL weight x keep rule, then order)
picks on those rows, and s is scored by the two models trained on both other sources, decided by the pick (keep rule
fitted on the inner CV rows). s's labels reach no step of that selection and no fit. What stays fixed: the recipes
(feature groups, N and T, the encoders), the candidate lists and the noise band, set earlier on all three sources.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

import pandas as pd

from medrank.selection.evaluation import METRICS, candidate_systems, evaluate_decided, loso_summary, rounded_scores
from medrank.selection.experiment import PriorShift
from medrank.selection.resampling import Resampling

# one system's held-out rows for a held-out source: (inner questions, inner sources, the held-out questions) ->
# rows with part oof (inner CV), loso (fold = index in the inner sources), test (the held-out questions)
RowsFn = Callable[[list[str], list[str], list[str]], pd.DataFrame]


@dataclass(frozen=True)
class Selection:
    """What the written rule decides (the score stage's grid)."""

    weights: tuple[float, ...]
    keep_rules: tuple[str, ...]
    orders: tuple[str, ...]
    band: dict  # {"accuracy": ..., "order": ...}: the noise band of `pick`
    select_on: tuple[str, ...] = (
        "accuracy",
    )  # the metrics whose selection scores the rule averages (weight x keep rule)
    select_under: str = "mean"  # score.select_under: "shift_worst" reads each figure at its worst positive rate


def held_out_source(
    source: str,
    sources: Sequence[str],
    cand: pd.DataFrame,
    mtl_rows: RowsFn,
    base_rows: RowsFn,
    sel: Selection,
    per_rule: Sequence[str] = (),
    per_weight: Sequence[float] = (),
    resample: Resampling | None = None,
) -> dict:
    """Select on the sources other than `source`, score `source`: {"chosen", "selection_score", "scores" (official
    metrics), "shift", "by_keep_rule" (each keep rule of `per_rule`: its scores when it is the only one the rule may
    pick), "by_weight" (each MTL weight of `per_weight` alone: 0 the baseline, 1 the MTL, on the same folds)}; with
    `resample`, the pick, each keep rule alone and each weight alone also carry "resampled" (Resampling.fold_scores of
    `source`)."""
    split_of = cand.drop_duplicates("gid").set_index("gid")["split"]
    inner = [s for s in sources if s != source]
    inner_gids = [g for g in pd.unique(cand["gid"]) if split_of[g] in inner]
    outer_gids = [g for g in pd.unique(cand["gid"]) if split_of[g] == source]
    mine, theirs = mtl_rows(inner_gids, inner, outer_gids), base_rows(inner_gids, inner, outer_gids)
    for name, rows in (("mtl", mine), ("baseline", theirs)):
        _check_isolation(name, rows, set(inner_gids), set(outer_gids))
    # the held-out source's rows carry no label into the choice: candidate_systems reads part oof / loso only,
    # and the truth it joins is cut to the inner questions for those parts (the test part is scored below)
    # one key per held-out source: every rule facing it sees the same resampled batches (paired comparisons)
    key = list(sources).index(source)
    out = _select_and_score(mine, theirs, cand, inner_gids, inner, sel, resample, key)
    # each keep rule alone (weight and order still chosen inside): how it transfers to a source it never saw
    out["by_keep_rule"] = {
        r: _select_and_score(mine, theirs, cand, inner_gids, inner, replace(sel, keep_rules=(r,)), resample, key)
        for r in per_rule
    }
    out["by_weight"] = {
        w: _select_and_score(mine, theirs, cand, inner_gids, inner, replace(sel, weights=(w,)), resample, key)
        for w in per_weight
    }
    return out


def _select_and_score(
    mine: pd.DataFrame,
    theirs: pd.DataFrame,
    cand: pd.DataFrame,
    inner_gids: list[str],
    inner: list[str],
    sel: Selection,
    resample: Resampling | None = None,
    key: int = 0,
) -> dict:
    got = candidate_systems(
        mine,
        theirs,
        cand,
        inner_gids,
        sel.weights,
        sel.keep_rules,
        sel.orders,
        inner,
        sel.band,
        sel.select_on,
        sel.select_under,
    )
    decided = got["decided"]
    test = decided[decided["part"] == "test"]
    out = {
        "chosen": {"mtl_weight": got["weight"], "keep_rule": got["rule"], "order": got["order"]},
        "selection_score": round(0.5 * (got["cv"]["accuracy"]["mean"] + got["loso"]["accuracy"]["mean"]), 4),
        "scores": rounded_scores(evaluate_decided(test, cand)),
        # the held-out source re-weighted to each plausible positive rate (its labels only score, never select)
        "shift": PriorShift().fold_scores(test, cand),
    }
    if resample is not None:
        # the held-out source resampled to each rate, the pick's keep rule re-fitted as decide_system fits the test
        # part (on every inner CV row; a batch-adaptive rule also reads the batch): its labels only draw and score
        oof = decided[decided["part"] == "oof"]
        out["resampled"] = resample.fold_scores(oof, test, cand, got["rule"], got["order"], key)
    return out


def _check_isolation(name: str, rows: pd.DataFrame, inner: set[str], outer: set[str]) -> None:
    """The inner parts hold inner questions only; the test part the held-out ones (a wiring error is loud)."""
    held = rows[rows["part"].isin(("oof", "loso"))]
    if not set(held["gid"]) <= inner or not set(rows.loc[rows["part"] == "test", "gid"]) <= outer:
        raise AssertionError(f"nested LOSO: {name} rows mix the held-out source into the selection")


def nested_loso(
    sources: Sequence[str],
    cand: pd.DataFrame,
    mtl_rows: RowsFn,
    base_rows: RowsFn,
    sel: Selection,
    per_rule: Sequence[str] = (),
    per_weight: Sequence[float] = (),
    resample: Resampling | None = None,
) -> dict:
    """held_out_source for every source -> per source (chosen, scores) and loso_summary (mean, worst) per metric, and
    the same per keep rule of `per_rule` alone and per MTL weight of `per_weight` alone; with `resample`, the pick
    and each keep rule alone also carry "resampled" (Resampling.summary over the held-out sources)."""
    per = {
        s: held_out_source(s, sources, cand, mtl_rows, base_rows, sel, per_rule, per_weight, resample) for s in sources
    }
    summary = loso_summary({s: r["scores"] for s, r in per.items()})
    shift = PriorShift()

    def alone(key: str, choice) -> dict:
        got = loso_summary({s: per[s][key][choice]["scores"] for s in sources})
        out = {
            **{m: got[m] for m in METRICS},
            "by_source": got["by_source"],  # what the acceptance rule reads (a loss on any one source)
            "shift": shift.summary({s: per[s][key][choice]["shift"] for s in sources}),
        }
        if "resampled" in per[sources[0]][key][choice]:
            out["resampled"] = resample.summary({s: per[s][key][choice]["resampled"] for s in sources})
        return out

    resampled = {} if resample is None else {"resampled": resample.summary({s: r["resampled"] for s, r in per.items()})}
    return {
        "by_source": {
            s: {k: v for k, v in r.items() if k not in ("by_keep_rule", "by_weight", "shift", "resampled")}
            for s, r in per.items()
        },
        "by_keep_rule": {r: alone("by_keep_rule", r) for r in per_rule},
        "by_weight": {str(w): alone("by_weight", w) for w in per_weight},
        **{m: summary[m] for m in METRICS},
        # the held-out sources re-weighted to each plausible positive rate: the estimate as a band over priors
        "shift": shift.summary({s: r["shift"] for s, r in per.items()}),
        # resampled to each rate, the keep rule re-run on each batch (a batch-adaptive rule adapts; re-weighting
        # shows it the same batch at every rate)
        **resampled,
    }


def overstatement(plain: dict, nested: dict) -> dict:
    """How far plain LOSO (selection-time) exceeds nested LOSO, per metric: mean and worst source."""
    return {
        m: {
            "mean": round(float(plain[m]["mean"]) - float(nested[m]["mean"]), 4),
            "worst": round(float(plain[m]["worst"]) - float(nested[m]["worst"]), 4),
        }
        for m in METRICS
    }
