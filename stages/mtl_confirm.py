"""Stage `mtl_confirm` (analysis/dvc.yaml): a lever counts only beyond the noise. The default MTL and the rows named in
`analysis.confirm.mtl_rows` (rows of `analysis.mtl.rows`) are re-run under CV and LOSO for `analysis.confirm.seeds`
seeds (the mtl stage's seed and the next ones: folds and initialisation), paired by seed -> metrics/mtl_confirm.json:
each row's score per seed (mean of CV accuracy and LOSO mean accuracy), its mean paired difference to the default, and
`win` when that difference exceeds the band (the sd of the default's score over the seeds)."""

from __future__ import annotations

import time

from medrank.stage.runner import run


def main(params_path: str = "params.yaml") -> None:
    from medrank.core import layout as L
    from medrank.core.errors import MedrankError
    from medrank.selection.evaluation import confirm_table, rounded
    from medrank.core.io import write_json
    from medrank.models.mtl.setup import prepare
    from medrank.params import load_params, mtl_rows

    p = load_params(params_path)
    mp = p.mtl
    t0 = time.perf_counter()
    rows = mtl_rows(mp, p.analysis.mtl.rows)
    unknown = [n for n in p.analysis.confirm.mtl_rows if n not in rows]
    if unknown:
        raise MedrankError(
            f"{params_path}: analysis.confirm.mtl_rows: {unknown[0]!r} is not a row name of analysis.mtl.rows"
        )
    rows = {"default": ({}, mp)} | {n: rows[n] for n in p.analysis.confirm.mtl_rows}
    names = {"mtl.augment" if n == "default" else f"analysis.mtl.rows ({n})": r for n, (_, r) in rows.items()}
    s = prepare(p, names, params_path)
    seeds = [p.seed + i for i in range(p.analysis.confirm.seeds)]
    by_row, per_seed = s.confirm({n: r for n, (_, r) in rows.items()}, mp, seeds)
    out = confirm_table(by_row, seeds)
    for n, r in out["rows"].items():
        r["overrides"] = rows[n][0]
    out |= {
        "per_seed": per_seed,
        "score": "mean of CV accuracy and LOSO mean accuracy",
        "seconds_total": round(time.perf_counter() - t0, 1),
    }
    write_json(L.metrics_file("mtl_confirm"), rounded(out))


if __name__ == "__main__":
    run(main)
