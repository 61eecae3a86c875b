"""Stage `mtl`: train the multi-task filter + pairwise re-ranker (paper §4.5-4.6).

Question-grouped CV over train+val (out-of-fold predictions choose the threshold and give mean ± sd), LOSO (the seed
spread is stage noise_band's), a train-only model checked on the 25 validation questions, and the final model on
train+val for test; the fits run `mtl.workers` side by side. Writes models/mtl/ (final bag; val/ = the train-only bag),
data/processed/mtl_predictions.parquet, metrics/mtl.json and dvclive curves plots/mtl/. The ablation rows are
analysis/dvc.yaml's `mtl_ablations` (`main(ablations=True)`: the same data, folds and seed, one row per
`analysis.mtl.rows` entry -> metrics/mtl_ablations.json) and `mtl_confirm` (`main(confirm=True)`: the default and the
rows of `analysis.confirm.mtl_rows` under several seeds, paired -> metrics/mtl_confirm.json).
"""

from __future__ import annotations

import logging
import time

from medrank.runner import run

log = logging.getLogger("stages.mtl")


def main(params_path: str = "params.yaml", ablations: bool = False, confirm: bool = False) -> None:
    import torch
    from dvclive import Live

    from medrank import layout as L
    from medrank.encoders.base import deterministic_torch, fixed_blas_threads, resolve_device
    from medrank.errors import MedrankError
    from medrank.evaluation import confirm_table, rounded, split_questions
    from medrank.features import medquad_tfidf
    from medrank.io import write_json, write_parquet
    from medrank.models import mtl
    from medrank.params import load_params, mtl_rows

    p = load_params(params_path)
    mp = p.mtl
    t_start = time.perf_counter()
    if mp.threads:
        torch.set_num_threads(mp.threads)
    device = resolve_device(p.device)

    rows = mtl_rows(mp, p.analysis.mtl.rows) if ablations or confirm else {}
    if confirm:  # the default and the rows to confirm
        unknown = [n for n in p.analysis.confirm.mtl_rows if n not in rows]
        if unknown:
            raise MedrankError(f"{params_path}: analysis.confirm.mtl_rows: {unknown[0]!r} is not a row name of analysis.mtl.rows")
        rows = {"default": ({}, mp)} | {n: rows[n] for n in p.analysis.confirm.mtl_rows}
    configs = [r for _, r in rows.values()] if rows else [mp]
    # per-answer scores of other stages for the bienc / heading / cnn / qa groups (of the default or of the rows)
    _, data = mtl.read_mtl_data(p, set().union(*(r.feature_groups for r in configs)))
    tfidf = {r.tfidf_max_features: medquad_tfidf(r.tfidf_max_features) for r in configs if "bow" in r.feature_groups}
    named = {"mtl.augment" if n == "default" else f"analysis.mtl.rows ({n})": r for n, (_, r) in rows.items()} if rows else {"mtl.augment": mp}
    mtl.check_augmentation(data, named, params_path)

    def builder(r):
        return mtl.builder_factory(r.feature_groups, p.n_candidates, tfidf.get(r.tfidf_max_features))

    # question order as in the answers table: the same question-grouped folds as the baseline's CV (same seed)
    train_gids = split_questions(data.cand, L.TRAIN_SPLITS)
    val_gids = split_questions(data.cand, [L.VAL_SPLIT])
    test_gids = split_questions(data.cand, [L.TEST_SPLIT])
    log.info("%d candidates, %d (candidate, entailed) pairs; questions: %d train, %d val, %d test; %d fit processes",
             len(data.cand), len(data.pairs), len(train_gids), len(val_gids), len(test_gids), mp.workers)  # fmt: skip

    # deterministic kernels (on CUDA; CPU kernels already are at the fixed mtl.threads) and fixed BLAS threads
    with deterministic_torch(), fixed_blas_threads():
        if confirm:
            t0 = time.perf_counter()
            seeds = [p.seed + i for i in range(p.analysis.confirm.seeds)]
            labelled = mtl.labelled_gids(data, train_gids, val_gids)
            by_row: dict[str, list[float]] = {n: [] for n in rows}  # each row's score per seed
            per_seed = []
            for seed_i in seeds:  # one seed's rows side by side (same folds and initialisation for every row)
                table = mtl.ablation_cv(data, labelled, {n: (r, builder(r)) for n, (_, r) in rows.items()}, k=mp.cv_folds, seed=seed_i,
                                        device=device, sources=L.LABELLED_SPLITS, workers=mp.workers)  # fmt: skip
                per_seed.append({n: {"cv_accuracy": t["accuracy"]["mean"], "loso_accuracy": t["loso"]["accuracy"]["mean"]} for n, t in table.items()})
                for n, t in table.items():
                    by_row[n].append((t["accuracy"]["mean"] + t["loso"]["accuracy"]["mean"]) / 2)
            out = confirm_table(by_row, seeds)
            for n, r in out["rows"].items():
                r["overrides"] = rows[n][0]
            out |= {"per_seed": per_seed, "score": "mean of CV accuracy and LOSO mean accuracy", "seconds_total": round(time.perf_counter() - t0, 1)}
            write_json(L.metrics_file("mtl_confirm"), rounded(out))
            return
        if ablations:
            t0 = time.perf_counter()
            table = mtl.ablation_cv(data, mtl.labelled_gids(data, train_gids, val_gids), {n: (r, builder(r)) for n, (_, r) in rows.items()},
                                    k=mp.cv_folds, seed=p.seed, device=device, sources=L.LABELLED_SPLITS, workers=mp.workers)  # fmt: skip
            for name, row in table.items():
                row["overrides"] = rows[name][0]
            write_json(L.metrics_file("mtl_ablations"), rounded({"rows": table, "seconds_total": round(time.perf_counter() - t0, 1),
                                                                "workers": mp.workers, "device": str(device)}))  # fmt: skip
            return
        report = mtl.run_recipe(
            data, train_gids, val_gids, test_gids, mp, builder(mp), seed=p.seed, device=device,
            live=Live(dir=str(L.plots_dir("mtl")), dvcyaml=None, save_dvc_exp=False), sources=L.LABELLED_SPLITS, workers=mp.workers,
        )  # fmt: skip
    report.final_model.save(L.MTL_MODEL, extra_meta={"decision": report.decisions["final"], "n_candidates": p.n_candidates})
    report.val_model.save(L.MTL_MODEL / "val", extra_meta={"decision": report.decisions["val"], "n_candidates": p.n_candidates})
    write_parquet(report.predictions, L.MTL_PREDICTIONS, mtl.PREDICTIONS_SCHEMA)
    metrics = {**report.metrics, "seconds_total": round(time.perf_counter() - t_start, 1), "device": str(device), "threads": torch.get_num_threads()}
    write_json(L.metrics_file("mtl"), rounded(metrics))
    log.info("mtl: CV accuracy %.3f ± %.3f, val accuracy %.3f, in %.0fs", metrics["cv"]["accuracy"]["mean"],
             metrics["cv"]["accuracy"]["sd"], metrics["val"]["accuracy"], metrics["seconds_total"])  # fmt: skip


if __name__ == "__main__":
    run(main)
