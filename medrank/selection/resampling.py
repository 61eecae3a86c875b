"""Resampled priors: a held-out fold's rows resampled to each positive rate by dropping answers within questions, the
keep rule re-run on each resampled batch. Re-weighting (experiment.PriorShift) shows every rule the same batch at every
prior, so it cannot credit (or blame) a rule that adapts to its batch; resampling can. For a fixed rule the two agree
in expectation (tests/selection/test_resampling.py).

How a batch at rate p is drawn from a fold with P correct and N incorrect answers (rate pi0 = P / (P + N)): only the
over-represented class is thinned, so the batch stays as large as it can and p(x | y) is unchanged (pure prior shift).
p < pi0: every incorrect answer stays and round(p N / (1 - p)) correct ones are kept; p > pi0: every correct answer
stays and round((1 - p) P / p) incorrect ones are kept; p = pi0: the fold as it is. The realised rate is p up to that
rounding (one answer: reported as `rate`). Which answers go is uniform at random within the thinned class, except that
a question holding only that class keeps one of them (chosen at random): every question keeps >= 1 answer. A prior is
unreachable - reported, not scored - when that protection leaves too few answers to drop, when the kept count rounds to
0, or when the fold holds one class only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from medrank.core.errors import MedrankError
from medrank.selection.decision import (
    BATCH_ADAPTIVE,
    Keep,
    apply_decision,
    fit_keep_on,
)  # BATCH_ADAPTIVE: re-fitted per batch
from medrank.selection.evaluation import METRICS, gold_of, ranked_rows
from medrank.selection.experiment import SHIFT_PRIORS
from medrank.selection.metrics import task3_by_question, task3_scores_of


def draw_batch(gid: np.ndarray, y: np.ndarray, prior: float, rng: np.random.Generator) -> np.ndarray | None:
    """Mask of the rows one draw keeps at positive rate `prior` (module docstring: how); None where unreachable."""
    gid, y = np.asarray(gid), np.asarray(y, dtype=int)
    n_pos = int(y.sum())
    n_neg = len(y) - n_pos
    if n_pos == 0 or n_neg == 0:
        return None
    pi0 = n_pos / len(y)
    if np.isclose(prior, pi0):
        return np.ones(len(y), dtype=bool)
    thin = 1 if prior < pi0 else 0  # the class that is thinned
    other = n_neg if thin == 1 else n_pos
    keep_n = int(round(other * (prior / (1 - prior) if thin == 1 else (1 - prior) / prior)))
    rows = np.flatnonzero(y == thin)
    if keep_n < 1:
        return None
    # one random order of the thinned rows serves both choices: the first row of each question without the other
    # class is protected, the first `drop` of the rest go (uniform without replacement)
    rows = rows[rng.permutation(len(rows))]
    has_other = set(gid[y != thin].tolist())
    g = pd.Series(gid[rows])
    protected = (~g.isin(has_other) & ~g.duplicated()).to_numpy()
    pool = rows[~protected]
    drop = len(rows) - keep_n
    if drop > len(pool):
        return None
    mask = np.ones(len(y), dtype=bool)
    mask[pool[:drop]] = False
    return mask


@dataclass(frozen=True)
class Resampling:
    """Held-out folds resampled to each positive rate of `priors`, `draws` batches per rate (seeded by `seed`, the
    fold's key and the rate: every rule of a fold sees the same batches), the keep rule re-run on each batch.
    `summary` mirrors experiment.PriorShift's (per metric the mean over the rates, the worst rate, the band)."""

    priors: tuple[float, ...] = SHIFT_PRIORS
    draws: int = 5
    seed: int = 0

    def fold_scores(
        self,
        cal: pd.DataFrame,
        batch: pd.DataFrame,
        cand: pd.DataFrame,
        rule: str | Keep,
        order: str = "rank",
        key: int = 0,
    ) -> dict[float, dict | None]:
        """{prior: {"scores": {metric: mean over draws}, "sd": {metric: sd over draws}, "rate": realised positive rate,
        "answers": rows kept} or None (unreachable)} of one held-out fold: `batch` (gid, aid, prob, rank_key) resampled,
        the truth from `cand`; `rule` a KEEP_RULES name fitted on `cal` (label_true, prob, gid; batch-adaptive rules
        re-fitted on each batch), or a fitted Keep applied as it is."""
        if self.draws < 1:
            raise MedrankError(f"resampled priors: {self.draws} draws (need >= 1)")
        rows = _with_truth(batch, cand)
        y, gid = rows["_y"].to_numpy(dtype=int), rows["gid"].to_numpy()
        # the fold's gold, built once (evaluation.fold_by_question builds it per call): a batch's gold is the fold's
        # gold rows it kept, in the same order (the official scorer reads ids as strings)
        gold = gold_of(cand.iloc[rows["_at"].to_numpy()])
        ids = [rows["gid"].astype(str), rows["aid"].astype(str)]
        at = pd.Series(np.arange(len(rows)), index=pd.MultiIndex.from_arrays(ids))
        gold_row = at.loc[list(zip(gold["qid"], gold["aid"]))].to_numpy()
        rows = rows.drop(columns=["_y", "_at"])

        def keep_for(target: pd.DataFrame) -> Keep:
            if isinstance(rule, Keep):
                return rule
            return fit_keep_on(rule, cal, target)

        fixed = None if isinstance(rule, str) and rule in BATCH_ADAPTIVE else keep_for(rows)
        out: dict[float, dict | None] = {}
        for pi in self.priors:
            got = []
            for d in range(self.draws):
                rng = np.random.default_rng([self.seed, key, int(round(pi * 1e6)), d])
                mask = draw_batch(gid, y, pi, rng)
                if mask is None:
                    break
                sub = rows[mask].reset_index(drop=True)
                decided = ranked_rows(apply_decision(sub, fixed or keep_for(sub), order))
                submitted = decided[["gid", "aid", "label"]].rename(columns={"gid": "qid"})
                scores = task3_scores_of(task3_by_question(gold[mask[gold_row]], submitted))
                got.append(({m: float(scores[m]) for m in METRICS}, float(y[mask].mean()), int(mask.sum())))
            if not got:
                out[pi] = None
                continue
            out[pi] = {
                "scores": {m: float(np.mean([s[m] for s, _, _ in got])) for m in METRICS},
                "sd": {m: float(np.std([s[m] for s, _, _ in got], ddof=1)) if len(got) > 1 else 0.0 for m in METRICS},
                "rate": float(np.mean([r for _, r, _ in got])),
                "answers": float(np.mean([n for _, _, n in got])),
            }
        return out

    def summary(self, per_fold: Mapping[object, dict[float, dict | None]]) -> dict:
        """Per metric over the rates every fold reached, the folds averaged at each rate: {"mean", "worst",
        "worst_prior", "best", "by_prior", "by_fold" (each fold's mean, worst and worst rate), "band" (the worst fold
        at its worst rate up to the mean: {"worst", "worst_fold", "worst_prior", "mean"})}, and "draws", "rate" (the
        realised rate per prior, over folds and draws), "unreachable" ({prior: folds that cannot reach it})."""
        if not per_fold:
            raise MedrankError("resampled priors: no held-out fold to summarise")
        reached = [pi for pi in self.priors if all(f.get(pi) is not None for f in per_fold.values())]
        out: dict = {
            "draws": self.draws,
            "rate": {f"{pi:g}": round(float(np.mean([f[pi]["rate"] for f in per_fold.values()])), 4) for pi in reached},
            "unreachable": {
                f"{pi:g}": [str(k) for k, f in per_fold.items() if f.get(pi) is None]
                for pi in self.priors
                if pi not in reached
            },
        }
        for m in METRICS:
            if not reached:
                out[m] = None
                continue
            by_prior = {pi: float(np.mean([f[pi]["scores"][m] for f in per_fold.values()])) for pi in reached}
            worst = min(by_prior, key=by_prior.get)
            mean = round(float(np.mean(list(by_prior.values()))), 4)
            by_fold = {}
            for k, f in per_fold.items():
                v = {pi: f[pi]["scores"][m] for pi in reached}
                at = min(v, key=v.get)
                by_fold[str(k)] = {"mean": round(float(np.mean(list(v.values()))), 4), "worst": round(v[at], 4)}
                by_fold[str(k)]["worst_prior"] = at
            low = min(by_fold, key=lambda k: by_fold[k]["worst"])
            out[m] = {
                "mean": mean,
                "worst": round(by_prior[worst], 4),
                "worst_prior": worst,
                "best": round(max(by_prior.values()), 4),
                "by_prior": {f"{pi:g}": round(v, 4) for pi, v in by_prior.items()},
                "by_fold": by_fold,
                "band": {
                    "worst": by_fold[low]["worst"],
                    "worst_fold": low,
                    "worst_prior": by_fold[low]["worst_prior"],
                    "mean": mean,
                },
            }
        return out


def _with_truth(batch: pd.DataFrame, cand: pd.DataFrame) -> pd.DataFrame:
    """`batch` in a canonical (gid, aid) order - so a draw does not depend on how the caller ordered its rows - with
    each row's truth (_y) and its position in `cand` (_at)."""
    truth = pd.DataFrame({"gid": cand["gid"], "aid": cand["aid"], "_y": cand["label"], "_at": np.arange(len(cand))})
    rows = batch.drop(columns=[c for c in ("_y", "_at") if c in batch.columns])
    rows = rows.merge(truth, on=["gid", "aid"], how="inner", validate="one_to_one")
    if len(rows) != len(batch):
        raise MedrankError(f"resampled priors: {len(batch) - len(rows)} held-out rows are not in the candidate table")
    return rows.sort_values(["gid", "aid"], kind="stable").reset_index(drop=True)


def held_out_resampled(
    decided: pd.DataFrame,
    cand: pd.DataFrame,
    part: str,
    rule: str | Keep,
    order: str,
    resampling: Resampling,
    sources: Sequence[str] | None = None,
) -> dict:
    """`Resampling.summary` of one part's decided held-out rows (decision.decide_system: oof or loso), each fold's
    batch decided by `rule` fitted on the same part's other folds, as decide_system fits it (fold f named sources[f]
    for loso)."""
    rows = decided[decided["part"] == part]
    per_fold = {}
    for f in sorted(rows["fold"].unique()):
        name = int(f) if sources is None else sources[int(f)]
        per_fold[name] = resampling.fold_scores(
            rows[rows["fold"] != f], rows[rows["fold"] == f], cand, rule, order, key=int(f)
        )
    return resampling.summary(per_fold)
