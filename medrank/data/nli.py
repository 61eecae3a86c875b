"""NLI readers into the one NLI schema: SICK (shipped, open) and MedNLI (licence-gated, user-supplied)."""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

import pandas as pd

from medrank.core.errors import MedrankError
from medrank.core.io import decode_utf8
from medrank.text.clean import normalize_text

SICK_FILE = "sick/SICK.txt"
COLUMNS = ["dataset", "split", "pair_id", "premise", "hypothesis", "label"]
LABELS = ("entailment", "neutral", "contradiction")
SICK_SPLITS = {"TRAIN": "train", "TRIAL": "dev", "TEST": "test"}
_SICK_REQUIRED = ("pair_ID", "sentence_A", "sentence_B", "entailment_label", "SemEval_set")


def _label(value: str, where: str) -> str:
    label = value.strip().lower()
    if label not in LABELS:
        raise MedrankError(f"{where}: label {value!r} is not one of {', '.join(LABELS)}")
    return label


def _csv_rows(records, path: Path):
    try:
        yield from records
    except csv.Error as e:  # a NUL byte, a field over the csv module's size limit
        raise MedrankError(f"{path}:{records.line_num}: unreadable as tab-separated text ({e})") from None


def read_sick(path: str | os.PathLike) -> pd.DataFrame:
    """SICK pairs (tab-separated, header row); SemEval_set TRAIN/TRIAL/TEST -> train/dev/test.

    The file must be SICK's kind: UTF-8, a header with the `_SICK_REQUIRED` columns, every row as many fields as
    the header, at least one row."""
    path = Path(path)
    if not path.is_file():
        raise MedrankError(f"{path}: raw file not found (run the acquire stage)")
    text = decode_utf8(path.read_bytes(), path)
    # no quoting: sentences contain bare double quotes
    records = csv.reader(io.StringIO(text, newline=""), delimiter="\t", quoting=csv.QUOTE_NONE)
    header = next(_csv_rows(records, path), [])
    missing = [c for c in _SICK_REQUIRED if c not in header]
    if missing:
        got = "\t".join(header)[:80] or "(empty file)"
        raise MedrankError(f"{path}: header lacks column(s) {', '.join(missing)} (expected SICK's), got {got!r}")
    rows = []
    for line_no, fields in enumerate(_csv_rows(records, path), 2):
        if not fields:
            continue  # blank line
        where = f"{path}:{line_no}"
        if len(fields) != len(header):
            raise MedrankError(f"{where}: {len(fields)} tab-separated fields, expected {len(header)} as in the header")
        rec = dict(zip(header, fields, strict=True))
        split = SICK_SPLITS.get(rec["SemEval_set"].strip().upper())
        if split is None:
            raise MedrankError(f"{where}: SemEval_set {rec['SemEval_set']!r} is not TRAIN, TRIAL or TEST")
        rows.append(
            {
                "dataset": "sick",
                "split": split,
                "pair_id": rec["pair_ID"].strip(),
                "premise": normalize_text(rec["sentence_A"]),
                "hypothesis": normalize_text(rec["sentence_B"]),
                "label": _label(rec["entailment_label"], where),
            }
        )
    if not rows:
        raise MedrankError(f"{path}: no SICK pairs after the header (expected at least one)")
    return pd.DataFrame(rows, columns=COLUMNS)


def _mednli_split(file: Path) -> str:
    name = file.name.lower()
    for split in ("train", "dev", "test"):
        if split in name:
            return split
    raise MedrankError(f"{file}: cannot tell the split from the file name (expected train, dev or test in it)")


def read_mednli(path: str | os.PathLike) -> pd.DataFrame:
    """MedNLI jsonl (sentence1, sentence2, gold_label, pairID): one file, or a folder of mli_*_v1.jsonl files."""
    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("*.jsonl"))
        if not files:
            raise MedrankError(f"{path}: no .jsonl files (MedNLI is licence-gated: download it from PhysioNet)")
    elif path.is_file():
        files = [path]
    else:
        raise MedrankError(f"{path}: MedNLI path not found (MedNLI is licence-gated: download it from PhysioNet)")
    rows = []
    for file in files:
        split = _mednli_split(file)
        n_read = len(rows)
        lines = io.StringIO(decode_utf8(file.read_bytes(), file), newline=None)  # universal newlines, as open()
        for line_no, line in enumerate(lines, 1):
            if not line.strip():
                continue
            where = f"{file}:{line_no}"
            try:
                rec = json.loads(line)
                premise, hypothesis, gold, pair_id = (
                    rec["sentence1"],
                    rec["sentence2"],
                    rec["gold_label"],
                    rec["pairID"],
                )
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise MedrankError(f"{where}: not a MedNLI record ({type(e).__name__}: {e})") from None
            if not all(isinstance(v, str) for v in (premise, hypothesis, gold)):
                raise MedrankError(f"{where}: not a MedNLI record (sentence1, sentence2, gold_label must be strings)")
            rows.append(
                {
                    "dataset": "mednli",
                    "split": split,
                    "pair_id": str(pair_id),
                    "premise": normalize_text(premise),
                    "hypothesis": normalize_text(hypothesis),
                    "label": _label(str(gold), where),
                }
            )
        if len(rows) == n_read:
            raise MedrankError(f"{file}: no MedNLI records (expected JSON lines with sentence1, sentence2, gold_label)")
    return pd.DataFrame(rows, columns=COLUMNS)
