"""Stage `nested_loso` (analysis/dvc.yaml): the final system's selection procedure under nested leave-one-source-out.

For each labelled source (train_liveqa, train_alexa, val): the baseline and the MTL (their default recipes) are
refitted on the other two sources (question-grouped CV over them, and leave-one-of-the-two-out), the score stage's
written rule picks MTL weight x keep rule, then the order, on those rows only, and the held-out source is scored by
the pick (medrank.selection.nested). Writes metrics/nested_loso.json: per source the pick and its official scores, the mean and
worst source per metric, the plain (selection-time) LOSO of the final system beside it and how far it over-states,
each keep rule alone (weight and order still chosen inside), the pick and each keep rule alone under resampled priors
(`analysis.nested.resample`: each held-out source resampled to every rate, the keep rule re-run on each batch; key
`resampled`), and the rows of `analysis.nested.variants` (other feature
groups for both systems, e.g. the fine-tuned QA bi-encoder's) under the same protocol, beside the default. The noise band of the rule is the score stage's (the defaults' seed spread: a tolerance, not a label of any source).
"""

from __future__ import annotations

import logging
import time

from medrank.stage.runner import run

log = logging.getLogger("stages.nested_loso")


def main(params_path: str = "params.yaml") -> None:
    import json

    from medrank.core import layout as L
    from medrank.models import nested_refits as N
    from medrank.selection.evaluation import rounded
    from medrank.core.io import write_json
    from medrank.params import load_params

    p = load_params(params_path)
    t0 = time.perf_counter()
    recipes = N.recipes(p)
    final = json.loads(L.metrics_file("task3_val").read_text(encoding="utf-8"))
    band = N.noise_band()
    results, seconds, _ = N.run_all(p, recipes, band, log)
    out = N.report(p, recipes, results, band, final)
    write_json(
        L.metrics_file("nested_loso"),
        rounded({**out, "seconds": {**seconds, "total": round(time.perf_counter() - t0, 1)}}),
    )
    r, plain = results["default"], final["systems"]["final"]["loso"]
    log.info(
        "nested LOSO accuracy %.3f (worst %.3f %s); plain LOSO %.3f",
        r["accuracy"]["mean"],
        r["accuracy"]["worst"],
        r["accuracy"]["worst_source"],
        plain["accuracy"]["mean"],
    )
    acc = (r.get("resampled") or {}).get("accuracy")
    if acc:  # no key: resample.draws 0; None: no rate that every held-out source reaches
        log.info(
            "resampled priors: accuracy %.3f over the rates (worst rate %.3f at %g; worst source %s %.3f at %g)",
            acc["mean"],
            acc["worst"],
            acc["worst_prior"],
            acc["band"]["worst_fold"],
            acc["band"]["worst"],
            acc["band"]["worst_prior"],
        )


if __name__ == "__main__":
    run(main)
