"""Cross-fitting over question folds: a score for every row from a model that never learned that row's question."""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

import numpy as np
import pandas as pd

M = TypeVar("M")


def crossfit(
    n_folds: int,
    scored_fold: np.ndarray,
    train_folds: Sequence[np.ndarray],
    fit: Callable[[int, list[np.ndarray]], M],
    score: Callable[[M, np.ndarray], np.ndarray],
) -> np.ndarray:
    """For each fold f: `fit(f, [rows of each training table whose question is outside f])` -> a model, then
    `score(model, rows to score whose question is in f)`. `scored_fold` / `train_folds[i]`: the question fold of each
    row (the same question -> the same fold in every table). Returns the scores of every scored row."""
    out = np.full(len(scored_fold), np.nan)
    for f in range(n_folds):
        model = fit(f, [np.flatnonzero(np.asarray(t) != f) for t in train_folds])
        rows = np.flatnonzero(np.asarray(scored_fold) == f)
        if len(rows):
            out[rows] = score(model, rows)
    return out


def folds_by_source(keys: pd.DataFrame, sources: Sequence[str], seed: int) -> np.ndarray:
    """A fold per row of `keys` (unique split, qid): the index of its split in `sources` (one fold per labelled source),
    other splits' questions (unlabelled: test) dealt over those folds in a seeded random order."""
    from medrank.data.judged import question_folds
    from medrank.core.errors import MedrankError

    present = [s for s in sources if s in set(keys["split"])]
    if len(present) < 2:
        raise MedrankError(f"cross-fitting by source needs two labelled sources, found {present}")
    dealt = question_folds(keys, len(present), seed)
    return np.array(
        [present.index(s) if s in present else int(d) for s, d in zip(keys["split"], dealt)], dtype=np.int64
    )
