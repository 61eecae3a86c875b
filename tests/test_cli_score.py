"""`medrank score`: table/JSON output, one-line errors with exit code 2, and the subcommand registry."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from medrank import cli
from medrank.metrics import score_task2, score_task3

REPO = Path(__file__).resolve().parents[1]
FIX = Path(__file__).parent / "fixtures" / "metrics"
GOLD, SUB = FIX / "tiny_gold.csv", FIX / "tiny_submission.csv"


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = cli.main(list(argv))
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def test_score_prints_table(capsys):
    code, out, err = run_cli(capsys, "score", str(GOLD), str(SUB))
    assert code == 0 and err == ""
    lines = dict(line.split() for line in out.splitlines())
    assert lines["accuracy"] == "0.6667" and lines["precision"] == "0.7500" and lines["mrr"] == "0.2500"
    assert lines["spearman"] == "0.5000" and lines["spearman_true"] == "-1.0000" and lines["n_questions"] == "2"


def test_score_json_task3_and_task2(capsys):
    code, out, _ = run_cli(capsys, "score", str(GOLD), str(SUB), "--json")
    assert code == 0 and json.loads(out) == score_task3(GOLD, SUB)
    rqe_gold, rqe_sub = FIX / "tiny_rqe_gold.csv", FIX / "tiny_rqe_submission.csv"
    code, out, _ = run_cli(capsys, "score", str(rqe_gold), str(rqe_sub), "--task", "2", "--json")
    assert code == 0 and json.loads(out) == score_task2(rqe_gold, rqe_sub)


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["score", str(GOLD), "missing_sub.csv"], "missing_sub.csv: submission file not found"),
        (["score", str(GOLD), str(FIX / "tiny_rqe_submission.csv")], "tiny_rqe_submission.csv: line 1: expected 3"),
        (["score", str(GOLD), str(SUB), "--task", "4"], "argument --task: invalid choice"),
        (["score", str(GOLD)], "the following arguments are required: submission"),
        (["nonsense"], "invalid choice: 'nonsense'"),
        ([], "no command given"),
    ],
)
def test_errors_are_one_line_exit_2(capsys, argv, expected):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    assert err.endswith("\n") and err.count("\n") == 1 and err.startswith("error: ") and expected in err


def test_malformed_submission_via_module_entry_point(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("1,1_A2,1\n1,1_A2,0\n")
    proc = subprocess.run(
        [sys.executable, "-m", "medrank.cli", "score", str(GOLD), str(bad)], cwd=REPO, capture_output=True, text=True
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == f"error: {bad}: line 2: duplicate row for 1, 1_A2 (first at line 1); the official script silently keeps the first, medrank refuses\n"


def test_adding_a_subcommand_is_one_registry_entry(capsys, monkeypatch):
    seen = {}

    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("--k", type=int, default=1)

    def handler(args: argparse.Namespace) -> None:
        seen["k"] = args.k

    monkeypatch.setitem(cli.COMMANDS, "echo", cli.Command("test command", add_arguments, handler))
    code, _, _ = run_cli(capsys, "echo", "--k", "7")
    assert code == 0 and seen == {"k": 7}
