"""Stage `task2`: the Task 2 submissions, decided within each CHQ (medrank.task2.rules) from finetune_rqe's P(entailed).

Every rule of `task2.rules` is scored by the CHQ-grouped CV over the 302 validation pairs (finetune_rqe's folds and
its out-of-fold probabilities; a rule's floor/margin fitted on the other folds); the best mean CV accuracy wins (a tie
keeps the earlier, simpler rule), and the nested CV (the choice made on the other folds only) is the estimate of that
selection. The validation submission holds the chosen rule's out-of-fold labels; the test submission the rule fitted
on every validation pair, applied to the final RQE model's test probabilities. Writes submissions/task2_{val,test}.csv
and metrics/task2.json (each rule's CV accuracy and predicted-positive rates beside validation's true rate).
"""

import logging

from medrank.stage.runner import run

log = logging.getLogger("stages.task2")


def main(params_path: str = "params.yaml") -> None:
    from medrank.core import layout
    from medrank.task2 import rules as T
    from medrank.core.io import read_parquet, write_json
    from medrank.selection.metrics import score_task2
    from medrank.params import load_params
    from medrank.selection.submission import write_task2_submission

    p = load_params(params_path)
    d = T.decide_task2(read_parquet(layout.TASK2_PROBS), list(p.task2.rules))
    val_out, test_out = layout.TASK2_SUBMISSIONS["val"], layout.TASK2_SUBMISSIONS["test"]
    write_task2_submission(val_out, d.val)
    write_task2_submission(test_out, d.test)
    n_gold = sum(1 for line in layout.RQE_VAL_GOLD.read_text(encoding="utf-8").splitlines()[1:] if line.strip())
    full = len(d.val) == n_gold  # a capped (smoke) profile scores fewer pairs than the official gold holds
    official = score_task2(layout.RQE_VAL_GOLD, val_out) if full else None
    write_json(layout.metrics_file("task2"), {**d.metrics, "val_official_oof": official})
    m = d.metrics
    log.info(
        "task2: %s (CV accuracy %.3f, nested %.3f); test positive rate %s (validation %.2f)",
        d.chosen,
        m["cv"]["accuracy"],
        m["nested_cv"]["accuracy"],
        m["test_positive_rate"],
        m["val_true_positive_rate"],
    )


if __name__ == "__main__":
    run(main)
