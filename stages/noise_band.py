"""Stage `noise_band` (frozen): the written rule's tolerance, the seed spread of the two systems' default recipes.

The baseline's and the MTL's CV + LOSO over train+val re-run under `noise_band.seeds` seeds (the top-level seed and the
next ones: folds, inner folds, initialisation); per metric, the sd over seeds of its selection score (mean of CV and
LOSO mean), and of the order score (evaluation.seed_spread). The band is a property of the committed defaults, so the
stage is frozen (analysis/dvc.yaml): `dvc repro` and `dvc exp run` read it instead of fitting 3x the networks in every experiment. After a
change of a default, refresh it: `python -m stages.noise_band && dvc commit -f analysis/dvc.yaml:noise_band` (DVC never runs a frozen
stage's command; docs/experiments.md). A test checks that analysis/dvc.lock records it for the committed params and data.
Writes metrics/noise_band.json (read by score, system_choice and nested_loso) and its timings, metrics/noise_band_seconds.json.
"""

from __future__ import annotations

import logging
import time

from medrank.stage.runner import run

log = logging.getLogger("stages.noise_band")


def main(params_path: str = "params.yaml") -> None:
    from medrank.core import layout as L
    from medrank.task3.inputs import load_tables
    from medrank.core.io import write_json
    from medrank.models import baseline as B
    from medrank.models import baseline_protocols as BP
    from medrank.models.mtl.setup import prepare
    from medrank.params import load_params

    p = load_params(params_path)
    bp, mp = p.baseline, p.mtl
    t0 = time.perf_counter()
    seeds = [p.seed + i for i in range(p.noise_band.seeds)]
    # the baseline: its protocols under each seed (folds, inner-CV folds, rank-SVM pair flips)
    _, labelled, *_, tfidf = load_tables(p, set(bp.features), bp.judged_rows != "none")
    cfg = B.BaselineConfig(bp, tuple(bp.features), p.n_candidates, p.seed)
    baseline = BP.spread_over_seeds(labelled, cfg, tfidf, L.LABELLED_SPLITS, len(seeds))
    t_base = time.perf_counter() - t0
    # the MTL: run_recipe's CV and LOSO fits under each seed (the same jobs: the first seed's are the mtl stage's)
    mtl_spread = prepare(p, {"mtl.augment": mp}, params_path).spread(mp, seeds)
    # timings apart: metrics/noise_band.json is an input of score, which a refresh with the same band must not change
    write_json(
        L.metrics_file("noise_band"),
        {"seeds": seeds, "baseline": baseline, "mtl": mtl_spread, "n_candidates": p.n_candidates},
    )
    total = time.perf_counter() - t0
    write_json(L.metrics_file("noise_band_seconds"), {"baseline": round(t_base, 1), "total": round(total, 1)})
    log.info(
        "noise band over seeds %s: accuracy baseline %.4f, MTL %.4f (%.0fs)",
        seeds,
        baseline["accuracy"],
        mtl_spread["accuracy"],
        total,
    )


if __name__ == "__main__":
    run(main)
