"""What an experiment costs: `dvc exp run -S <param>` after a full `dvc repro`, per stage, with the extraction caches' hits.

The mission's loop is `dvc exp run -S n_candidates=5` then `dvc metrics diff`; the caches make the new sentence pairs
the only new encoder work, so the experiment should cost a fraction of the full repro. This prints, side by side in
one run: the full repro's seconds, the experiment's seconds, and per stage whether it ran and for how long, plus the
cached / computed pairs of each extraction pass (retrieve, embed), so that cost is watched like extraction speed;
with --cold also whether the fresh clone rebuilt the committed outputs bit for bit (its dvc.lock against the commit's).

    python benchmarks/experiment.py [--set n_candidates=5] [--workdir DIR]   # tiny profile, a scratch repo (~6 min)
    python benchmarks/experiment.py --profile default                        # a clone of this checkout, outputs from
                                                                             # its DVC cache (no full repro)
    python benchmarks/experiment.py --profile default --target analysis/dvc.yaml:system_choice   # N's experiment:
                                                                             # the MTL path reads N, the default DAG not
    python benchmarks/experiment.py --profile default --cold                 # a fresh clone, an empty DVC cache: the
                                                                             # full `dvc repro` (~40 min), then the experiment
    python benchmarks/experiment.py --paired NEW OLD [--runs 3]              # the experiment from two checkouts with
                                                                             # outputs, taking turns: median totals
    python benchmarks/experiment.py --queue n_candidates=4 n_candidates=5    # two queued experiments: `dvc queue start
                                                                             # -j 1` vs `-j 2`, each in its own clone
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.conftest import GIT, REPO, SHARED_DATA, build_tiny_repo

_RUNNING = re.compile(r"^Running stage '([^']+)'")
_SKIPPED = re.compile(r"^Stage '([^']+)' didn't change, skipping")
_PEAK = re.compile(r"stage (\S+): peak RSS (\d+) MiB \(its largest worker: (\d+) MiB\)")  # medrank.stage.runner


def timed_dvc(args: list[str], cwd: Path, peaks: dict[str, int] | None = None) -> tuple[float, dict[str, float | None]]:
    """Run `dvc <args>`, streaming its output; (wall seconds, {stage: seconds it ran, or None if skipped}). `peaks`
    gets each stage's peak RSS in MiB (its process or its largest worker, from the line the stage ends with)."""
    stages: dict[str, float | None] = {}
    current, since = None, 0.0
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dvc", *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    tail: list[str] = []
    for line in proc.stdout:
        now = time.perf_counter()
        tail = (tail + [line])[-40:]
        if peaks is not None and (p := _PEAK.search(line)):
            peaks[p[1]] = max(int(p[2]), int(p[3]))
        if (m := _RUNNING.match(line)) or (s := _SKIPPED.match(line)):
            if current is not None:
                stages[current] = now - since
                current = None
            if m:
                current, since = m[1], now
            else:
                stages.setdefault(s[1], None)
    wall = time.perf_counter() - t0
    if current is not None:
        stages[current] = wall - (since - t0)
    if proc.wait() != 0:
        sys.exit(f"dvc {' '.join(args)} failed:\n{''.join(tail)}")
    return wall, stages


def cache_hits(repo: Path) -> dict[str, dict]:
    """cached / computed pairs of each extraction pass, from the stages' metrics."""
    out = {}
    for stage, key in (("retrieve", None), ("embed", "nli"), ("embed", "bi_encoder")):
        path = repo / "metrics" / f"{stage}.json"
        if path.is_file():
            extract = json.loads(path.read_text()).get("extract", {})
            ex = extract.get(key, {}) if key else extract
            if ex:
                out[f"{stage}/{ex.get('kind', key)}"] = {
                    "cached": ex.get("cached"),
                    "computed": ex.get("computed"),
                    "pairs": ex.get("pairs"),
                }
    return out


def lock_outs(lock_text: str) -> dict[str, str]:
    """{stage/out path: md5} of a dvc.lock's outs (metrics and plots carry seconds: compared as outs only when cached)."""
    import yaml

    lock = yaml.safe_load(lock_text) or {}
    return {
        f"{name}/{o['path']}": o.get("md5", "")
        for name, st in (lock.get("stages") or {}).items()
        for o in st.get("outs", [])
    }


def rebuilt(committed: dict[str, str], fresh: dict[str, str]) -> tuple[int, list[str]]:
    """(outs the fresh repro rebuilt bit for bit, the ones it did not) among the committed lock's outs, ignoring the
    outputs that hold their own wall time (metrics, dvclive plots, models/mtl's per-epoch seconds) and the persistent
    extraction caches (a working copy's hold every namespace it ever computed)."""
    skip = ("metrics/", "plots/", "models/mtl", "data/cache/")
    keys = [k for k in committed if not k.split("/", 1)[1].startswith(skip)]
    differ = [k for k in keys if fresh.get(k) != committed[k]]
    return len(keys) - len(differ), differ


def machine_speed() -> str:
    """1-thread fp32 and bf16 matmul GFLOP/s (benchmarks/extraction.py's matmul_peak), in a subprocess so this one's
    torch threads stay as they are: the reference a result file's seconds are read against."""
    code = (
        "import sys, torch; sys.path.insert(0, 'benchmarks'); torch.set_num_threads(1); from extraction import matmul_peak; "
        "print(f'{matmul_peak(torch.float32):.0f} / {matmul_peak(torch.bfloat16):.0f}')"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    return out.stdout.strip() or f"(not measured: {out.stderr.strip().splitlines()[-1:]})"


def scratch_default(work: Path) -> Path:
    """A clone of this checkout with its committed outputs checked out from the DVC cache (its config.local)."""
    subprocess.run(["git", "clone", "-q", str(REPO), str(work)], check=True)
    local = REPO / ".dvc" / "config.local"
    if local.is_file():
        shutil.copy2(local, work / ".dvc" / "config.local")
    else:  # this checkout's own cache (a machine without a shared cache dir)
        subprocess.run(
            [sys.executable, "-m", "dvc", "cache", "dir", "--local", str((REPO / ".dvc" / "cache").resolve())],
            cwd=work,
            check=True,
        )
    # --allow-missing: the analysis pipeline's outputs may never have been built here; the experiment does not read them
    subprocess.run([sys.executable, "-m", "dvc", "checkout", "-q", "--allow-missing"], cwd=work, check=True)
    return work


def scratch_cold(work: Path) -> Path:
    """A fresh clone of this checkout with ../shared beside it (the acquire stage's mirror) and its own empty DVC cache."""
    subprocess.run(["git", "clone", "-q", str(REPO), str(work)], check=True)
    (work.parent / "shared").symlink_to(SHARED_DATA.parent.resolve())
    return work


def scratch_isolated(work: Path, repo: Path = REPO) -> Path:
    """A clone of `repo` whose DVC cache is a hard-linked copy of its cache (no bytes copied): the clone's
    experiments add objects and run-cache entries to its own copy only, so a second clone does not find them."""
    subprocess.run(["git", "clone", "-q", str(repo), str(work)], check=True)
    source = repo / ".dvc" / "cache"
    local = repo / ".dvc" / "config.local"
    if local.is_file():
        got = subprocess.run(
            [sys.executable, "-m", "dvc", "cache", "dir"], cwd=repo, capture_output=True, text=True, check=True
        ).stdout.strip()
        source = Path(got)
    cache = work.parent / f"{work.name}-cache"
    subprocess.run(["cp", "-al", str(source), str(cache)], check=True)
    subprocess.run([sys.executable, "-m", "dvc", "cache", "dir", "--local", str(cache)], cwd=work, check=True)
    subprocess.run([sys.executable, "-m", "dvc", "checkout", "-q", "--allow-missing"], cwd=work, check=True)
    return work


def queue_experiments(overrides: list[str], work_root: Path) -> dict[str, dict]:
    """The experiments queued (`dvc exp run --queue -S o` each) and run by `dvc queue start -j J`, J = 1 (one after
    the other) and 2 (side by side), each mode in its own clone and cache copy; wall seconds until the queue is empty."""
    out = {}
    for mode, jobs in (("serial (-j 1)", 1), ("side by side (-j 2)", 2)):
        work = scratch_isolated(work_root / f"repo-j{jobs}")
        for o in overrides:
            subprocess.run(
                [sys.executable, "-m", "dvc", "exp", "run", "--queue", "-S", o],
                cwd=work,
                check=True,
                capture_output=True,
            )
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "dvc", "queue", "start", "-j", str(jobs)], cwd=work, check=True, capture_output=True
        )
        while True:
            time.sleep(5)
            status = subprocess.run(
                [sys.executable, "-m", "dvc", "queue", "status"], cwd=work, capture_output=True, text=True
            ).stdout
            if not re.search(r"\b(Queued|Running)\b", status):
                break
        wall = time.perf_counter() - t0
        subprocess.run([sys.executable, "-m", "dvc", "queue", "stop"], cwd=work, capture_output=True)
        done = len(re.findall(r"\bSuccess\b", status))
        out[mode] = {"seconds": round(wall, 1), "succeeded": done, "queued": len(overrides)}
        print(f"{mode}: {len(overrides)} experiments in {wall:.0f} s ({done} succeeded)", flush=True)
    return out


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def paired_experiments(sources: list[Path], runs: int, overrides: list[str], work_root: Path) -> None:
    """The same experiment from each source checkout (its committed outputs in its DVC cache), `runs` rounds taking
    turns, each in a fresh clone with its own cache copy; per-stage seconds, the median total per source, the host's
    speed around each run, and whether every run left the same output bits (a faster path must not change them)."""
    args = [a for o in overrides for a in ("-S", o)]
    rows, outs, notes = [], {}, []
    for r in range(1, runs + 1):
        for src in sources:
            commit = subprocess.run(
                [*GIT, "rev-parse", "--short", "HEAD"], cwd=src, capture_output=True, text=True, check=True
            ).stdout.strip()
            work = work_root / f"run{r}-{commit}"
            scratch_isolated(work, src)
            before, load0 = machine_speed(), load()
            wall, stages = timed_dvc(["exp", "run", *args], work)
            outs[(r, commit)] = lock_outs((work / "dvc.lock").read_text())
            notes.append(
                f"run {r} {commit}: machine speed (1-thread fp32 / bf16 matmul GFLOP/s): before {before}, after "
                f"{machine_speed()}; load at start/end: {load0} / {load()}"
            )
            rows.append((r, commit, stages, wall))
            print(f"run {r} {commit}: {wall:.1f} s", flush=True)
            shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(work.parent / f"{work.name}-cache", ignore_errors=True)
    ran = [st for st in dict.fromkeys(k for _, _, stages, _ in rows for k in stages) if any(x[2].get(st) for x in rows)]
    print(f"{'run':<6} {'commit':<9}" + "".join(f" {st[:9]:>9}" for st in ran) + f" {'total':>9}")
    for r, commit, stages, wall in rows:
        cells = "".join(f" {'-' if stages.get(st) is None else f'{stages[st]:.1f}':>9}" for st in ran)
        print(f"{r:<6} {commit:<9}{cells} {wall:>9.1f}")
    by = {}
    for _, commit, _, wall in rows:
        by.setdefault(commit, []).append(wall)
    print("median total: " + ", ".join(f"{c} {sorted(w)[len(w) // 2]:.1f} s ({len(w)} runs)" for c, w in by.items()))
    print("\n".join(notes))
    first = next(iter(outs.values()))
    differ = sorted({k for o in outs.values() for k in rebuilt(first, o)[1]})
    print(
        f"outputs after the experiment: {rebuilt(first, first)[0]} compared (metrics, plots, models/mtl and data/cache/ "
        "hold timings or every namespace: not compared); "
        + (f"differ between runs: {', '.join(differ)}" if differ else "the same bits in every run")
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", choices=("tiny", "default"), default="tiny")
    ap.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help="dvc exp run -S (default n_candidates=5)",
    )
    ap.add_argument(
        "--target",
        action="append",
        default=None,
        metavar="STAGE",
        help="dvc exp run's targets (default: dvc.yaml's; the MTL path, which reads N: analysis/dvc.yaml:system_choice)",
    )
    ap.add_argument("--workdir", type=Path, default=None, help="scratch folder (kept); default a temp folder, removed")
    ap.add_argument(
        "--cold",
        action="store_true",
        help="default profile: a fresh clone and an empty DVC cache, so the full repro runs first",
    )
    ap.add_argument(
        "--queue", nargs="+", metavar="KEY=VALUE", default=None, help="queue one experiment per value; -j 1 vs -j 2"
    )
    ap.add_argument(
        "--paired",
        nargs="+",
        type=Path,
        metavar="CHECKOUT",
        default=None,
        help="default profile: the experiment from each checkout (outputs in its DVC cache), --runs rounds taking turns",
    )
    ap.add_argument("--runs", type=int, default=3, help="--paired: rounds (the median total per checkout)")
    args = ap.parse_args()
    if args.paired:
        if args.runs < 1:
            sys.exit(f"--runs: at least 1, got {args.runs}")
        if bad := [str(s) for s in args.paired if not (s / ".git").exists() or not (s / "dvc.lock").is_file()]:
            sys.exit(f"--paired: not a checkout with a dvc.lock: {', '.join(bad)}")
        work_root = args.workdir or Path(tempfile.mkdtemp(prefix="medrank-paired-"))
        work_root.mkdir(parents=True, exist_ok=True)
        try:
            paired_experiments(
                [s.resolve() for s in args.paired], args.runs, args.overrides or ["n_candidates=5"], work_root
            )
        finally:
            if args.workdir is None:
                shutil.rmtree(work_root, ignore_errors=True)
        return
    if args.queue:
        work_root = args.workdir or Path(tempfile.mkdtemp(prefix="medrank-queue-"))
        try:
            res = queue_experiments(args.queue, work_root)
        finally:
            if args.workdir is None:
                shutil.rmtree(work_root, ignore_errors=True)
        serial, side = res["serial (-j 1)"]["seconds"], res["side by side (-j 2)"]["seconds"]
        print(
            f"side by side / serial: {side / serial:.2f}x (<= 1.00: two queued experiments finish no later than one after the other)"
        )
        return
    overrides = args.overrides or ["n_candidates=5"]
    speed_before = machine_speed()
    work_root = args.workdir or Path(tempfile.mkdtemp(prefix="medrank-exp-"))
    work = work_root / "repo"
    full_peaks: dict[str, int] = {}
    exp_peaks: dict[str, int] = {}
    try:
        if args.profile == "tiny" or args.cold:
            if not SHARED_DATA.is_dir():
                sys.exit(f"mirror {SHARED_DATA} not present")
            if args.profile == "tiny":
                build_tiny_repo(work)
            else:
                scratch_cold(work)
            committed = lock_outs((work / "dvc.lock").read_text())
            full, full_stages = timed_dvc(["repro"], work, full_peaks)
            same, differ = rebuilt(committed, lock_outs((work / "dvc.lock").read_text()))
            subprocess.run([*GIT, "add", "-A"], cwd=work, check=True)
            subprocess.run([*GIT, "commit", "-qm", "full repro"], cwd=work, check=True)
        else:
            scratch_default(work)
            full, full_stages = None, {}
            same, differ = None, []
        before = cache_hits(work)
        targets = args.target or []
        exp, exp_stages = timed_dvc(
            ["exp", "run", *targets, *[a for o in overrides for a in ("-S", o)]], work, exp_peaks
        )
        after = cache_hits(work)
        diff = subprocess.run(
            [sys.executable, "-m", "dvc", "metrics", "diff", "--md"], cwd=work, capture_output=True, text=True
        ).stdout
    finally:
        if args.workdir is None:
            shutil.rmtree(work_root, ignore_errors=True)

    print(
        f"profile {args.profile}{' (cold: fresh clone, empty DVC cache)' if args.cold else ''}; experiment: dvc exp run {' '.join([*(args.target or []), *('-S ' + o for o in overrides)])}"
    )
    # the same cores give other seconds when the host is busy (a shared VM): this says how fast they were, before and after
    print(f"machine speed (1-thread fp32 / bf16 matmul GFLOP/s): before {speed_before}, after {machine_speed()}")
    print(f"{'stage':<14} {'full repro s':>12} {'experiment s':>12} {'peak RSS MiB':>12}")
    for st in dict.fromkeys([*full_stages, *exp_stages]):
        f, e = full_stages.get(st), exp_stages.get(st)
        rss = max(full_peaks.get(st, 0), exp_peaks.get(st, 0)) or "-"
        print(f"{st:<14} {'-' if f is None else f'{f:.1f}':>12} {'skipped' if e is None else f'{e:.1f}':>12} {rss:>12}")
    ratio = f"  ({exp / full:.2f}x the full repro)" if full else ""
    print(f"{'total':<14} {'-' if full is None else f'{full:.1f}':>12} {exp:>12.1f}{ratio}")
    # ru_maxrss of waited-for descendants: the largest single process (a stage, or one of the mtl stage's fit workers)
    if args.cold:  # the tiny profile has no committed outputs to compare
        print(
            f"fresh clone vs the committed dvc.lock: {same} outputs rebuilt bit for bit"
            + (
                f"; differ: {', '.join(differ)}"
                if differ
                else " (all; metrics, plots and models/mtl hold timings, data/cache/ every namespace ever computed: not compared)"
            )
        )
    print(
        f"peak RSS of one process (full repro and experiment): {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20:.2f} GiB"
    )
    ran = {*full_stages, *exp_stages}
    for name, hits in after.items():
        if not ran & {name.split("/")[0], f"analysis/dvc.yaml:{name.split('/')[0]}"}:
            continue  # its metrics file is the committed one: neither run computed a pair of it
        print(
            f"{name}: experiment computed {hits['computed']} of {hits['pairs']} pairs, {hits['cached']} from the cache"
            + (f" (full repro computed {before[name]['computed']})" if name in before and full else "")
        )
    print("\ndvc metrics diff (experiment vs its baseline):\n" + (diff or "(no change)"))


if __name__ == "__main__":
    main()
