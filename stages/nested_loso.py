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

    import torch

    from medrank import layout as L
    from medrank import nested
    from medrank.encoders.base import deterministic_torch, fixed_blas_threads, resolve_device
    from medrank.evaluation import rounded
    from medrank.features import answer_table, medquad_tfidf, read_answer_scores
    from medrank.io import read_parquet, write_json
    from medrank.models import baseline as B
    from medrank.models import mtl
    from medrank.params import load_params
    from stages.baseline import load_tables

    p = load_params(params_path)
    mp, bp = p.mtl, p.baseline
    t0 = time.perf_counter()
    if mp.threads:
        torch.set_num_threads(mp.threads)
    device = resolve_device(p.device)
    rows = {"default": (list(bp.features), list(mp.feature_groups))}
    rows |= {v.name: (list(v.baseline_features), list(v.mtl_feature_groups)) for v in p.analysis.nested.variants}
    groups = set().union(*(set(b) | set(m) for b, m in rows.values()))
    retrieved = read_parquet(L.RETRIEVED)
    answers = read_parquet(L.ANSWERS).merge(retrieved[["split", "qid"]].drop_duplicates(), on=["split", "qid"])
    data = mtl.build_mtl_data(answers, read_parquet(L.NLI_GRID), retrieved, n_candidates=p.n_candidates, scores=read_answer_scores(answers, groups))
    tfidf_mtl = medquad_tfidf(mp.tfidf_max_features) if "bow" in groups else None
    _, labelled, _, _, _, tfidf = load_tables(p, groups, bp.judged_rows != "none")
    cand = answer_table(answers)
    cand = cand[cand["split"].isin(L.LABELLED_SPLITS)].reset_index(drop=True)
    final = json.loads(L.metrics_file("task3_val").read_text(encoding="utf-8"))
    sel = nested.Selection(tuple(p.score.mtl_weights), tuple(p.score.keep_rules), tuple(p.score.orders), final["selection"]["noise_band"])

    results, seconds = {}, {}
    for name, (base_groups, mtl_groups) in rows.items():
        ts = time.perf_counter()
        cfg_m = mp.model_copy(update={"feature_groups": mtl_groups})
        make = mtl.builder_factory(mtl_groups, p.n_candidates, tfidf_mtl)
        cfg_b = B.BaselineConfig(bp, tuple(base_groups), p.n_candidates, p.seed)

        def mtl_rows(inner, inner_sources, outer, cfg_m=cfg_m, make=make):
            with deterministic_torch(), fixed_blas_threads():
                return mtl.held_out_rows(data, inner, inner_sources, outer, cfg_m, make, seed=p.seed, device=device, workers=mp.workers)

        def base_rows(inner, inner_sources, outer, cfg_b=cfg_b):
            return B.held_out_rows(labelled, cfg_b, tfidf, inner, inner_sources, outer)

        results[name] = nested.nested_loso(L.LABELLED_SPLITS, cand, mtl_rows, base_rows, sel)
        seconds[name] = round(time.perf_counter() - ts, 1)
        log.info("nested LOSO %s: accuracy %.3f (worst %.3f), MRR %.3f (%.0fs)", name, results[name]["accuracy"]["mean"],
                 results[name]["accuracy"]["worst"], results[name]["mrr"]["mean"], seconds[name])  # fmt: skip
    result = results["default"]
    plain = final["systems"]["final"]["loso"]
    summary = lambda r: {m: r[m] for m in nested.METRICS}  # noqa: E731
    write_json(L.metrics_file("nested_loso"), rounded({
        "final_system": {"nested_loso": result, "plain_loso": {m: plain[m] for m in nested.METRICS},
                         "overstatement": nested.overstatement(plain, result)},
        "variants": {n: {"baseline_features": rows[n][0], "mtl_feature_groups": rows[n][1], "nested_loso": summary(r),
                         "picks": {s: v["chosen"] for s, v in r["by_source"].items()},
                         "vs_default": {m: round(float(r[m]["mean"]) - float(result[m]["mean"]), 4) for m in nested.METRICS}}
                     for n, r in results.items() if n != "default"},
        "selection": {"weights": list(sel.weights), "keep_rules": list(sel.keep_rules), "orders": list(sel.orders), "noise_band": sel.band,
                      "rule": final["selection"]["rule"]},
        "recipes": {"baseline_features": rows["default"][0], "mtl_feature_groups": rows["default"][1]},
        "seconds": {**seconds, "total": round(time.perf_counter() - t0, 1)},
    }))  # fmt: skip
    log.info("nested LOSO accuracy %.3f (worst %.3f %s); plain LOSO %.3f", result["accuracy"]["mean"], result["accuracy"]["worst"],
             result["accuracy"]["worst_source"], plain["accuracy"]["mean"])  # fmt: skip


if __name__ == "__main__":
    run(main)
