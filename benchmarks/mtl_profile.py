"""Where the MTL stage's time goes: one `fit_mtl` (the default row, the training questions) under cProfile, on the
committed default-profile data exactly as stage mtl builds it (run from the repository root after `dvc repro` or
`dvc checkout`). The stage runs ~100 such fits (CV, LOSO, the seed spread, the ablation rows), so one fit's profile is
the stage's. Prints the cumulative and the self-time tables.

    python benchmarks/mtl_profile.py
"""

import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from medrank.core import layout as L
from medrank.selection.evaluation import split_questions
from medrank.task3.bow import medquad_tfidf
from medrank.task3.features import read_answer_scores
from medrank.core.io import read_parquet
from medrank.models import mtl
from medrank.params import load_params


def main() -> None:
    p = load_params()
    mp = p.mtl
    if mp.threads:
        torch.set_num_threads(mp.threads)
    t0 = time.perf_counter()
    retrieved = read_parquet(L.RETRIEVED)
    answers = read_parquet(L.ANSWERS).merge(retrieved[["split", "qid"]].drop_duplicates(), on=["split", "qid"])
    scores = read_answer_scores(answers, set(mp.feature_groups))
    data = mtl.build_mtl_data(answers, read_parquet(L.NLI_GRID), retrieved, n_candidates=p.n_candidates, scores=scores)
    train = split_questions(data.cand, L.TRAIN_SPLITS)
    print(
        f"load + build_mtl_data {time.perf_counter() - t0:.1f}s; {len(data.cand)} candidates, {len(data.pairs)} pairs, "
        f"{len(train)} train questions; torch threads {torch.get_num_threads()}"
    )
    tfidf = medquad_tfidf(mp.tfidf_max_features) if "bow" in mp.feature_groups else None
    builder = mtl.builder_factory(mp.feature_groups, p.n_candidates, tfidf)()
    prof = cProfile.Profile()
    t1 = time.perf_counter()
    prof.enable()
    model = mtl.fit_mtl(data, train, mp, builder, seed=p.seed)
    prof.disable()
    fit_s = time.perf_counter() - t1
    t2 = time.perf_counter()
    model.predict(data)
    print(
        f"one fit_mtl: {fit_s:.1f}s, best epoch {model.best_epoch}, {len(model.history)} epochs; predicting every candidate {time.perf_counter() - t2:.1f}s"
    )
    for order, n in (("cumulative", 35), ("tottime", 20)):
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats(order).print_stats(n)
        print(out.getvalue())


if __name__ == "__main__":
    main()
