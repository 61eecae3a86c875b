"""Stage `mtl`: train the multi-task filter + pairwise re-ranker (paper §4.5-4.6).

Question-grouped CV over train+val (out-of-fold predictions choose the threshold and give mean ± sd), LOSO (the seed
spread is stage noise_band's), a train-only model checked on the 25 validation questions, and the final model on
train+val for test; the fits run `mtl.workers` side by side. Writes models/mtl/ (final bag; val/ = the train-only bag),
data/processed/mtl_predictions.parquet, metrics/mtl.json and dvclive curves plots/mtl/. The ablation rows and their
confirmation under several seeds are analysis/dvc.yaml's `mtl_ablations` and `mtl_confirm`.
"""

from __future__ import annotations

import logging
import time

from medrank.stage.runner import run

log = logging.getLogger("stages.mtl")


def main(params_path: str = "params.yaml") -> None:
    import torch

    from medrank.core import layout as L
    from medrank.core.live import stage_live
    from medrank.selection.evaluation import rounded
    from medrank.core.io import write_json, write_parquet
    from medrank.models import mtl
    from medrank.models.mtl.setup import prepare
    from medrank.params import load_params
    from medrank.selection.submission import write_task3_submission

    p = load_params(params_path)
    mp = p.mtl
    t_start = time.perf_counter()
    s = prepare(p, {"mtl.augment": mp}, params_path)
    report = s.recipe(mp, p.seed, stage_live("mtl"))
    meta = {"n_candidates": p.n_candidates}
    report.final_model.save(L.MTL_MODEL, extra_meta={"decision": report.decisions["final"], **meta})
    report.val_model.save(L.MTL_MODEL / "val", extra_meta={"decision": report.decisions["val"], **meta})
    write_parquet(report.predictions, L.MTL_PREDICTIONS, mtl.PREDICTIONS_SCHEMA)
    # the paper's system as it decides on its own (its keep rule and order), beside the baseline's and the final files
    for part in ("val", "test"):
        rows = report.predictions[report.predictions["part"] == part]
        write_task3_submission(L.task3_submission(part, "mtl"), rows[["qid", "aid", "label", "score"]])
    # timings apart: metrics/mtl.json is an input of score, which a re-run with the same results must not change
    seconds = {**report.metrics.pop("seconds"), "total": round(time.perf_counter() - t_start, 1)}
    metrics = {**report.metrics, "device": str(s.device), "threads": torch.get_num_threads()}
    write_json(L.metrics_file("mtl"), rounded(metrics))
    write_json(L.metrics_file("mtl_seconds"), rounded(seconds))
    log.info(
        "mtl: CV accuracy %.3f ± %.3f, val accuracy %.3f, in %.0fs",
        metrics["cv"]["accuracy"]["mean"],
        metrics["cv"]["accuracy"]["sd"],
        metrics["val"]["accuracy"],
        seconds["total"],
    )


if __name__ == "__main__":
    run(main)
