"""How scores become a submission: question-grouped folds, threshold rules, keep/order rules, prior shift,
and the combination of two systems. Every model and stage decides through these functions.

Threshold rules (one home for "how is the threshold chosen?"):
- `select_threshold`: the best-accuracy point of a fixed probability grid (ties: the middle of the longest run
  of best points) - probabilities of the baseline, the MTL (its `sum` ensemble on a 0..N grid) and ensembles;
- `best_cut_threshold`: the best-accuracy cut between neighbouring scores - unbounded scores (the CNN's
  question-relative scores), where no fixed grid fits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np
import pandas as pd

from medrank.errors import MedrankError

if TYPE_CHECKING:
    from medrank.params import MtlParams

THRESHOLD_GRID = np.round(np.arange(0.05, 0.951, 0.01), 2)
ENSEMBLE_MODES = ("sum", "mean", "max")


# ---------------------------------------------------------------- folds


def grouped_folds(gid: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Fold index per row; all rows of a question share a fold; questions shuffled with `seed`."""
    questions = pd.unique(pd.Series(np.asarray(gid)))
    if k < 2 or k > len(questions):
        raise MedrankError(f"{k} folds for {len(questions)} questions")
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(questions))
    fold_of = {q: int(i % k) for i, q in zip(range(len(questions)), questions[perm])}
    return np.array([fold_of[q] for q in gid], dtype=np.int64)


# ---------------------------------------------------------------- thresholds


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


def threshold_grid(mode: str, max_entailed: int) -> np.ndarray:
    """Candidate thresholds of an ensemble over entailed answers: probabilities for mean/max, up to N for sum."""
    return THRESHOLD_GRID * (max_entailed if mode == "sum" else 1)


def choose_threshold(ens: pd.DataFrame, labels: np.ndarray, mode: str) -> float:
    """Best-accuracy threshold of an ensembled probability (`select_threshold` on its mode's grid)."""
    n = int(ens["n_entailed"].max()) if len(ens) else 1
    return select_threshold(np.asarray(labels, dtype=int), ens["prob"].to_numpy(dtype=float), threshold_grid(mode, max(n, 1)))


def best_cut_threshold(scores: np.ndarray, labels: np.ndarray) -> float:
    """Decision threshold maximising accuracy on labelled scores (midpoint between neighbouring scores)."""
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.int64)
    cand = np.unique(scores)
    cuts = np.concatenate([[cand[0] - 1e-9], (cand[:-1] + cand[1:]) / 2, [cand[-1] + 1e-9]])
    acc = [((scores >= c) == labels).mean() for c in cuts]
    return float(cuts[int(np.argmax(acc))])


def relative_to_question_best(scores: pd.Series, qids: pd.Series) -> np.ndarray:
    """Each score divided by its question's best score: scale-free, so one threshold transfers across sources."""
    best = scores.groupby(qids.to_numpy()).transform("max").to_numpy(dtype=np.float64)
    return scores.to_numpy(dtype=np.float64) / np.maximum(best, 1e-12)


# ---------------------------------------------------------------- label shift


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


# ---------------------------------------------------------------- keep and order


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


def decide(ens: pd.DataFrame, threshold: float, rule: MtlParams, train_prior: float | None = None) -> pd.DataFrame:
    """MTL rows ensembled over entailed answers -> label (keep/drop) and score (kept first, then the rule's key).

    `rule` supplies ensemble, rank_by, prior_shift and min_keep (medrank.params.MtlParams).
    """
    prob = ens["prob"].to_numpy(dtype=float)
    # EM re-estimation needs probabilities: not defined on the summed scale
    if rule.prior_shift == "em" and train_prior is not None and rule.ensemble != "sum":
        _, prob = em_prior_shift(prob, train_prior)
    gid = ens["gid"].to_numpy()
    labels = keep_labels(prob, threshold, gid, rule.min_keep)
    key = {"pairwise": ens["pair_score"], "expected": ens["expected_score"], "filter": ens["prob"]}[rule.rank_by].to_numpy(dtype=float)
    # ties in the pairwise score (e.g. a single candidate) fall back to the filter probability
    key = key + 1e-6 * ens["prob"].to_numpy(dtype=float)
    return ens.assign(prob_used=prob, label=labels, rank_key=key, score=submission_score(labels, key, gid))


# ---------------------------------------------------------------- two systems


def pct_rank(values: pd.Series, gid: pd.Series) -> np.ndarray:
    """Within-question rank of `values` scaled to (0, 1] (1 = best), so two systems' keys can be averaged."""
    r = values.groupby(gid.to_numpy(), sort=False).rank(method="average")
    n = values.groupby(gid.to_numpy(), sort=False).transform("size")
    return (r / n).to_numpy(dtype=float)


def combine_systems(a: pd.DataFrame, b: pd.DataFrame, weight: float) -> pd.DataFrame:
    """weight·a + (1-weight)·b of two systems' (part, gid, aid, fold, prob in [0,1], rank_key) rows, on a's rows
    (b may cover more, e.g. a capped profile); rank keys are averaged as within-question percentile ranks."""
    m = a.merge(b[["part", "gid", "aid", "prob", "rank_key"]], on=["part", "gid", "aid"], suffixes=("_a", "_b"), validate="one_to_one")
    if len(m) != len(a):
        raise MedrankError(f"systems to combine: {len(a) - len(m)} of {len(a)} rows have no prediction of the other system")
    key = m["part"] + "\0" + m["gid"]
    return pd.DataFrame(
        {
            "part": m["part"], "gid": m["gid"], "aid": m["aid"], "fold": m["fold"],
            "prob": weight * m["prob_a"] + (1 - weight) * m["prob_b"],
            "rank_key": weight * pct_rank(m["rank_key_a"], key) + (1 - weight) * pct_rank(m["rank_key_b"], key),
        }
    )  # fmt: skip


def decide_rows(rows: pd.DataFrame, threshold: float) -> pd.DataFrame:
    """Rows (gid, prob, rank_key) of one system kept at `threshold` and ordered by rank_key."""
    gid = rows["gid"].to_numpy()
    labels = keep_labels(rows["prob"].to_numpy(dtype=float), threshold, gid)
    return rows.assign(threshold=threshold, label=labels, score=submission_score(labels, rows["rank_key"].to_numpy(dtype=float), gid))


def decide_system(pred: pd.DataFrame, cand: pd.DataFrame, train: Sequence[str], threshold: float | None = None) -> tuple[dict[str, object], pd.DataFrame]:
    """Thresholds and labels for one system's rows (part oof / val / test; prob in [0,1], rank_key).

    oof fold f: threshold from the other folds' rows; val: from the oof rows of the training questions;
    test: from all oof rows (unless `threshold` is fixed). Returns ({"folds": [..], "val": t, "test": t}, decided
    rows with label_true from `cand`).
    """
    truth = cand[["gid", "aid", "label"]].rename(columns={"label": "label_true"})
    pred = pred.merge(truth, on=["gid", "aid"], how="left")
    oof = pred[pred["part"] == "oof"]

    def _t(rows: pd.DataFrame) -> float:
        return float(threshold) if threshold is not None else select_threshold(rows["label_true"].to_numpy(dtype=int), rows["prob"].to_numpy(dtype=float))

    out, thresholds = [], {"folds": []}
    for f in sorted(oof["fold"].unique()):
        t = _t(oof[oof["fold"] != f])
        out.append(decide_rows(oof[oof["fold"] == f], t))
        thresholds["folds"].append(t)
    thresholds["val"] = _t(oof[oof["gid"].isin(set(train))])
    out.append(decide_rows(pred[pred["part"] == "val"], thresholds["val"]))
    if (pred["part"] == "test").any():
        thresholds["test"] = _t(oof)
        out.append(decide_rows(pred[pred["part"] == "test"], thresholds["test"]))
    return thresholds, pd.concat(out, ignore_index=True)
