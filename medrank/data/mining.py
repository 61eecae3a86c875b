"""Training pairs mined from MedQuAD's (focus, question type) structure: question pairs for RQE (shaped like
MEDIQA Task 2 validation pairs) and (question, answer) pairs for a QA relevance cross-encoder.

FINDINGS: a cross-encoder fine-tuned on the 1.7k MEDIQA training pairs barely learned and needs more data;
MedQuAD's structure gives plenty, with the hard negatives MEDIQA is full of (right topic, wrong aspect).
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from medrank.core.errors import MedrankError

Pair = tuple[str, str]

_TRAILING_SPACE_Q = re.compile(r"\s+\?$")

# Consumer-style ways of asking each MedQuAD question type: the pseudo consumer question (CHQ) says what it
# wants in its own words, so a positive FAQ never repeats the CHQ's text and the model must match intent.
CONSUMER_ASKS: dict[str, tuple[str, ...]] = {
    "information": (
        "I would like to learn more about {f}.",
        "Please send me information on {f}.",
        "Can you explain what {f} is?",
    ),
    "symptoms": (
        "How do I know if I have {f}?",
        "What signs should I look for with {f}?",
        "Does {f} cause pain or other problems I would notice?",
    ),
    "treatment": (
        "How can I treat {f}?",
        "Is there any cure or medicine for {f}?",
        "What can I do about my {f}, nothing has helped so far.",
    ),
    "causes": ("Why do people get {f}?", "What leads to {f}?", "How did I get {f}?"),
    "exams and tests": (
        "How is {f} detected?",
        "What tests do I need to find out if I have {f}?",
        "How do doctors confirm {f}?",
    ),
    "inheritance": ("Will my children get {f}?", "Does {f} run in families?", "Can {f} be passed on to my kids?"),
    "frequency": ("How common is {f}?", "How many people have {f}?"),
    "genetic changes": ("Which gene is involved in {f}?", "What mutation causes {f}?"),
    "outlook": (
        "Will I recover from {f}?",
        "What is the life expectancy with {f}?",
        "Can someone live a normal life with {f}?",
    ),
    "prevention": ("How can I avoid getting {f}?", "Is there a way to stop {f} from happening?"),
    "susceptibility": ("Am I at risk of {f}?", "Who usually gets {f}?"),
    "complications": ("What problems can {f} lead to?", "Can {f} get worse and cause other problems?"),
    "research": ("Are there any clinical trials for {f}?", "What is the latest research on {f}?"),
    "stages": ("What stage is my {f}?", "How is {f} staged?"),
    "considerations": ("What should I do if I have {f}?", "Any advice for living with {f}?"),
}
CONTEXTS = ("", "", "My mother was diagnosed with {f}. ", "I have had {f} for two years. ", "My doctor mentioned {f}. ")


def _tidy(q: str) -> str:
    # MedQuAD templates end with " ?" and say "What is (are)"; consumer/FAQ questions do not
    return _TRAILING_SPACE_Q.sub("?", q.replace("What is (are)", "What is")).strip()


def foci_by_type(
    medquad: pd.DataFrame, text: str, task: str
) -> tuple[pd.DataFrame, dict[str, pd.DataFrame], list[str]]:
    """MedQuAD rows of the CONSUMER_ASKS types with a non-empty `text` column (tidied questions, one row per
    focus, type and text) -> (rows with focus_key, rows by focus_key, foci with >= 2 types) for pair mining.

    Foci with at least two types give the hard negatives (same focus, another type); sorted keys keep sampling
    deterministic. No such focus: one clear error naming the `task` being mined.
    """
    df = medquad[list(dict.fromkeys(["focus", "question_type", "question", text]))].dropna().copy()
    df = df[df["question_type"].isin(list(CONSUMER_ASKS)) & (df[text].str.len() > 0)]
    df["focus_key"] = df["focus"].str.lower().str.strip()
    df["question"] = df["question"].map(_tidy)
    df = df.drop_duplicates(["focus_key", "question_type", text])
    by_focus = {k: g for k, g in df.groupby("focus_key", sort=True)}
    multi = [k for k, g in by_focus.items() if g["question_type"].nunique() >= 2]
    if not multi:
        raise MedrankError(
            f"medquad table: no focus with {text.split('_')[0]}s of two question types to mine {task} pairs from"
        )
    return df, by_focus, multi


def _mining_pools(medquad: pd.DataFrame, text: str, task: str, rng: np.random.Generator):
    """foci_by_type's groups, every row's `text` and focus key (other-focus negatives), and a random picker."""
    df, by_focus, multi = foci_by_type(medquad, text, task)
    return (
        by_focus,
        multi,
        df[text].to_numpy(),
        df["focus_key"].to_numpy(),
        lambda seq: seq[int(rng.integers(len(seq)))],
    )


def _other_focus(rng: np.random.Generator, texts: np.ndarray, foci: np.ndarray, focus_key: str) -> str | None:
    """A random text about another focus (one draw; None when it hit the same focus: the caller draws again)."""
    j = int(rng.integers(len(texts)))
    return None if foci[j] == focus_key else str(texts[j])


def medquad_rqe_pairs(medquad: pd.DataFrame, n_pairs: int, rng: np.random.Generator) -> tuple[list[Pair], np.ndarray]:
    """Question pairs mined from MedQuAD, shaped like MEDIQA validation pairs (CHQ: 'Focus. what I want').

    A pseudo consumer question asks, in consumer words (CONSUMER_ASKS), one or two things about a focus.
    Positive FAQ: a MedQuAD question of the same focus and an asked type. Negatives, half each: same focus
    but a type not asked (the hard case in MEDIQA validation), and a question about another focus.
    """
    if n_pairs <= 0:
        return [], np.zeros(0, dtype=np.int64)
    by_focus, multi, all_q, all_focus, pick = _mining_pools(medquad, "question", "RQE", rng)
    pairs: list[Pair] = []
    labels: list[int] = []
    n_pos = n_pairs // 2
    while len(pairs) < n_pairs:
        g = by_focus[multi[int(rng.integers(len(multi)))]]
        types = sorted(g["question_type"].unique())
        n_ask = 1 if len(types) < 3 or rng.random() < 0.6 else 2
        asked = [types[i] for i in rng.choice(len(types), size=n_ask, replace=False)]
        focus = str(g["focus"].iloc[0])
        f = focus if rng.random() < 0.5 else focus.lower()
        chq = f"{focus}. " + pick(CONTEXTS).format(f=f) + " ".join(pick(CONSUMER_ASKS[t]).format(f=f) for t in asked)
        if len(labels) < n_pos:
            faq = pick(g[g["question_type"] == pick(asked)]["question"].tolist())
            label = 1
        elif rng.random() < 0.5:
            rest = g[~g["question_type"].isin(asked)]["question"].tolist()
            if not rest:
                continue
            faq, label = pick(rest), 0
        else:
            faq, label = _other_focus(rng, all_q, all_focus, g["focus_key"].iloc[0]), 0
            if faq is None:
                continue
        pairs.append((chq, faq))
        labels.append(label)
    order = rng.permutation(len(pairs))
    return [pairs[i] for i in order], np.asarray(labels, dtype=np.int64)[order]


def medquad_qa_pairs(medquad: pd.DataFrame, n_pairs: int, rng: np.random.Generator) -> tuple[list[Pair], np.ndarray]:
    """(question, answer) pairs mined from MedQuAD for a question-answer relevance cross-encoder.

    The question is a MedQuAD question or, half the time, a pseudo consumer question about its focus and type
    (CONSUMER_ASKS). Half the pairs are positive (an answer of that focus and type); of the negatives, half
    answer the same focus but another type (MEDIQA's typical wrong answer: right topic, wrong aspect) and half
    are answers about another focus. Reads the columns focus, question_type, question, answer_norm.
    """
    if n_pairs <= 0:
        return [], np.zeros(0, dtype=np.int64)
    by_focus, multi, all_a, all_focus, pick = _mining_pools(medquad, "answer_norm", "QA", rng)
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
        r = rng.random()  # < 0.5: the asked type's answer; < 0.75: another type's; else another focus's
        label = int(r < 0.5)
        if r >= 0.75:
            answer = _other_focus(rng, all_a, all_focus, g["focus_key"].iloc[0])
            if answer is None:
                continue
        else:
            answer = pick(g[(g["question_type"] == qtype) == bool(label)]["answer_norm"].tolist())
        pairs.append((question, answer))
        labels.append(label)
    return pairs, np.asarray(labels, dtype=np.int64)


def medquad_qa_triplets(medquad: pd.DataFrame, n: int, rng: np.random.Generator) -> list[tuple[str, str, str]]:
    """(question, its answer, a hard negative) triplets mined from MedQuAD for a question -> answer bi-encoder: the
    question is a MedQuAD question or, half the time, a pseudo consumer question about its focus and type (as in
    medquad_qa_pairs); the negative answers the same focus but another question type (MEDIQA's typical wrong answer:
    right topic, wrong aspect). In-batch negatives supply the other foci."""
    if n <= 0:
        return []
    by_focus, multi, _, _, pick = _mining_pools(medquad, "answer_norm", "QA", rng)
    out: list[tuple[str, str, str]] = []
    while len(out) < n:
        g = by_focus[multi[int(rng.integers(len(multi)))]]
        qtype = pick(sorted(g["question_type"].unique()))
        focus = str(g["focus"].iloc[0])
        f = focus if rng.random() < 0.5 else focus.lower()
        asked = g[g["question_type"] == qtype]
        row = asked.iloc[int(rng.integers(len(asked)))]
        question = (
            f"{focus}. " + pick(CONTEXTS).format(f=f) + pick(CONSUMER_ASKS[qtype]).format(f=f)
            if rng.random() < 0.5
            else str(row["question"])
        )
        negative = pick(g[g["question_type"] != qtype]["answer_norm"].tolist())
        out.append((question, str(row["answer_norm"]), str(negative)))
    return out
