"""The judged LiveQA answers as extra training rows (medrank.data.judged): the graded-target builder."""

import numpy as np
import pandas as pd
import pytest

from medrank.data.judged import chiqa_heading, graded_targets, judged_answers, question_folds, with_judged
from medrank.core.errors import MedrankError
from medrank.task3.features import answer_table


def mediqa_answers() -> pd.DataFrame:
    rows = []
    for split, qid in (("train_liveqa", "1"), ("train_liveqa", "2"), ("train_alexa", "1")):
        for i in (1, 2):
            text = f"Anemia: answer {i} to {split} {qid}."
            rows.append(
                {
                    "split": split,
                    "qid": qid,
                    "question": f"q{qid}",
                    "question_raw": f"Q{qid}",
                    "aid": f"{qid}_Answer{i}",
                    "answer": text,
                    "answer_raw": text,
                    "url": None,
                    "source": "medlineplus",
                    "answer_pos": i,
                    "system_rank": i,
                    "reference_rank": i,
                    "reference_score": 4 - i,
                    "label": int(i == 1),
                    "question_norm": f"q{qid} norm",
                    "answer_norm": text,
                    "answer_sentences": [text],
                }
            )
    return pd.DataFrame(rows)


def qrels() -> pd.DataFrame:
    rows = [  # number, answer_id, grade, source, question, answer
        (1, "GHR_1_Sec1", 4, "medquad", "What is (are) Anemia ?", "Anemia is a low red cell count. It tires you."),
        (
            1,
            "GHR_1_Sec1",
            2,
            "medquad",
            "What is (are) Anemia ?",
            "Anemia is a low red cell count. It tires you.",
        ),  # judged twice
        (1, "GHR_1_Sec2", 2, "medquad", "What causes Anemia ?", "Iron deficiency."),
        (1, "nist-1-7", 3, "nist", None, "Eat more iron."),
        (2, "GHR_2_Sec1", 1, "medquad", "What are the treatments for Anemia ?", "Answer 1 to train_liveqa 2."),
        (
            2,
            "dup",
            3,
            "medquad",
            None,
            "Anemia: answer 1 to train_liveqa 2.",
        ),  # the text of a MEDIQA answer of question 2
        (
            7,
            "GHR_7_Sec1",
            4,
            "medquad",
            "What causes Gout ?",
            "Uric acid.",
        ),  # question 7 is not in the (capped) answers
    ]
    df = pd.DataFrame(rows, columns=["number", "answer_id", "grade", "source", "question", "answer"])
    return df.assign(
        answer_norm=df["answer"], answer_sentences=df["answer"].map(lambda t: [s for s in t.split(". ") if s])
    )


def test_chiqa_heading_mimics_the_answer_titles():
    assert chiqa_heading("What is (are) Polycystic ovary syndrome ?") == "Polycystic ovary syndrome"
    assert chiqa_heading("What causes Noonan syndrome ?") == "What causes Noonan syndrome?"
    assert chiqa_heading(None) is None and chiqa_heading("  ") is None


def test_judged_answers_become_graded_training_rows_of_their_question():
    answers = mediqa_answers()
    out = judged_answers(qrels(), answers)
    assert list(out["aid"]) == ["judged:GHR_1_Sec1", "judged:GHR_1_Sec2", "judged:nist-1-7", "judged:GHR_2_Sec1"]
    assert (out["split"] == "train_liveqa").all() and list(out["qid"]) == ["1", "1", "1", "2"]
    # mean grade of a pair judged twice; correct = grade >= 3 (MEDIQA's scale)
    assert list(out["reference_score"]) == [3.0, 2.0, 3.0, 1.0] and list(out["label"]) == [1, 0, 1, 0]
    assert out["system_rank"].isna().all() and out["answer_pos"].isna().all() and out["reference_rank"].isna().all()
    assert list(out["source"]) == ["judged_medquad", "judged_medquad", "judged_nist", "judged_medquad"]
    assert out["answer_norm"].iloc[0] == "Anemia: Anemia is a low red cell count. It tires you."
    assert out["answer_sentences"].iloc[0][0].startswith("Anemia: ") and out["answer_norm"].iloc[2] == "Eat more iron."
    assert out["question_norm"].iloc[3] == "q2 norm" and out["judged"].all()
    both = with_judged(answers, out)
    assert len(both) == len(answers) + len(out) and list(both.columns) == [*answers.columns, "judged"]
    assert not both["judged"].iloc[: len(answers)].any()


def test_judged_rows_form_their_own_list_in_the_answer_table():
    answers = mediqa_answers()
    t = answer_table(with_judged(answers, judged_answers(qrels(), answers)))
    j = t[t["judged"]]
    assert set(j["gid"]) == {"train_liveqa:1#judged", "train_liveqa:2#judged"}
    assert set(j["qkey"]) == {"train_liveqa:1", "train_liveqa:2"} and j["chiqa_rank"].isna().all()
    assert (t.loc[~t["judged"], "gid"] == t.loc[~t["judged"], "qkey"]).all() and not np.isnan(
        t.loc[~t["judged"], "chiqa_rank"]
    ).any()


def test_judged_answers_name_missing_columns():
    with pytest.raises(MedrankError, match=r"lacks columns \['answer_norm', 'answer_sentences'\]"):
        judged_answers(qrels().drop(columns=["answer_norm", "answer_sentences"]), mediqa_answers())


def test_question_folds_deal_every_split_evenly_and_ignore_input_order():
    keys = pd.DataFrame(
        {
            "split": ["train_liveqa"] * 7 + ["train_alexa"] * 5,
            "qid": [str(i) for i in range(7)] + [str(i) for i in range(5)],
        }
    )
    f = question_folds(keys, 3, seed=1)
    for split, n in (("train_liveqa", 7), ("train_alexa", 5)):
        counts = np.bincount(f[keys["split"].to_numpy() == split], minlength=3)
        assert counts.sum() == n and counts.max() - counts.min() <= 1  # an even share of each split per fold
    shuffled = keys.sample(frac=1.0, random_state=0)
    again = dict(zip(zip(shuffled["split"], shuffled["qid"]), question_folds(shuffled, 3, seed=1)))
    assert again == dict(zip(zip(keys["split"], keys["qid"]), f))  # a question's fold does not depend on row order
    with pytest.raises(MedrankError, match="k >= 2"):
        question_folds(keys, 1, seed=1)
    with pytest.raises(MedrankError, match="unique"):
        question_folds(pd.concat([keys, keys.head(1)]), 3, seed=1)


def test_graded_targets_rescale_the_grade_or_threshold_it():
    grade = np.array([1.0, 2.0, 2.5, 3.0, 4.0])
    np.testing.assert_allclose(graded_targets(grade, "grade"), [0.0, 1 / 3, 0.5, 2 / 3, 1.0], atol=1e-7)
    assert list(graded_targets(grade, "label")) == [0, 0, 0, 1, 1]
    with pytest.raises(MedrankError, match="1..4"):
        graded_targets(np.array([0.0, 3.0]), "grade")
    with pytest.raises(MedrankError, match="grade or label"):
        graded_targets(grade, "rank")
