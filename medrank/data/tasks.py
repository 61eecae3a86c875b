"""Labelled pair tasks for fine-tuning cross-encoders: pairs and integer labels per split.

nli: SICK (or a user-supplied NLI set in the clean `nli` table), train -> dev.
rqe: MEDIQA Task 2 (AMIA 2016) train and validation pairs; the blind test pairs are only predicted (the training
sources and the CV over the validation pairs: medrank.models.rqe).
qa: (question, answer) relevance pairs mined from MedQuAD, validated on held-out foci.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from medrank.core import layout
from medrank.data.mining import Pair, medquad_qa_pairs
from medrank.core.errors import MedrankError
from medrank.core.io import read_parquet

NLI_LABELS = ("entailment", "neutral", "contradiction")
RQE_LABELS = ("not_entailed", "entailed")  # index = the official 0/1 label
QA_LABELS = ("not_answered", "answered")
TASKS = ("nli", "rqe")  # tasks with a clean table: stages finetune_nli, finetune_rqe
TASK_TABLES = {"nli": layout.CLEAN_NLI, "rqe": layout.CLEAN_RQE_PAIRS}


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
        cut = lambda x: x[:n] if x is not None else None
        return TaskData(
            self.label_names,
            self.train_pairs,
            self.train_labels,
            cut(self.eval_pairs),
            cut(self.eval_labels),
            cut(self.eval_ids),
            cut(self.test_pairs),
            cut(self.test_ids),
            cut(self.test_labels),
        )

    def predictions_csv(self, ids: list[str], probs: np.ndarray | None) -> str:
        """`pair_id,label` of `ids` (eval_ids or test_ids), each pair's most probable label (no label without `probs`)."""
        labels = np.asarray(self.label_names)[probs.argmax(1)] if probs is not None else []
        return pd.DataFrame({"pair_id": ids, "label": labels}).to_csv(index=False)


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
    test = parts["test"]
    labelled_test = not test.empty and test["label"].notna().all()
    return _split_task(
        NLI_LABELS,
        parts,
        ("train", "dev", "test"),
        ("premise", "hypothesis"),
        "pair_id",
        lambda d: d["label"].map(idx).to_numpy(np.int64),
        labelled_test,
    )


def _split_task(
    labels: tuple[str, ...],
    parts: dict[str, pd.DataFrame],
    splits: tuple[str, str, str],
    columns: tuple[str, str],
    id_col: str,
    label_of,
    labelled_test: bool = False,
) -> TaskData:
    """TaskData of the (train, eval, test) parts: pairs of `columns`, labels by `label_of`, ids from `id_col`."""
    train, dev, test = (parts[s] for s in splits)
    return TaskData(
        labels,
        _pairs(train, *columns),
        label_of(train),
        _pairs(dev, *columns),
        label_of(dev),
        dev[id_col].astype(str).tolist(),
        _pairs(test, *columns),
        test[id_col].astype(str).tolist(),
        label_of(test) if labelled_test else None,
    )


def rqe_task(table: pd.DataFrame) -> TaskData:
    """RQE train/val with labels, and the blind test pairs, from the clean `rqe_pairs` table."""
    parts = {s: table[table["split"] == s] for s in ("train", "val", "test")}
    if parts["train"].empty or parts["val"].empty:
        raise MedrankError("rqe_pairs table needs train and val rows")
    return _split_task(
        RQE_LABELS,
        parts,
        ("train", "val", "test"),
        ("chq", "faq"),
        "pid",
        lambda d: d["label"].astype(np.int64).to_numpy(),
    )


def qa_task(
    medquad: pd.DataFrame, n_train: int, n_eval: int, eval_focus_frac: float, rng: np.random.Generator
) -> TaskData:
    """QA relevance pairs mined from MedQuAD: training pairs from most foci, validation pairs from held-out foci."""
    foci = np.array(sorted(medquad["focus"].dropna().str.lower().str.strip().unique()))
    held = (
        set(rng.choice(foci, size=max(1, int(round(len(foci) * eval_focus_frac))), replace=False).tolist())
        if len(foci) > 1
        else set()
    )
    is_held = medquad["focus"].fillna("").str.lower().str.strip().isin(held)
    train_pairs, train_y = medquad_qa_pairs(medquad[~is_held], n_train, rng)
    eval_pairs, eval_y = medquad_qa_pairs(medquad[is_held], n_eval, rng)
    return TaskData(QA_LABELS, train_pairs, train_y, eval_pairs, eval_y, [str(i) for i in range(len(eval_pairs))])


def cap_pairs(
    pairs: list[Pair], labels: np.ndarray, cap: int | None, rng: np.random.Generator
) -> tuple[list[Pair], np.ndarray]:
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


def load_task(task: str, dataset: str = "sick") -> TaskData:
    """TaskData for 'nli' or 'rqe' from the clean tables."""
    if task not in TASKS:
        raise MedrankError(f"unknown finetune task '{task}' (expected one of {', '.join(TASKS)})")
    table = read_parquet(TASK_TABLES[task])
    return nli_task(table, dataset) if task == "nli" else rqe_task(table)
