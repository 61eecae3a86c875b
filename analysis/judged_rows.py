"""The judged LiveQA answers as extra baseline training rows (`baseline.judged_rows`), measured under the written rule.

Each mode (none | ranker | all) of the default baseline is run under question-grouped CV and LOSO for
`noise_band.seeds` seeds (the stage's seed and the next ones), paired by seed, on the committed outputs (no
stage is re-run; nothing but metrics/judged_rows.json is written; the judged answers' bi-encoder scores, which stage
bienc writes only with `bienc.judged`, are computed here, read-only through its cache). Per mode: the rule's filter score (mean of CV and
LOSO mean accuracy) and order score (`evaluation.order_score`: MRR and Spearman), their paired difference to `none`,
and `win` when that difference exceeds the sd of `none`'s score over the seeds. `medrank report` renders it.

    python analysis/judged_rows.py      # under a minute on 2 cores (9 runs)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from medrank.core import layout as L
from medrank.selection.evaluation import confirm_table, order_score, rounded
from medrank.core.io import write_json
from medrank.models import baseline as B
from medrank.models import baseline_protocols as BP
from medrank.data.judged import judged_answers
from medrank.task3.features import cap_questions
from medrank.core.io import read_parquet
from medrank.params.groups import BIENC_GROUPS
from medrank.params import load_params
from medrank.task3.answer_scores import score_answers
from medrank.task3.inputs import load_tables

OUT = ROOT / "metrics" / "judged_rows.json"
MODES = ("none", "ranker", "all")
METRICS = ("accuracy", "precision", "mrr", "spearman")


def paired(scores: dict[str, list[float]], seeds: list[int]) -> dict:
    """Per mode: mean, paired difference to `none` (mean, sd), win = beyond none's seed sd (evaluation.confirm_table)."""
    t = confirm_table(scores, seeds, default="none")
    return rounded(
        {
            "band": t["band"],
            "modes": {m: {k: r[k] for k in ("mean", "diff_mean", "diff_sd", "win")} for m, r in t["rows"].items()},
        }
    )


def main() -> None:
    os.chdir(ROOT)  # the stages' relative paths
    p = load_params("params.yaml")
    bp = p.baseline
    seeds = [p.seed + i for i in range(p.noise_band.seeds)]
    extra = None
    if (
        set(bp.features) & set(BIENC_GROUPS) and not p.bienc.judged
    ):  # stage bienc left them out: scored here, the same way
        answers = cap_questions(read_parquet(L.ANSWERS), p.max_questions_per_split)
        extra = {
            L.BIENC: score_answers(judged_answers(read_parquet(L.JUDGED), answers), p, read_only=True)[0]
        }  # the cache is stage bienc's
    runs: dict[str, list[dict]] = {}
    bar = tqdm(total=len(MODES) * len(seeds), desc="judged_rows runs", unit="run")
    for mode in MODES:
        cfg = B.BaselineConfig(bp.model_copy(update={"judged_rows": mode}), tuple(bp.features), p.n_candidates, p.seed)
        _, labelled, *_, tfidf = load_tables(p, set(bp.features), mode != "none", extra)
        runs[mode] = []
        for seed in seeds:
            r = BP.protocols(labelled, replace(cfg, seed=seed), tfidf, L.LABELLED_SPLITS)
            cv, lo = r["cv"]["base"], r["loso"]["base"]
            runs[mode].append(
                {
                    "seed": seed,
                    "cv": {k: round(cv[k]["mean"], 4) for k in METRICS},
                    "loso": {k: round(lo[k]["mean"], 4) for k in METRICS},
                    "loso_worst": {"accuracy": lo["accuracy"]["worst"], "source": lo["accuracy"]["worst_source"]},
                    "score": round((cv["accuracy"]["mean"] + lo["accuracy"]["mean"]) / 2, 4),
                    "order_score": round(order_score(cv, lo), 4),
                    "judged_training_rows": int(labelled["judged"].sum()),
                }
            )
            bar.update()
            bar.set_postfix(mode=mode, score=runs[mode][-1]["score"], order=runs[mode][-1]["order_score"])
    bar.close()
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    write_json(
        OUT,
        {
            "commit": head,
            "date": time.strftime("%Y-%m-%d"),
            "features": list(bp.features),
            "seeds": seeds,
            "runs": runs,
            "filter": paired({m: [r["score"] for r in runs[m]] for m in MODES}, seeds),
            "order": paired({m: [r["order_score"] for r in runs[m]] for m in MODES}, seeds),
        },
    )


if __name__ == "__main__":
    main()
