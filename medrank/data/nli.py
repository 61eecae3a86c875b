"""NLI readers into the one NLI schema: SICK (shipped, open) and MedNLI (licence-gated, user-supplied)."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pandas as pd

from medrank.errors import MedrankError
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


def read_sick(path: str | os.PathLike) -> pd.DataFrame:
    """SICK pairs (tab-separated, header row); SemEval_set TRAIN/TRIAL/TEST -> train/dev/test."""
    path = Path(path)
    if not path.is_file():
        raise MedrankError(f"{path}: raw file not found (run the acquire stage)")
    rows = []
    with path.open(encoding="utf-8", newline="") as f:
        # no quoting: sentences contain bare double quotes
        reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        missing = [c for c in _SICK_REQUIRED if c not in (reader.fieldnames or [])]
        if missing:
            raise MedrankError(f"{path}: header lacks column(s) {', '.join(missing)}")
        for line_no, rec in enumerate(reader, 2):
            where = f"{path}:{line_no}"
            split = SICK_SPLITS.get((rec["SemEval_set"] or "").strip().upper())
            if split is None:
                raise MedrankError(f"{where}: SemEval_set {rec['SemEval_set']!r} is not TRAIN, TRIAL or TEST")
            rows.append(
                {
                    "dataset": "sick",
                    "split": split,
                    "pair_id": (rec["pair_ID"] or "").strip(),
                    "premise": normalize_text(rec["sentence_A"]),
                    "hypothesis": normalize_text(rec["sentence_B"]),
                    "label": _label(rec["entailment_label"] or "", where),
                }
            )
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
        with file.open(encoding="utf-8") as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = f"{file}:{line_no}"
                try:
                    rec = json.loads(line)
                    premise, hypothesis, gold, pair_id = (
                        rec["sentence1"], rec["sentence2"], rec["gold_label"], rec["pairID"]
                    )  # fmt: skip
                except (json.JSONDecodeError, KeyError, TypeError) as e:
                    raise MedrankError(f"{where}: not a MedNLI record ({type(e).__name__}: {e})") from None
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
    return pd.DataFrame(rows, columns=COLUMNS)
