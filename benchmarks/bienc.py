"""Bi-encoder (all-mpnet-base-v2, stage bienc / passages) encoding speed on real MEDIQA answers: sentence-transformers at
its best against medrank's paths, side by side in one process.

Peers: sentence-transformers' SentenceTransformer on the same weights at fp32 and with its weights cast to bf16, at
batch 32 and 64. medrank: SentenceEncoder.encode at fp32, bf16 (torch autocast over bf16 Linear copies) and, where
OpenVINO is installed, openvino-bf16 / openvino-fp32. Methods take turns on slices of the texts (best of --repeats
per slice), so load from other processes hits them alike. Prints texts/s, the ratio to the fastest peer within the
cosine tolerance, the share of the bf16 / fp32 matmul peak, and max |1 - cos| against medrank fp32.

    python benchmarks/bienc.py [--texts 256] [--max-length 256] [--threads N]

With --request K: a served request instead (issue 65), the 10-answer validation questions' texts (question + answers,
normalized, as /rank encodes them), one question at a time, K of them in turns: medrank at --precision with the
stages' batching (one batch padded to the longest: one OpenVINO stream busy) and with serving's
(`request_batches`: each text at its own width, the call shared by the streams), and the peer (sentence-transformers
fp32, batch 32). Prints the median seconds per question, the ratio to the question's compute floor (its useful
FLOPs at the measured matmul peak of the precision on these threads) and whether the two batchings' vectors are the
same bits.

    python benchmarks/bienc.py --request 5 [--precision openvino-fp32] [--threads N]
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from extraction import flops_per_pair, matmul_peak  # noqa: E402

from medrank.core import layout  # noqa: E402
from medrank.encoders.hardware import cpu_flags  # noqa: E402
from medrank.encoders.weights import resolve_model_path  # noqa: E402
from medrank.encoders.sentence_encoder import SentenceEncoder  # noqa: E402

TOLERANCE = 0.02  # max |1 - cos| against fp32 a path may show and still count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--texts", type=int, default=256)
    ap.add_argument("--model", default="all-mpnet-base-v2")
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--request", type=int, default=0, help="time K served requests instead (validation questions)")
    ap.add_argument("--precision", default="openvino-fp32", help="medrank's precision in --request mode")
    args = ap.parse_args()
    threads = args.threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    if args.request:
        return request_rows(args, threads)
    answers = pd.read_parquet(layout.NORMALIZED / "answers.parquet", columns=["answer_norm"])["answer_norm"]
    rng = np.random.default_rng(13)
    texts = answers.fillna("").iloc[rng.choice(len(answers), args.texts, replace=False)].tolist()

    ours = SentenceEncoder(args.model, device="cpu", max_length=args.max_length)
    st = peer_model(ours, args.model, args.max_length)
    st_cast = copy.deepcopy(st).to(torch.bfloat16)  # the peer at its own bf16: weights cast
    tokens = np.array([len(x) for x in ours.tokenizer(texts, truncation=True, max_length=args.max_length)["input_ids"]])
    fpt = flops_per_pair(ours.model.config, tokens)
    peak = {"fp32": matmul_peak(torch.float32), "bf16": matmul_peak(torch.bfloat16)}
    load = os.getloadavg()

    def st_encode(model, ts, batch):
        return np.asarray(model.encode(ts, batch_size=batch, normalize_embeddings=True), dtype=np.float32)

    methods = {"medrank fp32": ("fp32", lambda ts: ours.encode(ts, "fp32", 32))}
    peers = set()
    for batch in (32, 64):
        for name, model, prec in ((f"ST fp32 b{batch}", st, "fp32"), (f"ST bf16-cast b{batch}", st_cast, "bf16")):
            methods[name] = (prec, lambda ts, m=model, b=batch: st_encode(m, ts, b))
            peers.add(name)
    ours_precs = ["bf16"] + (["openvino-bf16", "openvino-fp32"] if importlib.util.find_spec("openvino") else [])
    for prec in ours_precs:
        methods[f"medrank {prec}"] = (prec, lambda ts, p=prec: ours.encode(ts, p, 32))
    for _, fn in methods.values():
        fn(texts[:8])  # warm: weights cast, graphs compiled
    seconds = {k: 0.0 for k in methods}
    outs: dict[str, list] = {k: [] for k in methods}
    step = -(-len(texts) // args.rounds)
    for s in range(0, len(texts), step):
        part = texts[s : s + step]
        best = {k: float("inf") for k in methods}
        for rep in range(args.repeats):
            for name, (_, fn) in methods.items():
                t = time.perf_counter()
                r = fn(part)
                best[name] = min(best[name], time.perf_counter() - t)
                if rep == 0:
                    outs[name].append(r)
        for name in methods:
            seconds[name] += best[name]
    ref = np.concatenate(outs["medrank fp32"])
    rows = []
    for name, (prec, _) in methods.items():
        v = np.concatenate(outs[name])
        rows.append((name, prec, len(texts) / seconds[name], float(np.abs((v * ref).sum(1) - 1).max())))
    best_peer_rate, best_peer = max((r, n) for n, _, r, d in rows if n in peers and d <= TOLERANCE)
    load_end = os.getloadavg()
    print(
        f"{len(texts)} MEDIQA answers (mean {tokens.mean():.1f} tokens, max_length {args.max_length}); model {args.model}; "
        f"CPU flags {','.join(cpu_flags())}; threads {threads}; load average at start {load[0]:.2f}, at end {load_end[0]:.2f}"
    )
    print(
        f"matmul peak: fp32 {peak['fp32']:.1f} GFLOP/s, bf16 {peak['bf16']:.1f} GFLOP/s; useful forward "
        f"{fpt / 1e9:.2f} GFLOP/text; fastest peer within |1 - cos| <= {TOLERANCE}: {best_peer} ({best_peer_rate:.2f} texts/s)\n"
    )
    print(
        "| method | precision | texts/s | x best peer | % of its precision's peak | max abs (1 - cos) vs medrank fp32 |"
    )
    print("|---|---|---|---|---|---|")
    for name, prec, rate, d in rows:
        share = 100 * rate * fpt / 1e9 / peak["fp32" if prec.endswith("fp32") else "bf16"]
        print(f"| {name} | {prec} | {rate:.2f} | {rate / best_peer_rate:.2f} | {share:.1f}% | {d:.5f} |")


def peer_model(ours: SentenceEncoder, model: str, max_length: int):
    """sentence-transformers on the same weights: the model card's pipeline (transformer, mean pooling, L2
    normalisation), built from its modules (the packaged folder's pooling config predates its keyword names)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    body = Transformer(str(resolve_model_path(model)), max_seq_length=max_length)
    return SentenceTransformer(modules=[body, Pooling(ours.hidden, "mean"), Normalize()], device="cpu")


def request_rows(args, threads: int) -> None:
    """One served request at a time: the stages' batching, serving's, and the peer, in turns on the same questions."""
    import statistics

    answers = pd.read_parquet(
        layout.NORMALIZED / "answers.parquet", columns=["split", "qid", "question_norm", "answer_norm"]
    )
    val = answers[answers["split"] == "val"].fillna("")
    questions = [
        [g["question_norm"].iloc[0], *g["answer_norm"].tolist()]
        for _, g in val.groupby("qid", sort=False)
        if len(g) == 10
    ][: args.request]
    ours = SentenceEncoder(args.model, device="cpu", max_length=args.max_length)
    st = peer_model(ours, args.model, args.max_length)
    prec = args.precision
    fp = torch.float32 if prec.endswith("fp32") else torch.bfloat16
    peak = matmul_peak(fp)

    def medrank(parts):
        def run(texts):
            ours.parts = parts
            return ours.encode(texts, prec, 32)

        return run

    methods = {
        f"medrank {prec}, the stages' batching": medrank(1),
        f"medrank {prec}, serving's batching": medrank(max(2, threads)),
        "ST fp32 b32 (peer)": lambda texts: np.asarray(st.encode(texts, batch_size=32, normalize_embeddings=True)),
    }
    for fn in methods.values():
        fn(questions[0])  # warm: graphs compiled
    seconds: dict[str, list[float]] = {k: [] for k in methods}
    same = True
    floors = []
    for texts in questions:
        tokens = np.array(
            [len(x) for x in ours.tokenizer(texts, truncation=True, max_length=args.max_length)["input_ids"]]
        )
        floors.append(flops_per_pair(ours.model.config, tokens) * len(tokens) / (peak * 1e9))
        outs = {}
        for name, fn in methods.items():
            t = time.perf_counter()
            outs[name] = fn(texts)
            seconds[name].append(time.perf_counter() - t)
        a, b = (outs[k] for k in list(methods)[:2])
        same = same and bool(np.array_equal(a, b))
    floor = statistics.median(floors)
    print(
        f"{len(questions)} served requests (10-answer validation questions, 11 texts each); model {args.model}; CPU flags "
        f"{','.join(cpu_flags())}; threads {threads}; {prec} matmul peak {peak:.1f} GFLOP/s; median floor {floor:.3f} s; "
        f"the two batchings' vectors the same bits: {same}\n"
    )
    print("| method | median s | min s | max s | x floor |")
    print("|---|---|---|---|---|")
    for name, ts in seconds.items():
        med = statistics.median(ts)
        print(f"| {name} | {med:.3f} | {min(ts):.3f} | {max(ts):.3f} | {med / floor:.2f} |")


if __name__ == "__main__":
    main()
