"""The paper's N x T grid (N entailed MedQuAD questions per user question, RQE threshold T) under the written rule.

Each cell is `dvc exp run -S n_candidates=N -S rqe_threshold=T` of the whole default pipeline (the final system,
chosen by the score stage's rule inside each cell) in a clone of this checkout whose outputs come from its DVC cache,
so only what a cell changes runs (retrieve, the new sentence pairs of embed, baseline, mtl, score). Per cell it keeps
the final system's CV and LOSO metrics and the rule's score (mean of CV accuracy and LOSO mean accuracy), and writes
metrics/nt_grid.json, which `medrank report` renders in RESULTS.md with the rule's pick:

    python analysis/nt_grid.py                       # N in 1 3 5, T in none 0.7 0.5 (~5 min a cell on 2 cores)
    python analysis/nt_grid.py --n 3 5 --t 0.5       # a sub-grid
    python analysis/nt_grid.py --confirm             # the pick vs the default over analysis.confirm.seeds seeds (~10 min)

The rule for N and T (README, "How defaults are chosen"): the best score wins unless the current default is within
the noise band of it (the score stage's band: the larger seed spread of the two systems); a tie keeps the default.
A grid cell is one seed, so before a pick replaces the default `--confirm` re-runs both cells' final system (the MTL
alone) under CV + LOSO for `analysis.confirm.seeds` seeds, paired by seed (the mtl_confirm stage's code and rule): the
pick is adopted only if its mean paired difference exceeds the default's seed spread. The result is stored beside the
grid in metrics/nt_grid.json (`confirm`) and rendered with it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from experiment import scratch_default, timed_dvc

from medrank.core.io import write_json

OUT = ROOT / "metrics" / "nt_grid.json"


def cell_metrics(repo: Path) -> dict:
    """The final system's CV / LOSO metrics of one run, the rule's score and its noise band (metrics/task3_val.json)."""
    m = json.loads((repo / "metrics" / "task3_val.json").read_text())
    final = m["systems"]["final"]
    cv, loso = final["cv"], final["loso"]
    return {
        "system": m["system"],
        "mtl_weight": m["mtl_weight"],
        "keep_rule": m["keep_rule"],
        "order": m["order"],
        "score": round((cv["accuracy"]["mean"] + loso["accuracy"]["mean"]) / 2, 4),
        "noise_band": m["selection"]["noise_band"]["accuracy"],
        "cv": {k: cv[k]["mean"] for k in ("accuracy", "precision", "mrr", "spearman")},
        "loso": {k: loso[k]["mean"] for k in ("accuracy", "precision", "mrr", "spearman")},
        "loso_worst": {"accuracy": loso["accuracy"]["worst"], "source": loso["accuracy"]["worst_source"]},
        "val": {k: m[k] for k in ("accuracy", "precision", "mrr", "spearman")},
    }


def pick(cells: list[dict], default: tuple[int, float | None]) -> dict:
    """The rule: the best score, unless the default cell is within the noise band of it (then the default)."""
    best = max(cells, key=lambda c: c["score"])
    band = max(c["noise_band"] for c in cells)
    base = next((c for c in cells if (c["n_candidates"], c["rqe_threshold"]) == default), None)
    keep = base is not None and best["score"] - base["score"] <= band
    chosen = base if keep else best
    return {
        "n_candidates": chosen["n_candidates"],
        "rqe_threshold": chosen["rqe_threshold"],
        "band": band,
        "best": {"n_candidates": best["n_candidates"], "rqe_threshold": best["rqe_threshold"], "score": best["score"]},
        "default_kept": keep,
    }


def seed_scores(repo: Path) -> list[float]:
    """The final system's score (mean of CV and LOSO mean accuracy) under analysis.confirm.seeds seeds in `repo`: the
    mtl_confirm stage's code with no other rows. Only for cells whose final system is the MTL alone (checked)."""
    m = json.loads((repo / "metrics" / "task3_val.json").read_text())
    if m["system"] != "mtl" or m["mtl_weight"] != 1.0:
        sys.exit(
            f"--confirm: the final system of {repo} is {m['system']} (MTL weight {m['mtl_weight']}), not the MTL alone; "
            "re-run its members by hand"
        )
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["analysis"]["confirm"]["mtl_rows"] = []
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    subprocess.run([sys.executable, "-m", "stages.mtl_confirm"], cwd=repo, check=True)
    subprocess.run(["git", "checkout", "-q", "--", "params.yaml"], cwd=repo, check=True)
    return json.loads((repo / "metrics" / "mtl_confirm.json").read_text())["rows"]["default"]["scores"]


def confirm(work: Path, grid: dict) -> dict:
    """The grid's pick vs the default over seeds, paired by seed (evaluation.confirm_table: a win beyond the band)."""
    from medrank.selection.evaluation import confirm_table

    pk, d = grid["pick"], grid["default"]
    best = (pk["best"]["n_candidates"], pk["best"]["rqe_threshold"])
    if best == (d["n_candidates"], d["rqe_threshold"]):
        sys.exit("--confirm: the grid's best cell is the default; nothing to confirm")
    scratch_default(work)
    scores = {"default": seed_scores(work)}
    t = "null" if best[1] is None else str(best[1])
    timed_dvc(["exp", "run", "-S", f"n_candidates={best[0]}", "-S", f"rqe_threshold={t}"], work)
    name = f"N={best[0]} T={t}"
    scores[name] = seed_scores(work)
    seeds = json.loads((work / "metrics" / "mtl_confirm.json").read_text())["seeds"]
    table = confirm_table(scores, seeds)
    row = table["rows"][name]
    print(
        f"{name} vs default over seeds {seeds}: {row['diff_mean']:+.4f} +- {row['diff_sd']:.4f}, band {table['band']:.4f}",
        flush=True,
    )
    return {"cell": {"n_candidates": best[0], "rqe_threshold": best[1]}, "name": name, **table}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--confirm",
        action="store_true",
        help="re-run the grid's best cell and the default over seeds (metrics/nt_grid.json)",
    )
    ap.add_argument("--n", type=int, nargs="+", default=[1, 3, 5])
    ap.add_argument("--t", nargs="+", default=["null", "0.7", "0.5"], help="RQE thresholds; null = no threshold")
    ap.add_argument("--workdir", type=Path, default=None, help="scratch folder (kept); default a temp folder, removed")
    args = ap.parse_args()
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    default = (params["n_candidates"], params["rqe_threshold"])
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    work_root = args.workdir or Path(tempfile.mkdtemp(prefix="medrank-grid-"))
    work = work_root / "repo"
    if args.confirm:
        grid = json.loads(OUT.read_text())
        try:
            grid["confirm"] = {"commit": head, "date": time.strftime("%Y-%m-%d"), **confirm(work, grid)}
        finally:
            if args.workdir is None:
                shutil.rmtree(work_root, ignore_errors=True)
        write_json(OUT, grid)
        return
    cells = []
    try:
        scratch_default(work)
        cells.append({"n_candidates": default[0], "rqe_threshold": default[1], "seconds": 0.0, **cell_metrics(work)})
        for n in args.n:
            for t in args.t:
                thr = None if t == "null" else float(t)
                if (n, thr) == default:
                    continue
                wall, _ = timed_dvc(["exp", "run", "-S", f"n_candidates={n}", "-S", f"rqe_threshold={t}"], work)
                cells.append({"n_candidates": n, "rqe_threshold": thr, "seconds": round(wall, 1), **cell_metrics(work)})
                print(f"N={n} T={t}: score {cells[-1]['score']:.4f} ({wall:.0f} s)", flush=True)
    finally:
        if args.workdir is None:
            shutil.rmtree(work_root, ignore_errors=True)
    cells.sort(key=lambda c: (c["n_candidates"], -1.0 if c["rqe_threshold"] is None else c["rqe_threshold"]))
    out = {
        "commit": head,
        "date": time.strftime("%Y-%m-%d"),
        "default": {"n_candidates": default[0], "rqe_threshold": default[1]},
        "rule": "N and T: the best score (mean of CV accuracy and LOSO mean accuracy of the final system) wins unless the "
        "default cell is within the noise band of it; a tie keeps the default",
        "pick": pick(cells, default),
        "cells": cells,
    }
    write_json(OUT, out)
    print(json.dumps(out["pick"]))


if __name__ == "__main__":
    main()
