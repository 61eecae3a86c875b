"""What a signal costs a served request: two decided systems' `medrank rank` pipelines side by side in one run.

Each validation question (its text and CHiQA's answers in CHiQA's order, as a user sends them) is ranked by both
systems' lean pipelines (InferencePipeline.load: only the steps each system reads), alternating A, B, B, A per
question so drift on a shared machine falls on both, from scratch folders without data/cache (every vector computed,
as for a new question). Prints per-question milliseconds, the medians and the ratio, and which answers each keeps.

    python benchmarks/request_price.py --a old/models --b models [--data data] [--fit val] [--limit 25]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def ranker_in_scratch(models: Path, fit: str):
    """A Ranker loaded from a scratch folder that links `models` and holds nothing else (no vector cache)."""
    from medrank.serving.rank import Ranker
    from medrank.steps.pipeline import InferencePipeline

    scratch = Path(tempfile.mkdtemp(prefix="medrank-price-"))
    (scratch / "models").symlink_to(models.resolve())
    here = Path.cwd()
    os.chdir(scratch)
    try:
        ranker = Ranker(InferencePipeline.load("models", fit))
    finally:
        os.chdir(here)
    return ranker, scratch


def timed(ranker, scratch: Path, inp) -> tuple[float, object]:
    here = Path.cwd()
    os.chdir(scratch)
    try:
        t0 = time.perf_counter()
        out = ranker.rank(inp)
        return (time.perf_counter() - t0) * 1000, out
    finally:
        os.chdir(here)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", type=Path, required=True, help="models/ of system A (e.g. the previous default)")
    ap.add_argument("--b", type=Path, required=True, help="models/ of system B")
    ap.add_argument("--data", type=Path, default=ROOT / "data", help="a data/ folder with interim/clean (read only)")
    ap.add_argument("--fit", choices=("final", "val"), default="val")
    ap.add_argument("--limit", type=int, default=25, help="validation questions to rank (default all 25)")
    args = ap.parse_args()
    import pandas as pd

    from medrank.serving.rank import as_input

    clean = pd.read_parquet(args.data / "interim" / "clean" / "answers.parquet")
    val = clean[clean["split"] == "val"]
    systems = {name: ranker_in_scratch(path, args.fit) for name, path in (("A", args.a), ("B", args.b))}
    for name, (ranker, _) in systems.items():
        print(
            name,
            "groups",
            sorted(ranker.pipeline.system.groups),
            "steps",
            [type(s).__name__ for s in ranker.pipeline.steps.steps],
        )
    ms: dict[str, list[float]] = {"A": [], "B": []}
    same_kept = 0
    qids = list(pd.unique(val["qid"]))[: args.limit]
    for i, qid in enumerate(qids):
        rows = val[val["qid"] == qid].sort_values("system_rank", kind="stable")
        inp = as_input(rows["question"].iloc[0], list(zip(rows["aid"], rows["answer"], rows["url"])))
        order = ("A", "B", "B", "A") if i % 2 == 0 else ("B", "A", "A", "B")
        got: dict[str, list] = {"A": [], "B": []}
        for name in order:
            t, out = timed(*systems[name], inp)
            got[name].append((t, out))
        # the first call of a pair warms nothing a later question could reuse (no cache): both are counted
        for name in ("A", "B"):
            ms[name].append(statistics.mean(t for t, _ in got[name]))
        kept = {n: sorted(got[n][0][1].loc[got[n][0][1]["kept"], "id"]) for n in ("A", "B")}
        same_kept += kept["A"] == kept["B"]
        print(
            f"{qid}: {len(rows)} answers, A {ms['A'][-1]:.0f} ms, B {ms['B'][-1]:.0f} ms, same kept {kept['A'] == kept['B']}"
        )
    a, b = statistics.median(ms["A"]), statistics.median(ms["B"])
    print(
        f"median ms per request over {len(qids)} questions: A {a:.0f}, B {b:.0f}; B/A {b / a:.3f}; "
        f"same answers kept {same_kept}/{len(qids)}; load average {os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()
