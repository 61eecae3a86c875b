"""MEDIQA 2019 Task 3 (answers) and Task 2 (RQE pairs) XML parsers, plus the safe XML reader they share."""

from __future__ import annotations

import os
import re
import urllib.parse
from pathlib import Path
from typing import Iterator
from xml.etree.ElementTree import Element, ParseError

import defusedxml
import defusedxml.ElementTree as DET
import pandas as pd

from medrank.errors import MedrankError
from medrank.text.clean import clean_answer, normalize_text

# Task 3 files (relative to the raw data dir) and the split name each becomes.
TASK3_FILES = {
    "train_liveqa": "mediqa2019/MEDIQA_Task3_QA/MEDIQA2019-Task3-QA-TrainingSet1-LiveQAMed.xml",
    "train_alexa": "mediqa2019/MEDIQA_Task3_QA/MEDIQA2019-Task3-QA-TrainingSet2-Alexa.xml",
    "val": "mediqa2019/MEDIQA_Task3_QA/MEDIQA2019-Task3-QA-ValidationSet.xml",
    "test": "mediqa2019/MEDIQA_Task3_QA/MEDIQA2019-Task3-QA-TestSet.xml",
}
RQE_FILES = {
    "train": "mediqa2019/MEDIQA_Task2_RQE/MEDIQA2019-Task2-RQE-TrainingSet-AMIA2016.xml",
    "val": "mediqa2019/MEDIQA_Task2_RQE/MEDIQA2019-Task2-RQE-ValidationSet-AMIA2016.xml",
    "test": "mediqa2019/MEDIQA_Task2_RQE/MEDIQA2019-Task2-RQE-TestSet.xml",
}
POSITIVE_MIN_SCORE = 3  # official rule: ReferenceScore 3 (correct but incomplete) or 4 (excellent) -> label 1

# URL host (or host + path prefix) -> short source name. Anything else falls back to the registrable
# domain's name (www.womenshealth.gov -> womenshealth) or, under nih.gov, the institute (www.niddk.nih.gov
# -> niddk). Answers with no usable URL (the data has "#") get "unknown".
SOURCE_BY_HOST = {
    "medlineplus.gov": "medlineplus",
    "www.nlm.nih.gov/medlineplus": "medlineplus",  # old MedlinePlus URLs
    "ghr.nlm.nih.gov": "ghr",  # Genetics Home Reference
    "rarediseases.info.nih.gov": "gard",  # Genetic and Rare Diseases Information Center
    "www.mayoclinic.org": "mayoclinic",
    "nihseniorhealth.gov": "nihseniorhealth",
    "www.cancer.gov": "cancergov",
}
_TWO_LEVEL_SUFFIXES = ("nih.gov", "co.uk", "org.uk", "ac.uk", "gov.uk", "com.au")


def source_of(url: str | None) -> str:
    """Short site name of an answer URL (see `SOURCE_BY_HOST`)."""
    parts = urllib.parse.urlsplit((url or "").strip())
    host = (parts.hostname or "").lower()
    if not host:
        return "unknown"
    first_dir = parts.path.strip("/").split("/", 1)[0].lower()
    for key in (f"{host}/{first_dir}", host):
        if key in SOURCE_BY_HOST:
            return SOURCE_BY_HOST[key]
    labels = host.split(".")
    for suffix in _TWO_LEVEL_SUFFIXES:
        n = suffix.count(".") + 1
        if host.endswith("." + suffix) and len(labels) > n:
            return labels[-n - 1]
    return labels[-2] if len(labels) >= 2 else labels[0]


def _unsafe_reason(data: bytes, err: Exception) -> str:
    if isinstance(err, defusedxml.EntitiesForbidden) or b"<!ENTITY" in data:
        return "entity declaration"
    if isinstance(err, defusedxml.ExternalReferenceForbidden):
        return "external reference"
    return "DTD"


def parse_xml(data: bytes, name: str | os.PathLike) -> Element:
    """Parse XML bytes with defusedxml (no DTD, entities or external references); errors name `name`."""
    try:
        return DET.fromstring(data, forbid_dtd=True, forbid_entities=True, forbid_external=True)
    except defusedxml.DefusedXmlException as e:
        raise MedrankError(f"{name}: rejected unsafe XML ({_unsafe_reason(data, e)})") from None
    except ParseError as e:
        line, col = getattr(e, "position", (None, None))
        msg = re.sub(r": line \d+, column \d+$", "", str(e))
        raise MedrankError(f"{name}: malformed XML at line {line}, column {col}: {msg}") from None


def read_xml_file(path: str | os.PathLike) -> Element:
    path = Path(path)
    if not path.is_file():
        raise MedrankError(f"{path}: raw file not found (run the acquire stage)")
    return parse_xml(path.read_bytes(), path)


def _int_attr(elem: Element, attr: str, path: Path, what: str) -> int | None:
    value = elem.get(attr)
    if value is None or not value.strip():
        return None
    try:
        return int(value)
    except ValueError:
        raise MedrankError(f"{path}: {what}: {attr}={value!r} is not an integer") from None


def _elements(path: str | os.PathLike, tag: str) -> Iterator[tuple[Path, int, Element]]:
    """(path, 1-based number, element) of every `tag` element of an XML file."""
    path = Path(path)
    for n, elem in enumerate(read_xml_file(path).iter(tag), 1):
        yield path, n, elem


def _required(elem: Element, attr: str, path: Path, what: str) -> str:
    value = (elem.get(attr) or "").strip()
    if not value:
        raise MedrankError(f"{path}: {what} has no {attr} attribute")
    return value


def read_task3(path: str | os.PathLike, split: str) -> pd.DataFrame:
    """One row per (question, answer) of a Task 3 file; rank/score/label are null where absent (test)."""
    rows = []
    for path, q_no, question in _elements(path, "Question"):
        qid = _required(question, "QID", path, f"Question #{q_no}")
        question_raw = question.findtext("QuestionText") or ""
        question_clean = normalize_text(question_raw)
        answers = question.find("AnswerList")
        for pos, answer in enumerate(answers.iter("Answer") if answers is not None else (), 1):
            aid = _required(answer, "AID", path, f"Question {qid} answer #{pos}")
            what = f"answer {aid}"
            url = (answer.findtext("AnswerURL") or "").strip()
            answer_raw = answer.findtext("AnswerText") or ""
            score = _int_attr(answer, "ReferenceScore", path, what)
            rows.append(
                {
                    "split": split,
                    "qid": qid,
                    "question": question_clean,
                    "question_raw": question_raw,
                    "aid": aid,
                    "answer": clean_answer(answer_raw),
                    "answer_raw": answer_raw,
                    "url": url,
                    "source": source_of(url),
                    "answer_pos": pos,
                    "system_rank": _int_attr(answer, "SystemRank", path, what),
                    "reference_rank": _int_attr(answer, "ReferenceRank", path, what),
                    "reference_score": score,
                    "label": None if score is None else int(score >= POSITIVE_MIN_SCORE),
                }
            )
    df = pd.DataFrame(rows, columns=_TASK3_COLUMNS)
    for col in ("answer_pos", "system_rank", "reference_rank", "reference_score"):
        df[col] = df[col].astype("Int32")
    df["label"] = df["label"].astype("Int8")
    return df


_TASK3_COLUMNS = [
    "split", "qid", "question", "question_raw", "aid", "answer", "answer_raw", "url", "source",
    "answer_pos", "system_rank", "reference_rank", "reference_score", "label",
]  # fmt: skip

_BOOL = {"true": 1, "false": 0}


def read_rqe(path: str | os.PathLike, split: str) -> pd.DataFrame:
    """One row per Task 2 pair; `label` 1 = the CHQ entails the FAQ (null when unlabelled, as in test)."""
    rows = []
    for path, n, pair in _elements(path, "pair"):
        pid = _required(pair, "pid", path, f"pair #{n}")
        value = pair.get("value")
        if value is not None and value.strip().lower() not in _BOOL:
            raise MedrankError(f"{path}: pair {pid}: value={value!r} is not true/false")
        rows.append(
            {
                "split": split,
                "pid": pid,
                "chq": normalize_text(pair.findtext("chq")),
                "faq": normalize_text(pair.findtext("faq")),
                "pair_type": pair.get("type"),
                "label": None if value is None else _BOOL[value.strip().lower()],
            }
        )
    df = pd.DataFrame(rows, columns=["split", "pid", "chq", "faq", "pair_type", "label"])
    df["label"] = df["label"].astype("Int8")
    return df
