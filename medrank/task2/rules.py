"""Task 2 decisions within a CHQ: which of a consumer question's FAQs are entailed, decided by comparing them.

The labelled data has a shape that a pair-by-pair threshold ignores: in the validation set 90 of 120 CHQs come with
exactly two FAQs and in 89 of them exactly one is entailed (../shared/FINDINGS.md). Each rule below reads the RQE
model's P(entailed) of every FAQ of one CHQ (the group) and is fitted on labelled groups only:

- `threshold_0.5`: each pair alone, P >= 0.5 (the decision before these rules);
- `best_only`: the CHQ's most probable FAQ, nothing else;
- `best_margin`: the most probable FAQ if P >= a floor, and the others within a logit margin of it (softmax share
  relative to the best; floor and margin: the accuracy-best point of a grid on the calibration groups);
- `top_half`: the max(1, n // 2) most probable FAQs of a CHQ with n FAQs.

`cross_validate` scores each rule on the validation folds (grouped by CHQ, the RQE stage's folds: every rule fitted on
the other folds' out-of-fold probabilities); `nested_cv` scores the selection itself (the rule chosen on the other
folds only, then applied to the held-out fold).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from medrank.core.errors import MedrankError
from medrank.params.rankers import CHQ_RULES  # the vocabulary: params owns the names, this module the rules

# data/processed/task2_probs.parquet (finetune_rqe -> task2): validation pairs with their out-of-fold P(entailed),
# label and CHQ-grouped fold; test pairs with the final model's P(entailed), label and fold -1
PROBS_SCHEMA = pa.schema(
    [
        ("split", pa.string()),
        ("pair_id", pa.string()),
        ("chq", pa.string()),
        ("prob", pa.float64()),
        ("label", pa.int64()),
        ("fold", pa.int64()),
    ]
)

FLOOR_GRID = np.round(np.arange(0.0, 0.951, 0.05), 2)
MARGIN_GRID = np.round(np.arange(0.0, 4.001, 0.25), 2)  # logit units: exp(-margin) = the softmax share vs the best


@dataclass(frozen=True)
class ChqRule:
    """A fitted within-CHQ rule, as it is applied: `floor` and `margin` are used by best_margin only."""

    name: str
    floor: float = 0.0
    margin: float = 0.0

    def labels(self, p: np.ndarray, group: np.ndarray) -> np.ndarray:
        p, group = np.asarray(p, dtype=float), np.asarray(group)
        if self.name == "threshold_0.5":
            return (p >= 0.5).astype(int)
        s = pd.Series(p)
        g = s.groupby(group, sort=False)
        rank = g.rank(ascending=False, method="first").to_numpy()
        if self.name == "best_only":
            return (rank == 1).astype(int)
        if self.name == "top_half":
            n = g.transform("size").to_numpy()
            return (rank <= np.maximum(1, n // 2)).astype(int)
        logit = _logit(p)
        best = pd.Series(logit).groupby(group, sort=False).transform("max").to_numpy()
        best_p = g.transform("max").to_numpy()
        return ((best_p >= self.floor - 1e-12) & (logit >= best - self.margin - 1e-12)).astype(int)

    def to_json(self) -> dict:
        return {"rule": self.name, "floor": float(self.floor), "margin": float(self.margin)}


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=float), 1e-6, 1 - 1e-6)
    return np.log(p / (1 - p))


def fit_rule(name: str, y: np.ndarray, p: np.ndarray, group: np.ndarray) -> ChqRule:
    """Rule `name` (CHQ_RULES) fitted on labelled calibration pairs: the accuracy-best grid point (ties: the first,
    i.e. the lowest floor, then the smallest margin)."""
    if name not in CHQ_RULES:
        raise MedrankError(f"task2.rules: unknown rule '{name}' (expected one of {', '.join(CHQ_RULES)})")
    if name != "best_margin":
        return ChqRule(name)
    y = np.asarray(y, dtype=int)
    best, best_acc = ChqRule(name, float(FLOOR_GRID[0]), float(MARGIN_GRID[0])), -1.0
    for floor in FLOOR_GRID:
        for margin in MARGIN_GRID:
            rule = ChqRule(name, float(floor), float(margin))
            acc = float(np.mean(rule.labels(p, group) == y))
            if acc > best_acc + 1e-12:
                best, best_acc = rule, acc
    return best


def _fold_accuracy(name: str, y, p, group, folds, train: np.ndarray, test: np.ndarray) -> tuple[float, np.ndarray]:
    rule = fit_rule(name, y[train], p[train], group[train])
    pred = rule.labels(p[test], group[test])
    return float(np.mean(pred == y[test])), pred


def cross_validate(rules: Sequence[str], y: np.ndarray, p: np.ndarray, group: np.ndarray, folds: np.ndarray) -> dict:
    """Per rule: accuracy per held-out fold (fitted on the other folds), mean and sd, and the out-of-fold labels.
    -> {rule: {"accuracy", "accuracy_sd", "accuracy_folds", "positive_rate", "oof"}}."""
    y, p, group, folds = np.asarray(y, dtype=int), np.asarray(p, dtype=float), np.asarray(group), np.asarray(folds)
    out = {}
    for name in rules:
        oof = np.zeros(len(y), dtype=int)
        accs = []
        for k in np.unique(folds):
            acc, pred = _fold_accuracy(name, y, p, group, folds, folds != k, folds == k)
            oof[folds == k] = pred
            accs.append(acc)
        out[name] = {
            "accuracy": float(np.mean(accs)),
            "accuracy_sd": float(np.std(accs, ddof=1)) if len(accs) > 1 else 0.0,
            "accuracy_folds": accs,
            "positive_rate": float(oof.mean()),
            "oof": oof,
        }
    return out


def choose(cv: dict, rules: Sequence[str]) -> str:
    """The rule with the best mean CV accuracy; a tie keeps the one listed first (the simpler)."""
    return max(rules, key=lambda r: (round(cv[r]["accuracy"], 10), -list(rules).index(r)))


def nested_cv(rules: Sequence[str], y: np.ndarray, p: np.ndarray, group: np.ndarray, folds: np.ndarray) -> dict:
    """The selection's own estimate: for each outer fold k, `choose` by cross_validate over the other folds only, fit
    the chosen rule on them and score fold k (fold k's labels reach no selection step).
    -> {"accuracy", "accuracy_sd", "accuracy_folds", "chosen": [rule per outer fold]}."""
    y, p, group, folds = np.asarray(y, dtype=int), np.asarray(p, dtype=float), np.asarray(group), np.asarray(folds)
    accs, chosen = [], []
    for k in np.unique(folds):
        inner = folds != k
        cv = cross_validate(rules, y[inner], p[inner], group[inner], folds[inner])
        name = choose(cv, rules)
        acc, _ = _fold_accuracy(name, y, p, group, folds, inner, ~inner)
        accs.append(acc)
        chosen.append(name)
    return {
        "accuracy": float(np.mean(accs)),
        "accuracy_sd": float(np.std(accs, ddof=1)) if len(accs) > 1 else 0.0,
        "accuracy_folds": accs,
        "chosen": chosen,
    }


SELECTION_RULE = (
    "best mean CV accuracy over the validation folds (grouped by CHQ); a tie keeps the earlier, simpler rule"
)


@dataclass
class Task2Decision:
    """What stage task2 writes: the chosen rule, its submissions (pair_id, label) and metrics/task2.json's figures."""

    chosen: str
    val: pd.DataFrame  # the chosen rule's out-of-fold labels
    test: pd.DataFrame  # the rule fitted on every validation pair, applied to the test probabilities
    metrics: dict


def decide_task2(probs: pd.DataFrame, rules: Sequence[str]) -> Task2Decision:
    """Score every rule by the CHQ-grouped CV over the validation pairs of `probs` (split, pair_id, chq, prob, label,
    fold), keep the best (`choose`), estimate that selection by `nested_cv`, and label the test pairs."""
    val = probs[probs["split"] == "val"].reset_index(drop=True)
    test = probs[probs["split"] == "test"].reset_index(drop=True)
    y, pv, gv, folds = (
        val["label"].to_numpy(int),
        val["prob"].to_numpy(float),
        val["chq"].to_numpy(),
        val["fold"].to_numpy(int),
    )
    cv = cross_validate(rules, y, pv, gv, folds)
    nested = nested_cv(rules, y, pv, gv, folds)
    chosen = choose(cv, rules)
    final = fit_rule(chosen, y, pv, gv)
    pt, gt = test["prob"].to_numpy(float), test["chq"].to_numpy()
    test_labels = final.labels(pt, gt) if len(test) else np.zeros(0, dtype=int)
    metrics = {
        "chosen": chosen,
        "selection_rule": SELECTION_RULE,
        "fitted": final.to_json(),
        "cv": {k: round(cv[chosen][k], 4) for k in ("accuracy", "accuracy_sd")},
        "nested_cv": {
            "accuracy": round(nested["accuracy"], 4),
            "accuracy_sd": round(nested["accuracy_sd"], 4),
            "chosen_per_fold": nested["chosen"],
        },
        "rules": {
            r: {
                "description": CHQ_RULES[r],
                "accuracy": round(c["accuracy"], 4),
                "accuracy_sd": round(c["accuracy_sd"], 4),
                "accuracy_folds": [round(a, 4) for a in c["accuracy_folds"]],
                "val_positive_rate": round(c["positive_rate"], 4),
                "test_positive_rate": round(float(fit_rule(r, y, pv, gv).labels(pt, gt).mean()), 4)
                if len(test)
                else None,
            }
            for r, c in cv.items()
        },
        "val_true_positive_rate": round(float(y.mean()), 4),
        "test_positive_rate": round(float(test_labels.mean()), 4) if len(test) else None,
        "n_val_pairs": len(val),
        "n_val_chqs": int(pd.Series(gv).nunique()),
        "n_test_pairs": len(test),
        "n_test_chqs": int(test["chq"].nunique()),
    }
    return Task2Decision(
        chosen,
        pd.DataFrame({"pair_id": val["pair_id"], "label": cv[chosen]["oof"]}),
        pd.DataFrame({"pair_id": test["pair_id"], "label": test_labels}),
        metrics,
    )
