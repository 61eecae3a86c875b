"""Stage `score`: the final Task 3 system, its submissions, the comparison tables and the paper's error analysis.

The system is `score.system`: the baseline, the pick of analysis/dvc.yaml's `system_choice` (the written rule over every
MTL weight of score.mtl_weights; metrics/system_choice.json, RESULTS), so the default DAG trains no MTL. Here its keep
rule (score.keep_rules, medrank.params.rankers.KEEP_RULES) is fitted under question-grouped CV and leave-one-source-out,
then the order of the kept answers (ORDERS) is picked by the written rule (SELECTION_RULE; the noise band is the larger
seed spread of the two defaults, metrics/noise_band.json of the frozen analysis stage noise_band). Never the 25
validation questions, never test labels; the steps are medrank/selection/final_system.py. Writes
submissions/task3_{val,test}.csv, models/system.json (weight, the Keep fitted per target set, the order, and every knob
of the inference path: what `medrank rank` runs), metrics/task3_val.json (every system's val / CV / LOSO row, the
candidate and order tables, `vs_baseline`, `cv_by_split` beside `question_chars_median`), task3_val_ensemble.json (the
final system's row) and plots/error_analysis/{val,cv}/*.csv.
"""

from __future__ import annotations

import logging
import time

from medrank.stage.runner import run

log = logging.getLogger("stages.score")


def main(params_path: str = "params.yaml") -> None:
    from medrank.selection import final_system as F
    from medrank.core import layout as L
    from medrank.core.io import write_json, write_sealed_json
    from medrank.params import load_params

    p = load_params(params_path)
    t0 = time.perf_counter()
    inp, sel, metrics = F.decide(p.score, p.seed, F.SCORE_WEIGHTS)
    F.write_submissions(sel["decided"], inp.cand)
    for name, row in F.system_rows(metrics).items():
        write_json(L.metrics_file(name), row)
    write_sealed_json(L.SYSTEM, F.system_record(sel))  # record_sha256: an edited decision is refused at load
    write_json(L.metrics_file("task3_val"), metrics)  # an input of nested_loso: its timing apart
    write_json(L.metrics_file("score_seconds"), {"total": round(time.perf_counter() - t0, 1)})
    F.write_error_analysis(sel["decided"], inp.cand)
    log.info(
        "score: final system %s; val acc %.3f prec %.3f mrr %.3f spearman %.3f (%.0fs)",
        metrics["system"],
        metrics["accuracy"],
        metrics["precision"],
        metrics["mrr"],
        metrics["spearman"],
        time.perf_counter() - t0,
    )


if __name__ == "__main__":
    run(main)
