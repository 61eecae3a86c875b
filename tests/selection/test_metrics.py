"""The MEDIQA scorers against hand-computed values and the official evaluator script."""

from __future__ import annotations

import functools
import importlib.util
import random
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from medrank.core.errors import MedrankError
from medrank.selection.metrics import (
    _resampled_scores,
    gold_from_answers,
    ir_metrics,
    paired_bootstrap,
    read_task2_table,
    read_task3_gold,
    read_task3_submission,
    score_task2,
    score_task3,
    task3_by_question,
    task3_scores_of,
)
from medrank.selection.submission import write_task3_submission
from tests.helpers import FIXTURES

REPO = Path(__file__).resolve().parents[2]
FIX = FIXTURES / "metrics"
EVAL = REPO.parent / "shared" / "data" / "mediqa2019" / "Eval_Scripts"
OFFICIAL_SCRIPT = EVAL / "mediqa2019_evaluator_allTasks_final.py"
QA_GOLD = EVAL / "data" / "QA_validationSet_ground_truth.txt"
RQE_GOLD = EVAL / "data" / "RQE_validationSet_ground_truth.txt"
VAL_XML = REPO.parent / "shared" / "data" / "mediqa2019" / "MEDIQA_Task3_QA" / "MEDIQA2019-Task3-QA-ValidationSet.xml"

needs_official = pytest.mark.skipif(
    not (OFFICIAL_SCRIPT.exists() and QA_GOLD.exists() and RQE_GOLD.exists()),
    reason=f"official MEDIQA evaluator/gold not found under {EVAL}",
)


@pytest.fixture(scope="module")
def official():
    """The official MediqaEvaluator class, imported by path."""
    spec = importlib.util.spec_from_file_location("mediqa_official_evaluator", OFFICIAL_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MediqaEvaluator


def run_official(evaluator_cls, gold: Path, submission: Path, task: int = 3) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # spearmanr ConstantInputWarning on 0/1-item questions
        return evaluator_cls(str(gold), task=task)._evaluate({"submission_file_path": str(submission)})


def assert_same_as_official(ours: dict, off: dict) -> None:
    assert abs(ours["accuracy"] - off["score"]) < 1e-12
    assert abs(ours["spearman"] - float(off["score_secondary"])) < 1e-12
    assert abs(ours["mrr"] - off["meta"]["MRR"]) < 1e-12
    assert abs(ours["precision"] - off["meta"]["Precision"]) < 1e-12


def write_rows(path: Path, rows: list[tuple]) -> Path:
    path.write_text("".join(",".join(map(str, r)) + "\n" for r in rows))
    return path


def gold_rows() -> list[tuple[str, str, int]]:
    g = read_task3_gold(QA_GOLD)
    return list(zip(g["qid"], g["aid"], g["label"]))


def by_question(rows):
    out: dict[str, list] = {}
    for r in rows:
        out.setdefault(r[0], []).append(r)
    return out


# ---------------------------------------------------------------- hand-computed (no shared data needed)


def test_tiny_fixture_hand_computed():
    m = score_task3(FIX / "tiny_gold.csv", FIX / "tiny_submission.csv")
    # rows 1_A1/1_A3/1_A2 with label 1 and 2_A1 with label 0 match the gold: 4 of 6 gold rows
    assert m["accuracy"] == pytest.approx(4 / 6)
    # 4 predicted positives, 3 correct (1_A4 is a false positive)
    assert m["precision"] == pytest.approx(0.75)
    # q1: first kept correct answer is at position 2 (the label-1 false positive counts); q2: none
    assert m["mrr"] == pytest.approx(0.25)
    # q1 kept order 1_A1,1_A3,1_A2 is the exact reverse of the gold order 1_A2,1_A3,1_A1: the official
    # string-ranked rho says 0.5, the position-based rho says -1; q2 has no kept answer and is excluded
    assert m["spearman"] == pytest.approx(0.5)
    assert m["spearman_true"] == pytest.approx(-1.0)
    assert (m["n_questions"], m["n_gold_rows"], m["n_submitted_rows"]) == (2, 6, 6)
    assert (m["n_predicted_positive"], m["n_correct_positive"], m["n_spearman_questions"]) == (4, 3, 1)


def test_dataframe_input_equals_file_input():
    sub = read_task3_submission(FIX / "tiny_submission.csv")
    sub["qid"] = sub["qid"].astype(int)  # ints compare as their decimal strings, as the official script does
    sub["label"] = sub["label"].astype(bool)
    gold = pd.read_csv(FIX / "tiny_gold.csv", header=None, names=["qid", "aid", "label"])
    assert score_task3(gold, sub) == score_task3(FIX / "tiny_gold.csv", FIX / "tiny_submission.csv")


def test_question_without_gold_positive_is_kept_with_documented_rule():
    gold = pd.DataFrame({"qid": ["1", "1", "2", "2"], "aid": ["a", "b", "c", "d"], "label": [1, 0, 0, 0]})
    sub = pd.DataFrame({"qid": ["1", "1", "2", "2"], "aid": ["a", "b", "d", "c"], "label": [1, 0, 1, 0]})
    m = score_task3(gold, sub)
    assert m["accuracy"] == pytest.approx(3 / 4)
    assert m["precision"] == pytest.approx(1 / 2)  # the label-1 row of q2 counts as a false positive
    assert m["mrr"] == pytest.approx(1 / 2)  # q2 stays in the denominator with 0
    assert m["spearman"] == 0.0 and m["n_spearman_questions"] == 0  # no question with >= 2 kept answers


def test_no_predicted_positive_gives_zero_precision_and_spearman():
    gold = pd.DataFrame({"qid": ["1", "1", "1"], "aid": ["a", "b", "c"], "label": [1, 1, 0]})
    sub = gold.assign(label=0)
    m = score_task3(gold, sub)
    assert (m["precision"], m["mrr"], m["spearman"], m["spearman_true"]) == (0.0, 0.0, 0.0, 0.0)
    assert m["accuracy"] == pytest.approx(1 / 3)


def test_missing_questions_count_zero_for_mrr_and_accuracy():
    gold = pd.DataFrame({"qid": ["1", "1", "2"], "aid": ["a", "b", "c"], "label": [1, 0, 1]})
    sub = pd.DataFrame({"qid": ["1", "1"], "aid": ["b", "a"], "label": [0, 1]})
    m = score_task3(gold, sub)
    assert m["mrr"] == pytest.approx((1 / 2 + 0) / 2)
    assert m["accuracy"] == pytest.approx(2 / 3)
    assert m["precision"] == 1.0


# ---------------------------------------------------------------- malformed input


@pytest.mark.parametrize(
    "content, expected",
    [
        ("1,1_A2,1\n9,9_A1,1\n", "line 2: question id '9' is not in the gold"),
        ("1,1_A2,1\n1,2_A1,0\n", "line 2: answer id '2_A1' is not a candidate of question '1'"),
        ("1,1_A2,2\n", "line 1: label must be 0 or 1, got '2'"),
        ("1,1_A2,1.0\n", "line 1: label must be 0 or 1, got '1.0'"),
        ("qid,aid,label\n1,1_A2,1\n", "line 1: label must be 0 or 1, got 'label' (Task 3 files have no header line)"),
        ("1,1_A2,1\n1,1_A3,0\n1,1_A2,0\n", "line 3: duplicate row for 1, 1_A2 (first at line 1)"),
        ("1,1_A2,1,0\n", "line 1: expected 3 comma-separated fields, got 4"),
        ("1,1_A2,1\n\n1,1_A3\n", "line 3: expected 3 comma-separated fields, got 2"),
        (",1_A2,1\n", "line 1: empty qid"),
        ("", "submission file has no rows"),
        ("\n\n", "submission file has no rows"),
    ],
)
def test_malformed_submission_names_file_and_line(tmp_path, content, expected):
    sub = tmp_path / "bad_submission.csv"
    sub.write_text(content)
    with pytest.raises(MedrankError) as e:
        score_task3(FIX / "tiny_gold.csv", sub)
    msg = str(e.value)
    assert "bad_submission.csv" in msg and expected in msg and "\n" not in msg


def test_missing_and_binary_files(tmp_path):
    with pytest.raises(MedrankError, match="nope.csv: submission file not found"):
        score_task3(FIX / "tiny_gold.csv", tmp_path / "nope.csv")
    with pytest.raises(MedrankError, match="nogold.txt: gold file not found"):
        score_task3(tmp_path / "nogold.txt", FIX / "tiny_submission.csv")
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"1,1_A2,1\n\xff\xfe\x00\n")
    with pytest.raises(MedrankError, match="binary.csv: not UTF-8"):
        score_task3(FIX / "tiny_gold.csv", binary)


def test_bom_is_ignored(tmp_path):
    sub = tmp_path / "bom.csv"
    sub.write_bytes(b"\xef\xbb\xbf" + (FIX / "tiny_submission.csv").read_bytes())
    assert score_task3(FIX / "tiny_gold.csv", sub) == score_task3(FIX / "tiny_gold.csv", FIX / "tiny_submission.csv")


def test_malformed_dataframe_names_row():
    gold = read_task3_gold(FIX / "tiny_gold.csv")
    with pytest.raises(MedrankError, match=r"<submission DataFrame>: row 2: label must be 0 or 1, got '0.5'"):
        score_task3(gold, pd.DataFrame({"qid": ["1", "1"], "aid": ["1_A1", "1_A2"], "label": [1, 0.5]}))
    with pytest.raises(MedrankError, match=r"<submission DataFrame>: missing columns \['label'\]"):
        score_task3(gold, pd.DataFrame({"qid": ["1"], "aid": ["1_A1"]}))
    with pytest.raises(MedrankError, match=r"<gold DataFrame>: gold has no rows"):
        score_task3(gold.iloc[:0], gold)
    # an empty submission is valid: it scores zero everywhere
    m = score_task3(gold, gold.iloc[:0])
    assert (m["accuracy"], m["precision"], m["mrr"], m["spearman"]) == (0.0, 0.0, 0.0, 0.0)


def test_duplicate_gold_rows_are_refused(tmp_path):
    gold = write_rows(tmp_path / "dup_gold.txt", [(1, "a", 1), (1, "a", 0)])
    with pytest.raises(MedrankError, match="dup_gold.txt: line 2: duplicate row"):
        read_task3_gold(gold)


# ---------------------------------------------------------------- same numbers as the official script


@functools.lru_cache(maxsize=1)
def _official_cases() -> dict[str, list[tuple]]:
    rows = gold_rows()
    qs = by_question(rows)
    cases = {
        "gold": rows,
        "reversed_within_questions": [r for q in qs.values() for r in reversed(q)],
        "reversed_file": list(reversed(rows)),
        # CHiQA-like: answers in AnswerK order (what a no-op system submits), gold labels kept
        "answer_number_order": [
            r for q in qs.values() for r in sorted(q, key=lambda r: int(r[1].rsplit("Answer", 1)[1]))
        ],
        "all_one": [(q, a, 1) for q, a, _ in rows],
        "some_questions_missing": [r for r in rows if r[0] not in set(list(qs)[::3])],
        "some_answers_missing": [r for i, r in enumerate(rows) if i % 4 != 1],
    }
    for seed in range(5):
        rng = random.Random(seed)
        shuffled = []
        for q in rng.sample(list(qs), len(qs)):
            answers = qs[q][:]
            rng.shuffle(answers)
            shuffled += [(q, a, rng.randint(0, 1)) for q, a, _ in answers]
        cases[f"random_seed{seed}"] = shuffled
    return cases


@needs_official
@pytest.mark.parametrize("case", list(_official_cases()) if QA_GOLD.exists() else [])
def test_identical_to_official_on_validation_gold(official, tmp_path, case):
    sub = write_rows(tmp_path / f"{case}.csv", _official_cases()[case])
    assert_same_as_official(score_task3(QA_GOLD, sub), run_official(official, QA_GOLD, sub))


@needs_official
def test_tiny_fixture_identical_to_official(official):
    gold, sub = FIX / "tiny_gold.csv", FIX / "tiny_submission.csv"
    assert_same_as_official(score_task3(gold, sub), run_official(official, gold, sub))


@needs_official
def test_all_zero_labels_official_crashes_ours_follows_rule(official, tmp_path):
    rows = gold_rows()
    sub = write_rows(tmp_path / "zeros.csv", [(q, a, 0) for q, a, _ in rows])
    with pytest.raises(ZeroDivisionError):
        run_official(official, QA_GOLD, sub)
    m = score_task3(QA_GOLD, sub)
    assert (m["precision"], m["mrr"], m["spearman"], m["spearman_true"]) == (0.0, 0.0, 0.0, 0.0)
    assert m["accuracy"] == pytest.approx(sum(l == 0 for *_, l in rows) / len(rows))


@needs_official
def test_flipped_labels_official_crashes_ours_follows_rule(official, tmp_path):
    # every predicted positive is wrong: no question has a rho, the official mean divides by zero
    rows = gold_rows()
    sub = write_rows(tmp_path / "flipped.csv", [(q, a, 1 - l) for q, a, l in rows])
    with pytest.raises(ZeroDivisionError):
        run_official(official, QA_GOLD, sub)
    m = score_task3(QA_GOLD, sub)
    assert (m["accuracy"], m["precision"], m["mrr"], m["spearman"]) == (0.0, 0.0, 0.0, 0.0)
    assert m["n_predicted_positive"] == sum(l == 0 for *_, l in rows)


@needs_official
def test_question_without_positive_official_keyerror(official, tmp_path):
    gold = write_rows(tmp_path / "gold.txt", [(1, "1_A1", 1), (1, "1_A2", 0), (2, "2_A1", 0)])
    sub = write_rows(tmp_path / "sub.csv", [(1, "1_A1", 1), (2, "2_A1", 0)])
    with pytest.raises(KeyError):
        run_official(official, gold, sub)
    m = score_task3(gold, sub)
    assert (m["accuracy"], m["precision"], m["mrr"]) == (pytest.approx(2 / 3), 1.0, pytest.approx(0.5))


@needs_official
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1), keep_q=st.floats(0.3, 1.0), keep_a=st.floats(0.3, 1.0), p_one=st.floats(0.0, 1.0)
)
def test_property_random_submissions_match_official(official, seed, keep_q, keep_a, p_one):
    rng = random.Random(seed)
    qs = by_question(gold_rows())
    rows = []
    for q in rng.sample(list(qs), len(qs)):
        if rng.random() > keep_q:
            continue
        answers = [r for r in qs[q] if rng.random() <= keep_a]
        rng.shuffle(answers)
        rows += [(q, a, int(rng.random() < p_one)) for q, a, _ in answers]
    if not rows:
        rows = [qs[next(iter(qs))][0]]
    with tempfile.TemporaryDirectory() as d:
        sub = write_rows(Path(d) / "sub.csv", rows)
        ours = score_task3(QA_GOLD, sub)
        try:
            off = run_official(official, QA_GOLD, sub)
        except ZeroDivisionError:
            # official divides by zero when no question has >= 2 kept answers or nothing is predicted positive
            assert ours["n_spearman_questions"] == 0 or ours["n_predicted_positive"] == 0
            assert ours["spearman"] == 0.0
            return
    assert_same_as_official(ours, off)


# ---------------------------------------------------------------- per-question parts and the paired bootstrap


def test_by_question_parts_of_the_tiny_fixture():
    rows = task3_by_question(FIX / "tiny_gold.csv", FIX / "tiny_submission.csv").set_index("qid")
    assert rows.loc["1", ["gold_rows", "matches", "predicted_positive", "correct_positive"]].tolist() == [4, 3, 4, 3]
    assert rows.loc["2", ["gold_rows", "matches", "predicted_positive", "correct_positive"]].tolist() == [2, 1, 0, 0]
    assert rows.loc["1", "rr"] == pytest.approx(0.5) and rows.loc["2", "rr"] == 0.0
    assert rows.loc["1", "rho"] == pytest.approx(0.5) and rows.loc["1", "rho_true"] == pytest.approx(-1.0)
    assert pd.isna(rows.loc["2", "rho"])  # no kept answer: left out of the Spearman means


def test_parts_sum_to_the_official_scores():
    whole = score_task3(FIX / "tiny_gold.csv", FIX / "tiny_submission.csv")
    parts = task3_scores_of(task3_by_question(FIX / "tiny_gold.csv", FIX / "tiny_submission.csv"))
    for k in (
        "accuracy",
        "precision",
        "mrr",
        "spearman",
        "spearman_true",
        "n_predicted_positive",
        "n_spearman_questions",
    ):
        assert parts[k] == pytest.approx(whole[k]), k


@needs_official
def test_parts_sum_to_the_official_scores_on_validation(tmp_path):
    rng = random.Random(3)
    rows = [(q, a, int(rng.random() < 0.5)) for q, a, _ in gold_rows()]
    sub = write_rows(tmp_path / "sub.csv", rows)
    whole, parts = score_task3(QA_GOLD, sub), task3_scores_of(task3_by_question(QA_GOLD, sub))
    for k in ("accuracy", "precision", "mrr", "spearman", "spearman_true"):
        assert parts[k] == pytest.approx(whole[k]), k


def test_repeated_questions_weigh_twice():
    rows = task3_by_question(FIX / "tiny_gold.csv", FIX / "tiny_submission.csv")
    twice_q1 = task3_scores_of(rows.iloc[[0, 0, 1]])
    assert twice_q1["accuracy"] == pytest.approx((3 + 3 + 1) / (4 + 4 + 2))
    assert twice_q1["mrr"] == pytest.approx((0.5 + 0.5 + 0) / 3)


def _gold_and_subs():
    gold = pd.DataFrame(
        {
            "qid": [str(q) for q in range(20) for _ in range(3)],
            "aid": [f"{q}_{i}" for q in range(20) for i in range(3)],
            "label": [1, 0, 0] * 20,
        }
    )
    perfect = gold.copy()
    noisy = gold.assign(label=[(1 - l) if i % 7 == 0 else l for i, l in enumerate(gold["label"])])
    return gold, perfect, noisy


def test_paired_bootstrap_difference_and_interval():
    gold, perfect, noisy = _gold_and_subs()
    a, b = task3_by_question(gold, perfect), task3_by_question(gold, noisy)
    out = paired_bootstrap(a, b, 500, seed=1)
    acc = out["accuracy"]
    assert acc["diff"] == pytest.approx(
        score_task3(gold, perfect)["accuracy"] - score_task3(gold, noisy)["accuracy"], abs=1e-4
    )
    assert acc["ci95"][0] <= acc["diff"] <= acc["ci95"][1] and acc["ci95"][0] > 0  # perfect is better in every resample
    assert (acc["p_better"], acc["p_worse"]) == (1.0, 0.0)
    same = paired_bootstrap(a, a, 200, seed=1)["accuracy"]
    assert same == {"diff": 0.0, "ci95": [0.0, 0.0], "p_better": 0.0, "p_worse": 0.0}
    assert paired_bootstrap(a, b, 300, seed=5) == paired_bootstrap(a, b, 300, seed=5)  # seeded


def test_paired_bootstrap_same_scores_in_another_order_tie():
    # q0 and q2 swap reciprocal ranks between the systems; a resample that draws them equally often sums the
    # same values in another order (0.1 + 0.2 + 0.3 != 0.3 + 0.2 + 0.1 in floats): a tie, not a win or a loss
    a = pd.DataFrame(
        {
            "qid": ["0", "1", "2"],
            "gold_rows": 3,
            "matches": 3,
            "predicted_positive": 1,
            "correct_positive": 1,
            "rr": [0.1, 0.2, 0.3],
            "rho": float("nan"),
            "rho_true": float("nan"),
        }
    )
    b = a.assign(rr=[0.3, 0.2, 0.1])
    out = paired_bootstrap(a, b, 400, seed=2)["mrr"]
    rng = np.random.default_rng(2)  # the draws paired_bootstrap makes
    counts = [np.bincount(rng.integers(3, size=3), minlength=3) for _ in range(400)]
    assert out["p_better"] == pytest.approx(np.mean([c[2] > c[0] for c in counts]), abs=1e-4)
    assert out["p_worse"] == pytest.approx(np.mean([c[2] < c[0] for c in counts]), abs=1e-4)


def test_resampled_scores_are_task3_scores_of_each_resample_bit_for_bit():
    # paired_bootstrap scores every resample at once: the same floats as scoring each resample's rows one at a time
    rng = np.random.default_rng(0)
    n = 40
    rho = np.where(rng.random(n) < 0.3, np.nan, rng.uniform(-1, 1, n))
    rows = pd.DataFrame(
        {
            "qid": [str(i) for i in range(n)],
            "gold_rows": rng.integers(2, 10, n),
            "matches": rng.integers(0, 3, n),
            "predicted_positive": rng.integers(0, 4, n),
            "correct_positive": rng.integers(0, 2, n),
            "rr": rng.random(n),
            "rho": rho,
            "rho_true": np.where(np.isnan(rho), np.nan, rng.uniform(-1, 1, n)),
        }
    )
    rows.loc[:5, "predicted_positive"] = 0
    idx = np.stack(
        [rng.integers(n, size=n) for _ in range(50)] + [np.zeros(n, dtype=np.int64)]
    )  # the last: q0 only (no rho, no positive)
    fast = _resampled_scores(rows, idx)
    for r, i in enumerate(idx):
        slow = task3_scores_of(rows.iloc[i])
        for m in fast:
            assert fast[m][r] == slow[m], (r, m)


def test_paired_bootstrap_refuses_unpaired_rows():
    gold, perfect, noisy = _gold_and_subs()
    a = task3_by_question(gold, perfect)
    with pytest.raises(MedrankError, match="different questions"):
        paired_bootstrap(a, a.iloc[::-1], 10, seed=1)
    with pytest.raises(MedrankError, match="resamples"):
        paired_bootstrap(a, a, 0, seed=1)
    with pytest.raises(MedrankError, match="no questions"):
        paired_bootstrap(a.iloc[:0], a.iloc[:0], 10, seed=1)


# ---------------------------------------------------------------- gold from the cleaned answers table


def _answers_frame() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "split": ["val"] * 5 + ["test"] * 2,
            "qid": ["7", "7", "7", "3", "3", "99", "99"],
            "aid": ["7_Answer1", "7_Answer2", "7_Answer3", "3_Answer1", "3_Answer2", "99_Answer1", "99_Answer2"],
            "reference_rank": [2, 3, 1, 2, 1, None, None],
            "reference_score": [3, 1, 4, 2, 4, None, None],
        }
    )


def test_gold_from_answers_orders_by_reference_rank():
    g = gold_from_answers(_answers_frame())
    assert list(g.itertuples(index=False, name=None)) == [
        ("7", "7_Answer3", 1),
        ("7", "7_Answer1", 1),
        ("7", "7_Answer2", 0),
        ("3", "3_Answer2", 1),
        ("3", "3_Answer1", 0),
    ]
    with pytest.raises(MedrankError, match="no answers with a reference_rank in split 'test'"):
        gold_from_answers(_answers_frame(), split="test")


def test_gold_from_answers_written_like_the_official_file(tmp_path):
    g = gold_from_answers(_answers_frame())
    out = tmp_path / "gold.txt"
    write_task3_submission(out, g.assign(score=-pd.Series(range(len(g)), dtype=float)))
    assert out.read_text() == "7,7_Answer3,1\n7,7_Answer1,1\n7,7_Answer2,0\n3,3_Answer2,1\n3,3_Answer1,0\n"
    assert read_task3_gold(out).equals(g)


@pytest.mark.skipif(not (VAL_XML.exists() and QA_GOLD.exists()), reason="validation XML or official gold absent")
def test_gold_from_parsed_val_equals_official_gold():
    from medrank.data.mediqa import read_task3

    ours = gold_from_answers(read_task3(VAL_XML, "val"), split="val")
    official_gold = read_task3_gold(QA_GOLD)
    assert list(ours.itertuples(index=False, name=None)) == list(official_gold.itertuples(index=False, name=None))


# ---------------------------------------------------------------- Task 2


def test_task2_tiny_fixture():
    m = score_task2(FIX / "tiny_rqe_gold.csv", FIX / "tiny_rqe_submission.csv")
    assert m == {"accuracy": 0.5, "n_gold_rows": 4, "n_submitted_rows": 3, "n_correct": 2}
    assert list(read_task2_table(FIX / "tiny_rqe_gold.csv", "gold")["pair_id"]) == ["1", "2", "3", "4"]


def test_task2_errors(tmp_path):
    for content, expected in [
        ("pair_id,label\n1,1\n77,0\n", "line 3: pair id '77' is not in the gold"),
        ("1,1\n1,0\n", "line 2: duplicate row for 1 (first at line 1)"),
        ("1,true\n", "line 1: label must be 0 or 1, got 'true'"),
        ("1,1,1\n", "line 1: expected 2 comma-separated fields, got 3"),
    ]:
        sub = tmp_path / "rqe_sub.csv"
        sub.write_text(content)
        with pytest.raises(MedrankError) as e:
            score_task2(FIX / "tiny_rqe_gold.csv", sub)
        assert "rqe_sub.csv" in str(e.value) and expected in str(e.value)


@needs_official
@pytest.mark.parametrize("with_header", [True, False])
def test_task2_relation_to_official(official, tmp_path, with_header):
    gold = read_task2_table(RQE_GOLD, "gold")
    rng = random.Random(1)
    labels = [rng.randint(0, 1) for _ in range(len(gold))]
    sub = tmp_path / "rqe.csv"
    sub.write_text(
        ("pair_id,label\n" if with_header else "") + "".join(f"{p},{l}\n" for p, l in zip(gold["pair_id"], labels))
    )
    ours = score_task2(RQE_GOLD, sub)
    off = run_official(official, RQE_GOLD, sub, task=2)["score"]
    n = len(gold)
    # the official script counts the gold header as a row (and matches a submission header against it)
    assert abs(off - (ours["n_correct"] + with_header) / (n + 1)) < 1e-12
    assert ours["accuracy"] == ours["n_correct"] / n and n == 302


# ---------------------------------------------------------------- ranx IR metrics


def test_ir_metrics_hand_computed():
    qrels = pd.DataFrame({"qid": ["1", "1", "1", "2", "2"], "aid": ["a", "b", "c", "d", "e"], "label": [1, 0, 1, 0, 1]})
    run = pd.DataFrame(
        {
            "qid": ["1", "1", "1", "2", "2", "5"],
            "aid": ["a", "b", "c", "d", "e", "x"],
            "score": [0.2, 0.9, 0.1, 0.8, 0.7, 1.0],
        }
    )
    m = ir_metrics(qrels, run, ["mrr", "precision@1", "map"])
    # q1 ranking b,a,c -> RR 1/2, AP (1/2 + 2/3)/2; q2 ranking d,e -> RR 1/2, AP 1/2; q5 not in qrels: dropped
    assert m["mrr"] == pytest.approx(0.5)
    assert m["precision@1"] == pytest.approx(0.0)
    assert m["map"] == pytest.approx(((1 / 2 + 2 / 3) / 2 + 1 / 2) / 2)


def test_permutation_rho_has_the_bits_of_scipy_spearmanr():
    """The official script's Spearman (scipy.stats.spearmanr) on permutations, computed ~6x faster, the same float."""
    import scipy.stats

    from medrank.selection.metrics import _permutation_rho

    rng = np.random.default_rng(0)
    for _ in range(3000):
        n = int(rng.integers(2, 12))
        x, y = rng.permutation(n).tolist(), rng.permutation(n).tolist()
        assert _permutation_rho(tuple(x), tuple(y)) == float(scipy.stats.spearmanr(x, y)[0])
