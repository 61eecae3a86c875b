"""Stage qa_graded (analysis/dvc.yaml): the qa cross-encoder learns the judged LiveQA answers' grades, cross-fitted so
that no model scores a question whose judged answers it learned. A fake encoder that remembers the questions it
trained on (and scores 1.0 exactly for those) makes any leak visible."""

import json

import numpy as np
import pandas as pd
import pytest

import stages.qa_graded as stage
from medrank.models import qa_graded as graded
from medrank.core import layout
from medrank.core.errors import MedrankError
from tests.conftest import write_params


class RememberingEncoder:
    """Stands in for CrossEncoder: fit remembers the questions (and targets) it saw; predict gives P = 1 for them."""

    fits: list[dict] = []

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.train_precision = "fp32"

    @classmethod
    def load(cls, path, device="auto", precision="auto", task=None) -> "RememberingEncoder":
        return cls()

    def fit(self, pairs, targets, **kw):
        self.seen = {q for q, _ in pairs}
        RememberingEncoder.fits.append(
            {"questions": self.seen, "targets": np.asarray(targets), "pairs": list(pairs), **kw}
        )
        return []

    def predict(self, pairs, batch_size=32, show_progress=False):
        p = np.array([1.0 if q in self.seen else 0.0 for q, _ in pairs])
        return np.column_stack([1.0 - p, p])


def _answers() -> pd.DataFrame:
    rows = []
    for split, n in (("train_liveqa", 6), ("train_alexa", 3), ("val", 2), ("test", 2)):
        for q in range(1, n + 1):
            for i in (1, 2):
                text = f"Anemia: answer {i} of {split} {q}."
                rows.append(
                    {
                        "split": split,
                        "qid": str(q),
                        "question": f"{split} q{q}",
                        "question_raw": f"{split} q{q}",
                        "aid": f"{q}_Answer{i}",
                        "answer": text,
                        "answer_raw": text,
                        "url": None,
                        "source": "medlineplus",
                        "answer_pos": i,
                        "system_rank": i,
                        "reference_rank": i if split != "test" else None,
                        "reference_score": (4 - i) if split != "test" else None,
                        "label": int(i == 1) if split != "test" else None,
                        "question_norm": f"{split} question {q}",
                        "answer_norm": text,
                        "answer_sentences": [text],
                    }
                )
    return pd.DataFrame(rows)


def _qrels() -> pd.DataFrame:
    rows = [
        (q, f"GHR_{q}_Sec{k}", g, "medquad", "What causes Anemia ?", f"Judged answer {k} of question {q}.")
        for q in range(1, 7)
        for k, g in ((1, 4), (2, 1), (3, 2.5))
    ]
    df = pd.DataFrame(rows, columns=["number", "answer_id", "grade", "source", "question", "answer"])
    return df.assign(answer_norm=df["answer"], answer_sentences=df["answer"].map(lambda t: [t]))


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    answers = _answers()
    for path, df in (
        (layout.ANSWERS, answers),
        (layout.JUDGED, _qrels()),
        (layout.QA_SCORES, answers[["split", "qid", "aid"]].assign(qa_score=np.linspace(0, 1, len(answers)))),
    ):
        path.parent.mkdir(parents=True, exist_ok=True)
        df.to_parquet(path)
    # every question of the fixture (the checkout's params.yaml may cap them: the tiny profile keeps 2 per split)
    write_params(tmp_path, {"max_questions_per_split": None, "qa_graded": {"folds": 3}})
    RememberingEncoder.fits = []
    monkeypatch.setattr(graded, "CrossEncoder", RememberingEncoder)
    return tmp_path


def test_no_question_is_scored_by_a_model_that_learned_its_grades(project):
    stage.main()
    scores = pd.read_parquet(layout.QA_GRADED_SCORES)
    assert len(scores) == len(_answers()) and set(scores["split"]) == {"train_liveqa", "train_alexa", "val", "test"}
    assert (scores["qa_graded_score"] == 0.0).all()  # P = 1 would mean the scoring model had learned that question
    fits = RememberingEncoder.fits
    assert len(fits) == 3
    learned = [q for f in fits for q in f["questions"]]
    # every judged question is learned by k - 1 = 2 fold models, and held out (scored) by the third
    assert sorted(set(learned)) == [f"train_liveqa question {q}" for q in range(1, 7)]
    assert all(learned.count(q) == 2 for q in set(learned))
    for f in fits:  # soft targets = (grade - 1) / 3 of the judged answers, the heading CHiQA would give them
        assert f["soft_targets"] is True
        assert sorted(set(np.round(f["targets"], 4))) == [0.0, 0.5, 1.0]
        assert all(a.startswith("What causes Anemia?: Judged answer") for _, a in f["pairs"])
    m = json.loads((project / "metrics/qa_graded.json").read_text())
    assert (
        m["n_judged"] == 18 and m["n_judged_questions"] == 6 and [f["n_held_judged"] for f in m["folds"]] == [6, 6, 6]
    )
    assert (
        m["held_out_judged"]["after"]["n"] == 18 and m["held_out_judged"]["after"]["auc"] == 0.5
    )  # the fake scores every held-out row 0
    assert (
        set(m["mediqa_auc"]) == {"train_liveqa", "train_alexa", "val", "test"}
        and m["mediqa_auc"]["test"]["qa_graded_auc"] is None
    )


def test_label_targets_and_a_fold_with_nothing_to_learn(project, monkeypatch):
    write_params(project, {"qa_graded": {"folds": 3, "target": "label"}})
    stage.main()
    assert all(f["soft_targets"] is False and sorted(set(f["targets"])) == [0, 1] for f in RememberingEncoder.fits)
    # judged answers of one question only: the fold holding it would have nothing to learn -> one error, no scores
    q = _qrels()
    q[q["number"] == 1].to_parquet(layout.JUDGED)
    layout.QA_GRADED_SCORES.unlink()
    with pytest.raises(MedrankError, match="fold 0 leaves no judged answer to train on"):
        stage.main()
    assert not layout.QA_GRADED_SCORES.exists()
