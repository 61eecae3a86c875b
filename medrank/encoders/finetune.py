"""Task data for fine-tuning the NLI and RQE cross-encoders, and RQE augmentation mined from MedQuAD.

nli: SICK (or a user-supplied NLI set in the clean `nli` table), train → dev.
rqe: MEDIQA Task 2 (AMIA 2016) train → validation; the blind test pairs are only predicted.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from medrank.errors import MedrankError

log = logging.getLogger(__name__)

NLI_LABELS = ("entailment", "neutral", "contradiction")
RQE_LABELS = ("not_entailed", "entailed")  # index = the official 0/1 label
TASKS = ("nli", "rqe")
TASK_TABLES = {"nli": "nli.parquet", "rqe": "rqe_pairs.parquet"}

Pair = tuple[str, str]


@dataclass
class TaskData:
    """Pairs and integer labels per split; `*_ids` are the official pair ids (test has no labels)."""

    label_names: tuple[str, ...]
    train_pairs: list[Pair]
    train_labels: np.ndarray
    eval_pairs: list[Pair]
    eval_labels: np.ndarray
    eval_ids: list[str]
    test_pairs: list[Pair] = field(default_factory=list)
    test_ids: list[str] = field(default_factory=list)
    test_labels: np.ndarray | None = None  # public labelled test sets only (SICK); never MEDIQA

    def capped(self, n: int | None) -> "TaskData":
        """The first `n` validation and test pairs (smoke profiles); None = all."""
        if n is None:
            return self
        cut = lambda x: x[:n] if x is not None else None  # noqa: E731
        return TaskData(
            self.label_names, self.train_pairs, self.train_labels, cut(self.eval_pairs), cut(self.eval_labels),
            cut(self.eval_ids), cut(self.test_pairs), cut(self.test_ids), cut(self.test_labels),
        )  # fmt: skip


def _pairs(df: pd.DataFrame, a: str, b: str) -> list[Pair]:
    return list(zip(df[a].astype(str), df[b].astype(str)))


def nli_task(table: pd.DataFrame, dataset: str = "sick") -> TaskData:
    """NLI train/dev(/test) from the clean `nli` table, one dataset."""
    df = table[table["dataset"] == dataset]
    if df.empty:
        have = sorted(table["dataset"].unique())
        raise MedrankError(f"nli table has no rows for dataset '{dataset}' (have {have})")
    idx = {n: i for i, n in enumerate(NLI_LABELS)}
    bad = set(df["label"]) - set(idx)
    if bad:
        raise MedrankError(f"nli table: unknown labels {sorted(bad)} (expected {list(NLI_LABELS)})")
    parts = {s: df[df["split"] == s] for s in ("train", "dev", "test")}
    if parts["train"].empty or parts["dev"].empty:
        raise MedrankError(f"nli dataset '{dataset}' needs train and dev rows")
    lab = lambda d: d["label"].map(idx).to_numpy(np.int64)  # noqa: E731
    test = parts["test"]
    return TaskData(
        NLI_LABELS,
        _pairs(parts["train"], "premise", "hypothesis"),
        lab(parts["train"]),
        _pairs(parts["dev"], "premise", "hypothesis"),
        lab(parts["dev"]),
        parts["dev"]["pair_id"].astype(str).tolist(),
        _pairs(test, "premise", "hypothesis"),
        test["pair_id"].astype(str).tolist(),
        lab(test) if not test.empty and test["label"].notna().all() else None,
    )


def rqe_task(table: pd.DataFrame) -> TaskData:
    """RQE train/val with labels, and the blind test pairs, from the clean `rqe_pairs` table."""
    parts = {s: table[table["split"] == s] for s in ("train", "val", "test")}
    if parts["train"].empty or parts["val"].empty:
        raise MedrankError("rqe_pairs table needs train and val rows")
    lab = lambda d: d["label"].astype(np.int64).to_numpy()  # noqa: E731
    return TaskData(
        RQE_LABELS,
        _pairs(parts["train"], "chq", "faq"),
        lab(parts["train"]),
        _pairs(parts["val"], "chq", "faq"),
        lab(parts["val"]),
        parts["val"]["pid"].astype(str).tolist(),
        _pairs(parts["test"], "chq", "faq"),
        parts["test"]["pid"].astype(str).tolist(),
    )


def cap_pairs(pairs: list[Pair], labels: np.ndarray, cap: int | None, rng: np.random.Generator) -> tuple[list[Pair], np.ndarray]:
    """At most `cap` pairs, stratified by label (same label mix), order shuffled; None = all."""
    if cap is None or cap >= len(pairs):
        return pairs, labels
    keep: list[int] = []
    for lab in np.unique(labels):
        idx = np.flatnonzero(labels == lab)
        k = max(1, round(cap * len(idx) / len(labels)))
        keep.extend(rng.choice(idx, size=min(k, len(idx)), replace=False).tolist())
    keep_arr = rng.permutation(np.array(keep[:cap] if len(keep) > cap else keep))
    return [pairs[i] for i in keep_arr], labels[keep_arr]


_TRAILING_SPACE_Q = re.compile(r"\s+\?$")

# Consumer-style ways of asking each MedQuAD question type: the pseudo consumer question (CHQ) says what it
# wants in its own words, so a positive FAQ never repeats the CHQ's text and the model must match intent.
CONSUMER_ASKS: dict[str, tuple[str, ...]] = {
    "information": ("I would like to learn more about {f}.", "Please send me information on {f}.", "Can you explain what {f} is?"),
    "symptoms": ("How do I know if I have {f}?", "What signs should I look for with {f}?", "Does {f} cause pain or other problems I would notice?"),
    "treatment": ("How can I treat {f}?", "Is there any cure or medicine for {f}?", "What can I do about my {f}, nothing has helped so far."),
    "causes": ("Why do people get {f}?", "What leads to {f}?", "How did I get {f}?"),
    "exams and tests": ("How is {f} detected?", "What tests do I need to find out if I have {f}?", "How do doctors confirm {f}?"),
    "inheritance": ("Will my children get {f}?", "Does {f} run in families?", "Can {f} be passed on to my kids?"),
    "frequency": ("How common is {f}?", "How many people have {f}?"),
    "genetic changes": ("Which gene is involved in {f}?", "What mutation causes {f}?"),
    "outlook": ("Will I recover from {f}?", "What is the life expectancy with {f}?", "Can someone live a normal life with {f}?"),
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


def foci_by_type(medquad: pd.DataFrame, text: str, task: str) -> tuple[pd.DataFrame, dict[str, pd.DataFrame], list[str]]:
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
        raise MedrankError(f"medquad table: no focus with {text.split('_')[0]}s of two question types to mine {task} pairs from")
    return df, by_focus, multi


def live_step_logger(live, keys: dict[str, str]):
    """A CrossEncoder.fit step_callback writing `keys` (fit metric -> dvclive name) at x = optimizer step."""

    def log_step(step: int, m: dict) -> None:
        live.step = step
        for key, name in keys.items():
            if key in m:
                live.log_metric(name, m[key])
        live.next_step()

    return log_step


# train loss (mean since the last point) and validation metrics, the curves of every fine-tuned cross-encoder
CURVES = {"train_loss": "train/loss", "eval_loss": "val/loss", "eval_accuracy": "val/accuracy", "eval_macro_f1": "val/macro_f1"}


def medquad_rqe_pairs(medquad: pd.DataFrame, n_pairs: int, rng: np.random.Generator) -> tuple[list[Pair], np.ndarray]:
    """Question pairs mined from MedQuAD, shaped like MEDIQA validation pairs (CHQ: 'Focus. what I want').

    A pseudo consumer question asks, in consumer words (CONSUMER_ASKS), one or two things about a focus.
    Positive FAQ: a MedQuAD question of the same focus and an asked type. Negatives, half each: same focus
    but a type not asked (the hard case in MEDIQA validation), and a question about another focus.
    """
    if n_pairs <= 0:
        return [], np.zeros(0, dtype=np.int64)
    df, by_focus, multi = foci_by_type(medquad, "question", "RQE")
    all_q = df["question"].to_numpy()
    all_focus = df["focus_key"].to_numpy()
    pick = lambda seq: seq[int(rng.integers(len(seq)))]  # noqa: E731
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
            j = int(rng.integers(len(all_q)))
            if all_focus[j] == g["focus_key"].iloc[0]:
                continue
            faq, label = str(all_q[j]), 0
        pairs.append((chq, faq))
        labels.append(label)
    order = rng.permutation(len(pairs))
    return [pairs[i] for i in order], np.asarray(labels, dtype=np.int64)[order]


def load_task(task: str, clean_dir: Path, dataset: str = "sick") -> TaskData:
    """TaskData for 'nli' or 'rqe' from the clean tables."""
    from medrank.io import read_parquet

    if task not in TASKS:
        raise MedrankError(f"unknown finetune task '{task}' (expected one of {', '.join(TASKS)})")
    table = read_parquet(Path(clean_dir) / TASK_TABLES[task])
    return nli_task(table, dataset) if task == "nli" else rqe_task(table)


def training_set(task: str, data: TaskData, tp: Any, clean_dir: Path, rng: np.random.Generator) -> tuple[list[Pair], np.ndarray, int]:
    """Task pairs capped by `max_train_pairs`, plus `medquad_pairs` mined pairs for rqe; returns n mined."""
    from medrank.io import read_parquet

    pairs, labels = cap_pairs(data.train_pairs, data.train_labels, tp.max_train_pairs, rng)
    n_mined = 0
    if task == "rqe" and tp.medquad_pairs:
        mined, mined_y = medquad_rqe_pairs(read_parquet(Path(clean_dir) / "medquad.parquet"), tp.medquad_pairs, rng)
        n_mined = len(mined)
        pairs, labels = pairs + mined, np.concatenate([labels, mined_y])
        order = rng.permutation(len(pairs))
        pairs, labels = [pairs[i] for i in order], labels[order]
    return pairs, labels, n_mined


def classification_metrics(y: np.ndarray, probs: np.ndarray) -> dict[str, float]:
    """Accuracy, macro-F1, per-class F1 and NLL of argmax predictions."""
    from sklearn.metrics import accuracy_score, f1_score

    pred = probs.argmax(1)
    labels = list(range(probs.shape[1]))
    return {
        "accuracy": float(accuracy_score(y, pred)),
        "macro_f1": float(f1_score(y, pred, average="macro", labels=labels, zero_division=0)),
        "loss": float(-np.mean(np.log(np.clip(probs[np.arange(len(y)), y], 1e-12, 1.0)))),
        "n": int(len(y)),
    }
