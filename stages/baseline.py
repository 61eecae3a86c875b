"""Stage `baseline`: LR filter + pairwise rank SVM on the paper's features (§4.4), ablations, submissions.

Selection uses train + validation only: question-grouped K-fold CV over both (mean ± sd), then the model trained
on the two training sets scores validation; the test submission comes from a model retrained on train +
validation with the same params. Writes both models (models/baseline/{val,final}.json, read by `medrank rank`),
the submissions, metrics/task3_val_baseline.json, metrics/baseline.json (the default's CV/LOSO variants, label-shift
check; its seed spread is stage noise_band's) and the per-answer predictions data/processed/baseline/predictions.parquet
(oof / val / test).
The Table 1 / Table 4 rows are analysis/dvc.yaml's `baseline_ablations` (stages/baseline_ablations.py).
"""

from __future__ import annotations

import time

from medrank.stage.runner import run


def main(params_path: str = "params.yaml") -> None:
    from medrank.core import layout as L
    from medrank.task3.inputs import load_tables
    from medrank.core.io import write_json, write_parquet
    from medrank.selection.metrics import gold_from_answers, score_task3
    from medrank.models import baseline as B
    from medrank.models import baseline_protocols as BP
    from medrank.params import load_params
    from medrank.selection.submission import write_task3_submission

    p = load_params(params_path)
    bp = p.baseline
    t0 = time.perf_counter()
    cfg = B.BaselineConfig(bp, tuple(bp.features), p.n_candidates, p.seed)
    answers, labelled, train, val, test, tfidf = load_tables(p, set(bp.features), bp.judged_rows != "none")

    proto = BP.protocols(labelled, cfg, tfidf, L.LABELLED_SPLITS, BP.VARIANTS)
    # validation: trained on the two training sets; test: retrained on train + validation, same params
    model, final = B.fit_baseline(train, cfg, tfidf), B.fit_baseline(labelled, cfg, tfidf)
    pred, test_pred = model.predict(val), final.predict(test)
    write_task3_submission(L.task3_submission("val", "baseline"), pred[["qid", "aid", "label", "score"]])
    write_task3_submission(L.task3_submission("test", "baseline"), test_pred[["qid", "aid", "label", "score"]])
    val_scores = score_task3(gold_from_answers(answers, "val"), L.task3_submission("val", "baseline"))
    model.save(L.BASELINE_MODEL / "val.json")
    final.save(L.BASELINE_MODEL / "final.json")
    rows = BP.prediction_rows(labelled, proto, (pred, model), (test_pred, final))
    write_parquet(rows, L.BASELINE_PREDICTIONS, B.PREDICTIONS)
    task3_val, summary = BP.stage_metrics(cfg, labelled, proto, val_scores, (pred, model), (test_pred, final))
    write_json(L.metrics_file("task3_val_baseline"), task3_val)
    write_json(L.metrics_file("baseline"), {"model": summary, "seconds": round(time.perf_counter() - t0, 1)})


if __name__ == "__main__":
    run(main)
