"""Stage `score`: the final Task 3 system, its submissions, the comparison tables and the paper's error analysis.

Candidates: MTL weight (0 = the baseline's rows alone, 1 = the MTL's alone, between: averaged probabilities and
within-question ranks) × keep rule (medrank.decision.KEEP_RULES) under question-grouped CV and leave-one-source-out,
then the order of the kept answers (ORDERS); `score.system: auto` picks by the written rule (SELECTION_RULE; the noise
band is the larger seed spread of the two defaults, metrics/noise_band.json of the frozen stage noise_band). Never the 25 validation questions, never
test labels. Writes submissions/task3_{val,test}.csv, models/system.json (weight, the Keep fitted per target set, the
order, and every knob of the inference path: what `medrank rank` runs), metrics/task3_val.json (every system's val /
CV / LOSO row, the candidate and order tables, `vs_baseline`, `cv_by_split` beside `question_chars_median`),
task3_val_mtl.json / task3_val_ensemble.json (the final system's row) and plots/error_analysis/{val,cv}/*.csv.
"""

from __future__ import annotations

import logging
import time

from medrank.runner import run

log = logging.getLogger("stages.score")
SELECTION_RULE = (
    "MTL weight and keep rule: the highest mean, over the metrics of score.select_on, of CV and LOSO mean; candidates "
    "within the noise band (the larger seed spread of the two systems' defaults) of the best count as tied and the simplest wins "
    "(keep rules in the listed order, a single system before an ensemble). Order of the kept answers: the same rule "
    "on the mean of MRR and official Spearman."
)


def main(params_path: str = "params.yaml") -> None:
    import json

    import pandas as pd

    from medrank import evaluation as E
    from medrank import layout as L
    from medrank.errors import MedrankError
    from medrank.features import answer_table, question_key
    from medrank.io import read_parquet, write_json, write_text
    from medrank.metrics import gold_from_answers, score_task3, task3_by_question, task3_scores_of
    from medrank.params import inference_recipe, load_params
    from medrank.submission import write_task3_submission

    p = load_params(params_path)
    sp = p.score
    t0 = time.perf_counter()
    all_answers = read_parquet(L.ANSWERS)
    pred = read_parquet(L.MTL_PREDICTIONS)
    # CV rows: the answers the MTL saw (capped profiles see fewer); validation: always the full official gold
    cand = answer_table(all_answers.merge(pred[["split", "qid", "aid"]].drop_duplicates(), on=["split", "qid", "aid"]))
    pred = pred.assign(gid=question_key(pred))
    base = read_parquet(L.BASELINE_PREDICTIONS)
    base = base.assign(gid=question_key(base))
    gold_val = gold_from_answers(all_answers, L.VAL_SPLIT)
    weights = {
        "auto": sp.mtl_weights,
        "baseline": [0.0],
        "mtl": [1.0],
        "ensemble": [w for w in sp.mtl_weights if 0 < w < 1],
    }[sp.system]
    if not weights:
        raise MedrankError("score.system: ensemble needs an MTL weight strictly between 0 and 1 in score.mtl_weights")
    base_metrics = json.loads(L.metrics_file("task3_val_baseline").read_text(encoding="utf-8"))
    mtl_metrics = json.loads(L.metrics_file("mtl").read_text(encoding="utf-8"))
    # the noise band of the written rule: the larger seed spread of the two systems' defaults (stage noise_band)
    spreads = json.loads(L.metrics_file("noise_band").read_text(encoding="utf-8"))
    band = E.noise_band([spreads["baseline"], spreads["mtl"]], ("accuracy", *sp.select_on, "order"))
    sel = E.candidate_systems(
        pred,
        base,
        cand,
        E.split_questions(cand, L.TRAIN_SPLITS),
        weights,
        sp.keep_rules,
        sp.orders,
        L.LABELLED_SPLITS,
        band,
        sp.select_on,
    )
    final = E.system_name(sel["weight"])
    chosen = sel["decided"]
    q_order = {g: i for i, g in enumerate(pd.unique(cand["gid"]))}
    for part in ("val", "test"):
        rows = chosen[chosen["part"] == part]
        if part == "test" and rows.empty:
            raise MedrankError("no test predictions (did the mtl stage see the test split?)")
        rows = rows.assign(_q=rows["gid"].map(q_order)).sort_values("_q", kind="stable")
        write_task3_submission(L.task3_submission(part), rows[["qid", "aid", "label", "score"]])
    # the written validation files scored officially, per question (summed: the official scores; resampled: the bootstrap)
    val_q = {
        "final": task3_by_question(gold_val, L.task3_submission("val")),
        "baseline": task3_by_question(gold_val, L.task3_submission("val", "baseline")),
    }
    final_val = task3_scores_of(val_q["final"])
    cv_q, cv_by_split, cv_by_order = E.cv_comparisons(
        chosen, base, cand, {"filter probability": ("prob", True), "CHiQA rank": ("chiqa_rank", False)}
    )

    # CHiQA keeps every answer in its own order: scored on the same CV folds and held-out sources
    chiqa = E.held_out_copies(
        cand[["gid", "aid", "split", "chiqa_rank"]].assign(label=1, score=-cand["chiqa_rank"]),
        sp.cv_folds,
        p.seed,
        L.LABELLED_SPLITS,
    )
    cnn_metrics = json.loads(L.metrics_file("cnn_mediqa").read_text(encoding="utf-8"))
    rows = {
        "mtl": {
            "val": E.rounded_scores(
                score_task3(gold_val, E.ranked_rows(pred[pred["part"] == "val"])[["qid", "aid", "label"]])
            ),
            "cv": E.rounded_summary(mtl_metrics["cv"]),
            "loso": mtl_metrics["loso"],
        },
        "chiqa": {
            "val": E.rounded_scores(score_task3(gold_val, L.task3_submission("val", "chiqa"))),
            "cv": E.rounded_summary(E.cv_summary_of(chiqa, cand)),
            "loso": E.loso_summary_of(chiqa, cand, L.LABELLED_SPLITS),
        },
        "baseline": {
            "val": E.rounded_scores(task3_scores_of(val_q["baseline"])),
            "cv": base_metrics["cv"],
            "loso": base_metrics["loso"],
        },
        "cnn": {"val": E.rounded_scores(cnn_metrics["val"]), "cv": cnn_metrics["cv"], "loso": cnn_metrics["loso"]},
        "final": {
            "val": E.rounded_scores(final_val),
            "cv": E.rounded_summary(sel["cv"]),
            "loso": sel["loso"],
            "mtl_weight": sel["weight"],
            "keep_rule": sel["rule"],
            "order": sel["order"],
        },
    }
    candidates = {
        str(w): {
            r: {"cv": E.rounded_summary(c["cv"]), "loso": c["loso"], "score": round(c["score"], 4)}
            for r, c in by_rule.items()
        }
        for w, by_rule in sel["table"].items()
    }
    orders = {
        o: {"cv": E.rounded_summary(c["cv"]), "loso": c["loso"], "score": round(c["score"], 4)}
        for o, c in sel["orders"].items()
    }
    for name in ("mtl", "final"):
        write_json(
            L.metrics_file("task3_val_mtl" if name == "mtl" else "task3_val_ensemble"),
            {**rows[name]["val"], "cv": rows[name]["cv"], "loso": rows[name]["loso"]},
        )
    write_json(
        L.SYSTEM,
        {
            "system": final,
            "mtl_weight": sel["weight"],
            "keep": {k: v for k, v in sel["fits"].items() if k in ("val", "test")},
            "keep_rule": sel["rule"],
            "order": sel["order"],
            "recipe": inference_recipe(p),
        },
    )
    write_json(
        L.metrics_file("task3_val"),
        {
            **E.rounded_scores(final_val),
            "system": final,
            "mtl_weight": sel["weight"],
            "keep_rule": sel["rule"],
            "order": sel["order"],
            "selection": {
                "rule": SELECTION_RULE,
                "noise_band": band,
                "weights": [float(w) for w in weights],
                "keep_rules": list(sp.keep_rules),
                "orders": list(sp.orders),
                "select_on": list(sp.select_on),
            },
            "n_predicted_positive": final_val["n_predicted_positive"],
            "systems": rows,
            "candidates": candidates,
            "orders": orders,
            "keep_fits": sel["fits"],
            "vs_baseline": E.vs_baseline(val_q, cv_q, sp.bootstrap_resamples, p.seed),
            "cv_by_split": cv_by_split,
            "cv_by_order": cv_by_order,
            "question_chars_median": E.question_chars_median(all_answers),
            "test_predicted_positive_rate": round(float(chosen.loc[chosen["part"] == "test", "label"].mean()), 4),
            "seconds": round(time.perf_counter() - t0, 1),
        },
    )
    # error analysis (Figures 7-9) of the final system: validation, and all CV folds
    for where, part in (("val", "val"), ("cv", "oof")):
        for name, df in E.error_analysis(chosen[chosen["part"] == part], cand).items():
            write_text(L.ERROR_ANALYSIS / where / f"{name}.csv", E.rounded_csv(df))
    log.info(
        "score: final system %s; val acc %.3f prec %.3f mrr %.3f spearman %.3f (%.0fs)",
        final,
        final_val["accuracy"],
        final_val["precision"],
        final_val["mrr"],
        final_val["spearman"],
        time.perf_counter() - t0,
    )


if __name__ == "__main__":
    run(main)
