"""Stage `baseline`: LR filter + pairwise rank SVM on the paper's features (§4.4), ablations, submissions.

Selection uses train + validation only: question-grouped K-fold CV over both (mean ± sd), then the model
trained on the two training sets scores validation; the test submission comes from a model retrained on
train + validation with the same params. Writes submissions/task3_{val,test}_baseline.csv,
metrics/task3_val_baseline.json, metrics/baseline.json (Table 1 ablation, Table 4, label-shift check) and the
per-answer predictions data/processed/baseline/predictions.parquet (oof / val / test, for ensembling).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from medrank.runner import run

log = logging.getLogger("stages.baseline")
RETRIEVED = Path("data/processed/retrieved.parquet")
NLI_GRID = Path("data/processed/embeddings/nli_grid.parquet")
BIENC = Path("data/processed/bienc.parquet")
CNN_SCORES = Path("data/processed/cnn_mediqa_scores.parquet")
QA_SCORES = Path("data/processed/qa_scores.parquet")
# per-answer scores of other stages, by feature group: (column, file)
SCORE_FILES = {"bienc": ("bienc_cos", BIENC), "heading": ("heading_cos", BIENC), "cnn": ("cnn_score", CNN_SCORES), "qa": ("qa_score", QA_SCORES)}
VAL_SUBMISSION = "submissions/task3_val_baseline.csv"
TEST_SUBMISSION = "submissions/task3_test_baseline.csv"
VAL_METRICS = "metrics/task3_val_baseline.json"
METRICS = "metrics/baseline.json"
PREDICTIONS = Path("data/processed/baseline/predictions.parquet")
TRAIN_SPLITS = ("train_liveqa", "train_alexa")


def main() -> None:
    from medrank.features import answer_scores, answer_table, cap_questions, fit_tfidf
    import pandas as pd

    from medrank.io import read_parquet, write_json, write_parquet
    from medrank.metrics import gold_from_answers, score_task3
    from medrank.models.baseline import PREDICTIONS as PRED_SCHEMA
    from medrank.models.baseline import BaselineConfig, cross_validate, fit_baseline, holdout, rounded_scores, rounded_summary, source_transfer
    from medrank.params import load_params
    from medrank.submission import write_task3_submission

    p = load_params()
    bp = p.baseline
    t0 = time.perf_counter()
    rows = {"+".join(groups): tuple(groups) for groups in bp.ablations}
    used = set(bp.features).union(*rows.values())

    answers = cap_questions(read_parquet(Path(bp.normalized_dir) / "answers.parquet"), bp.max_questions_per_split)
    inputs: dict = {}
    if used & {"bow", "rqe", "rqe_emb", "anli"}:
        inputs["entailed"] = read_parquet(RETRIEVED)
    if "anli" in used:
        inputs["anli"] = read_parquet(NLI_GRID, columns=["split", "qid", "aid", "entailed_kind", "entailed_rank", "anli"])
    inputs.update({col: answer_scores(answers, read_parquet(path), col, str(path)) for group, (col, path) in SCORE_FILES.items() if group in used})
    table = answer_table(answers, n_candidates=p.n_candidates, **inputs)
    tfidf = None
    if "bow" in used:
        medquad = read_parquet(Path(bp.normalized_dir) / "medquad.parquet", columns=["answer_norm"])
        tfidf = fit_tfidf(medquad["answer_norm"].dropna().tolist(), bp.bow_max_features)
    labelled = table[table["split"] != "test"].reset_index(drop=True)
    train = labelled[labelled["split"].isin(TRAIN_SPLITS)]
    val = labelled[labelled["split"] == "val"]
    test = table[table["split"] == "test"].reset_index(drop=True)

    def config(groups: tuple[str, ...]) -> BaselineConfig:
        return BaselineConfig(
            groups=groups, n_candidates=p.n_candidates, lr_c=bp.lr_c, svm_c=bp.svm_c, rank_target=bp.rank_target,
            threshold=bp.threshold, prior_shift=bp.prior_shift, min_keep=bp.min_keep, inner_folds=bp.cv_folds, seed=p.seed,
        )  # fmt: skip

    # ---- Table 1 (+ extras) and Table 4: every ablation row, CV on train+val and train -> val
    lr_rank = {"lr_rank": {"ranker": "lr"}}
    table1, table4 = {}, {}
    for name, groups in rows.items():
        t1 = time.perf_counter()
        cfg = config(groups)
        cv = cross_validate(labelled, cfg, tfidf, bp.cv_folds, p.seed, lr_rank)
        ho = holdout(train, val, cfg, tfidf, lr_rank)
        table1[name] = {"groups": list(groups), "cv": rounded_summary(cv["base"]), "val": rounded_scores(ho["base"]), "val_threshold": ho["base"]["threshold"]}
        table4[name] = {
            ranker: {"cv_spearman": rounded_summary(cv[key])["spearman"], "cv_spearman_true": rounded_summary(cv[key])["spearman_true"],
                     "cv_mrr": rounded_summary(cv[key])["mrr"], "val_spearman": rounded_scores(ho[key])["spearman"],
                     "val_spearman_true": rounded_scores(ho[key])["spearman_true"], "val_mrr": rounded_scores(ho[key])["mrr"]}
            for ranker, key in (("lr_filter_score", "lr_rank"), ("rank_svm", "base"))
        }  # fmt: skip
        log.info("%-40s cv acc %.3f±%.3f prec %.3f | val acc %.3f prec %.3f spearman %.3f (%.0fs)", name,
                 cv["base"]["accuracy"]["mean"], cv["base"]["accuracy"]["sd"], cv["base"]["precision"]["mean"],
                 ho["base"]["accuracy"], ho["base"]["precision"], ho["base"]["spearman"], time.perf_counter() - t1)  # fmt: skip

    # ---- the configured model: CV with prediction-time variants (label-shift EM, keep-one), source transfer
    cfg = config(tuple(bp.features))
    variants = {
        "prior_shift_none": {"prior_shift": "none"},
        "prior_shift_em": {"prior_shift": "em"},
        "threshold_0.5": {"threshold": 0.5},
        "min_keep_1": {"min_keep": 1},
    }
    cv, oof = cross_validate(labelled, cfg, tfidf, bp.cv_folds, p.seed, variants, with_predictions=True)
    transfer = source_transfer(labelled, cfg, tfidf, {k: variants[k] for k in ("prior_shift_none", "prior_shift_em")})

    # ---- validation: train on the two training sets, score the written submission file officially
    model = fit_baseline(train, cfg, tfidf)
    pred = model.predict(val)
    write_task3_submission(VAL_SUBMISSION, pred[["qid", "aid", "label", "score"]])
    val_scores = score_task3(gold_from_answers(answers, "val"), VAL_SUBMISSION)

    # ---- test: retrain on train + validation (all labelled rows), same params
    final = fit_baseline(labelled, cfg, tfidf)
    test_pred = final.predict(test)
    write_task3_submission(TEST_SUBMISSION, test_pred[["qid", "aid", "label", "score"]])

    parts = [
        oof.assign(part="oof", split=labelled["split"].to_numpy()),
        pred.assign(part="val", split="val", fold=-1, threshold=model.threshold),
        test_pred.assign(part="test", split="test", fold=-1, threshold=final.threshold),
    ]
    write_parquet(pd.concat(parts, ignore_index=True)[PRED_SCHEMA.names], PREDICTIONS, PRED_SCHEMA)
    write_json(
        VAL_METRICS,
        {
            **rounded_scores(val_scores),
            "n_predicted_positive": val_scores["n_predicted_positive"],
            "threshold": model.threshold,
            "features": list(bp.features),
            "cv": rounded_summary(cv["base"]),
            "cv_folds": bp.cv_folds,
            "cv_questions": int(labelled["gid"].nunique()),
            "test_model": {"trained_on": sorted(labelled["split"].unique()), "threshold": final.threshold,
                           "test_predicted_positive_rate": round(float(test_pred["label"].mean()), 4)},
        },
    )  # fmt: skip
    write_json(
        METRICS,
        {
            "table1_ablation": table1,
            "table4_ranking": table4,
            "model": {
                "features": list(bp.features),
                "n_features": len(model.builder.feature_names),
                "cv": rounded_summary(cv["base"]),
                "cv_thresholds": cv["base"]["thresholds"],
                "cv_variants": {k: rounded_summary(cv[k]) for k in variants},
                "source_transfer": {
                    split: {"positive_rate": round(r["positive_rate"], 4), "train_positive_rate": round(r["train_positive_rate"], 4),
                            "em_estimated_rate": round(r["prior_shift_em"]["target_prior"], 4),
                            "none": rounded_scores(r["prior_shift_none"]), "em": rounded_scores(r["prior_shift_em"])}
                    for split, r in transfer.items()
                },
                "val": rounded_scores(val_scores),
            },
            "seconds": round(time.perf_counter() - t0, 1),
        },
    )  # fmt: skip
    log.info("baseline: val acc %.3f prec %.3f mrr %.3f spearman %.3f; cv acc %.3f±%.3f; %.0fs", val_scores["accuracy"],
             val_scores["precision"], val_scores["mrr"], val_scores["spearman"], cv["base"]["accuracy"]["mean"],
             cv["base"]["accuracy"]["sd"], time.perf_counter() - t0)  # fmt: skip


if __name__ == "__main__":
    run(main)
