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

from medrank.core.runner import run


def main(params_path: str = "params.yaml") -> None:
    import pandas as pd
    from dvclive import Live

    from medrank.core import layout
    from medrank.core.io import write_json, write_parquet
    from medrank.models import rqe_choice
    from medrank.models import rqe_training as R
    from medrank.params import load_params
    from medrank.task2.decisions import PROBS_SCHEMA

    p = load_params(params_path)
    tp = p.finetune.rqe
    inputs = R.read_inputs(p, tp)
    with Live(dir=str(layout.plots_dir("finetune_rqe")), dvcyaml=None, save_dvc_exp=False) as live:
        live.log_params(tp.model_dump())
        trainer = R.Trainer(p, tp, inputs.data, live)
        sel = trainer.select(inputs)
        final_ce, ce_recipe, final_bi = trainer.final_models(sel)
        live.log_metric("cv/accuracy", sel.rows[sel.chosen]["accuracy"], plot=False)
    test_prob, stack = R.test_probabilities(sel, inputs, trainer, final_ce, final_bi)
    write_parquet(R.task2_probs(sel, inputs, test_prob), layout.TASK2_PROBS, PROBS_SCHEMA)
    chosen, data, qtypes = sel.rows[sel.chosen], inputs.data, inputs.qtypes
    recipe = {
        **sel.recipe.as_dict(),
        "cross_encoder": {"extras": list(ce_recipe[0]), "val_stage": ce_recipe[1]},
        "stack": stack,
    }
    metrics = {
        "task": "rqe",
        "base_model": tp.base_model,
        "base_fingerprint": final_ce.base_fingerprint,
        "chosen": sel.chosen,
        # the rows this stage trains (finetune.rqe): analysis rqe_selection's choice must be among them
        "trained": {"extra_sets": tp.extra_sets, "bi_encoder_sets": tp.bi_encoder_sets, "val_stages": tp.val_stages},
        "recipe": recipe,
        "selection_rule": R.SELECTION_RULE,
        "cv": {k: chosen[k] for k in ("accuracy", "accuracy_sd", "auc", "same_focus", "by_overlap")},
        "vs": rqe_choice.paired_differences(sel, data),
        "rows": sel.rows,
        "n_val_pairs": len(data.y),
        "n_val_questions": int(pd.Series(data.chq).nunique()),
        "n_pretrain_pairs": sel.pretrain_pairs,
        "question_types": {
            "types": qtypes.types,
            "val_faq_types": pd.Series(qtypes.predict(data.faq)).value_counts().to_dict(),
        },
        "train_precision": trainer.precision,
        "threads": final_ce.threads,
        "seconds": trainer.seconds,
        "predict_speed": dict(final_ce.last_predict_stats),
        "test_mean_prob": round(float(test_prob.mean()), 4) if len(test_prob) else None,
    }
    meta = {"task": "rqe", "recipe": recipe, "cv_accuracy": chosen["accuracy"]}
    # the cross-encoder's save replaces the whole folder (no stale bi-encoder survives); the bi-encoder goes inside it
    metrics["model_fingerprint"] = final_ce.save(layout.finetuned_model("rqe"), extra_meta=meta)
    if final_bi is not None:
        metrics["bi_encoder_fingerprint"] = final_bi.save(layout.RQE_BI_MODEL)
    write_json(layout.metrics_file("finetune_rqe"), metrics)


if __name__ == "__main__":
    run(main)
