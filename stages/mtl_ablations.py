"""Stage `mtl_ablations` (analysis/dvc.yaml): the MTL ablation rows of `analysis.mtl.rows`, each overriding keys of
the `mtl` section, under the mtl stage's question-grouped CV and leave-one-source-out folds (same data, same seed)
-> metrics/mtl_ablations.json. Off the default pipeline: `dvc exp run` does not wait for ~80 fits it does not need;
`dvc repro analysis/dvc.yaml` refreshes the table."""

from __future__ import annotations

import time

from medrank.stage.runner import run


def main(params_path: str = "params.yaml") -> None:
    from medrank.core import layout as L
    from medrank.selection.evaluation import rounded
    from medrank.core.io import write_json
    from medrank.models.mtl.setup import prepare
    from medrank.params import load_params, mtl_rows

    p = load_params(params_path)
    mp = p.mtl
    t0 = time.perf_counter()
    rows = mtl_rows(mp, p.analysis.mtl.rows)
    s = prepare(p, {f"analysis.mtl.rows ({n})": r for n, (_, r) in rows.items()}, params_path)
    table = s.ablations({n: r for n, (_, r) in rows.items()}, mp, p.seed)
    for name, row in table.items():
        row["overrides"] = rows[name][0]
    out = {
        "rows": table,
        "seconds_total": round(time.perf_counter() - t0, 1),
        "workers": mp.workers,
        "device": str(s.device),
    }
    write_json(L.metrics_file("mtl_ablations"), rounded(out))


if __name__ == "__main__":
    run(main)
