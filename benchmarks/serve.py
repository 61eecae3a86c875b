"""`medrank serve` under load on loopback: latency, throughput, errors and memory, each question alone and micro-batched.

The real MEDIQA validation questions (data/interim/clean/answers.parquet, as a user sends them: the question and
CHiQA's answers in CHiQA's order) are posted to a server started here on 127.0.0.1 (a free port), run from a scratch
folder that holds only a link to the models (no data/cache: every vector is computed, as for a new question).
Phases, each bounded in time and in requests:

  single      one client, the 10-answer questions in turn after one unmeasured: the latency of one question alone
  load        --clients clients for --duration seconds, each posting the next question as soon as it has an answer
  overload    --overload-clients clients against a queue of --overload-queue for --overload-duration seconds:
              the overflow must be 503 with Retry-After, never a failure

`load` and `overload` run once per --max-batch value (1: each question alone; >1: the questions waiting together in
one pass). --systems runs, side by side in the same run on the same requests: `medrank` (as served: its vector cache
on), `medrank-nocache` (`--vector-cache-mb 0`: every text encoded at every request) and `peer`
(benchmarks/peer_server.py: sentence-transformers `encode` of the same texts with the same encoder, precision and
max length, cosine order; no queue bound, so it has no overload phase). Peak RSS is the server's (sampled every 0.5 s); "flat memory" compares its RSS after the first and the
last quarter of the load phase. The machine's load average is recorded: on a shared machine the figures move with it.

    python benchmarks/serve.py --data ../main/data [--models models] [--clients 8] [--duration 120]
        [--max-batch 1 4] [--out benchmarks/results/serve-DATE]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def validation_questions(data: Path) -> list[dict]:
    """The validation questions as `medrank rank` / POST /rank bodies (answers in CHiQA's order)."""
    from medrank.core.errors import MedrankError
    from medrank.serving.examples import validation_questions as read

    try:
        return read(data / "interim" / "clean" / "answers.parquet")
    except MedrankError as e:
        sys.exit(f"error: {e}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`medrank serve` (or the peer) in a subprocess from a scratch folder (models linked, nothing else), its RSS
    sampled."""

    def __init__(
        self, models: Path, max_batch: int, max_queue: int, timeout: float, threads: int | None, system: str = "medrank"
    ) -> None:
        self.scratch = Path(tempfile.mkdtemp(prefix="medrank-serve-bench-"))
        (self.scratch / "models").symlink_to(models.resolve())
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        if system == "peer":
            cmd = [sys.executable, str(ROOT / "benchmarks" / "peer_server.py"), "--models", "models"]
            cmd += ["--port", str(self.port)]
        else:
            cmd = [sys.executable, "-m", "medrank.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port)]
            cmd += ["--max-batch", str(max_batch), "--max-queue", str(max_queue), "--timeout", str(timeout)]
            cmd += ["--vector-cache-mb", "0"] if system == "medrank-nocache" else []
        cmd += ["--threads", str(threads)] if threads else []
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.log = open(self.scratch / "server.log", "w")
        self.proc = subprocess.Popen(cmd, cwd=self.scratch, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.rss: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        import psutil

        p = psutil.Process(self.proc.pid)
        while not self._stop.is_set():
            try:
                self.rss.append((time.monotonic(), p.memory_info().rss))
            except psutil.Error:
                return
            time.sleep(0.5)

    def wait_ready(self, timeout: float = 600) -> dict:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"error: the server exited ({self.proc.returncode}); log: {self.scratch / 'server.log'}")
            try:
                r = httpx.get(f"{self.url}/readyz", timeout=5)
                if r.status_code == 200:
                    return r.json()
            except httpx.HTTPError:
                pass
            time.sleep(1)
        sys.exit("error: the server was not ready in time")

    def stop(self) -> int:
        """SIGTERM (graceful: in-flight requests finish), then the exit code."""
        self.proc.terminate()
        try:
            code = self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._stop.set()
        self.log.close()
        return code


def percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def drive(url: str, questions: list[dict], clients: int, duration: float, max_requests: int) -> dict:
    """`clients` threads posting questions in turn for `duration` seconds (at most `max_requests` in all)."""
    import httpx

    lock = threading.Lock()
    done: list[dict] = []
    issued = [0]
    stop_at = time.monotonic() + duration

    def client(k: int) -> None:
        with httpx.Client(timeout=900) as c:
            i = k
            while time.monotonic() < stop_at:
                with lock:
                    if issued[0] >= max_requests:
                        return
                    issued[0] += 1
                q = questions[i % len(questions)]
                i += clients
                body = {"question": q["question"], "answers": q["answers"]}
                t0 = time.monotonic()
                try:
                    r = c.post(f"{url}/rank", json=body)
                    status, retry = r.status_code, r.headers.get("retry-after")
                    if status == 503:
                        time.sleep(min(float(retry or 1), max(0.0, stop_at - time.monotonic())))
                except httpx.HTTPError as e:
                    status, retry = type(e).__name__, None
                with lock:
                    done.append({"status": status, "s": time.monotonic() - t0, "answers": len(q["answers"])})

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    ok = [d["s"] for d in done if d["status"] == 200]
    statuses: dict[str, int] = {}
    for d in done:
        statuses[str(d["status"])] = statuses.get(str(d["status"]), 0) + 1
    return {
        "clients": clients,
        "seconds": round(wall, 1),
        "requests": len(done),
        "ok": len(ok),
        "statuses": statuses,
        "errors": sum(n for s, n in statuses.items() if s not in ("200", "503", "429")),
        "rejected_503": statuses.get("503", 0) + statuses.get("429", 0),
        "req_per_s": round(len(ok) / wall, 3) if wall else None,
        "p50_s": _r(percentile(ok, 0.5)),
        "p95_s": _r(percentile(ok, 0.95)),
        "p99_s": _r(percentile(ok, 0.99)),
        "mean_answers": round(statistics.mean(d["answers"] for d in done), 1) if done else None,
    }


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def single_questions(questions: list[dict], count: int) -> tuple[list[dict], list[dict]]:
    """(the unmeasured warm-up question, the measured ones): 10-answer questions."""
    tens = [q for q in questions if len(q["answers"]) == 10]
    return tens[-1:], tens[:count]


def compute_floor(models: Path, questions: list[dict], threads: int | None) -> dict:
    """The decided system's compute floor per question: the bi-encoder's useful forward FLOPs over the question and
    each answer (their real token counts, truncated at the encoder's max length; projections, FFN, attention:
    benchmarks/extraction.py's flops_per_pair) at this CPU's measured matmul peak (n=1024, the server's threads and
    precision). Everything else medrank does (cleaning, features, the fitted models) is counted as zero."""
    import numpy as np
    import torch
    from transformers import AutoConfig, AutoTokenizer

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from extraction import flops_per_pair, matmul_peak
    from peer_server import encoder_settings

    settings = encoder_settings(models)
    config, tok = AutoConfig.from_pretrained(settings["path"]), AutoTokenizer.from_pretrained(settings["path"])
    before = torch.get_num_threads()
    torch.set_num_threads(threads or os.cpu_count() or 1)
    try:
        bf16 = settings["precision"].removeprefix("openvino-") == "bf16"
        peak = matmul_peak(torch.bfloat16 if bf16 else torch.float32)
    finally:
        torch.set_num_threads(before)
    floors = {}
    for q in questions:
        texts = [q["question"]] + [a["text"] for a in q["answers"]]
        ids = tok(texts, truncation=True, max_length=settings["max_length"])["input_ids"]
        tokens = np.array([len(x) for x in ids])
        floors[q["qid"]] = round(flops_per_pair(config, tokens) * len(tokens) / (peak * 1e9), 3)
    return {
        "precision": settings["precision"],
        "threads": threads or os.cpu_count(),
        "matmul_peak_gflops": round(peak, 1),
        "floor_s": floors,
        "median_floor_s": round(statistics.median(floors.values()), 3),
    }


def single(url: str, questions: list[dict], count: int) -> dict:
    """One client, the 10-answer questions in turn: the latency of a question alone on a warm server."""
    warm, tens = single_questions(questions, count)
    drive(url, warm, 1, 3600, 1)  # one question first, not measured: the server is warm after it
    return {**drive(url, tens, 1, 3600, len(tens)), "questions": [q["qid"] for q in tens]}


def rss_summary(server: Server, start: float, end: float) -> dict:
    """Peak RSS, and the largest RSS in each quarter of the phase (flat memory: the quarters level off)."""
    window = [(t, r) for t, r in server.rss if start <= t <= end]
    if not window:
        return {}
    mib = 1 << 20
    span = max(end - start, 1e-9)
    quarters = [[r for t, r in window if min(int(4 * (t - start) / span), 3) == k] for k in range(4)]
    return {
        "peak_rss_mib": round(max(r for _, r in server.rss) / mib, 1),
        "rss_quarters_mib": [round(max(q) / mib, 1) if q else None for q in quarters],
        "rss_first_quarter_mib": round(max(quarters[0] or [0]) / mib, 1),
        "rss_last_quarter_mib": round(max(quarters[3] or [0]) / mib, 1),
    }


def run_mode(args, questions: list[dict], max_batch: int, system: str = "medrank") -> dict:
    out: dict = {"max_batch": max_batch, "system": system}
    server = Server(args.models, max_batch, args.max_queue, args.timeout, args.threads, system)
    try:
        out["ready"] = server.wait_ready()
        out["loadavg_start"] = [round(x, 2) for x in os.getloadavg()]
        if max_batch == 1 and args.single:
            out["single"] = single(server.url, questions, args.single)
            print(f"single: {json.dumps(out['single'])}", flush=True)
        t0 = time.monotonic()
        out["load"] = drive(server.url, questions, args.clients, args.duration, args.max_requests)
        out["load"].update(rss_summary(server, t0, time.monotonic()))
        out["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
        print(f"load ({system}, max_batch {max_batch}): {json.dumps(out['load'])}", flush=True)
        import httpx

        out["server_stats"] = httpx.get(f"{server.url}/readyz", timeout=10).json()["stats"]
        if system != "peer":
            out["cache"] = cache_counts(httpx.get(f"{server.url}/metrics", timeout=10).text)
    finally:
        out["exit_code"] = server.stop()
    if args.overload_duration > 0 and system == "medrank":
        server = Server(args.models, max_batch, args.overload_queue, args.timeout, args.threads, system)
        try:
            server.wait_ready()
            t0 = time.monotonic()
            out["overload"] = drive(
                server.url, questions, args.overload_clients, args.overload_duration, args.max_requests
            )
            out["overload"].update(rss_summary(server, t0, time.monotonic()))
            out["overload"]["max_queue"] = args.overload_queue
            print(f"overload (max_batch {max_batch}): {json.dumps(out['overload'])}", flush=True)
        finally:
            out["overload_exit_code"] = server.stop()
    return out


def cache_counts(text: str) -> dict:
    """The vector cache's hits, misses and bytes from a /metrics scrape."""
    from prometheus_client.parser import text_string_to_metric_families

    got = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    hits, misses = got.get("medrank_vector_cache_hits_total", 0), got.get("medrank_vector_cache_misses_total", 0)
    return {
        "hits": hits,
        "misses": misses,
        "hit_rate": round(hits / (hits + misses), 3) if hits + misses else None,
        "mib": round(got.get("medrank_vector_cache_bytes", 0) / (1 << 20), 1),
    }


def table(result: dict) -> str:
    lines = [
        f"medrank serve on loopback, {result['date']}, commit {result['commit']}, {result['cores']} cores, "
        f"{len(result['questions'])} MEDIQA validation questions ({result['mean_answers']} answers on average)",
        f"load average (1/5/15 min) at the start: {result['loadavg_start']}, at the end: {result['loadavg_end']} "
        "(a shared machine: the other work on it moves every figure)",
        "",
        "| system | phase | max_batch | clients | s | requests | ok | 503/429 | errors | req/s | p50 s | p95 s | p99 s | "
        "peak RSS MiB | RSS by quarter MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m in result["modes"]:
        for phase in ("single", "load", "overload"):
            r = m.get(phase)
            if not r:
                continue
            rss = " / ".join(str(x) for x in r.get("rss_quarters_mib", ["-"]))
            name = phase if phase != "overload" else f"overload (queue {r['max_queue']})"
            lines.append(
                f"| {m['system']} | {name} | {m['max_batch']} | {r['clients']} | {r['seconds']} | {r['requests']} | {r['ok']} | "
                f"{r['rejected_503']} | {r['errors']} | {r['req_per_s']} | {r['p50_s']} | {r['p95_s']} | "
                f"{r['p99_s']} | {r.get('peak_rss_mib', '-')} | {rss} |"
            )
    floor = result.get("floor")
    if floor:
        lines.append("")
        lines.append(
            f"compute floor of the single-phase questions: median {floor['median_floor_s']} s (the bi-encoder's useful "
            f"FLOPs at the measured {floor['precision']} matmul peak, {floor['matmul_peak_gflops']} GFLOP/s on "
            f"{floor['threads']} threads); single p50 / floor: "
            + ", ".join(
                f"{m['system']} {m['single']['p50_s'] / floor['median_floor_s']:.2f}x"
                for m in result["modes"]
                if m.get("single") and m["single"].get("p50_s")
            )
        )
    lines.append("")
    for m in result["modes"]:
        if m["system"] == "peer":
            continue
        lines.append(
            f"{m['system']}, max_batch {m['max_batch']}: vector cache after the load phase {m.get('cache')}; passes by size {m.get('server_stats', {}).get('batches')}, server exit code "
            f"{m['exit_code']} after SIGTERM, warm-up {m['ready'].get('warmup_s')} s"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT / "data", help="a data/ folder with interim/clean (read only)")
    ap.add_argument("--models", type=Path, default=ROOT / "models")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--duration", type=float, default=120.0, help="seconds of the load phase")
    ap.add_argument("--max-requests", type=int, default=2000, help="a bound on the requests of one phase")
    ap.add_argument("--single", type=int, default=5, help="10-answer questions in the single-client phase")
    ap.add_argument("--max-batch", type=int, nargs="+", default=[1, 4], help="medrank's (the peer: 1 only)")
    ap.add_argument(
        "--systems",
        nargs="+",
        default=["medrank", "medrank-nocache", "peer"],
        choices=["medrank", "medrank-nocache", "peer"],
    )
    ap.add_argument("--max-queue", type=int, default=16)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--overload-clients", type=int, default=12)
    ap.add_argument("--overload-queue", type=int, default=2)
    ap.add_argument("--overload-duration", type=float, default=45.0)
    ap.add_argument(
        "--questions",
        type=int,
        default=None,
        help="only the first N 10-answer questions (a memory soak: each seen often)",
    )
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / f"serve-{date.today()}")
    args = ap.parse_args()
    if args.clients < 1 or args.duration <= 0 or args.max_requests < 1:
        sys.exit("error: --clients, --duration and --max-requests must be positive")
    questions = validation_questions(args.data)
    if args.questions:
        questions = [q for q in questions if len(q["answers"]) == 10][: args.questions]
    from medrank.serving.app import git_commit

    result = {
        "date": str(date.today()),
        "commit": (git_commit() or "unknown")[:7],
        "cores": os.cpu_count(),
        "questions": [q["qid"] for q in questions],
        "mean_answers": round(statistics.mean(len(q["answers"]) for q in questions), 1),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "modes": [],
    }
    if args.single:
        result["floor"] = compute_floor(args.models, single_questions(questions, args.single)[1], args.threads)
        print(f"floor: {json.dumps(result['floor'])}", flush=True)
    for system in args.systems:
        for b in args.max_batch if system != "peer" else [1]:
            result["modes"].append(run_mode(args, questions, b, system))
    result["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    text = table(result)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".txt").write_text(text, encoding="utf-8")
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
