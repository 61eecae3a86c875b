"""Build every cleaned table from the raw data folder, with the counts that go to metrics/data.json."""

from __future__ import annotations

import logging
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd

from medrank.data import consumer, mediqa, medquad, nli, squad
from medrank.core.errors import MedrankError
from medrank.text.clean import boilerplate_rules_hit, normalize_text

log = logging.getLogger(__name__)

# Key of each table: rows sharing it are exact duplicates (dropped, counted) or a data error.
KEYS = {
    "answers": ["split", "aid"],
    "rqe_pairs": ["split", "pid"],
    "medquad": ["qa_id"],
    "nli": ["dataset", "split", "pair_id"],
    "squad": ["split", "question_id"],
    "meqsum": ["file"],
    "liveqa_questions": ["lq_id"],
    # some MedQuAD answers were judged twice for one question with different grades: both judgments are kept
    "liveqa_qrels": ["source", "number", "answer_id", "grade"],
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


def _require_every_split(
    by_split: dict[str, dict], files: dict[str, str], unit: str, raw_dir: Path, table: str
) -> None:
    """Stop unless every split of `files` has > 0 `unit` (a split that vanished would only show in the metrics)."""
    for split, rel in files.items():
        n = by_split.get(split, {}).get(unit, 0)
        if n == 0:
            raise MedrankError(f"{raw_dir / rel}: {table} split {split!r} has no {unit}, expected > 0")


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
    _require_every_split(by_split, mediqa.TASK3_FILES, "questions", raw_dir, "answers")
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
    _require_every_split(by_split, mediqa.RQE_FILES, "pairs", raw_dir, "rqe_pairs")
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


def _meqsum(raw_dir: Path, test_keys: set[str]) -> tuple[pd.DataFrame, dict[str, Any]]:
    df = consumer.read_meqsum(raw_dir / consumer.MEQSUM_FILE)
    n_read = len(df)
    df, overlap = consumer.drop_test_overlap(df, "chq", test_keys)  # before anything else sees the pairs
    df, dup = drop_exact_duplicates(df, "meqsum")
    hygiene = {"pairs": n_read, "dropped_test_overlap": overlap}
    return df, {"rows": len(df), "duplicates_dropped": dup, "hygiene": hygiene}


def _liveqa_questions(raw_dir: Path, answers: pd.DataFrame, test_keys: set[str]) -> tuple[pd.DataFrame, dict[str, Any]]:
    df = consumer.read_liveqa_questions(raw_dir / consumer.LIVEQA_QUESTIONS_FILE, answers)
    n_read = len(df)
    df, by_question = consumer.drop_test_overlap(df, "question", test_keys)
    df, by_message = consumer.drop_test_overlap(df, "message", test_keys)
    df, dup = drop_exact_duplicates(df, "liveqa_questions")
    unmapped = int(df["mediqa_qid"].isna().sum())
    if unmapped:
        log.warning("liveqa_questions: %d questions have no MEDIQA train_liveqa question of the same text", unmapped)
    counts = {
        "rows": len(df),
        "duplicates_dropped": dup,
        "mapped_to_mediqa": len(df) - unmapped,
        "hygiene": {"questions": n_read, "dropped_test_overlap": by_question + by_message},
    }
    return df, counts


def _liveqa_qrels(
    raw_dir: Path, medquad_table: pd.DataFrame, questions: pd.DataFrame
) -> tuple[pd.DataFrame, dict[str, Any]]:
    df, read_counts = consumer.read_liveqa_qrels(
        raw_dir / consumer.LIVEQA_QRELS_ZIP, raw_dir / consumer.LIVEQA_NIST_QRELS, medquad_table
    )
    # judgments of a question the hygiene filter dropped go with it
    kept = df["number"].isin(questions["number"]).to_numpy()
    df, dup = drop_exact_duplicates(df[kept], "liveqa_qrels")
    medquad_rows = df[df["source"] == "medquad"]
    linked = medquad_rows.assign(
        prefix=medquad_rows["answer_id"].map(consumer.answer_id_prefix), found=medquad_rows["medquad_qa_id"].notna()
    )
    counts = {
        **read_counts,
        "rows": len(df),
        "duplicates_dropped": dup,
        "answers_judged_twice": int(df.duplicated(["source", "number", "answer_id"]).sum()),
        "by_source_grade": {
            f"{s}/{g}": int(n) for (s, g), n in df.groupby(["source", "grade"]).size().sort_index().items()
        },
        "medquad_qa_id": {
            prefix: {"matched": int(g["found"].sum()), "unmatched": int((~g["found"]).sum())}
            for prefix, g in linked.groupby("prefix", sort=True)
        },
        "hygiene": {"judgments": len(kept), "dropped_with_test_overlap_question": int((~kept).sum())},
    }
    return df, counts


def build_tables(
    raw_dir: str | os.PathLike,
    squad_max_articles: int | None = None,
    mednli_dir: str | os.PathLike | None = None,
) -> tuple[dict[str, pd.DataFrame], dict[str, Any]]:
    """Parse and clean every raw dataset: ({table name: DataFrame}, {table name: counts, "hygiene": drops})."""
    raw_dir = Path(raw_dir)
    if not raw_dir.is_dir():
        raise MedrankError(f"{raw_dir}: raw data folder not found (run the acquire stage first)")
    tables: dict[str, pd.DataFrame] = {}
    counts: dict[str, Any] = {}

    def test_keys() -> set[str]:
        return consumer.test_question_keys(tables["answers"], tables["rqe_pairs"])

    steps = {
        "answers": lambda: _answers(raw_dir),
        "rqe_pairs": lambda: _rqe(raw_dir),
        "medquad": lambda: _medquad(raw_dir),
        "nli": lambda: _nli(raw_dir, mednli_dir),
        "squad": lambda: _squad(raw_dir, squad_max_articles),
        # consumer questions after answers/rqe_pairs/medquad: the hygiene filter reads their test questions
        "meqsum": lambda: _meqsum(raw_dir, test_keys()),
        "liveqa_questions": lambda: _liveqa_questions(raw_dir, tables["answers"], test_keys()),
        "liveqa_qrels": lambda: _liveqa_qrels(raw_dir, tables["medquad"], tables["liveqa_questions"]),
    }
    for name, step in steps.items():
        tables[name], counts[name] = step()
        log.info("%s: %d rows", name, len(tables[name]))
    # the test-overlap drops of every table, in one block
    counts["hygiene"] = {name: c.pop("hygiene") for name, c in list(counts.items()) if "hygiene" in c}
    return tables, counts
