"""The `medrank` command. Subcommands live in COMMANDS: add one with an add-arguments and a handler function."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Callable, Sequence

from medrank.errors import MedrankError


@dataclass(frozen=True)
class Command:
    """One subcommand: `add_arguments(parser)` declares its options, `handler(args)` runs it."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    handler: Callable[[argparse.Namespace], None]


# ---------------------------------------------------------------- score


def _score_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("gold", help="gold file (Task 3: qid,aid,label, no header; Task 2: pair_id,label)")
    p.add_argument("submission", help="submission file in the same format")
    p.add_argument("--task", type=int, choices=(2, 3), default=3, help="MEDIQA task (default 3)")
    p.add_argument("--json", action="store_true", help="print the metrics as JSON")


def _score(args: argparse.Namespace) -> None:
    from medrank.metrics import score_task2, score_task3

    metrics = (score_task3 if args.task == 3 else score_task2)(args.gold, args.submission)
    if args.json:
        print(json.dumps(metrics, indent=2))
        return
    width = max(map(len, metrics))
    for name, value in metrics.items():
        print(f"{name:<{width}}  {value:.4f}" if isinstance(value, float) else f"{name:<{width}}  {value}")


def _report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--metrics-dir", default="metrics", help="folder of committed metrics JSON files")
    p.add_argument("--readme", default=None, help="rewrite the results and DAG blocks of this README instead of printing")
    p.add_argument("--check", action="store_true", help="with --readme: exit 1 if the block is out of date")


def _report(args: argparse.Namespace) -> None:
    from medrank.report import readme_is_current, render_results, update_readme

    if args.readme is None:
        print(render_results(args.metrics_dir), end="")
    elif args.check:
        if not readme_is_current(args.readme, args.metrics_dir):
            raise MedrankError(f"{args.readme}: results or DAG block differs from {args.metrics_dir}/ or dvc.yaml (run `medrank report --readme {args.readme}`)")
    else:
        update_readme(args.readme, args.metrics_dir)


COMMANDS: dict[str, Command] = {
    "score": Command("score a MEDIQA submission against a gold file (official semantics)", _score_arguments, _score),
    "report": Command("render the results tables from metrics/*.json (or refresh README's block)", _report_arguments, _report),
    "rank": Command(*__import__("medrank.pipeline", fromlist=["RANK_COMMAND"]).RANK_COMMAND),  # JSON question + answers -> ranked
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
    from medrank.runner import run

    def _main() -> None:
        args = build_parser().parse_args(argv)
        if args.command is None:
            raise MedrankError("no command given (see `medrank --help`)")
        COMMANDS[args.command].handler(args)

    run(_main)
    return 0


if __name__ == "__main__":
    sys.exit(main())
