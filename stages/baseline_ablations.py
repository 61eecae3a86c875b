"""Stage `baseline_ablations` (analysis/dvc.yaml): the paper's Table 1 (+ extras) and Table 4 for the baseline.

Each row of `analysis.baseline.rows` (feature groups over the `baseline` section's other params) gets the default's
protocols: question-grouped CV and leave-one-source-out over train + validation, and train -> validation, by filter
and by ranker -> metrics/baseline_ablations.json with the written rule's selection score per row. Off the default
pipeline: `dvc exp run` does not wait for it; `dvc repro analysis/dvc.yaml` refreshes it.
"""

from __future__ import annotations

import time

from medrank.stage.runner import run


def main(params_path: str = "params.yaml") -> None:
    from medrank.core import layout as L
    from medrank.core.io import write_json
    from medrank.models import baseline as B
    from medrank.models import baseline_protocols as BP
    from medrank.params import load_params
    from medrank.task3.inputs import load_tables

    p = load_params(params_path)
    t0 = time.perf_counter()
    configs = {
        "+".join(g): B.BaselineConfig(p.baseline, tuple(g), p.n_candidates, p.seed) for g in p.analysis.baseline.rows
    }
    _, labelled, train, val, _, tfidf = load_tables(p, set().union(*(c.groups for c in configs.values())))
    table1, table4 = BP.ablation_tables(labelled, train, val, configs, tfidf, L.LABELLED_SPLITS)
    write_json(
        L.metrics_file("baseline_ablations"),
        {
            "default_features": list(p.baseline.features),
            "table1_ablation": table1,
            "table4_ranking": table4,
            "seconds": round(time.perf_counter() - t0, 1),
        },
    )


if __name__ == "__main__":
    run(main)
