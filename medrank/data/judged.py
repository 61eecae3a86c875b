"""The judged LiveQA 2017 answers as extra training rows of MEDIQA Task 3 (TrainingSet1 = the same 104 questions).

`../shared/data/liveqa_med_2017/` judges 2,456 MedQuAD answers and 666 TREC participant answers (after cleaning) for
the questions of MEDIQA's train_liveqa split on MEDIQA's own 1-4 scale (ReferenceScore). `judged_answers` turns the
normalize stage's table of them into rows shaped like the normalized MEDIQA answers, so the same feature code serves
both: question `number` n is train_liveqa question `qid` n (the judged answers' topics match; checked by the clean
stage's counts), label = mean grade >= 3 (MEDIQA's correct = score 3 or 4; a pair judged twice gets its mean grade),
reference_score = that mean grade, no CHiQA rank (`system_rank` / `answer_pos` null: the features carry an explicit
missing-rank indicator, never a silent zero) and no ReferenceRank. A MedQuAD answer gets the heading CHiQA gives such
an answer ("What causes X?: ...", "X: ..." for "What is (are) X ?"), so the heading-reading groups see the same form.
Rows whose answer text is one of their question's MEDIQA answers are dropped (the MEDIQA row is the one that counts).
These rows only ever train: `judged` marks them, and every protocol keeps them on their question's side of a split.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from medrank.core.errors import MedrankError

JUDGED_SPLIT = "train_liveqa"
AID_PREFIX = "judged:"
_WHAT_IS = re.compile(r"^What (?:is|are) \(are\) (.+?)\s*\?$")


def chiqa_heading(question: str | None) -> str | None:
    """The title CHiQA puts before a MedQuAD answer: its question ("What causes X?"), or just the focus for the
    "What is (are) X ?" questions; None for answers without a MedQuAD question (participant answers)."""
    if not isinstance(question, str) or not question.strip():
        return None
    q = question.strip()
    if m := _WHAT_IS.match(q):
        return m[1]
    return re.sub(r"\s+\?$", "?", q)


def _with_heading(heading: str | None, text: str | None) -> str | None:
    if text is None or heading is None:
        return text
    return f"{heading}: {text}"


def judged_answers(qrels: pd.DataFrame, answers: pd.DataFrame) -> pd.DataFrame:
    """Rows of the normalized judged answers (normalize stage's liveqa_qrels table) in the normalized answers' columns
    (+ `judged` = True), for the train_liveqa questions present in `answers` (capped profiles keep fewer)."""
    need = {"number", "answer_id", "grade", "source", "question", "answer_norm", "answer_sentences"}
    missing = sorted(need - set(qrels.columns))
    if missing:
        raise MedrankError(
            f"judged answers table lacks columns {missing} (expected the normalize stage's liveqa_qrels)"
        )
    questions = answers[answers["split"] == JUDGED_SPLIT].drop_duplicates("qid").set_index("qid")
    q = qrels.assign(qid=qrels["number"].astype(int).astype(str))
    q = q[q["qid"].isin(questions.index)]
    if q.empty:
        return pd.DataFrame(columns=[*answers.columns, "judged"])
    # one row per judged answer: a pair judged twice gets its mean grade
    first = q.drop_duplicates(["qid", "answer_id"]).set_index(["qid", "answer_id"])
    grade = q.groupby(["qid", "answer_id"], sort=False)["grade"].mean()
    first = first.assign(grade=grade).reset_index()
    heading = [chiqa_heading(q) for q in first["question"]]  # a list: Series.map would turn None into NaN
    answer_norm = [_with_heading(h, a) for h, a in zip(heading, first["answer_norm"])]
    sentences = [
        [_with_heading(h, s[0]), *s[1:]] if len(s) else []
        for h, s in zip(heading, map(list, first["answer_sentences"]))
    ]
    qrow = questions.loc[first["qid"]]
    out = pd.DataFrame(
        {
            "split": JUDGED_SPLIT,
            "qid": first["qid"].to_numpy(),
            "question": qrow["question"].to_numpy(),
            "question_raw": qrow["question_raw"].to_numpy(),
            "aid": (AID_PREFIX + first["answer_id"].astype(str)).to_numpy(),
            "answer": [_with_heading(h, a) for h, a in zip(heading, first["answer"])],
            "answer_raw": first["answer"].to_numpy(),
            "url": None,
            "source": ("judged_" + first["source"].astype(str)).to_numpy(),
            "answer_pos": pd.array([pd.NA] * len(first), dtype="Int64"),
            "system_rank": pd.array([pd.NA] * len(first), dtype="Int64"),
            "reference_rank": pd.array([pd.NA] * len(first), dtype="Int64"),
            "reference_score": first["grade"].to_numpy(dtype=float),
            "label": (first["grade"].to_numpy(dtype=float) >= 3).astype(np.int8),
            "question_norm": qrow["question_norm"].to_numpy(),
            "answer_norm": answer_norm,
            "answer_sentences": sentences,
        }
    )
    own = set(
        zip(
            answers["qid"].astype(str)[answers["split"] == JUDGED_SPLIT],
            answers["answer_norm"][answers["split"] == JUDGED_SPLIT],
        )
    )
    out = out[[(qid, a) not in own for qid, a in zip(out["qid"], out["answer_norm"])]]
    return out.assign(judged=True).reset_index(drop=True)


def with_judged(answers: pd.DataFrame, judged: pd.DataFrame | None) -> pd.DataFrame:
    """`answers` (judged = False) followed by the judged rows, when given."""
    base = answers.assign(judged=False)
    if judged is None or judged.empty:
        return base
    return pd.concat([base, judged[base.columns]], ignore_index=True)


def question_folds(keys: pd.DataFrame, k: int, seed: int) -> np.ndarray:
    """A fold in 0..k-1 for each row of `keys` (unique split, qid): each split's questions dealt in a seeded random
    order, so every fold gets an even share of every split (the judged train_liveqa questions above all)."""
    if k < 2:
        raise MedrankError(f"question folds: need k >= 2, got {k}")
    if keys.duplicated(["split", "qid"]).any():
        raise MedrankError("question folds: (split, qid) keys must be unique")
    rng = np.random.default_rng(seed)
    out = np.zeros(len(keys), dtype=np.int64)
    split = keys["split"].to_numpy()
    for s in sorted(pd.unique(split)):
        rows = np.flatnonzero(split == s)
        rows = rows[np.argsort(keys["qid"].to_numpy()[rows].astype(str), kind="stable")]  # input order does not matter
        out[rows[rng.permutation(len(rows))]] = np.arange(len(rows)) % k
    return out


def graded_targets(grade: np.ndarray, target: str) -> np.ndarray:
    """Training targets from MEDIQA grades (1-4; a mean of two judges in between): `grade` = (grade - 1) / 3, a
    probability for a soft cross-entropy; `label` = 1.0 where grade >= 3 (the binary label the filter predicts)."""
    grade = np.asarray(grade, dtype=float)
    if np.isnan(grade).any() or (grade < 1).any() or (grade > 4).any():
        raise MedrankError("graded targets: grades must be in 1..4")
    if target == "grade":
        return ((grade - 1.0) / 3.0).astype(np.float32)
    if target == "label":
        return (grade >= 3).astype(np.int64)
    raise MedrankError(f"graded targets: target must be grade or label, got {target!r}")
