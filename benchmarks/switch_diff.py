"""What a switch that should not change the science did to the pipeline's numbers: the workspace's metrics against a
git revision's, each change set beside the seed band of that revision's metrics/noise_band.json (the written rule's
noise band), the nested LOSO of the final system, and the blind Task 3 labels that flipped.

    python benchmarks/switch_diff.py --rev HEAD [--before-name "bf16 (torch)"] [--after-name openvino-bf16]

Reads only committed metrics files (never runs a stage); prints a markdown table for benchmarks/results/.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROWS = [  # (metrics file, system in the noise band, estimate path)
    *(
        (f"task3_val_{system}", system, f"{proto}.{metric}.{stat}")
        for system in ("baseline", "mtl")
        for proto in ("cv", "loso")
        for metric in ("accuracy", "precision", "mrr", "spearman")
        for stat in (("mean",) if proto == "cv" else ("mean", "worst"))
    ),
]


def at(rev: str | None, path: str) -> str:
    if rev is None:
        if not (REPO / path).is_file():
            raise SystemExit(f"{path}: missing in the workspace (run the pipeline first)")
        return (REPO / path).read_text()
    shown = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=REPO, capture_output=True, text=True)
    if shown.returncode != 0:
        raise SystemExit(f"{rev}:{path}: not in git ({shown.stderr.strip().splitlines()[-1:]})")
    return shown.stdout


def get(d: dict, dotted: str):
    for k in dotted.split("."):
        d = d[k]
    return d


def labels(text: str) -> tuple[dict[tuple[str, str], str], list[tuple[str, str]]]:
    rows = [r for r in csv.reader(io.StringIO(text)) if r and r[0] != "qid"]
    return {(r[0], r[1]): r[2] for r in rows}, [(r[0], r[1]) for r in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default="HEAD", help="the revision before the switch")
    ap.add_argument("--before-name", default="before")
    ap.add_argument("--after-name", default="after")
    args = ap.parse_args()
    band = json.loads(at(args.rev, "metrics/noise_band.json"))
    print(
        f"| metrics file | estimate | {args.before_name} | {args.after_name} | change | seed band "
        f"({band['baseline']['seeds']} seeds, before) | |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, system, path in ROWS:
        b = get(json.loads(at(args.rev, f"metrics/{name}.json")), path)
        a = get(json.loads(at(None, f"metrics/{name}.json")), path)
        width = band[system][path.split(".")[1]]
        where = "inside" if abs(a - b) <= width else "OUTSIDE"
        print(f"| {name} | {path} | {b:.4f} | {a:.4f} | {a - b:+.4f} | {width:.4f} | {where} |")
    print(f"\nnoise band before: {json.dumps(band)}")
    print(f"noise band after:  {json.dumps(json.loads(at(None, 'metrics/noise_band.json')))}")
    chosen = ("system", "keep_rule", "mtl_weight", "order")
    for when, rev in (("before", args.rev), ("after", None)):
        final = json.loads(at(rev, "metrics/task3_val.json"))
        print(f"final system {when}: " + ", ".join(f"{k} {final.get(k)}" for k in chosen))
    before, order_b = labels(at(args.rev, "submissions/task3_test.csv"))
    after, order_a = labels(at(None, "submissions/task3_test.csv"))
    flipped = sum(before[k] != after.get(k) for k in before)
    same_place = sum(x == y for x, y in zip(order_b, order_a))
    print(
        f"submissions/task3_test.csv: {flipped} of {len(before)} labels flipped, "
        f"{same_place / max(1, len(order_b)):.1%} of rows in the same position"
    )
    nb = json.loads(at(args.rev, "metrics/nested_loso.json"))["final_system"]["nested_loso"]
    na = json.loads(at(None, "metrics/nested_loso.json"))["final_system"]["nested_loso"]
    print("\nnested LOSO of the final system (metrics/nested_loso.json):")
    print(f"| metric | {args.before_name} | {args.after_name} | change |\n|---|---|---|---|")
    for metric in ("accuracy", "precision", "mrr", "spearman"):
        for stat in ("mean", "worst"):
            b, a = nb[metric][stat], na[metric][stat]
            print(f"| {metric} {stat} | {b:.4f} | {a:.4f} | {a - b:+.4f} |")


if __name__ == "__main__":
    main()
