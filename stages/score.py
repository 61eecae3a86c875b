"""Stage `score`: the final Task 3 system, its submissions, the comparison table and the paper's error analysis.

Candidates: the MTL (stage mtl) and its ensemble with the baseline (stage baseline's per-answer predictions:
averaged probabilities and within-question ranks, threshold chosen on out-of-fold rows); `score.system: auto`
picks the best mean CV accuracy over train+val (never the 25 validation questions). Writes
submissions/task3_{val,test}.csv, metrics/task3_val.json (+ task3_val_mtl.json / task3_val_ensemble.json rows
for the README table) and plots/error_analysis/{val,cv}/*.csv (Figures 7-9). metrics/task3_val.json also holds how
sure the comparison with the baseline is (`vs_baseline`: paired question bootstrap on validation and on the CV
questions), the CV scores per labelled question set beside each split's median question length (`cv_by_split`,
`question_chars_median`: unlabelled text, test included) and by order of the kept answers (`cv_by_order`).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from medrank.runner import run

log = logging.getLogger("stages.score")
NORMALIZED = Path("data/interim/normalized")
MTL_PREDICTIONS = Path("data/processed/mtl_predictions.parquet")
CHIQA_VAL = Path("submissions/task3_val_chiqa.csv")
BASELINE_VAL = Path("submissions/task3_val_baseline.csv")
BASELINE_METRICS = Path("metrics/task3_val_baseline.json")
BASELINE_PREDICTIONS = Path("data/processed/baseline/predictions.parquet")
VAL_OUT, TEST_OUT = Path("submissions/task3_val.csv"), Path("submissions/task3_test.csv")
METRICS = Path("metrics/task3_val.json")
ROW_METRICS = {"mtl": Path("metrics/task3_val_mtl.json"), "ensemble": Path("metrics/task3_val_ensemble.json")}
PLOTS = Path("plots/error_analysis")
TRAIN_SPLITS = ("train_liveqa", "train_alexa")


def main() -> None:
    import json

    import pandas as pd

    from medrank.errors import MedrankError
    from medrank.features import answer_table, question_key
    from medrank.io import read_parquet, write_json, write_text
    from medrank.metrics import gold_from_answers, paired_bootstrap, score_task3, task3_by_question, task3_scores_of
    from medrank.models import mtl
    from medrank.models.baseline import gold_of, ranked_rows, rounded_scores, rounded_summary, submission_score
    from medrank.params import load_params
    from medrank.submission import write_task3_submission

    p = load_params()
    sp = p.score
    t0 = time.perf_counter()
    all_answers = read_parquet(NORMALIZED / "answers.parquet")
    pred = read_parquet(MTL_PREDICTIONS)
    # CV rows: the answers the MTL saw (capped profiles see fewer); validation: always the full official gold
    answers = all_answers.merge(pred[["split", "qid", "aid"]].drop_duplicates(), on=["split", "qid", "aid"])
    cand = answer_table(answers)
    pred = pred.assign(gid=question_key(pred))
    split_of = cand.drop_duplicates("gid").set_index("gid")["split"]
    train = [g for g, s in split_of.items() if s in TRAIN_SPLITS]
    gold_val = gold_from_answers(all_answers, "val")

    def official_val(decided: pd.DataFrame) -> dict:
        rows = ranked_rows(decided[decided["part"] == "val"])
        return score_task3(gold_val, rows[["qid", "aid", "label"]])

    # ---- candidates: the MTL as decided by its stage, the baseline (its stage's files), their ensemble
    systems: dict[str, dict] = {}
    decided: dict[str, pd.DataFrame] = {}
    decided["mtl"] = pred
    systems["mtl"] = {"val": rounded_scores(official_val(pred)), "cv": rounded_summary(mtl.cv_summary_of(pred, cand))}
    systems["chiqa"] = {"val": rounded_scores(score_task3(gold_val, CHIQA_VAL))}
    base_cv = json.loads(BASELINE_METRICS.read_text(encoding="utf-8")).get("cv") if BASELINE_METRICS.exists() else None
    # the written validation files scored officially, per question (summed: the official scores; resampled: the bootstrap)
    val_by_question = {"baseline": task3_by_question(gold_val, BASELINE_VAL)}
    systems["baseline"] = {"val": rounded_scores(task3_scores_of(val_by_question["baseline"])), **({"cv": base_cv} if base_cv else {})}

    base = read_parquet(BASELINE_PREDICTIONS)
    base = base.assign(gid=question_key(base))
    decided["baseline"] = base
    mine = pred[["part", "gid", "aid", "fold", "prob_mean", "rank_key"]].rename(columns={"prob_mean": "prob"})
    theirs = base[["part", "gid", "aid", "prob", "rank_score"]].rename(columns={"rank_score": "rank_key"})
    # the ensemble weight: best mean CV accuracy over score.mtl_weights (the out-of-fold rows of both systems
    # come from the same question-grouped folds); every weight's CV is reported
    by_weight = {w: mtl.decide_system(mtl.combine_systems(mine, theirs, w), cand, train) for w in sp.mtl_weights}
    weight = max(sp.mtl_weights, key=lambda w: by_weight[w][0]["accuracy"]["mean"])
    cv, dec = by_weight[weight]
    decided["ensemble"] = dec.merge(cand[["gid", "split", "qid"]].drop_duplicates(), on="gid", how="left")
    systems["ensemble"] = {"val": rounded_scores(official_val(decided["ensemble"])), "cv": rounded_summary(cv), "mtl_weight": weight,
                           "cv_by_mtl_weight": {str(w): rounded_summary(c) for w, (c, _) in by_weight.items()},
                           "cv_thresholds": cv["thresholds"]}  # fmt: skip

    # ---- the final system: best mean CV accuracy of the MTL and the ensemble (ties: the MTL)
    if sp.system == "auto":
        final = max(("mtl", "ensemble"), key=lambda s: systems[s]["cv"]["accuracy"]["mean"])
    else:
        final = sp.system
    chosen = decided[final]
    for part, path in (("val", VAL_OUT), ("test", TEST_OUT)):
        rows = chosen[chosen["part"] == part]
        if part == "test" and rows.empty:
            raise MedrankError("no test predictions (did the mtl stage see the test split?)")
        q_order = {g: i for i, g in enumerate(pd.unique(cand["gid"]))}
        rows = rows.assign(_q=rows["gid"].map(q_order)).sort_values("_q", kind="stable")
        write_task3_submission(path, rows[["qid", "aid", "label", "score"]])
    val_by_question["final"] = task3_by_question(gold_val, VAL_OUT)
    final_val = task3_scores_of(val_by_question["final"])  # the written file, scored officially

    # ---- the CV questions' out-of-fold rows per question (each system with its own fold thresholds): scores by
    # question set, and the final system minus the baseline by paired question bootstrap (also on validation)
    # (the answers of the candidate table: a capped profile's MTL sees fewer answers than the baseline)
    cv_gids = set(chosen.loc[chosen["part"] == "oof", "gid"])
    cv_cand = cand[cand["gid"].isin(cv_gids)]
    cv_gold = gold_of(cv_cand)

    def oof_by_question(rows: pd.DataFrame) -> pd.DataFrame:
        rows = rows[rows["part"] == "oof"].merge(cv_cand[["gid", "aid"]], on=["gid", "aid"])
        out = task3_by_question(cv_gold, ranked_rows(rows)[["gid", "aid", "label"]].rename(columns={"gid": "qid"}))
        return out.assign(split=out["qid"].map(split_of))

    oof = {"final": oof_by_question(chosen), "baseline": oof_by_question(base)}
    cv_by_split = {name: {s: rounded_scores(task3_scores_of(g)) for s, g in rows.groupby("split", sort=True)} for name, rows in oof.items()}
    # the order of the kept answers trades MRR (the most probably correct first) against Spearman (the reference
    # order): the final system's CV rows re-ordered by its filter probability and by CHiQA's rank, labels unchanged
    final_oof = chosen[chosen["part"] == "oof"].merge(cv_cand[["gid", "aid", "chiqa_rank"]], on=["gid", "aid"])
    gid, kept = final_oof["gid"].to_numpy(), final_oof["label"].to_numpy()
    reordered = {"filter probability": final_oof["prob"].to_numpy(), "CHiQA rank": -final_oof["chiqa_rank"].to_numpy()}
    cv_by_order = {"rank model (submitted)": rounded_scores(task3_scores_of(oof["final"]))} | {
        name: rounded_scores(task3_scores_of(oof_by_question(final_oof.assign(score=submission_score(kept, key, gid))))) for name, key in reordered.items()
    }  # fmt: skip
    # unlabelled inputs only: how each split's questions are written (test: no labels read)
    question_chars = all_answers.drop_duplicates(["split", "qid"]).groupby("split")["question"].apply(lambda q: int(q.fillna("").str.len().median()))
    vs_baseline = None
    if sp.bootstrap_resamples:
        vs_baseline = {
            "resamples": sp.bootstrap_resamples,
            "val": paired_bootstrap(val_by_question["final"], val_by_question["baseline"], sp.bootstrap_resamples, p.seed),
            "cv": paired_bootstrap(oof["final"], oof["baseline"], sp.bootstrap_resamples, p.seed),
        }  # fmt: skip

    for name, path in ROW_METRICS.items():
        if name in systems:
            write_json(path, {**systems[name]["val"], "cv": systems[name].get("cv")})
    write_json(
        METRICS,
        {
            **rounded_scores(final_val),
            "system": final,
            "selection": "best mean accuracy in question-grouped CV over train+val" if sp.system == "auto" else f"fixed by score.system={sp.system}",
            "n_predicted_positive": final_val["n_predicted_positive"],
            "systems": systems,
            "vs_baseline": vs_baseline,
            "cv_by_split": cv_by_split,
            "cv_by_order": cv_by_order,
            "question_chars_median": question_chars.to_dict(),
            "test_predicted_positive_rate": round(float(chosen.loc[chosen["part"] == "test", "label"].mean()), 4),
            "seconds": round(time.perf_counter() - t0, 1),
        },
    )  # fmt: skip

    # ---- error analysis (Figures 7-9) of the final system: validation, and all CV folds (233 questions)
    for where, part in (("val", "val"), ("cv", "oof")):
        rows = chosen[chosen["part"] == part]
        for name, df in mtl.error_analysis(rows, cand).items():
            out = df.copy()
            for c in out.columns:
                if out[c].dtype.kind == "f":
                    out[c] = out[c].round(4)
            write_text(PLOTS / where / f"{name}.csv", out.to_csv(index=False))
    log.info("score: final system %s; val acc %.3f prec %.3f mrr %.3f spearman %.3f (%.0fs)", final, final_val["accuracy"],
             final_val["precision"], final_val["mrr"], final_val["spearman"], time.perf_counter() - t0)  # fmt: skip


if __name__ == "__main__":
    run(main)
