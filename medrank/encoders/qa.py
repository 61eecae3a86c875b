"""Question-answer relevance pairs mined from MedQuAD (stage qa): the data a QA cross-encoder learns from.

FINDINGS: a cross-encoder fine-tuned on the 1.7k MEDIQA training pairs barely learned and needs more data;
MedQuAD's (focus, question type) structure gives plenty, with the hard negatives MEDIQA is full of.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from medrank.encoders.finetune import CONSUMER_ASKS, CONTEXTS, Pair, TaskData, foci_by_type

QA_LABELS = ("not_answered", "answered")


def medquad_qa_pairs(medquad: pd.DataFrame, n_pairs: int, rng: np.random.Generator) -> tuple[list[Pair], np.ndarray]:
    """(question, answer) pairs mined from MedQuAD for a question-answer relevance cross-encoder.

    The question is a MedQuAD question or, half the time, a pseudo consumer question about its focus and type
    (CONSUMER_ASKS). Half the pairs are positive (an answer of that focus and type); of the negatives, half
    answer the same focus but another type (MEDIQA's typical wrong answer: right topic, wrong aspect) and half
    are answers about another focus. Reads the columns focus, question_type, question, answer_norm.
    """
    if n_pairs <= 0:
        return [], np.zeros(0, dtype=np.int64)
    df, by_focus, multi = foci_by_type(medquad, "answer_norm", "QA")
    all_a = df["answer_norm"].to_numpy()
    all_focus = df["focus_key"].to_numpy()
    pick = lambda seq: seq[int(rng.integers(len(seq)))]  # noqa: E731
    pairs: list[Pair] = []
    labels: list[int] = []
    while len(pairs) < n_pairs:
        g = by_focus[multi[int(rng.integers(len(multi)))]]
        qtype = pick(sorted(g["question_type"].unique()))
        focus = str(g["focus"].iloc[0])
        f = focus if rng.random() < 0.5 else focus.lower()
        if rng.random() < 0.5:
            question = f"{focus}. " + pick(CONTEXTS).format(f=f) + pick(CONSUMER_ASKS[qtype]).format(f=f)
        else:
            question = pick(g[g["question_type"] == qtype]["question"].tolist())
        r = rng.random()
        if r < 0.5:
            answer, label = pick(g[g["question_type"] == qtype]["answer_norm"].tolist()), 1
        elif r < 0.75:
            answer, label = pick(g[g["question_type"] != qtype]["answer_norm"].tolist()), 0
        else:
            j = int(rng.integers(len(all_a)))
            if all_focus[j] == g["focus_key"].iloc[0]:
                continue
            answer, label = str(all_a[j]), 0
        pairs.append((question, answer))
        labels.append(label)
    return pairs, np.asarray(labels, dtype=np.int64)


def qa_task(medquad: pd.DataFrame, n_train: int, n_eval: int, eval_focus_frac: float, rng: np.random.Generator) -> TaskData:
    """QA relevance pairs mined from MedQuAD: training pairs from most foci, validation pairs from held-out foci."""
    foci = np.array(sorted(medquad["focus"].dropna().str.lower().str.strip().unique()))
    held = set(rng.choice(foci, size=max(1, int(round(len(foci) * eval_focus_frac))), replace=False).tolist()) if len(foci) > 1 else set()
    is_held = medquad["focus"].fillna("").str.lower().str.strip().isin(held)
    train_pairs, train_y = medquad_qa_pairs(medquad[~is_held], n_train, rng)
    eval_pairs, eval_y = medquad_qa_pairs(medquad[is_held], n_eval, rng)
    return TaskData(QA_LABELS, train_pairs, train_y, eval_pairs, eval_y, [str(i) for i in range(len(eval_pairs))])
