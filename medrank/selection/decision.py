"""How scores become a submission (folds: medrank.selection.experiment): threshold rules, keep/order rules, prior shift,
and the combination of two systems. Every model and stage decides through these functions.

Threshold rules (one home for "how is the threshold chosen?"):
- `select_threshold`: the best-accuracy point of a fixed probability grid (ties: the middle of the longest run
  of best points) - probabilities of the baseline, the MTL (its `sum` ensemble on a 0..N grid) and ensembles;
- `best_cut_threshold`: the best-accuracy cut between neighbouring scores - unbounded scores (the CNN's
  question-relative scores), where no fixed grid fits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Literal, Sequence

import numpy as np
import pandas as pd

from medrank.core.errors import MedrankError
from medrank.params.rankers import KEEP_RULES, ORDERS  # the vocabulary: params owns the names, this module the rules

if TYPE_CHECKING:
    from medrank.params import MtlParams

THRESHOLD_GRID = np.round(np.arange(0.05, 0.951, 0.01), 2)
ENSEMBLE_MODES = ("sum", "mean", "max")


# ---------------------------------------------------------------- thresholds


def accuracy_at(y: np.ndarray, p: np.ndarray, t: float) -> float:
    return float(np.mean((np.asarray(p) >= t).astype(int) == np.asarray(y, dtype=int)))


def select_threshold(y: np.ndarray, p: np.ndarray, grid: np.ndarray = THRESHOLD_GRID) -> float:
    """Threshold with the best accuracy on (y, p); ties -> the middle of the best run of grid points."""
    return _middle_of_best(np.array([accuracy_at(y, p, t) for t in grid]), grid)


def minimax_threshold(
    y: np.ndarray, p: np.ndarray, priors: Sequence[float], grid: np.ndarray = THRESHOLD_GRID
) -> float:
    """The threshold whose worst accuracy over positive rates `priors` (pi TPR + (1 - pi) TNR: the rows re-weighted to
    each rate) is best; ties -> the middle of the best run. Linear in pi, so the worst is at an end of the range."""
    y, p = np.asarray(y, dtype=int), np.asarray(p, dtype=float)
    if not (y == 1).any() or not (y == 0).any():
        return select_threshold(y, p, grid)  # one class: no rate to shift
    tpr = np.array([np.mean(p[y == 1] >= t) for t in grid])
    tnr = np.array([np.mean(p[y == 0] < t) for t in grid])
    lo, hi = min(priors), max(priors)
    worst = np.minimum(lo * tpr + (1 - lo) * tnr, hi * tpr + (1 - hi) * tnr)
    return _middle_of_best(worst, grid)


def _middle_of_best(acc: np.ndarray, grid: np.ndarray) -> float:
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
    return select_threshold(
        np.asarray(labels, dtype=int), ens["prob"].to_numpy(dtype=float), threshold_grid(mode, max(n, 1))
    )


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


def em_prior_shift(
    p: np.ndarray, train_prior: float, max_iter: int = 200, tol: float = 1e-6
) -> tuple[float, np.ndarray]:
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
    key = {"pairwise": ens["pair_score"], "expected": ens["expected_score"], "filter": ens["prob"]}[
        rule.rank_by
    ].to_numpy(dtype=float)
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
    m = a.merge(
        b[["part", "gid", "aid", "prob", "rank_key"]],
        on=["part", "gid", "aid"],
        suffixes=("_a", "_b"),
        validate="one_to_one",
    )
    if len(m) != len(a):
        raise MedrankError(
            f"systems to combine: {len(a) - len(m)} of {len(a)} rows have no prediction of the other system"
        )
    key = m["part"] + "\0" + m["gid"]
    return pd.DataFrame(
        {
            "part": m["part"],
            "gid": m["gid"],
            "aid": m["aid"],
            "fold": m["fold"],
            "prob": weight * m["prob_a"] + (1 - weight) * m["prob_b"],
            "rank_key": weight * pct_rank(m["rank_key_a"], key) + (1 - weight) * pct_rank(m["rank_key_b"], key),
        }
    )


# ---------------------------------------------------------------- keep rules that may transfer to new questions

# KEEP_RULES (their names and what each does: medrank.params.rankers) fitted and applied below
RELATIVE_GRID = np.round(np.arange(0.0, 1.001, 0.02), 2)
TOP_K_GRID = np.arange(1, 11)


KEEP_KINDS = ("threshold", "relative", "top_k")


@dataclass(frozen=True)
class Keep:
    """A fitted keep rule, as it is applied (and saved for `medrank rank`): a probability threshold, a margin
    below the question's best (relative) or a per-question count (top_k); min_keep answers are always kept."""

    kind: Literal["threshold", "relative", "top_k"]
    value: float
    min_keep: int = 0
    target_prior: float | None = None  # estimated on the target rows by a prior-matching rule

    def labels(self, p: np.ndarray, gid: np.ndarray) -> np.ndarray:
        p, gid = np.asarray(p, dtype=float), np.asarray(gid)
        if self.kind == "threshold":
            return keep_labels(p, self.value, gid, self.min_keep)
        s = pd.Series(p)
        if self.kind == "relative":
            best = s.groupby(gid, sort=False).transform("max").to_numpy()
            return (p >= best - self.value - 1e-12).astype(int)
        rank = s.groupby(gid, sort=False).rank(ascending=False, method="first").to_numpy()
        return (rank <= max(self.value, self.min_keep)).astype(int)

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "value": float(self.value),
            "min_keep": self.min_keep,
            "target_prior": self.target_prior,
        }

    @classmethod
    def from_json(cls, d: dict) -> "Keep":
        if d["kind"] not in KEEP_KINDS:
            raise ValueError(f"keep kind {d['kind']!r}")
        return cls(d["kind"], float(d["value"]), int(d.get("min_keep", 0)), d.get("target_prior"))


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=float), 1e-6, 1 - 1e-6)
    return np.log(p / (1 - p))


def platt(y: np.ndarray, p: np.ndarray) -> tuple[float, float]:
    """(a, b) of calibrated P = sigmoid(a logit(p) + b), fitted by (nearly unregularised) logistic regression."""
    from sklearn.linear_model import LogisticRegression

    lr = LogisticRegression(C=1e4, solver="lbfgs").fit(_logit(p)[:, None], np.asarray(y, dtype=int))
    return float(lr.coef_[0, 0]), float(lr.intercept_[0])


def _threshold_where(logit_value: float, a: float, b: float) -> float:
    """The raw probability at which a logit(p) + b = logit_value (a > 0), i.e. a Platt-scaled decision point."""
    if a <= 1e-9:  # a flat or inverted calibration: no probability separates; keep nothing but min_keep
        return 1.0
    return float(1 / (1 + np.exp(-(logit_value - b) / a)))


def fraction_threshold(p: np.ndarray, fraction: float) -> float:
    """The threshold keeping the `fraction` most probable of the rows `p` (ties kept together)."""
    p = np.sort(np.asarray(p, dtype=float))[::-1]
    n = int(round(float(fraction) * len(p)))
    if n <= 0:
        return float(p[0] + 1e-9) if len(p) else 1.0
    return float(p[min(n, len(p)) - 1])


def bbse_prior(y: np.ndarray, p: np.ndarray, target_p: np.ndarray, t: float) -> float:
    """Black-box shift estimation (Lipton et al. 2018), binary: the target positive rate from the classifier's
    true/false positive rates at `t` on the calibration rows and its positive rate on the target rows."""
    y, p = np.asarray(y, dtype=int), np.asarray(p, dtype=float)
    tpr = float(np.mean(p[y == 1] >= t)) if (y == 1).any() else 1.0
    fpr = float(np.mean(p[y == 0] >= t)) if (y == 0).any() else 0.0
    q = float(np.mean(np.asarray(target_p) >= t))
    return float(np.clip((q - fpr) / max(tpr - fpr, 1e-6), 0.02, 0.98))


# what decides one request (`medrank rank`, `medrank serve`) when the chosen rule adapts to its batch: a question's ten
# answers are no batch to estimate a prior from, and a server's micro-batch mixes callers (docs/serving.md)
REQUEST_RULE = "min_keep_1"
# a batch a rule that adapts may be re-fitted on (`medrank rank` over a file of questions): at least the smallest batch
# the protocol scored such rules on (the 25 validation questions); a smaller one is decided by REQUEST_RULE
MIN_BATCH_QUESTIONS = 25

# em_guarded: the significance of the test that label shift alone explains the target batch, and the EM priors it trusts
EM_GUARD_ALPHA = 0.01
EM_GUARD_PRIORS = (0.05, 0.95)


def label_shift_ks(y: np.ndarray, p: np.ndarray, target_p: np.ndarray, prior: float) -> tuple[float, float]:
    """KS distance of the target's empirical CDF of p from the label-shift mixture prior F1 + (1 - prior) F0 of the
    calibration rows' class-conditional CDFs, and its two-sample critical value at EM_GUARD_ALPHA."""
    y, p, t = np.asarray(y, dtype=int), np.asarray(p, dtype=float), np.sort(np.asarray(target_p, dtype=float))
    pos, neg = np.sort(p[y == 1]), np.sort(p[y == 0])
    # every CDF here is a right-continuous step function: the sup of their difference is reached at a jump point
    at = np.unique(np.concatenate([t, pos, neg]))
    ecdf = lambda v: np.searchsorted(v, at, side="right") / len(v)
    dist = float(np.abs(ecdf(t) - (prior * ecdf(pos) + (1 - prior) * ecdf(neg))).max())
    # the mixture's effective sample size (the inverse of its CDF's variance factor): n1 / prior^2 and n0 / (1 - prior)^2
    m = 1 / (prior**2 / len(pos) + (1 - prior) ** 2 / len(neg))
    n = len(t)
    return dist, float(np.sqrt(-np.log(EM_GUARD_ALPHA / 2) / 2) * np.sqrt((n + m) / (n * m)))


def _best_on_grid(y: np.ndarray, grid: np.ndarray, labels_of) -> float:
    acc = np.array([np.mean(labels_of(v) == y) for v in grid])
    return float(grid[int(np.flatnonzero(np.isclose(acc, acc.max()))[0])])


# ---------------------------------------------------------------- the keep rules, one table (KEEP_FITS): each
# fits on labelled calibration rows (y, p, gid) and, where transductive, the unlabelled target probabilities


def _fixed(y, p, gid, target_p) -> Keep:
    return Keep("threshold", 0.5)


def _accuracy_best(min_keep: int):
    return lambda y, p, gid, target_p: Keep("threshold", select_threshold(y, p), min_keep)


def _minimax(min_keep: int):
    def fit(y, p, gid, target_p) -> Keep:
        from medrank.selection.metrics import SHIFT_PRIORS

        return Keep("threshold", minimax_threshold(y, p, SHIFT_PRIORS), min_keep)

    return fit


def _relative(y, p, gid, target_p) -> Keep:
    return Keep("relative", _best_on_grid(y, RELATIVE_GRID, lambda d: Keep("relative", d).labels(p, gid)))


def _top_k(y, p, gid, target_p) -> Keep:
    return Keep("top_k", _best_on_grid(y, TOP_K_GRID, lambda k: Keep("top_k", k).labels(p, gid)))


def _isotonic(y, p, gid, target_p) -> Keep:
    from sklearn.isotonic import IsotonicRegression

    iso = IsotonicRegression(out_of_bounds="clip", y_min=0.0, y_max=1.0).fit(p, y)
    cand = np.unique(p)
    above = cand[iso.predict(cand) >= 0.5]
    return Keep("threshold", float(above.min()) if len(above) else 1.0)


def _platt(min_keep: int):
    def fit(y, p, gid, target_p) -> Keep:  # not transductive: the calibration rows only
        a, b = platt(y, p)
        return Keep("threshold", _threshold_where(0.0, a, b), min_keep)

    return fit


def _bbse_fraction(y, p, gid, target_p) -> Keep:
    prior = bbse_prior(y, p, target_p, select_threshold(y, p))
    return Keep("threshold", fraction_threshold(target_p, prior), target_prior=prior)


def _calibrated(y, p, target_p) -> tuple[float, float, np.ndarray]:
    a, b = platt(y, p)
    return a, b, 1 / (1 + np.exp(-(a * _logit(target_p) + b)))


def _posterior_fraction(y, p, gid, target_p) -> Keep:  # the batch's mean calibrated posterior as its positive rate
    prior = float(_calibrated(y, p, target_p)[2].mean())
    return Keep("threshold", fraction_threshold(target_p, prior), target_prior=prior)


def _em_fraction(y, p, gid, target_p) -> Keep:
    prior, _ = em_prior_shift(_calibrated(y, p, target_p)[2], float(y.mean()))
    return Keep("threshold", fraction_threshold(target_p, prior), target_prior=prior)


def _em(guarded: bool):
    def fit(y, p, gid, target_p) -> Keep:
        a, b, calibrated = _calibrated(y, p, target_p)
        prior, _ = em_prior_shift(calibrated, float(y.mean()))
        if guarded and not _label_shift_explains(y, p, target_p, prior):
            # a batch no prior shift explains (LOSO Alexa: EM read a miscalibrated source as a 0.86 prior): the fixed rule
            return KEEP_FITS["min_keep_1"][0](y, p, gid, target_p)
        # em: prior-adjusted P >= 0.5  <=>  a logit(p) + b >= log of the prior odds ratio (calibration / target)
        pi0 = float(np.clip(y.mean(), 1e-6, 1 - 1e-6))
        shift = np.log(pi0 / (1 - pi0)) - np.log(max(prior, 1e-6) / max(1 - prior, 1e-6))
        return Keep("threshold", _threshold_where(shift, a, b), 1 if guarded else 0, target_prior=prior)

    return fit


# rule -> (fit, transductive: reads the target batch); the names and what each does: medrank.params.rankers.KEEP_RULES
KEEP_FITS: dict[str, tuple[Callable[..., Keep], bool]] = {
    "threshold": (_accuracy_best(0), False),
    "fixed_0.5": (_fixed, False),
    "min_keep_1": (_accuracy_best(1), False),
    "platt": (_platt(0), False),
    "platt_min_keep_1": (_platt(1), False),
    "isotonic": (_isotonic, False),
    "em": (_em(False), True),
    "em_guarded": (_em(True), True),
    "em_fraction": (_em_fraction, True),
    "posterior_fraction": (_posterior_fraction, True),
    "bbse_fraction": (_bbse_fraction, True),
    "minimax": (_minimax(0), False),
    "minimax_min_keep_1": (_minimax(1), False),
    "relative": (_relative, False),
    "top_k": (_top_k, False),
}


# keep rules whose fit reads the target batch's probabilities (the transductive ones): re-fitted on every batch; every
# other rule's fit depends on the calibration rows only (a test guards the list)
BATCH_ADAPTIVE = tuple(rule for rule, (_, transductive) in KEEP_FITS.items() if transductive)


def fit_keep(rule: str, y: np.ndarray, p: np.ndarray, gid: np.ndarray, target_p: np.ndarray | None = None) -> Keep:
    """Fit keep rule `rule` (KEEP_FITS) on labelled calibration rows (y, p, gid); transductive rules also read the
    unlabelled target probabilities `target_p`. Every fit is returned as the Keep it applies."""
    y, p, gid = np.asarray(y, dtype=int), np.asarray(p, dtype=float), np.asarray(gid)
    if rule not in KEEP_FITS:
        raise MedrankError(f"keep rule '{rule}': expected one of {', '.join(KEEP_RULES)}")
    fit, transductive = KEEP_FITS[rule]
    if transductive and (target_p is None or not len(target_p)):
        raise MedrankError(f"keep rule '{rule}' needs the target rows' probabilities")
    return fit(y, p, gid, target_p)


def _label_shift_explains(y: np.ndarray, p: np.ndarray, target_p: np.ndarray, prior: float) -> bool:
    """Whether em_guarded trusts EM's `prior`: inside EM_GUARD_PRIORS and the batch not far from the mixture at it."""
    if not EM_GUARD_PRIORS[0] <= prior <= EM_GUARD_PRIORS[1]:
        return False
    dist, critical = label_shift_ks(y, p, target_p, prior)
    return dist <= critical


def fit_keep_on(rule: str, cal: pd.DataFrame, target: pd.DataFrame) -> Keep:
    """fit_keep over decided frames: calibration rows with label_true, prob, gid; the target rows' prob only."""
    return fit_keep(
        rule,
        cal["label_true"].to_numpy(dtype=int),
        cal["prob"].to_numpy(dtype=float),
        cal["gid"].to_numpy(),
        target["prob"].to_numpy(dtype=float),
    )


def order_key(rows: pd.DataFrame, order: str) -> np.ndarray:
    """The within-question order key of an order rule (ORDERS; higher = earlier) over rows with prob, rank_key
    and label (kept)."""
    if order not in ORDERS:
        raise MedrankError(f"order '{order}': expected one of {', '.join(ORDERS)}")
    prob = rows["prob"].to_numpy(dtype=float)
    if order == "prob":
        return prob
    key = pct_rank(rows["rank_key"].reset_index(drop=True), rows["gid"].reset_index(drop=True))
    if order == "prob_first":
        kept_prob = pd.Series(np.where(rows["label"].to_numpy() == 1, prob, -np.inf))
        first = (
            kept_prob.groupby(rows["gid"].to_numpy(), sort=False).rank(ascending=False, method="first").to_numpy() == 1
        )
        key = key + 2.0 * (first & np.isfinite(kept_prob.to_numpy()))
    return key


def apply_decision(rows: pd.DataFrame, keep: Keep, order: str = "rank") -> pd.DataFrame:
    """Rows (gid, prob, rank_key) of one system kept by `keep` and ordered by `order`."""
    gid = rows["gid"].to_numpy()
    rows = rows.assign(label=keep.labels(rows["prob"].to_numpy(dtype=float), gid))
    return rows.assign(
        threshold=keep.value, score=submission_score(rows["label"].to_numpy(), order_key(rows, order), gid)
    )


# ---------------------------------------------------------------- one system's held-out rows


HELD_OUT_PARTS = ("oof", "loso")  # question-grouped CV folds | leave-one-source-out folds (fold = source index)


def decide_system(
    pred: pd.DataFrame, cand: pd.DataFrame, train: Sequence[str], rule: str = "threshold", order: str = "rank"
) -> tuple[dict[str, object], pd.DataFrame]:
    """Keep rule `rule` and order `order` over one system's rows (part oof / loso / val / test; prob in [0,1],
    rank_key), each target set decided by a rule fitted on other rows:

    oof / loso fold f: fitted on the same part's other folds (CV: the other questions; LOSO: the other sources'
    out-of-source rows); val: on the oof rows of the training questions; test: on all oof rows. Returns
    ({"folds": [Keep json per oof fold], "loso": [...], "val": ..., "test": ...}, decided rows with label_true).
    """
    truth = cand[["gid", "aid", "label"]].rename(columns={"label": "label_true"})
    pred = pred.merge(truth, on=["gid", "aid"], how="left")

    def _fit(cal: pd.DataFrame, target: pd.DataFrame) -> Keep:
        return fit_keep_on(rule, cal, target)

    out, fits = [], {}
    for part, name in zip(HELD_OUT_PARTS, ("folds", "loso")):
        rows = pred[pred["part"] == part]
        fits[name] = []
        for f in sorted(rows["fold"].unique()):
            keep = _fit(rows[rows["fold"] != f], rows[rows["fold"] == f])
            out.append(apply_decision(rows[rows["fold"] == f], keep, order))
            fits[name].append(keep.to_json())
    oof = pred[pred["part"] == "oof"]
    for part, cal in (("val", oof[oof["gid"].isin(set(train))]), ("test", oof)):
        rows = pred[pred["part"] == part]
        if len(rows):
            keep = _fit(cal, rows)
            out.append(apply_decision(rows, keep, order))
            fits[part] = keep.to_json()
    return fits, pd.concat(out, ignore_index=True)
