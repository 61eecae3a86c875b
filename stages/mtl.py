"""Stage `mtl`: train the multi-task filter + pairwise re-ranker (paper §4.5-4.6).

Question-grouped CV over train+val (out-of-fold predictions choose the threshold and give mean ± sd), a
train-only model checked on the 25 validation questions, and the final model on train+val for test.
Writes models/mtl/, data/processed/mtl_predictions.parquet, metrics/mtl.json and dvclive curves plots/mtl/.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from medrank.runner import run

log = logging.getLogger("stages.mtl")
NORMALIZED = Path("data/interim/normalized")
RETRIEVED = Path("data/processed/retrieved.parquet")
EMBEDDINGS = Path("data/processed/embeddings")
SCORE_FILES = {
    "bienc": ("bienc_cos", Path("data/processed/bienc.parquet")),
    "heading": ("heading_cos", Path("data/processed/bienc.parquet")),
    "cnn": ("cnn_score", Path("data/processed/cnn_mediqa_scores.parquet")),
    "qa": ("qa_score", Path("data/processed/qa_scores.parquet")),
}
MODEL_DIR = Path("models/mtl")
PREDICTIONS = Path("data/processed/mtl_predictions.parquet")
METRICS = Path("metrics/mtl.json")
LIVE_DIR = Path("plots/mtl")
TRAIN_SPLITS = ("train_liveqa", "train_alexa")


def main(params_path: str = "params.yaml") -> None:
    import torch
    from dvclive import Live

    from medrank.encoders.base import resolve_device
    from medrank.io import read_parquet, write_json, write_parquet
    from medrank.models import mtl
    from medrank.params import load_params

    p = load_params(params_path)
    mp = p.mtl
    t_start = time.perf_counter()
    if mp.threads:
        torch.set_num_threads(mp.threads)
    device = resolve_device(p.device)

    retrieved = read_parquet(RETRIEVED)
    # a capped profile retrieves for fewer questions (the same ones the bienc stage keeps): their answers only
    answers = read_parquet(NORMALIZED / "answers.parquet").merge(retrieved[["split", "qid"]].drop_duplicates(), on=["split", "qid"])
    from medrank.features import answer_scores, fit_tfidf

    ablations = mp.ablation_rows()
    rows = {name: r for name, (_, r) in ablations.items()}
    groups = set(mp.feature_groups).union(*(r.feature_groups for r in rows.values()))
    # per-answer scores of other stages for the bienc / heading / cnn / qa groups (of the default or any ablation row)
    scores = {col: answer_scores(answers, read_parquet(path), col, str(path))
              for group, (col, path) in SCORE_FILES.items() if group in groups}  # fmt: skip
    data = mtl.build_mtl_data(answers, read_parquet(EMBEDDINGS / "nli_grid.parquet"), retrieved, n_candidates=p.n_candidates, scores=scores)
    tfidf = {}  # vocabulary size -> vectorizer fitted on MedQuAD answers (bow group)
    for r in [mp, *rows.values()]:
        if "bow" in r.feature_groups and r.tfidf_max_features not in tfidf:
            corpus = read_parquet(NORMALIZED / "medquad.parquet", columns=["answer_norm"])["answer_norm"].dropna().tolist()
            tfidf[r.tfidf_max_features] = fit_tfidf(corpus, r.tfidf_max_features)

    def recipe(r):
        return (*mtl.config_from_params(r), mtl.builder_factory(r.feature_groups, p.n_candidates, tfidf.get(r.tfidf_max_features)))

    cfg, decision, make_builder = recipe(mp)

    # question order as in the answers table: the same question-grouped folds as the baseline's CV (same seed)
    split_of = data.cand.drop_duplicates("gid").set_index("gid")["split"]
    train_gids = [g for g, s in split_of.items() if s in TRAIN_SPLITS]
    val_gids = [g for g, s in split_of.items() if s == "val"]
    test_gids = [g for g, s in split_of.items() if s == "test"]
    log.info("%d candidates, %d (candidate, entailed) pairs; questions: %d train, %d val, %d test",
             len(data.cand), len(data.pairs), len(train_gids), len(val_gids), len(test_gids))  # fmt: skip

    report = mtl.run_recipe(
        data, train_gids, val_gids, test_gids, cfg, decision, make_builder,
        k=mp.cv_folds, seed=p.seed, device=device, live=Live(dir=str(LIVE_DIR), dvcyaml=None, save_dvc_exp=False),
        ablations={name: recipe(r) for name, r in rows.items()},
    )  # fmt: skip
    extra = {"decision": report.decision_json, "n_candidates": p.n_candidates, "bienc_model": p.bienc.model, "bienc_max_length": p.bienc.max_length,
             "cnn_aggregation": p.cnn.mediqa_aggregation}  # fmt: skip
    report.final_model.save(MODEL_DIR, extra_meta=extra)
    write_parquet(report.predictions, PREDICTIONS, mtl.PREDICTIONS_SCHEMA)
    for name, row in report.metrics["ablations"].items():
        row["overrides"] = ablations[name][0]
    metrics = {**report.metrics, "seconds_total": round(time.perf_counter() - t_start, 1), "device": str(device),
               "threads": torch.get_num_threads()}  # fmt: skip
    write_json(METRICS, _rounded(metrics))
    log.info("mtl: CV accuracy %.3f ± %.3f, val accuracy %.3f, in %.0fs", metrics["cv"]["accuracy"]["mean"],
             metrics["cv"]["accuracy"]["sd"], metrics["val"]["accuracy"], metrics["seconds_total"])  # fmt: skip


def _rounded(obj, digits: int = 4):
    """Floats rounded for a readable, diff-friendly metrics file."""
    if isinstance(obj, float):
        return round(obj, digits)
    if isinstance(obj, dict):
        return {k: _rounded(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_rounded(v, digits) for v in obj]
    return obj


if __name__ == "__main__":
    run(main)
