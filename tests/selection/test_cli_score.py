"""`medrank score`: table/JSON output, one-line errors with exit code 2, and the subcommand registry."""

from __future__ import annotations

import argparse
import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from medrank import cli
from medrank.selection.metrics import score_task2, score_task3
from tests.helpers import FIXTURES

REPO = Path(__file__).resolve().parents[2]
FIX = FIXTURES / "metrics"
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


@pytest.mark.checkout
def test_malformed_submission_via_module_entry_point(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("1,1_A2,1\n1,1_A2,0\n")
    proc = subprocess.run(
        [sys.executable, "-m", "medrank.cli", "score", str(GOLD), str(bad)], cwd=REPO, capture_output=True, text=True
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert (
        proc.stderr
        == f"error: {bad}: line 2: duplicate row for 1, 1_A2 (first at line 1); the official script silently keeps the first, medrank refuses\n"
    )


def test_oversized_input_is_refused_before_it_is_read(tmp_path, capsys, monkeypatch):
    """A 50 MB file used to take 19 s and 1 GB before its error: now the size alone stops it."""
    big = tmp_path / "big.csv"
    with open(big, "wb") as f:  # sparse: the size is what counts, not the bytes
        f.truncate(50 << 20)
    read_bytes = Path.read_bytes
    monkeypatch.setattr(
        Path, "read_bytes", lambda self: pytest.fail(f"{self} was read") if self == big else read_bytes(self)
    )
    code, out, err = run_cli(capsys, "score", str(GOLD), str(big))
    assert (
        code == 2
        and out == ""
        and err == f"error: {big}: 50.0 MiB, more than a submission file can be (at most 1 MiB)\n"
    )


@pytest.mark.parametrize("prefix", [b"", b"\xef\xbb\xbf"])
@pytest.mark.parametrize("line", [1, 2, 3])
def test_utf8_error_names_the_byte_offset_in_the_file(tmp_path, capsys, prefix, line):
    """The offset is the bad byte's position in the file (it used to be counted within the decoder's chunk)."""
    rows = [f"{q},{q}_A{i},{i % 2}\n".encode() for q in range(1, 2000) for i in range(1, 3)]
    rows[line * 700] = rows[line * 700].replace(b"_A", b"_\xe9")
    data = prefix + b"".join(rows)
    (tmp_path / "sub.csv").write_bytes(data)
    code, _, err = run_cli(capsys, "score", str(GOLD), str(tmp_path / "sub.csv"))
    offset = data.index(b"\xe9")
    assert code == 2 and f"not UTF-8 text (byte 0xe9 at offset {offset}:" in err


def test_adding_a_subcommand_is_one_registry_entry(capsys, monkeypatch):
    seen = {}

    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("--k", type=int, default=1)

    def handler(args: argparse.Namespace) -> None:
        seen["k"] = args.k

    monkeypatch.setitem(cli.COMMANDS, "echo", cli.Command("test command", add_arguments, handler))
    code, _, _ = run_cli(capsys, "echo", "--k", "7")
    assert code == 0 and seen == {"k": 7}


@pytest.mark.checkout
@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("unbuffered", ["", "1"])
def test_stdout_to_a_full_device_is_one_error_line(unbuffered):
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [sys.executable, "-m", "medrank.cli", "score", str(GOLD), str(SUB)],
            cwd=REPO,
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": unbuffered},
        )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "No space left on device" in proc.stderr, (
        proc.stderr
    )
    assert proc.stderr.startswith("error: cannot write to stdout"), (
        proc.stderr
    )  # unbuffered: it used to blame a temp file


@pytest.mark.checkout
def test_a_pipe_is_a_submission_file():
    """`medrank score GOLD /dev/stdin` (and `<(...)`) said "not found": a pipe is read up to the cap."""
    proc = subprocess.run(
        [sys.executable, "-m", "medrank.cli", "score", str(GOLD), "/dev/stdin", "--json"],
        cwd=REPO,
        input=SUB.read_text(),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and json.loads(proc.stdout)["accuracy"] >= 0, proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "medrank.cli", "score", str(GOLD), "/dev/stdin"],
        cwd=REPO,
        input="x" * (2 << 20),
        capture_output=True,
        text=True,
    )
    assert (
        proc.returncode == 2
        and proc.stderr == "error: /dev/stdin: more than a submission file can be (at most 1 MiB)\n"
    )


def test_a_full_disk_while_writing_is_one_error_line(monkeypatch, capsys, tmp_path):
    from medrank.stage import runner
    from medrank.core.io import write_text

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    (tmp_path / "out.txt").write_text("previous")
    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(SystemExit) as e:
        runner.run(lambda: write_text(tmp_path / "out.txt", "new"))
    assert e.value.code == 2 and capsys.readouterr().err.startswith(
        "error: No space left on device (files are written to a temp file"
    )
    monkeypatch.undo()
    assert (tmp_path / "out.txt").read_text() == "previous" and [p.name for p in tmp_path.iterdir()] == ["out.txt"]


@pytest.mark.checkout
def test_a_reader_that_leaves_early_is_no_error():
    proc = subprocess.run(
        f"{sys.executable} -m medrank.cli score {GOLD} {SUB} --json | head -c 1",
        shell=True,
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": ""},
    )
    assert proc.stdout == "{" and "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr
