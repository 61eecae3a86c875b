"""Stage `score`: the final Task 3 system, its submissions, the comparison tables and the paper's error analysis.

Candidates: MTL weight (0 = the baseline's rows alone, 1 = the MTL's alone, between: averaged probabilities and
within-question ranks) × keep rule (medrank.params.rankers.KEEP_RULES) under question-grouped CV and leave-one-source-out,
then the order of the kept answers (ORDERS); `score.system: auto` picks by the written rule (SELECTION_RULE; the noise
band is the larger seed spread of the two defaults, metrics/noise_band.json of the frozen stage noise_band). Never
the 25 validation questions, never test labels; the steps are medrank/selection/final_system.py. Writes submissions/task3_{val,test}.csv, models/system.json (weight, the Keep fitted per target set, the
order, and every knob of the inference path: what `medrank rank` runs), metrics/task3_val.json (every system's val /
CV / LOSO row, the candidate and order tables, `vs_baseline`, `cv_by_split` beside `question_chars_median`),
task3_val_mtl.json / task3_val_ensemble.json (the final system's row) and plots/error_analysis/{val,cv}/*.csv.
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
    sp = p.score
    t0 = time.perf_counter()
    inp = F.read_inputs()
    weights = F.weights_of(sp)
    band = F.noise_band(("accuracy", *sp.select_on, "precision", "mrr", "spearman", "order"))  # the guard's metrics too
    sel = F.select(inp, sp, weights, band)
    F.write_submissions(sel["decided"], inp.cand)
    metrics = F.task3_val_metrics(inp, sel, sp, p.seed, weights, band)
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
