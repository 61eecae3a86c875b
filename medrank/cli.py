"""The `medrank` command. Subcommands live in COMMANDS: add one with an add-arguments and a handler function."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

from medrank.core.errors import MedrankError

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class Command:
    """One subcommand: `add_arguments(parser)` declares its options, `handler(args)` runs it."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    handler: Callable[[argparse.Namespace], None]


def emit(text: str, end: str = "\n") -> None:
    """Print a command's output; a full device or a closed stdout is one line about stdout (also unbuffered, when
    the write itself fails: with PYTHONUNBUFFERED=1 the error used to blame a temp file)."""
    import errno

    try:
        sys.stdout.write(text + end)
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO):
            raise MedrankError(f"cannot write to stdout ({e.strerror})") from None
        raise


# ---------------------------------------------------------------- score


def _score_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("gold", help="gold file (Task 3: qid,aid,label, no header; Task 2: pair_id,label)")
    p.add_argument("submission", help="submission file in the same format")
    p.add_argument("--task", type=int, choices=(2, 3), default=3, help="MEDIQA task (default 3)")
    p.add_argument("--json", action="store_true", help="print the metrics as JSON")


def _score(args: argparse.Namespace) -> None:
    from medrank.selection.metrics import score_task2, score_task3

    metrics = (score_task3 if args.task == 3 else score_task2)(args.gold, args.submission)
    if args.json:
        emit(json.dumps(metrics, indent=2))
        return
    width = max(map(len, metrics))
    emit(
        "\n".join(
            f"{name:<{width}}  {value:.4f}" if isinstance(value, float) else f"{name:<{width}}  {value}"
            for name, value in metrics.items()
        )
    )


def _report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--metrics-dir",
        default="metrics",
        metavar="DIR",
        help="folder of committed metrics JSON files (default metrics)",
    )
    p.add_argument(
        "--readme",
        default="README.md",
        metavar="PATH",
        help="README whose headline block to refresh; the DAG block is docs/pipeline.md's beside it (default README.md)",
    )
    p.add_argument(
        "--results",
        default="RESULTS.md",
        metavar="PATH",
        help="RESULTS file whose results block to refresh (default RESULTS.md)",
    )
    p.add_argument(
        "--cards",
        default=None,
        metavar="DIR",
        help="model cards folder, one card per dvc.yaml artifact (default docs/model_cards beside the README)",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--check", action="store_true", help="write nothing; exit 2 naming each file whose blocks are out of date"
    )
    mode.add_argument("--print", action="store_true", help="write nothing; print the headline and results markdown")


def _report(args: argparse.Namespace) -> None:
    from medrank.reporting.formatting import metrics_value_errors

    with metrics_value_errors():  # a null / true / list where a number belongs: one line naming the file and key
        _report_from_metrics(args)


def _report_from_metrics(args: argparse.Namespace) -> None:
    from pathlib import Path

    from medrank.reporting import render_headline, render_results, stale_docs, update_docs
    from medrank.reporting.formatting import check_metrics_dir

    if args.print:
        check_metrics_dir(args.metrics_dir, Path(args.readme).parent)  # the README's repository, as the writes use
        emit(render_headline(args.metrics_dir) + "\n" + render_results(args.metrics_dir), end="")
    elif args.check:
        stale = stale_docs(args.readme, args.results, args.metrics_dir, args.cards)
        if stale:
            given = [
                ("--readme", args.readme, "README.md"),
                ("--results", args.results, "RESULTS.md"),
                ("--metrics-dir", args.metrics_dir, "metrics"),
                ("--cards", args.cards, None),
            ]
            fix = " ".join(
                ["medrank report"] + [f"{flag} {value}" for flag, value, default in given if value != default]
            )
            raise MedrankError(
                f"{', '.join(map(str, stale))}: generated blocks differ from {args.metrics_dir}/, dvc.yaml or dvc.lock (run `{fix}`)"
            )
    else:
        changed = update_docs(args.readme, args.results, args.metrics_dir, args.cards)
        emit(f"updated: {', '.join(map(str, changed))}" if changed else "up to date")


# ---------------------------------------------------------------- rank


def _rank_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "input",
        nargs="?",
        default="-",
        help='JSON file {"question": ..., "answers": [{"id", "text", "url"}, ...]}, or {"questions": [...]} of several '
        '(ranked as one batch); "-" or none = stdin',
    )
    p.add_argument("--format", choices=("json", "table"), default="json", help="output format (default json)")
    p.add_argument("--all", action="store_true", help="also list the filtered-out answers (after the kept ones)")
    p.add_argument(
        "--models",
        default="models",
        metavar="DIR",
        help="trained models folder with system.json from stage score (default models)",
    )
    p.add_argument(
        "--fit",
        choices=("final", "val"),
        default="final",
        help="final: models trained on train+val (as the test submission); val: on the training sets only (as the validation submission)",
    )


def _rank(args: argparse.Namespace) -> None:
    from medrank.serving.rank import rank_file, rank_question, read_rank_input

    inp = read_rank_input(args.input)  # validate before loading any model
    if not isinstance(inp, list):
        emit(format_result(inp.question, rank_question(inp, args.models, args.fit), args.format, args.all))
        return
    results, keep = rank_file(inp, args.models, args.fit)  # a file of questions: one batch
    emit(format_batch([q.question for q in inp], results, keep, args.format, args.all))


def format_batch(
    questions: list[str], results: list[pd.DataFrame], keep: dict | None, fmt: str = "json", show_all: bool = False
) -> str:
    """A file of questions' results in input order (`{"results": [...], "keep": ...}`, /rank/batch's results beside the
    keep rule the batch was decided by), or their tables one after another."""
    if fmt == "json":
        from medrank.serving.rank import result_record

        records = [result_record(q, r, show_all) for q, r in zip(questions, results)]
        return json.dumps({"results": records, "keep": keep}, indent=2)
    how = (
        "no answers"
        if keep is None
        else (
            f"keep rule {keep['rule']}"
            + (f", fitted on these {keep['questions']} questions" if keep["fitted_on_batch"] else "")
        )
    )
    blocks = [
        f"question {i + 1}: {printable(q)[:80]}\n" + format_result(q, r, fmt, show_all)
        for i, (q, r) in enumerate(zip(questions, results))
    ]
    return "\n\n".join(blocks + [f"{len(questions)} questions; {how}"])


def format_result(question: str, result: pd.DataFrame, fmt: str = "json", show_all: bool = False) -> str:
    """Kept answers in ranked order (JSON or a plain table); with show_all the filtered ones follow."""
    import pandas as pd

    from medrank.serving.rank import kept_and_dropped, result_record

    if fmt == "json":
        return json.dumps(result_record(question, result, show_all), indent=2)
    kept, dropped = kept_and_dropped(result)
    table = pd.concat([kept, dropped], ignore_index=True) if show_all else kept
    lines = [f"{'rank':>4}  {'id':<20} {'filter':>7} {'rank_score':>10}  url"]
    for _, r in table.iterrows():
        rk = "-" if pd.isna(r["rank"]) else str(int(r["rank"]))
        lines.append(
            f"{rk:>4}  {printable(str(r['id']))[:20]:<20} {r['prob']:7.3f} {r['rank_score']:10.3f}  {printable(r['url'])}"
        )
    lines.append(f"{len(kept)} of {len(result)} answers kept")
    return "\n".join(lines)


# ---------------------------------------------------------------- serve


def _serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--models", default="models", metavar="DIR", help="trained models folder (default models)")
    p.add_argument("--fit", choices=("final", "val"), default="final", help="as `medrank rank --fit` (default final)")
    p.add_argument(
        "--workers", type=int, default=1, help="server processes, each with its own copy of the models (default 1)"
    )
    p.add_argument(
        "--threads", type=int, default=None, help="torch threads per process (default: the cores over the workers)"
    )
    p.add_argument(
        "--max-batch",
        type=int,
        default=1,
        help="questions ranked together in one pass when several wait (default 1: each alone, as `medrank rank`)",
    )
    p.add_argument(
        "--max-queue", type=int, default=16, help="questions waiting at most per process; beyond, 503 (default 16)"
    )
    p.add_argument(
        "--timeout", type=float, default=120.0, help="seconds per request, waiting included; beyond, 504 (default 120)"
    )
    p.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        help="seconds for a request's headers to arrive; beyond, 408 and the connection is closed (default 10)",
    )
    p.add_argument(
        "--body-timeout",
        type=float,
        default=30.0,
        help="seconds for a request's body to arrive once its headers have; beyond, 408 (default 30)",
    )
    p.add_argument(
        "--vector-cache-mb",
        type=int,
        default=256,
        help="MiB of answer and question vectors held across requests, least recently used out first (default 256; 0: none)",
    )
    p.add_argument(
        "--rerank-kept-only",
        action="store_true",
        help="the rerank routes (/v1/rerank, /v2/rerank, /rerank) return only the kept answers unless a request says "
        "kept_only=false",
    )


def _serve(args: argparse.Namespace) -> None:
    import dataclasses
    import math
    import os

    # as stages/__init__.py: OpenMP threads that wait yield their core (read once, when torch loads: torch is not
    # loaded yet here); spinning ones collapse a pass when the cores are shared (docs/experiments.md)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from medrank.serving.app import CONFIG_ENV, ServeConfig, create_app, load_ranker
    from medrank.serving.slow_clients import check_timeout, slow_client_protocol

    if not 0 < args.port < 65536:
        raise MedrankError(f"--port must be in 1..65535, got {args.port}")
    # every count and the timeout checked here, named as typed, before uvicorn or any model loads (`--threads 0` once
    # fell through `args.threads or ...` to the default, and `--timeout inf` reached the server)
    for flag, value in (
        ("--workers", args.workers),
        ("--threads", args.threads),
        ("--max-batch", args.max_batch),
        ("--max-queue", args.max_queue),
    ):
        if value is not None and value < 1:
            raise MedrankError(f"{flag} must be at least 1, got {value}")
    if args.vector_cache_mb < 0:
        raise MedrankError(f"--vector-cache-mb must be at least 0, got {args.vector_cache_mb}")
    if not 0 < args.timeout < math.inf:  # NaN fails both comparisons
        raise MedrankError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    check_timeout("--header-timeout", args.header_timeout)
    check_timeout("--body-timeout", args.body_timeout)
    try:
        import uvicorn
    except ImportError:
        raise MedrankError("`medrank serve` needs fastapi and uvicorn: pip install -e '.[serve]'") from None
    threads = args.threads if args.threads is not None else max(1, (os.cpu_count() or 1) // args.workers)
    config = ServeConfig(
        models=args.models,
        fit=args.fit,
        threads=threads,
        max_batch=args.max_batch,
        max_queue=args.max_queue,
        timeout_s=args.timeout,
        header_timeout_s=args.header_timeout,
        body_timeout_s=args.body_timeout,
        vector_cache_mb=args.vector_cache_mb,
        rerank_kept_only=args.rerank_kept_only,
    )
    # the models load here first: a missing or damaged one stops with one line before any port is opened
    ranker = load_ranker(config)
    common = dict(host=args.host, port=args.port, log_config=None, access_log=False, timeout_graceful_shutdown=None)
    # a bound on open connections as the last guard (the queue answers 503 with Retry-After long before it)
    common["limit_concurrency"] = 4 * (args.max_queue + args.max_batch) + 16
    # h11 with a deadline on the headers, evicting the slowest request at that limit (medrank.serving.slow_clients)
    common["http"] = slow_client_protocol(config.header_timeout_s)
    if args.workers == 1:
        uvicorn.run(create_app(config, ranker), **common)
        return
    del ranker  # each worker process loads its own
    os.environ[CONFIG_ENV] = json.dumps(dataclasses.asdict(config))
    uvicorn.run("medrank.serving.app:app_from_env", factory=True, workers=args.workers, **common)


def printable(text: str) -> str:
    """`text` with control characters (ESC, OSC, CR, NUL, ...) escaped, as JSON output escapes them: ids and URLs come
    from the user's input, and a raw escape sequence in a terminal can rewrite what the table shows."""
    import unicodedata

    unsafe = ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")  # controls, format characters, line/paragraph separators
    return "".join(
        ch.encode("unicode_escape").decode("ascii") if unicodedata.category(ch) in unsafe else ch for ch in text
    )


COMMANDS: dict[str, Command] = {
    "score": Command("score a MEDIQA submission against a gold file (official semantics)", _score_arguments, _score),
    "report": Command(
        "refresh README.md's headline table, docs/pipeline.md's DAG, RESULTS.md's tables and the model cards (docs/model_cards/) from metrics/*.json, "
        "dvc.yaml and dvc.lock",
        _report_arguments,
        _report,
    ),
    "rank": Command(
        "rank a question's candidate answers with the trained system: kept answers in ranked order",
        _rank_arguments,
        _rank,
    ),
    "serve": Command(
        "serve `medrank rank` over HTTP: POST /rank, /rank/batch, /v1/rerank, /v2/rerank (Cohere), /rerank (TEI), "
        "GET /healthz, /readyz, /version, /metrics, / (a page)",
        _serve_arguments,
        _serve,
    ),
}


# ---------------------------------------------------------------- entry point


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # argparse prints usage + message; the project rule is one line and exit 2
        raise MedrankError(f"{message} (see `{self.prog} --help`)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="medrank", description="Filter and re-rank answers to consumer health questions.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, cmd in COMMANDS.items():
        cmd.add_arguments(sub.add_parser(name, help=cmd.help, description=cmd.help))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run `medrank COMMAND ...`; returns 0, or exits 2 with one `error: ...` line on bad input."""
    from medrank.stage.runner import run

    def _main() -> None:
        args = build_parser().parse_args(argv)
        if args.command is None:
            raise MedrankError("no command given (see `medrank --help`)")
        COMMANDS[args.command].handler(args)

    run(_main)
    return 0


if __name__ == "__main__":
    sys.exit(main())
