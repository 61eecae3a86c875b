"""medrank.task3.features: the answer table, the feature builder (shapes, determinism, no leakage), paper rules."""

import re

import numpy as np
import pandas as pd
import pytest

from medrank.task3.answer_scores import answer_heading
from medrank.task3.bow import fit_tfidf, tfidf_rows
from medrank.core.errors import MedrankError
from medrank.task3.features import (
    FeatureBuilder,
    aligned_scores,
    answer_table,
    cap_questions,
    chiqa_rank,
    relative_to_question,
    required_columns,
)
from tests.helpers import FIXTURES

FIX = FIXTURES / "baseline"
N = 2  # n_candidates in these tests


@pytest.fixture(scope="module")
def answers() -> pd.DataFrame:
    df = pd.read_json(FIX / "answers.jsonl", lines=True, dtype={"qid": str})
    for c in ("answer_pos", "system_rank", "reference_rank", "reference_score"):
        df[c] = df[c].astype("Int32")
    df["label"] = df["label"].astype("Int8")
    return df


@pytest.fixture(scope="module")
def medquad() -> list[str]:
    return (FIX / "medquad.txt").read_text(encoding="utf-8").splitlines()


def _retrieved(answers: pd.DataFrame) -> pd.DataFrame:
    """Per question: rank 1 passes T, rank 2 passes only for a few; the val question has only a fallback."""
    rows = []
    for (split, qid), _ in answers.groupby(["split", "qid"], sort=False):
        fallback = split == "val"
        rows.append(
            (
                split,
                qid,
                1,
                0.4 if fallback else 0.9,
                not fallback,
                f"entailed answer of {split} {qid} asthma",
                [0.5] * 4,
            )
        )
        if split == "train_liveqa":
            rows.append((split, qid, 2, 0.8, True, "second entailed answer diabetes", [0.25] * 4))
    return pd.DataFrame(
        rows, columns=["split", "qid", "rank", "rqe_score", "passes_threshold", "entailed_answer", "rqe_cls"]
    )


def _anli(answers: pd.DataFrame, retrieved: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for r in retrieved.itertuples():
        for a in answers[(answers["split"] == r.split) & (answers["qid"] == r.qid)].itertuples():
            rows.append((a.split, a.qid, a.aid, "rqe", r.rank, 0.1 * r.rank + 0.01 * a.answer_pos))
            rows.append((a.split, a.qid, a.aid, "augment", 1, 0.99))  # MTL-only pairs: must be ignored
    return pd.DataFrame(rows, columns=["split", "qid", "aid", "entailed_kind", "entailed_rank", "anli"])


@pytest.fixture(scope="module")
def table(answers) -> pd.DataFrame:
    ret = _retrieved(answers)
    cos = np.linspace(0.1, 0.9, len(answers))
    return answer_table(
        answers,
        entailed=ret,
        anli=_anli(answers, ret),
        bienc_cos=cos,
        heading_cos=cos**2,
        cnn_score=cos[::-1],
        n_candidates=N,
    )


ALL = ("metadata", "bow", "rqe", "rqe_emb", "anli", "bienc", "heading", "cnn")


def test_answer_table_keys_and_chiqa_rank(answers, table):
    assert len(table) == len(answers)
    # qid 1 exists in train_liveqa, train_alexa and test: the question key keeps them apart
    assert table["gid"].nunique() == answers.groupby(["split", "qid"]).ngroups
    test = table[table["split"] == "test"]
    # test rows have no system rank: position in the file stands in (1_Answer3 is the 2nd listed)
    assert test["chiqa_rank"].tolist() == [1.0, 2.0]
    assert chiqa_rank(answers[answers["split"] == "train_liveqa"]).tolist() == [1, 2, 3, 1, 2, 3]


def test_rqe_and_anli_zero_when_fewer_than_n_pass(table):
    live = table[table["split"] == "train_liveqa"]
    assert (live["rqe_1"] == 0.9).all() and (live["rqe_2"] == 0.8).all()
    alexa = table[table["split"] == "train_alexa"]
    assert (alexa["rqe_1"] == 0.9).all() and (alexa["rqe_2"] == 0.0).all() and (alexa["anli_2"] == 0.0).all()
    # val: only a below-threshold fallback was retrieved -> everything 0, no entailed text (paper rule)
    val = table[table["split"] == "val"]
    assert (val[["rqe_1", "rqe_2", "anli_1", "anli_2"]] == 0).all().all()
    assert (val["entailed_text"] == "").all()
    assert all(not v.any() for v in val["rqe_emb_1"])
    # anli comes from the rqe rows (rank i), never the augment rows
    row = table[(table["gid"] == "train_liveqa:1") & (table["aid"] == "1_Answer3")].iloc[0]
    assert row["anli_1"] == pytest.approx(0.13) and row["anli_2"] == pytest.approx(0.23)


def test_missing_inputs_are_errors_not_zeros(answers):
    ret = _retrieved(answers)
    with pytest.raises(MedrankError, match="retrieved table lacks 1 questions"):
        answer_table(answers, entailed=ret[ret["split"] != "val"], n_candidates=N)
    grid = _anli(answers, ret)
    with pytest.raises(MedrankError, match="NLI grid lacks"):
        answer_table(answers, entailed=ret, anli=grid.iloc[1:], n_candidates=N)
    with pytest.raises(MedrankError, match="need answer-table columns"):
        FeatureBuilder(("metadata", "anli"), n_candidates=N).fit(answer_table(answers, n_candidates=N))
    with pytest.raises(MedrankError, match="unknown feature group"):
        required_columns(["metadata", "tfidf"], N)


@pytest.mark.parametrize(
    "groups, n_dense",
    [
        (("metadata",), 4),
        (("rqe",), N),
        (("anli",), N),
        (("bienc",), 4),
        (("heading",), 4),
        (("rqe_emb",), N * 4),
        (("cnn",), 4),
        (ALL, 4 + N + N * 4 + N + 4 + 4 + 4),
    ],
)
def test_builder_shapes(table, medquad, groups, n_dense):
    tfidf = fit_tfidf(medquad, max_features=50, min_df=1)
    train = table[table["split"].str.startswith("train")]
    b = FeatureBuilder(groups, n_candidates=N, tfidf=tfidf, min_source_count=2).fit(train)
    X = b.transform(table)
    n_sources = 3 + 1 if "metadata" in groups else 0  # medlineplus, mayoclinic, nei seen >= 2 times, + other
    n_bow = 2 * len(tfidf.vocabulary_) if "bow" in groups else 0
    assert X.shape == (len(table), n_dense + n_sources + n_bow)
    assert len(b.feature_names) == X.shape[1] == len(set(b.feature_names))
    assert np.isfinite(X.toarray()).all()
    if "metadata" in groups:
        # unseen / rare sources (gard, ghr, unknown) share the 'other' column
        other = X[:, b.feature_names.index("source=other")].toarray().ravel()
        assert other.tolist() == [s not in ("medlineplus", "mayoclinic", "nei") for s in table["source"]]


def test_dense_features_standardised_on_training_rows(table):
    train = table[table["split"].str.startswith("train")]
    b = FeatureBuilder(("metadata", "bienc"), n_candidates=N).fit(train)
    X = b.transform(train).toarray()[:, : len(b.dense_names_)]
    np.testing.assert_allclose(X.mean(axis=0), 0, atol=1e-9)
    np.testing.assert_allclose(X.std(axis=0), 1, atol=1e-9)


def test_tfidf_vocabulary_has_no_mediqa_text(table, medquad):
    tfidf = fit_tfidf(medquad, max_features=1000, min_df=1)
    vocab = set(tfidf.vocabulary_)
    assert "asthma" in vocab and "glaucoma" in vocab
    # words that only occur in validation / test answers never enter the vocabulary
    assert "zyxvalonly" not in vocab and "qwtestonly" not in vocab
    words = lambda texts: set(re.findall(r"[a-z][a-z0-9-]+", " ".join(texts).lower()))
    mediqa_only = words(table["answer_text"]) - words(medquad)
    assert "zyxvalonly" in mediqa_only and "allergens" in mediqa_only
    assert not (vocab & mediqa_only)


def test_training_rows_do_not_depend_on_validation_or_test_text(table, medquad):
    """Fit on train only: changing val/test answers changes neither the fit nor any training row."""
    tfidf = fit_tfidf(medquad, max_features=100, min_df=1)
    train = table[table["split"].str.startswith("train")]
    b1 = FeatureBuilder(ALL, n_candidates=N, tfidf=tfidf).fit(train)
    X1 = b1.transform(table)
    other = table.copy()
    held = other["split"].isin(["val", "test"])
    other.loc[held, "answer_text"] = "asthma asthma glaucoma"
    other.loc[held, "n_sentences"] = 99.0
    b2 = FeatureBuilder(ALL, n_candidates=N, tfidf=tfidf).fit(other[~held])
    X2 = b2.transform(other)
    assert b1.feature_names == b2.feature_names
    np.testing.assert_array_equal(X1[~held.to_numpy()].toarray(), X2[~held.to_numpy()].toarray())


def test_deterministic_and_row_local(table, medquad):
    tfidf = fit_tfidf(medquad, max_features=100, min_df=1)
    train = table[table["split"].str.startswith("train")]
    X1 = FeatureBuilder(ALL, n_candidates=N, tfidf=tfidf).fit(train).transform(table)
    b = FeatureBuilder(ALL, n_candidates=N, tfidf=tfidf).fit(train)
    X2 = b.transform(table)
    np.testing.assert_array_equal(X1.toarray(), X2.toarray())
    # a question's rows do not depend on the other questions in the batch (question-relative features included)
    one = table["gid"] == "val:4"
    np.testing.assert_array_equal(b.transform(table[one]).toarray(), X2[one.to_numpy()].toarray())


def test_relative_to_question():
    rel = relative_to_question(np.array([0.2, 0.5, 0.5, 0.1]), np.array(["a", "a", "a", "b"]))
    np.testing.assert_allclose(rel["minus_max"], [-0.3, 0, 0, 0])
    np.testing.assert_allclose(rel["minus_mean"], [-0.2, 0.1, 0.1, 0])
    np.testing.assert_allclose(rel["rank_frac"], [1.0, 1 / 3, 2 / 3, 1.0])  # ties: input order


def test_bow_needs_a_vectorizer():
    with pytest.raises(MedrankError, match="needs a TF-IDF vectorizer"):
        FeatureBuilder(("bow",))


def test_tfidf_rows_memo_equals_transform(medquad):
    tfidf = fit_tfidf(medquad, max_features=100, min_df=1)
    a = ["asthma triggers", "glaucoma eye pressure", "asthma triggers", ""]
    b = ["insulin diabetes", "asthma triggers"]
    for texts in (a, b, a + b):
        np.testing.assert_array_equal(tfidf_rows(tfidf, texts).toarray(), tfidf.transform(texts).toarray())
    assert tfidf_rows(tfidf, []).shape == (0, len(tfidf.vocabulary_))


def test_answer_scores_align_to_answer_order_and_name_gaps(answers):
    keyed = answers[["split", "qid", "aid"]].assign(cnn_score=np.arange(len(answers), dtype=float))
    shuffled = keyed.sample(frac=1.0, random_state=0)
    np.testing.assert_array_equal(
        aligned_scores(answers, shuffled, "cnn_score", "scores.parquet"), np.arange(len(answers))
    )
    with pytest.raises(MedrankError, match=r"scores.parquet: no cnn_score for 1 answers"):
        aligned_scores(answers, shuffled.iloc[1:], "cnn_score", "scores.parquet")
    with pytest.raises(MedrankError, match="duplicate"):
        aligned_scores(answers, pd.concat([keyed, keyed.iloc[:1]]), "cnn_score", "scores.parquet")


def test_cap_questions_keeps_first_questions_per_split(answers):
    capped = cap_questions(answers, 1)
    firsts = answers.sort_values(["split", "qid"]).drop_duplicates("split")[["split", "qid"]]
    assert set(map(tuple, capped[["split", "qid"]].drop_duplicates().to_numpy())) == set(map(tuple, firsts.to_numpy()))
    assert cap_questions(answers, None) is answers


@pytest.mark.parametrize(
    "answer, heading",
    [
        (
            "Ectopic pregnancy (Symptoms): At first, an ectopic pregnancy might not cause signs.",
            "Ectopic pregnancy (Symptoms)",
        ),
        ("What causes Anemia?: The three main causes of anemia are: blood loss", "What causes Anemia?"),
        ("Ear wax:", "Ear wax"),
        ("No title here, only text.", "No title here, only text."),
        (": starts with a colon", ": starts with a colon"),
        ("", ""),
        (None, ""),
        ("x" * 300 + ": late colon", "x" * 200),
    ],
)
def test_answer_heading(answer, heading):
    assert answer_heading(answer) == heading
