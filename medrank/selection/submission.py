"""Write MEDIQA submission files (Task 3 ranked `qid,aid,label`; Task 2 `pair_id,label`) atomically."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd

from medrank.core.errors import MedrankError
from medrank.core.io import atomic_path


def _check_ids(df: pd.DataFrame, columns: list[str], what: str) -> list[list[str]]:
    """Ids as strings; refuse missing columns, NaN/empty ids, ids that would break a CSV line, duplicates."""
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise MedrankError(f"{what}: missing columns {missing} (need {columns})")
    out = []
    for c in columns:
        values = []
        for i, v in enumerate(df[c].tolist()):
            if v is None or (not isinstance(v, str) and pd.isna(v)):
                raise MedrankError(f"{what}: row {i + 1}: {c} is missing")
            s = str(int(v)) if isinstance(v, (np.integer, int)) and not isinstance(v, bool) else str(v)
            if s == "" or any(ch in s for ch in ',"\r\n'):
                raise MedrankError(f"{what}: row {i + 1}: {c} {s!r} is empty or contains a comma, quote or newline")
            values.append(s)
        out.append(values)
    seen: dict[tuple[str, ...], int] = {}
    for i, key in enumerate(zip(*out)):
        if key in seen:
            raise MedrankError(
                f"{what}: row {i + 1}: duplicate {', '.join(columns)} {', '.join(key)} (first at row {seen[key]})"
            )
        seen[key] = i + 1
    return out


def _check_labels(df: pd.DataFrame, what: str) -> np.ndarray:
    if "label" not in df.columns:
        raise MedrankError(f"{what}: missing column 'label'")
    labels = df["label"].tolist()
    for i, v in enumerate(labels):
        if isinstance(v, str) or v is None or pd.isna(v) or v not in (0, 1):
            raise MedrankError(f"{what}: row {i + 1}: label must be 0 or 1, got {v!r}")
    return np.asarray([int(v) for v in labels], dtype=np.int64)


def write_task3_submission(path: str | os.PathLike, df: pd.DataFrame) -> None:
    """Write `qid,aid,label` rows (no header) from df with qid, aid, label (0/1) and score (higher = better), in the
    order of `task3_submission_rows`. The file appears only when complete (medrank.core.io.atomic_path)."""
    rows = task3_submission_rows(df, f"Task 3 submission for {path}")
    text = "".join(f"{q},{a},{lab}\n" for q, a, lab in zip(rows["qid"], rows["aid"], rows["label"]))
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def task3_submission_rows(df: pd.DataFrame, what: str = "Task 3 submission") -> pd.DataFrame:
    """The qid, aid, label rows a Task 3 submission of df holds, in its order: questions keep their order of first
    appearance in `df`; within a question answers go by descending score, ties in input order."""
    qids, aids = _check_ids(df, ["qid", "aid"], what)
    labels = _check_labels(df, what)
    if "score" not in df.columns:
        raise MedrankError(f"{what}: missing column 'score'")
    try:
        scores = np.asarray(df["score"], dtype=np.float64)
    except (TypeError, ValueError):
        raise MedrankError(f"{what}: score column is not numeric") from None
    if np.isnan(scores).any():
        raise MedrankError(f"{what}: row {int(np.flatnonzero(np.isnan(scores))[0]) + 1}: score is NaN")
    first_seen: dict[str, int] = {}
    q_order = np.asarray([first_seen.setdefault(q, len(first_seen)) for q in qids])
    # lexsort: last key is primary -> question, then descending score, then input position (stable ties)
    order = np.lexsort((np.arange(len(qids)), -scores, q_order))
    return pd.DataFrame(
        {"qid": [qids[i] for i in order], "aid": [aids[i] for i in order], "label": [labels[i] for i in order]}
    )


def write_task2_submission(path: str | os.PathLike, df: pd.DataFrame) -> None:
    """Write `pair_id,label` with that header line (as the official RQE validation gold), rows in input order."""
    what = f"Task 2 submission for {path}"
    (pair_ids,) = _check_ids(df, ["pair_id"], what)
    labels = _check_labels(df, what)
    text = "pair_id,label\n" + "".join(f"{p},{l}\n" for p, l in zip(pair_ids, labels))
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
