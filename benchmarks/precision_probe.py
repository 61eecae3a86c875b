"""Cross-encoder inference speed side by side: naive padded fp32 loop vs medrank predict at fp32 / bf16 / int8.

    python benchmarks/precision_probe.py [--pairs 2000] [--model models/rqe] [--threads 1]

Pairs: MEDIQA Task 2 validation+test and SICK dev/test from data/interim/clean (run `dvc repro clean` first).
Prints pairs/s per variant, the ratio to the naive loop, the max probability difference to fp32, and what a
precision `auto` picks on this machine (the hardware's flags; set the stage's precision param to the fastest one).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd
import torch

from medrank.core import layout
from medrank.encoders.hardware import cpu_flags
from medrank.encoders.weights import DEFAULT_MODEL
from medrank.encoders.cross_encoder import CrossEncoder


def real_pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    rqe = pd.read_parquet(layout.CLEAN_RQE_PAIRS)
    nli = pd.read_parquet(layout.CLEAN_NLI)
    pairs = list(zip(rqe["chq"], rqe["faq"])) + list(zip(nli["premise"], nli["hypothesis"]))
    idx = np.random.default_rng(seed).choice(len(pairs), size=min(n, len(pairs)), replace=False)
    return [pairs[i] for i in idx]


def naive(ce: CrossEncoder, pairs: list[tuple[str, str]], batch_size: int) -> np.ndarray:
    """The usual loop: input order, every batch padded to max_length, fp32."""
    out = []
    with torch.inference_mode():
        for i in range(0, len(pairs), batch_size):
            chunk = pairs[i : i + batch_size]
            enc = ce.tokenizer(
                [a for a, _ in chunk],
                [b for _, b in chunk],
                truncation=True,
                max_length=ce.max_length,
                padding="max_length",
                return_tensors="pt",
            )
            out.append(torch.softmax(ce.model(**enc).logits, -1).numpy())
    return np.concatenate(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=2000)
    ap.add_argument("--model", default=None, help="a saved medrank model folder (default: fresh head on MiniLM)")
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.model:
        ce = CrossEncoder.load(a.model, device="cpu")
    else:
        ce = CrossEncoder.from_base(DEFAULT_MODEL, 2, a.max_length, device="cpu")
    pairs = real_pairs(a.pairs)
    print(f"{len(pairs)} pairs, max_length {ce.max_length}, threads {torch.get_num_threads()}, cpu flags {cpu_flags()}")
    t = time.perf_counter()
    ref = naive(ce, pairs, a.batch_size)
    base_rate = len(pairs) / (time.perf_counter() - t)
    print(f"{'naive padded fp32':<22} {base_rate:8.1f} pairs/s  1.00x")
    for p in ("fp32", "bf16", "int8"):
        probs = ce.predict(pairs, batch_size=a.batch_size, show_progress=False, precision=p)
        rate = ce.last_predict_stats["pairs_per_s"]
        diff = float(np.abs(probs - ref).max())
        agree = float((probs.argmax(1) == ref.argmax(1)).mean())
        print(
            f"{'medrank ' + p:<22} {rate:8.1f} pairs/s  {rate / base_rate:5.2f}x  max|Δp| vs fp32 {diff:.4f}  same label {agree:.1%}"
        )
    ce.precision_report = None
    ce.resolve_precision(pairs[:16])
    print("probe picks:", ce.precision_report.as_dict())


if __name__ == "__main__":
    main()
