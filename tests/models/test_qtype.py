"""Feature group qtype: the heading's question, the question-type agreement, stage bienc's columns, the feature
group and `medrank rank`'s scores."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from medrank.core import layout
from medrank.task3.answer_scores import (
    BIENC_SCORES,
    answer_qtype_scores,
    aspect_type,
    heading_question,
    split_heading,
)
from medrank.task3.features import (
    FeatureBuilder,
    answer_table,
    read_answer_scores,
    required_columns,
)
from medrank.data.schemas import NORMALIZED_LIVEQA_QRELS
from medrank.core.errors import MedrankError
from medrank.task3.qtype import QuestionTypes
from medrank.params import BaselineParams, Params, step_params
from tests.helpers.tables import MEDQUAD  # 5 foci x 4 types in MedQuAD's templates
from tests.conftest import write_params

# one question, three answers: the right aspect, a wrong aspect of the same focus, a question-shaped heading
ANSWERS = pd.DataFrame(
    {
        "split": "train_liveqa",
        "qid": "1",
        "aid": ["1_Answer1", "1_Answer2", "1_Answer3"],
        "question": "Lupus. How is lupus treated?",
        "question_norm": "Lupus. How is lupus treated?",
        "answer_norm": [
            "Lupus (Treatment): Medicines such as ...",
            "Lupus (Causes): The cause is unknown ...",
            "What are the symptoms of lupus?: Joint pain ...",
        ],
        "source": "medlineplus",
        "answer_sentences": [["a"], ["b", "c"], ["d"]],
        "system_rank": [1, 2, 3],
        "answer_pos": [1, 2, 3],
        "label": [1, 0, 0],
        "reference_rank": [1, 2, 3],
        "reference_score": [4, 2, 1],
    }
)


@pytest.fixture(scope="module")
def qtypes() -> QuestionTypes:
    return QuestionTypes(MEDQUAD, seed=0)


@pytest.mark.parametrize(
    "heading, title, aspect",
    [
        ("Anemia (Treatment)", "Anemia", "Treatment"),
        ("Scoliosis (Outlook (Prognosis))", "Scoliosis", "Outlook (Prognosis)"),
        ("Seasonal affective disorder (SAD) (Diagnosis)", "Seasonal affective disorder (SAD)", "Diagnosis"),
        (
            "Radiation therapy (Radiation therapy, Radiotherapy , Cancer - radi",
            "Radiation therapy",
            "",
        ),  # cut at 200 characters
        ("What causes Anemia?", "What causes Anemia?", ""),
    ],
)
def test_split_heading(heading, title, aspect):
    assert split_heading(heading) == (title, aspect)


@pytest.mark.parametrize(
    "heading, question",
    [
        ("Anemia (Treatment)", "What are the treatments for Anemia?"),
        ("Acne (Drug treatment)", "What are the treatments for Acne?"),  # a listed name inside the aspect
        ("Gout (Risk factors)", "Who is at risk for Gout?"),
        ("Scoliosis (Outlook (Prognosis))", "What is the outlook for Scoliosis?"),
        ("Fibromyalgia (What causes it?)", "What causes it?"),  # a question-shaped aspect is what is asked
        ("What causes Anemia?", "What causes Anemia?"),
        ("Spina bifida", "What is Spina bifida?"),  # a bare title: the page's overview
        ("Ibuprofen (Brand names)", "Brand names Ibuprofen"),  # an unlisted aspect reads as it is
        ("", ""),
    ],
)
def test_heading_question(heading, question):
    assert heading_question(heading) == question


def test_aspect_type_takes_the_first_listed_name():
    assert aspect_type("Symptoms and causes") == "symptoms"
    assert aspect_type("Exams and Tests") == "exams and tests"
    assert aspect_type("Brand names") is None


def test_agreement_is_higher_for_the_asked_type(qtypes):
    s = answer_qtype_scores(ANSWERS, qtypes)
    assert set(s) == {"qtype_agree", "qtype_match"}
    agree, match = s["qtype_agree"], s["qtype_match"]
    assert agree[0] > 0.5 > max(agree[1], agree[2])  # treatment heading vs causes / symptoms headings
    assert match.tolist() == [1.0, 0.0, 0.0]
    # deterministic: the same seed gives the same classifier and scores
    again = answer_qtype_scores(ANSWERS, QuestionTypes(MEDQUAD, seed=0))
    np.testing.assert_array_equal(again["qtype_agree"], agree)


def test_stage_bienc_writes_the_qtype_columns(tmp_path, monkeypatch, tiny_base):
    from medrank.task3 import answer_scores
    from stages import bienc as stage

    (tmp_path / layout.NORMALIZED).mkdir(parents=True)
    (tmp_path / layout.CLEAN).mkdir(parents=True)
    ANSWERS.to_parquet(tmp_path / layout.ANSWERS)
    MEDQUAD.to_parquet(tmp_path / layout.CLEAN_MEDQUAD)
    NORMALIZED_LIVEQA_QRELS.empty_table().to_pandas().to_parquet(tmp_path / layout.JUDGED)  # no judged answers here
    # the tiny base, not the acquired mpnet: a test never depends on what the machine happens to have installed
    write_params(tmp_path, {"seed": 0, "encoders": {"zero_shot": {"model": str(tiny_base)}}})
    n = len(ANSWERS)
    # the encoder is tested elsewhere (test_embed_cache): fixed cosines here
    monkeypatch.setattr(
        answer_scores,
        "answer_bienc_scores",
        lambda answers, *a, **k: ({"bienc_cos": np.full(n, 0.5), "heading_cos": np.full(n, 0.25)}, {}),
    )
    monkeypatch.chdir(tmp_path)
    stage.main()
    table = pq.read_table(tmp_path / layout.BIENC)
    assert table.schema.equals(BIENC_SCORES, check_metadata=False)
    assert {"qtype_agree", "qtype_match"} <= set(BIENC_SCORES.names)
    expected = answer_qtype_scores(ANSWERS, QuestionTypes(MEDQUAD, seed=0))
    np.testing.assert_allclose(table.column("qtype_agree").to_numpy(), expected["qtype_agree"])
    metrics = json.loads((tmp_path / layout.metrics_file("bienc")).read_text())
    assert metrics["qtype_mean"]["qtype_match"] == round(1 / 3, 4)
    # the baseline / mtl stages read the group back from the stage's file
    scores = read_answer_scores(ANSWERS, {"qtype"})
    assert set(scores) == {"qtype_agree", "qtype_match"}
    np.testing.assert_allclose(scores["qtype_match"], expected["qtype_match"])


def test_feature_group_qtype(qtypes):
    assert required_columns(["qtype"], 3) == ["qtype_agree", "qtype_match"]
    table = answer_table(ANSWERS, **answer_qtype_scores(ANSWERS, qtypes))
    b = FeatureBuilder(("qtype",)).fit(table)
    x = b.transform(table).toarray()
    assert b.feature_names == [
        "qtype_agree",
        "qtype_agree_minus_max",
        "qtype_agree_minus_mean",
        "qtype_rank_frac",
        "qtype_match",
    ]
    raw = x * b.scale_ + b.mean_
    assert raw[0, 1] == 0.0 and (raw[1:, 1] < 0).all()  # the right aspect is the question's best agreement
    assert raw[0, 3] == pytest.approx(1 / 3)  # rank 1 of 3
    assert BaselineParams(features=["metadata", "qtype"]).features == ["metadata", "qtype"]


def test_rank_computes_the_stage_columns(qtypes):
    from medrank.steps.score_step import AnswerScores

    got = AnswerScores(Params(), {"qtype"}, models={"qtypes": qtypes}).scores(ANSWERS)
    expected = answer_qtype_scores(ANSWERS, qtypes)
    assert set(got) == set(expected)
    for k in expected:
        np.testing.assert_array_equal(got[k], expected[k])
    # the classifier's seed travels with the answer-scores step stage bienc saves
    assert step_params(Params(seed=7), "answer_scores")["seed"] == 7


def test_saved_tables_predict_the_same_bits_without_refitting(qtypes, tmp_path):
    """Stage bienc saves the fitted classifier as tables (no pickle); `medrank rank` rebuilds it from them."""
    tables = qtypes.tables()
    for name, t in tables.items():
        t.to_parquet(tmp_path / f"{name}.parquet")
    back = QuestionTypes.from_tables({n: pd.read_parquet(tmp_path / f"{n}.parquet") for n in tables}, 0)
    texts = list(ANSWERS["question_norm"].fillna("")) + ["How is it treated?", "Is it genetic?", ""]
    np.testing.assert_array_equal(back.proba(texts), qtypes.proba(texts))
    assert back.types == qtypes.types
    with pytest.raises(MedrankError, match="question-type classifier tables: KeyError"):
        QuestionTypes.from_tables({k: v for k, v in tables.items() if k != "qtype_lr"})
