"""`medrank rank`'s pipeline running only what the decided system reads, against every step (issue 48), on the real
validation questions: the same output bits, the same answers kept and order as submissions/task3_val.csv, and the time.

Each validation question (its text and CHiQA's answers in CHiQA's order, as a user sends them) is ranked by
InferencePipeline.load(models, fit) (lean) and by InferencePipeline.load(models, fit, every_step=True) (every step,
the headings encoded too: what `medrank rank` ran before), from a folder without data/cache (every vector computed).

    python benchmarks/lean_pipeline.py --data ../main/data [--models models] [--fit val]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT / "data", help="a data/ folder with interim/clean (read only)")
    ap.add_argument("--models", type=Path, default=ROOT / "models")
    ap.add_argument("--fit", choices=("final", "val"), default="val")
    args = ap.parse_args()
    import pandas as pd

    from medrank.serving.rank import Ranker, as_input, ranked_ids
    from medrank.steps.pipeline import InferencePipeline

    models = args.models.resolve()
    clean = pd.read_parquet(args.data / "interim" / "clean" / "answers.parquet")
    sub = pd.read_csv(ROOT / "submissions" / "task3_val.csv", header=None, names=["qid", "aid", "label"], dtype=str)
    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / "medrank-lean-bench"
    scratch.mkdir(exist_ok=True)
    if not (scratch / "models").exists():
        (scratch / "models").symlink_to(models)
    os.chdir(scratch)  # no data/cache here
    lean = Ranker(InferencePipeline.load("models", args.fit))
    full = Ranker(InferencePipeline.load("models", args.fit, every_step=True))
    n = same = sub_equal = 0
    t_lean = t_full = 0.0
    for qid, rows in sub.groupby("qid", sort=False):
        answers = clean[(clean["split"] == "val") & (clean["qid"] == qid)].sort_values("system_rank")
        inp = as_input(answers["question"].iloc[0], list(zip(answers["aid"], answers["answer"], answers["url"])))
        t0 = time.perf_counter()
        a = lean.rank(inp)
        t_lean += time.perf_counter() - t0
        t0 = time.perf_counter()
        b = full.rank(inp)
        t_full += time.perf_counter() - t0
        same += a.equals(b)
        kept = sorted(a.loc[a["kept"], "id"]) == sorted(rows.loc[rows["label"] == "1", "aid"])
        sub_equal += ranked_ids(a) == rows["aid"].tolist() and kept
        n += 1
        print(qid, len(answers), "identical", a.equals(b), "submission", ranked_ids(a) == rows["aid"].tolist() and kept)
    print(
        f"fit={args.fit} questions={n} lean==every step (bit for bit): {same} equal to the submission: {sub_equal} "
        f"lean {t_lean:.1f}s every step {t_full:.1f}s load average {os.getloadavg()}"
    )


if __name__ == "__main__":
    main()
