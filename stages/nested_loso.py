"""Stage `nested_loso` (analysis/dvc.yaml): the final system's selection procedure under nested leave-one-source-out.

For each labelled source (train_liveqa, train_alexa, val): the baseline and the MTL (their default recipes) are
refitted on the other two sources (question-grouped CV over them, and leave-one-of-the-two-out), the score stage's
written rule picks MTL weight x keep rule, then the order, on those rows only, and the held-out source is scored by
the pick (medrank.nested). Writes metrics/nested_loso.json: per source the pick and its official scores, the mean and
worst source per metric, the plain (selection-time) LOSO of the final system beside it and how far it over-states,
each keep rule alone (weight and order still chosen inside), and the rows of `analysis.nested.variants` (other feature
groups for both systems, e.g. the fine-tuned QA bi-encoder's) under the same protocol, beside the default. The noise band of the rule is the score stage's (the defaults' seed spread: a tolerance, not a label of any source).
"""

from __future__ import annotations

import logging
import time

from medrank.runner import run

log = logging.getLogger("stages.nested_loso")


def main(params_path: str = "params.yaml") -> None:
    import json

    import pandas as pd
    import torch

    from medrank import layout as L
    from medrank import nested
    from medrank.encoders.hardware import resolve_device
    from medrank.encoders.runtime import deterministic_torch, fixed_blas_threads
    from medrank.evaluation import noise_band, rounded
    from medrank.features import answer_table, medquad_tfidf
    from medrank.inputs import load_tables
    from medrank.io import write_json
    from medrank.models import baseline as B
    from medrank.models import mtl
    from medrank.params import load_params

    p = load_params(params_path)
    mp, bp = p.mtl, p.baseline
    t0 = time.perf_counter()
    if mp.threads:
        torch.set_num_threads(mp.threads)
    device = resolve_device(p.device)
    rows = {"default": (list(bp.features), list(mp.feature_groups), list(p.score.select_on))}
    rows |= {
        v.name: (
            list(v.baseline_features or bp.features),
            list(v.mtl_feature_groups or mp.feature_groups),
            list(v.select_on or p.score.select_on),
        )
        for v in p.analysis.nested.variants
    }
    groups = set().union(*(set(b) | set(m) for b, m, _ in rows.values()))
    answers, data = mtl.read_mtl_data(p, groups)
    tfidf_mtl = medquad_tfidf(mp.tfidf_max_features) if "bow" in groups else None
    _, labelled, _, _, _, tfidf = load_tables(p, groups, bp.judged_rows != "none")
    cand = answer_table(answers)
    cand = cand[cand["split"].isin(L.LABELLED_SPLITS)].reset_index(drop=True)
    final = json.loads(L.metrics_file("task3_val").read_text(encoding="utf-8"))
    # the rule's tolerance: the defaults' seed spreads (as stage score), for every metric a row may select on
    spreads = json.loads(L.metrics_file("noise_band").read_text(encoding="utf-8"))
    band = noise_band([spreads["baseline"], spreads["mtl"]], ("accuracy", *nested.METRICS[:4], "order"))
    fits: dict[
        tuple, pd.DataFrame
    ] = {}  # rows of one recipe for one held-out source: shared by rows that differ in select_on only

    def memo(key: tuple, make_rows) -> pd.DataFrame:
        if key not in fits:
            fits[key] = make_rows()
        return fits[key]

    results, seconds = {}, {}
    for name, (base_groups, mtl_groups, select_on) in rows.items():
        ts = time.perf_counter()
        cfg_m = mp.model_copy(update={"feature_groups": mtl_groups})
        make = mtl.builder_factory(mtl_groups, p.n_candidates, tfidf_mtl)
        cfg_b = B.BaselineConfig(bp, tuple(base_groups), p.n_candidates, p.seed)
        sel = nested.Selection(
            tuple(p.score.mtl_weights), tuple(p.score.keep_rules), tuple(p.score.orders), band, tuple(select_on)
        )

        def mtl_rows(inner, inner_sources, outer, cfg_m=cfg_m, make=make, key=("mtl", tuple(mtl_groups))):
            def fit() -> pd.DataFrame:
                with deterministic_torch(), fixed_blas_threads():
                    return mtl.held_out_rows(
                        data, inner, inner_sources, outer, cfg_m, make, seed=p.seed, device=device, workers=mp.workers
                    )

            return memo((*key, tuple(outer)), fit)

        def base_rows(inner, inner_sources, outer, cfg_b=cfg_b, key=("baseline", tuple(base_groups))):
            return memo(
                (*key, tuple(outer)), lambda: B.held_out_rows(labelled, cfg_b, tfidf, inner, inner_sources, outer)
            )

        results[name] = nested.nested_loso(
            L.LABELLED_SPLITS,
            cand,
            mtl_rows,
            base_rows,
            sel,
            per_rule=p.analysis.nested.keep_rules if name == "default" else (),
        )
        seconds[name] = round(time.perf_counter() - ts, 1)
        log.info(
            "nested LOSO %s: accuracy %.3f (worst %.3f), MRR %.3f (%.0fs)",
            name,
            results[name]["accuracy"]["mean"],
            results[name]["accuracy"]["worst"],
            results[name]["mrr"]["mean"],
            seconds[name],
        )
    result = results["default"]
    # the keep rule for a new prior, on the nested figures of each rule alone: the best mean accuracy, and within the
    # accuracy band of it the best worst source (what score.keep_rules holds: RESULTS)
    by_rule = result["by_keep_rule"]
    best = max((float(v["accuracy"]["mean"]) for v in by_rule.values()), default=None)
    tied = [
        r
        for r, v in by_rule.items()
        if best is not None and float(v["accuracy"]["mean"]) >= best - float(band["accuracy"]) - 1e-12
    ]
    keep_pick = max(tied, key=lambda r: (float(by_rule[r]["accuracy"]["worst"]), -tied.index(r))) if tied else None
    plain = final["systems"]["final"]["loso"]
    summary = lambda r: {m: r[m] for m in nested.METRICS}
    write_json(
        L.metrics_file("nested_loso"),
        rounded(
            {
                "final_system": {
                    "nested_loso": result,
                    "plain_loso": {m: plain[m] for m in nested.METRICS},
                    "overstatement": nested.overstatement(plain, result),
                },
                "variants": {
                    n: {
                        "baseline_features": rows[n][0],
                        "mtl_feature_groups": rows[n][1],
                        "select_on": rows[n][2],
                        "nested_loso": summary(r),
                        "picks": {s: v["chosen"] for s, v in r["by_source"].items()},
                        "vs_default": {
                            m: round(float(r[m]["mean"]) - float(result[m]["mean"]), 4) for m in nested.METRICS
                        },
                    }
                    for n, r in results.items()
                    if n != "default"
                },
                "keep_rule_pick": {
                    "rule": keep_pick,
                    "on": "nested LOSO of each keep rule alone: the best mean accuracy, and within its accuracy "
                    "noise band the best worst-source accuracy",
                    "score_keep_rules": list(p.score.keep_rules),
                },
                "selection": {
                    "weights": list(p.score.mtl_weights),
                    "keep_rules": list(p.score.keep_rules),
                    "orders": list(p.score.orders),
                    "noise_band": band,
                    "rule": final["selection"]["rule"],
                },
                "recipes": {
                    "baseline_features": rows["default"][0],
                    "mtl_feature_groups": rows["default"][1],
                    "select_on": rows["default"][2],
                },
                "seconds": {**seconds, "total": round(time.perf_counter() - t0, 1)},
            }
        ),
    )
    log.info(
        "nested LOSO accuracy %.3f (worst %.3f %s); plain LOSO %.3f",
        result["accuracy"]["mean"],
        result["accuracy"]["worst"],
        result["accuracy"]["worst_source"],
        plain["accuracy"]["mean"],
    )


if __name__ == "__main__":
    run(main)
