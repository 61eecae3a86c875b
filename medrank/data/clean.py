"""Build every cleaned table from the raw data folder, with the counts that go to metrics/data.json."""

from __future__ import annotations

import logging
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd

from medrank.data import mediqa, medquad, nli, squad
from medrank.errors import MedrankError
from medrank.text.clean import boilerplate_rules_hit, normalize_text

log = logging.getLogger(__name__)

# Key of each table: rows sharing it are exact duplicates (dropped, counted) or a data error.
KEYS = {
    "answers": ["split", "aid"],
    "rqe_pairs": ["split", "pid"],
    "medquad": ["qa_id"],
    "nli": ["dataset", "split", "pair_id"],
    "squad": ["split", "question_id"],
}


def drop_exact_duplicates(df: pd.DataFrame, table: str) -> tuple[pd.DataFrame, int]:
    """Drop rows identical in every column; rows that share the key but differ stop with MedrankError."""
    key = KEYS[table]
    list_cols = [c for c in df.columns if df[c].dtype == object and df[c].map(type).eq(list).any()]
    hashable = df.assign(**{c: df[c].map(tuple) for c in list_cols})  # lists are unhashable
    exact = hashable.duplicated(keep="first")
    df = df[~exact.to_numpy()]
    clash = df.duplicated(subset=key, keep=False)
    if clash.any():
        example = df.loc[clash, key].iloc[0].to_dict()
        raise MedrankError(
            f"{table}: {int(clash.sum())} rows share a key {key} but differ (first: {example}); fix the raw data"
        )
    return df.reset_index(drop=True), int(exact.sum())


def _boilerplate_counts(raw: pd.Series) -> dict[str, int]:
    hits: Counter[str] = Counter()
    for text in raw:
        hits.update(boilerplate_rules_hit(normalize_text(text)))
    return dict(sorted(hits.items()))


def _answers(raw_dir: Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    parts = [mediqa.read_task3(raw_dir / rel, split) for split, rel in mediqa.TASK3_FILES.items()]
    df, dup = drop_exact_duplicates(pd.concat(parts, ignore_index=True), "answers")
    by_split = {
        split: {
            "questions": int(g["qid"].nunique()),
            "answers": len(g),
            "positive": int(g["label"].sum()) if g["label"].notna().any() else None,
        }
        for split, g in df.groupby("split", sort=False)
    }
    empty = int((df["answer"] == "").sum())
    if empty:
        # Task 3 rows are never dropped: keep the row (its raw text is there) but say so.
        log.warning("answers: %d answers are empty after cleaning", empty)
    counts = {
        "rows": len(df),
        "by_split": by_split,
        "duplicates_dropped": dup,
        "empty_after_cleaning": empty,
        "boilerplate_rule_hits": _boilerplate_counts(df["answer_raw"]),
        "by_source": {k: int(v) for k, v in df["source"].value_counts().sort_index().items()},
    }
    return df, counts


def _rqe(raw_dir: Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    parts = [mediqa.read_rqe(raw_dir / rel, split) for split, rel in mediqa.RQE_FILES.items()]
    df, dup = drop_exact_duplicates(pd.concat(parts, ignore_index=True), "rqe_pairs")
    by_split = {
        split: {"pairs": len(g), "positive": int(g["label"].sum()) if g["label"].notna().any() else None}
        for split, g in df.groupby("split", sort=False)
    }
    return df, {"rows": len(df), "by_split": by_split, "duplicates_dropped": dup}


def _medquad(raw_dir: Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    df, read_counts = medquad.read_medquad(raw_dir / medquad.MEDQUAD_FILE)
    raw_empty = df["answer_raw"].str.strip() == ""
    empty = df["answer"] == ""
    df = df[~empty.to_numpy()]
    df, dup = drop_exact_duplicates(df, "medquad")
    same_qa = df.duplicated(subset=["question", "answer"], keep="first")
    df = df[~same_qa.to_numpy()].reset_index(drop=True)
    counts = {
        **read_counts,
        "empty_answers_dropped": int(empty.sum()),
        "emptied_by_cleaning": int((empty & ~raw_empty).sum()),
        "duplicates_dropped": dup,
        "duplicate_question_answer_dropped": int(same_qa.sum()),
        "rows": len(df),
        "by_collection": {k: int(v) for k, v in df["collection"].value_counts().sort_index().items()},
        "boilerplate_rule_hits": _boilerplate_counts(df["answer_raw"]),
    }
    return df, counts


def _nli(raw_dir: Path, mednli_dir: str | os.PathLike | None) -> tuple[pd.DataFrame, dict[str, Any]]:
    parts = [nli.read_sick(raw_dir / nli.SICK_FILE)]
    if mednli_dir is not None:
        parts.append(nli.read_mednli(mednli_dir))
    df, dup = drop_exact_duplicates(pd.concat(parts, ignore_index=True), "nli")
    by_split = {
        f"{ds}/{split}": {"pairs": len(g), **{k: int(v) for k, v in g["label"].value_counts().sort_index().items()}}
        for (ds, split), g in df.groupby(["dataset", "split"], sort=True)
    }
    return df, {"rows": len(df), "by_split": by_split, "duplicates_dropped": dup}


def _squad(raw_dir: Path, max_articles: int | None) -> tuple[pd.DataFrame, dict[str, Any]]:
    parts = [squad.read_squad(raw_dir / rel, split, max_articles) for split, rel in squad.SQUAD_FILES.items()]
    df, dup = drop_exact_duplicates(pd.concat(parts, ignore_index=True), "squad")
    by_split = {
        split: {
            "articles": int(g["article"].nunique()),
            "paragraphs": int(g["paragraph_id"].nunique()),
            "questions": len(g),
            "answers": int(g["answers"].map(len).sum()),
        }
        for split, g in df.groupby("split", sort=False)
    }
    return df, {"rows": len(df), "by_split": by_split, "duplicates_dropped": dup, "max_articles": max_articles}


def build_tables(
    raw_dir: str | os.PathLike,
    squad_max_articles: int | None = None,
    mednli_dir: str | os.PathLike | None = None,
) -> tuple[dict[str, pd.DataFrame], dict[str, Any]]:
    """Parse and clean every raw dataset: ({table name: DataFrame}, {table name: counts})."""
    raw_dir = Path(raw_dir)
    if not raw_dir.is_dir():
        raise MedrankError(f"{raw_dir}: raw data folder not found (run the acquire stage first)")
    tables: dict[str, pd.DataFrame] = {}
    counts: dict[str, Any] = {}
    steps = {
        "answers": lambda: _answers(raw_dir),
        "rqe_pairs": lambda: _rqe(raw_dir),
        "medquad": lambda: _medquad(raw_dir),
        "nli": lambda: _nli(raw_dir, mednli_dir),
        "squad": lambda: _squad(raw_dir, squad_max_articles),
    }
    for name, step in steps.items():
        tables[name], counts[name] = step()
        log.info("%s: %d rows", name, len(tables[name]))
    return tables, counts
