"""Stage `task2`: the Task 2 submissions, decided within each CHQ (medrank.task2) from finetune_rqe's P(entailed).

Every rule of `task2.rules` is scored by the CHQ-grouped CV over the 302 validation pairs (finetune_rqe's folds and
its out-of-fold probabilities; a rule's floor/margin fitted on the other folds); the best mean CV accuracy wins (a tie
keeps the earlier, simpler rule), and the nested CV (the choice made on the other folds only) is the estimate of that
selection. The validation submission holds the chosen rule's out-of-fold labels; the test submission the rule fitted
on every validation pair, applied to the final RQE model's test probabilities. Writes submissions/task2_{val,test}.csv
and metrics/task2.json (each rule's CV accuracy and predicted-positive rates beside validation's true rate).
"""

import logging

from medrank.runner import run

log = logging.getLogger("stages.task2")
SELECTION_RULE = (
    "best mean CV accuracy over the validation folds (grouped by CHQ); a tie keeps the earlier, simpler rule"
)


def main(params_path: str = "params.yaml") -> None:
    import numpy as np
    import pandas as pd

    from medrank import layout
    from medrank import task2 as T
    from medrank.io import read_parquet, write_json
    from medrank.metrics import score_task2
    from medrank.params import load_params
    from medrank.submission import write_task2_submission

    p = load_params(params_path)
    rules = list(p.task2.rules)
    probs = read_parquet(layout.TASK2_PROBS)
    val, test = (
        probs[probs["split"] == "val"].reset_index(drop=True),
        probs[probs["split"] == "test"].reset_index(drop=True),
    )
    y, pv, gv, folds = (
        val["label"].to_numpy(int),
        val["prob"].to_numpy(float),
        val["chq"].to_numpy(),
        val["fold"].to_numpy(int),
    )
    cv = T.cross_validate(rules, y, pv, gv, folds)
    nested = T.nested_cv(rules, y, pv, gv, folds)
    chosen = T.choose(cv, rules)
    final = T.fit_rule(chosen, y, pv, gv)
    test_labels = (
        final.labels(test["prob"].to_numpy(float), test["chq"].to_numpy()) if len(test) else np.zeros(0, dtype=int)
    )
    val_out, test_out = layout.TASK2_SUBMISSIONS["val"], layout.TASK2_SUBMISSIONS["test"]
    write_task2_submission(val_out, pd.DataFrame({"pair_id": val["pair_id"], "label": cv[chosen]["oof"]}))
    write_task2_submission(test_out, pd.DataFrame({"pair_id": test["pair_id"], "label": test_labels}))
    n_gold = sum(1 for line in layout.RQE_VAL_GOLD.read_text(encoding="utf-8").splitlines()[1:] if line.strip())
    full = len(val) == n_gold  # a capped (smoke) profile scores fewer pairs than the official gold holds
    write_json(
        layout.metrics_file("task2"),
        {
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
                    "description": T.CHQ_RULES[r],
                    "accuracy": round(c["accuracy"], 4),
                    "accuracy_sd": round(c["accuracy_sd"], 4),
                    "accuracy_folds": [round(a, 4) for a in c["accuracy_folds"]],
                    "val_positive_rate": round(c["positive_rate"], 4),
                    "test_positive_rate": round(
                        float(
                            T.fit_rule(r, y, pv, gv).labels(test["prob"].to_numpy(float), test["chq"].to_numpy()).mean()
                        ),
                        4,
                    )
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
            "val_official_oof": score_task2(layout.RQE_VAL_GOLD, val_out) if full else None,
        },
    )
    log.info(
        "task2: %s (CV accuracy %.3f, nested %.3f); test positive rate %.2f (validation %.2f)",
        chosen,
        cv[chosen]["accuracy"],
        nested["accuracy"],
        float(test_labels.mean()) if len(test) else float("nan"),
        float(y.mean()),
    )


if __name__ == "__main__":
    run(main)
