"""DVC stage `finetune_rqe`: RQE for consumer questions, selected where the users' questions are.

The stage trains the rows of `finetune.rqe` (the sets analysis/dvc.yaml's `rqe_selection` chose: that stage measures every candidate row of
`analysis.rqe` the same way, writes metrics/rqe_selection.json and trains no final model; steps: models/rqe_training.py).
Every row of models/rqe.py is measured by question-grouped CV over the 302 Task 2 validation pairs (the only
labelled pairs with consumer CHQs; folds grouped by CHQ): each set of extra training sources alone ("amia" alone is
yesterday's recipe), each set then fine-tuned on the other folds' validation pairs, validation pairs only, the
zero-shot bi-encoder cosine, and stacks with the cosine and the question-type agreement. The row with the best mean
CV accuracy is kept; the final model is that recipe trained on every validation pair (its pretrained first step is
the one the CV already trained). data/processed/task2_probs.parquet holds the chosen row's out-of-fold P(entailed) of
the validation pairs (honest: the final model has seen every validation pair) with their folds, and the final model's
P(entailed) of the test pairs: stage `task2` decides them within each CHQ and writes the submissions.
"""

from __future__ import annotations

from medrank.stage.runner import run


def main(params_path: str = "params.yaml") -> None:
    from medrank.core import layout
    from medrank.core.io import write_json, write_parquet
    from medrank.core.live import stage_live
    from medrank.models import rqe_training as R
    from medrank.params import load_params
    from medrank.task2.rules import PROBS_SCHEMA

    p = load_params(params_path)
    tp = p.finetune.rqe
    inputs = R.read_inputs(p, tp)
    with stage_live("finetune_rqe", tp) as live:
        trainer = R.Trainer(p, tp, inputs.data, live)
        sel = trainer.select(inputs)
        final_ce, ce_recipe, final_bi = trainer.final_models(sel)
        live.log_metric("cv/accuracy", sel.rows[sel.chosen]["accuracy"], plot=False)
    test_prob, stack = R.test_probabilities(sel, inputs, trainer, final_ce, final_bi)
    write_parquet(R.task2_probs(sel, inputs, test_prob), layout.TASK2_PROBS, PROBS_SCHEMA)
    recipe = R.final_recipe(sel, ce_recipe, stack)
    metrics = R.final_metrics(sel, inputs, trainer, final_ce, recipe, test_prob)
    meta = {"task": "rqe", "recipe": recipe, "cv_accuracy": sel.rows[sel.chosen]["accuracy"]}
    # the cross-encoder's save replaces the whole folder (no stale bi-encoder survives); the bi-encoder goes inside it
    metrics["model_fingerprint"] = final_ce.save(layout.finetuned_model("rqe"), extra_meta=meta)
    if final_bi is not None:
        metrics["bi_encoder_fingerprint"] = final_bi.save(layout.RQE_BI_MODEL)
    write_json(layout.metrics_file("finetune_rqe"), metrics)


if __name__ == "__main__":
    run(main)
