"""The question -> answer bi-encoder (stage qa_bienc): cross-fitting never scores a question with a model that learned
it; the in-batch-negatives ranking fit learns; the MedQuAD triplets' negatives are same-focus, other-type answers."""

import numpy as np
import pandas as pd
import pytest

from medrank.task3.crossfit import crossfit, folds_by_source
from medrank.data.mining import medquad_qa_triplets
from medrank.encoders.sentence_encoder import SentenceEncoder
from tests.helpers.models import FIXTURES

pytestmark = pytest.mark.usefixtures("one_thread")


def test_crossfit_never_scores_a_question_with_a_model_that_learned_it():
    rng = np.random.default_rng(0)
    question = rng.integers(0, 12, 60)  # 60 answers of 12 questions
    judged_question = rng.integers(0, 12, 40)  # 40 judged answers of the same questions
    fold_of = rng.permutation(12) % 3
    learned: dict[int, set] = {}

    def fit(f, train):
        learned[f] = set(question[train[0]]) | set(judged_question[train[1]])
        return f

    def score(f, rows):
        assert not set(question[rows]) & learned[f], "a question scored by a model that learned it"
        return np.full(len(rows), float(f))

    out = crossfit(3, fold_of[question], [fold_of[question], fold_of[judged_question]], fit, score)
    assert not np.isnan(out).any() and (out == fold_of[question]).all()
    assert all(
        learned[f] == set(np.flatnonzero(fold_of != f)) & (set(question) | set(judged_question)) for f in range(3)
    )


def test_fit_ranking_learns_to_put_each_query_next_to_its_positive(tiny_base):
    pairs = pd.read_csv(FIXTURES / "pairs.tsv", sep="\t")
    pos = pairs[pairs["label"] == 1].head(16)
    q, a = pos["text_a"].tolist(), pos["text_b"].tolist()
    enc = SentenceEncoder(str(tiny_base), device="cpu", max_length=32)

    def hits() -> float:
        sim = enc.encode(q) @ enc.encode(a).T
        return float(np.mean(sim.argmax(1) == np.arange(len(q))))

    before = hits()
    hist = enc.fit_ranking(q, a, None, epochs=8, lr=5e-3, batch_size=8, seed=0, precision="fp32", show_progress=False)
    assert hist[-1]["train_loss"] < hist[0]["train_loss"]
    assert hits() > before
    again = SentenceEncoder(str(tiny_base), device="cpu", max_length=32)
    assert (
        again.fit_ranking(q, a, None, epochs=8, lr=5e-3, batch_size=8, seed=0, precision="fp32", show_progress=False)
        == hist
    )


def test_medquad_triplets_negatives_share_the_focus_not_the_question_type():
    medquad = pd.DataFrame(
        [
            {"focus": f, "question_type": t, "question": f"what {t} of {f} ?", "answer_norm": f"{f} {t} answer {i}"}
            for f in ("asthma", "gout", "flu")
            for t in ("information", "symptoms", "treatment")
            for i in range(2)
        ]
    )
    triplets = medquad_qa_triplets(medquad, 30, np.random.default_rng(0))
    assert len(triplets) == 30
    by_answer = medquad.drop_duplicates("answer_norm").set_index("answer_norm")
    for _, positive, negative in triplets:
        assert by_answer.loc[positive, "focus"] == by_answer.loc[negative, "focus"]
        assert by_answer.loc[positive, "question_type"] != by_answer.loc[negative, "question_type"]


def test_source_folds_hold_each_labelled_source_out_whole_and_deal_the_test_questions():
    keys = pd.DataFrame(
        {
            "split": ["train_liveqa"] * 4 + ["train_alexa"] * 3 + ["val"] * 2 + ["test"] * 6,
            "qid": [str(i) for i in range(15)],
        }
    )
    folds = folds_by_source(keys, ("train_liveqa", "train_alexa", "val"), seed=0)
    assert folds[:9].tolist() == [0] * 4 + [1] * 3 + [2] * 2
    assert sorted(folds[9:].tolist()) == [0, 0, 1, 1, 2, 2]  # dealt evenly
