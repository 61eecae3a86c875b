"""QA relevance pairs mined from MedQuAD (stage qa)."""

import numpy as np
import pandas as pd
import pytest

from medrank.data.mining import medquad_qa_pairs
from medrank.data.tasks import QA_LABELS, qa_task
from medrank.core.errors import MedrankError

TYPES = ("symptoms", "treatment", "causes")


def _medquad(n_foci: int = 8) -> pd.DataFrame:
    rows = [
        {
            "focus": f"Disease {i}",
            "question_type": t,
            "question": f"What are the {t} of Disease {i} ?",
            "answer_norm": f"answer about {t} of disease {i}",
        }
        for i in range(n_foci)
        for t in TYPES
    ]
    return pd.DataFrame(rows)


def _about(answer: str) -> tuple[str, str]:
    words = answer.split()  # "answer about <type...> of disease <i>"
    return " ".join(words[2:-3]), words[-1]


def test_pairs_are_half_positive_with_same_focus_hard_negatives():
    pairs, y = medquad_qa_pairs(_medquad(), 400, np.random.default_rng(0))
    assert len(pairs) == 400 and set(y) == {0, 1} and abs(y.mean() - 0.5) < 0.1
    same_focus_neg = other_focus_neg = 0
    for (q, a), label in zip(pairs, y):
        focus = q.split("isease ")[1].split()[0].strip(".?")  # "Disease 3. ..." or "What are the x of Disease 3?"
        qtype = (
            q.removeprefix("What are the ").split(" of ")[0] if q.startswith("What are the") else None
        )  # MedQuAD wording
        a_type, a_focus = _about(a)
        if label == 1:
            assert a_focus == focus and qtype in (None, a_type)
        elif a_focus == focus:
            same_focus_neg += 1
            assert qtype in (None,) or a_type != qtype  # right topic, another aspect
        else:
            other_focus_neg += 1
    # both kinds of negatives, roughly half each
    assert same_focus_neg > 0.3 * (y == 0).sum() and other_focus_neg > 0.3 * (y == 0).sum()


def test_mining_is_seeded():
    a = medquad_qa_pairs(_medquad(), 50, np.random.default_rng(3))
    b = medquad_qa_pairs(_medquad(), 50, np.random.default_rng(3))
    assert a[0] == b[0] and np.array_equal(a[1], b[1])


def test_qa_task_validates_on_held_out_foci():
    data = qa_task(_medquad(20), 100, 30, 0.2, np.random.default_rng(1))
    assert data.label_names == QA_LABELS and len(data.train_pairs) == 100 and len(data.eval_pairs) == 30
    train_foci = {_about(a)[1] for _, a in data.train_pairs}
    eval_foci = {_about(a)[1] for _, a in data.eval_pairs}
    assert eval_foci and not (train_foci & eval_foci)


def test_no_focus_with_two_types_is_a_clear_error():
    one_type = _medquad()[lambda d: d["question_type"] == "symptoms"]
    with pytest.raises(MedrankError, match="no focus with answers of two question types"):
        medquad_qa_pairs(one_type, 10, np.random.default_rng(0))
    assert medquad_qa_pairs(one_type, 0, np.random.default_rng(0))[0] == []
