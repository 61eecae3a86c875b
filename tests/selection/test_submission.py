"""Submission writers: ranked order, no header, validation, atomic writes, round trip with the scorer."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from medrank.core.errors import MedrankError
from medrank.selection.metrics import read_task3_gold, score_task2, score_task3
from medrank.selection.submission import write_task2_submission, write_task3_submission
from tests.helpers import FIXTURES

FIX = FIXTURES / "metrics"
QA_GOLD = (
    Path(__file__).resolve().parents[2].parent
    / "shared"
    / "data"
    / "mediqa2019"
    / "Eval_Scripts"
    / "data"
    / "QA_validationSet_ground_truth.txt"
)


def frame(**cols) -> pd.DataFrame:
    return pd.DataFrame(cols)


def test_task3_ranked_by_score_questions_in_first_appearance_order(tmp_path):
    df = frame(
        qid=["5", "2", "5", "2", "5", "5"],
        aid=["5_a", "2_a", "5_b", "2_b", "5_c", "5_d"],
        label=[0, 1, 1, 0, 1, 0],
        score=[0.1, 0.3, 0.9, 0.7, 0.5, 0.5],
    )
    out = tmp_path / "sub.csv"
    write_task3_submission(out, df)
    # q5 first (seen first); 5_c and 5_d tie at 0.5 and keep input order; no header line
    assert out.read_text() == "5,5_b,1\n5,5_c,1\n5,5_d,0\n5,5_a,0\n2,2_b,0\n2,2_a,1\n"


def test_task3_accepts_int_ids_bool_labels_and_infinite_scores(tmp_path):
    df = frame(qid=np.array([3, 3]), aid=["3_a", "3_b"], label=[False, True], score=[-np.inf, np.inf])
    out = tmp_path / "sub.csv"
    write_task3_submission(out, df)
    assert out.read_text() == "3,3_b,1\n3,3_a,0\n"


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"label": [0, 2]}, "row 2: label must be 0 or 1, got 2"),
        ({"label": [0, None]}, "row 2: label must be 0 or 1"),
        ({"label": ["1", 0]}, "row 1: label must be 0 or 1, got '1'"),
        ({"score": [0.5, np.nan]}, "row 2: score is NaN"),
        ({"aid": ["1_a", "1_a"]}, "row 2: duplicate qid, aid 1, 1_a (first at row 1)"),
        ({"aid": ["1_a", "1,b"]}, "row 2: aid '1,b' is empty or contains a comma"),
        ({"qid": ["1", None]}, "row 2: qid is missing"),
    ],
)
def test_task3_invalid_input_raises_and_leaves_existing_file(tmp_path, change, expected):
    out = tmp_path / "sub.csv"
    out.write_text("previous\n")
    df = frame(qid=["1", "1"], aid=["1_a", "1_b"], label=[0, 1], score=[0.1, 0.2]).assign(**change)
    with pytest.raises(MedrankError) as e:
        write_task3_submission(out, df)
    assert expected in str(e.value) and "sub.csv" in str(e.value)
    assert out.read_text() == "previous\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sub.csv"]


def test_task3_missing_score_column(tmp_path):
    with pytest.raises(MedrankError, match="missing column 'score'"):
        write_task3_submission(tmp_path / "s.csv", frame(qid=["1"], aid=["a"], label=[1]))
    assert not (tmp_path / "s.csv").exists()


def test_write_is_atomic_when_the_write_fails_midway(tmp_path, monkeypatch):
    out = tmp_path / "sub.csv"
    out.write_text("previous\n")

    def half_write_then_fail(self, text, encoding=None):
        with open(self, "w", encoding=encoding) as f:
            f.write(text[: len(text) // 2])
        raise OSError("disk full")

    monkeypatch.setattr(Path, "write_text", half_write_then_fail)
    df = frame(qid=["1", "1"], aid=["1_a", "1_b"], label=[0, 1], score=[0.1, 0.2])
    with pytest.raises(OSError, match="disk full"):
        write_task3_submission(out, df)
    monkeypatch.undo()
    assert out.read_text() == "previous\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sub.csv"]  # no temp file left behind


def test_round_trip_with_scorer_tiny(tmp_path):
    gold = read_task3_gold(FIX / "tiny_gold.csv")
    # score = reverse gold position, rows shuffled within the frame: the writer must restore gold order
    df = gold.assign(score=-np.arange(len(gold), dtype=float)).sample(frac=1.0, random_state=3)
    df = df.sort_values("qid", kind="stable")  # keep question order of the gold file
    out = tmp_path / "sub.csv"
    write_task3_submission(out, df)
    assert out.read_text() == (FIX / "tiny_gold.csv").read_text()
    m = score_task3(FIX / "tiny_gold.csv", out)
    assert (m["accuracy"], m["precision"], m["mrr"], m["spearman"], m["spearman_true"]) == (1.0, 1.0, 1.0, 1.0, 1.0)


@pytest.mark.skipif(not QA_GOLD.exists(), reason=f"official validation gold absent: {QA_GOLD}")
def test_round_trip_with_scorer_validation_gold(tmp_path):
    gold = read_task3_gold(QA_GOLD)
    rng = random.Random(0)
    df = gold.assign(
        score=[rng.random() for _ in range(len(gold))], label=[rng.randint(0, 1) for _ in range(len(gold))]
    )
    out = tmp_path / "sub.csv"
    write_task3_submission(out, df.sample(frac=1.0, random_state=0))
    written = read_task3_gold(out)  # same 3-column format
    assert len(written) == len(gold) and set(zip(written["qid"], written["aid"])) == set(zip(gold["qid"], gold["aid"]))
    # within every question rows come in descending score order
    score = dict(zip(zip(df["qid"], df["aid"]), df["score"]))
    for _, grp in written.groupby("qid", sort=False):
        s = [score[(q, a)] for q, a in zip(grp["qid"], grp["aid"])]
        assert s == sorted(s, reverse=True)
    # each question's rows are contiguous
    assert written["qid"].ne(written["qid"].shift()).sum() == gold["qid"].nunique()
    m = score_task3(QA_GOLD, out)
    assert m["n_submitted_rows"] == len(gold) and 0.0 <= m["accuracy"] <= 1.0


def test_task2_writer_header_and_round_trip(tmp_path):
    out = tmp_path / "rqe.csv"
    write_task2_submission(out, frame(pair_id=[1, 2, 4], label=[1, 1, 0]))
    assert out.read_text() == "pair_id,label\n1,1\n2,1\n4,0\n"
    assert out.read_text() == (FIX / "tiny_rqe_submission.csv").read_text()
    assert score_task2(FIX / "tiny_rqe_gold.csv", out)["accuracy"] == 0.5
    with pytest.raises(MedrankError, match="row 2: duplicate pair_id 1"):
        write_task2_submission(out, frame(pair_id=["1", "1"], label=[0, 1]))
    with pytest.raises(MedrankError, match="row 1: label must be 0 or 1"):
        write_task2_submission(out, frame(pair_id=["1"], label=[3]))
    assert out.read_text() == "pair_id,label\n1,1\n2,1\n4,0\n"
