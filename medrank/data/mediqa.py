"""MEDIQA 2019 Task 3 (answers) and Task 2 (RQE pairs) XML parsers, plus the safe XML reader they share."""

from __future__ import annotations

import codecs
import os
import re
import urllib.parse
from pathlib import Path
from typing import Iterator
from xml.etree.ElementTree import Element, ParseError

import defusedxml
import defusedxml.ElementTree as DET
import pandas as pd

from medrank.core import layout
from medrank.core.errors import MedrankError
from medrank.core.io import decode_utf8
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
# Root element of each file (the Task 2 test file's differs from its name) and the splits whose answers/pairs
# must carry labels: a file of the wrong kind (an HTML error page, another split) stops here, not downstream.
TASK3_ROOTS = {split: Path(rel).stem for split, rel in TASK3_FILES.items()}
RQE_ROOTS = {
    "train": "MEDIQA2019-Task2-RQE-TrainingSet-AMIA2016",
    "val": "MEDIQA2019-Task2-RQE-ValidationSet-AMIA2016",
    "test": "MEDIQA-2019-RQE-Test-Set",
}
RQE_LABELLED = ("train", "val")
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


def _decode(data: bytes, name: str | os.PathLike, encoding: str) -> None:
    """Check `data` decodes as `encoding`; messages as `medrank.core.io.decode_utf8`'s (which UTF-8 goes through)."""
    if codecs.lookup(encoding).name in ("utf-8", "utf-8-sig"):
        decode_utf8(data, name)
        return
    try:
        data.decode(encoding)
    except UnicodeDecodeError as e:
        raise MedrankError(
            f"{name}: not {encoding} text (byte 0x{data[e.start]:02x} at offset {e.start}: {e.reason})"
        ) from None
    except (UnicodeError, ValueError) as e:  # codecs like idna fail without an offset
        raise MedrankError(f"{name}: not {encoding} text ({e})") from None


_BOMS = ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))
_XML_DECL_ENCODING = re.compile(rb"<\?xml\s[^>]*?\bencoding\s*=\s*([\"'])(.*?)\1")


def _known_text_encoding(encoding: str) -> bool:
    """A name the XML grammar allows (EncName) that Python decodes bytes with (not rot13, hex, ...)."""
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9._-]*", encoding):
        return False
    try:
        codecs.lookup(encoding)
        b"<".decode(encoding, "ignore")  # LookupError for non-text codecs
    except LookupError:
        return False
    except ValueError:
        pass  # a text codec without "ignore" (idna): _decode reports what it cannot decode
    return True


def _check_xml_encoding(data: bytes, name: str | os.PathLike) -> str:
    """Stop with one line (file, byte offset) on an unknown declared encoding or bytes the encoding cannot decode;
    else describe the encoding for later messages ("'utf-8' (by default)"): BOM, XML declaration, else UTF-8.

    expat would otherwise raise LookupError/ValueError (not ParseError) for the first, and report the second
    as a line/column "invalid token"."""
    encoding, where = "utf-8", "by default"
    for bom, bom_encoding in _BOMS:
        if data.startswith(bom):
            encoding, where = bom_encoding, "by its byte order mark"
            break
    else:
        decl = _XML_DECL_ENCODING.match(data)
        if decl is not None:
            declared, at = decl.group(2).decode("ascii", "replace"), decl.start(2)
            if not _known_text_encoding(declared):
                raise MedrankError(f"{name}: unknown encoding {declared!r} declared at byte {at}")
            encoding, where = declared, f"declared at byte {at}"
    _decode(data, name, encoding)
    return f"{encoding!r} ({where})"


def parse_xml(data: bytes, name: str | os.PathLike) -> Element:
    """Parse XML bytes with defusedxml (no DTD, entities or external references); errors name `name`."""
    encoding = _check_xml_encoding(data, name)
    try:
        return DET.fromstring(data, forbid_dtd=True, forbid_entities=True, forbid_external=True)
    except defusedxml.DefusedXmlException as e:
        raise MedrankError(f"{name}: rejected unsafe XML ({_unsafe_reason(data, e)})") from None
    except ParseError as e:
        line, col = getattr(e, "position", (None, None))
        msg = re.sub(r": line \d+, column \d+$", "", str(e))
        raise MedrankError(f"{name}: malformed XML at line {line}, column {col}: {msg}") from None
    except (LookupError, ValueError) as e:  # an encoding Python knows but expat cannot use (multi-byte: utf-32)
        raise MedrankError(f"{name}: XML encoding {encoding} not supported by the parser ({e})") from None


def read_xml_file(path: str | os.PathLike) -> Element:
    path = Path(path)
    if not path.is_file():
        raise MedrankError(f"{path}: raw file not found (run the acquire stage)")
    return parse_xml(path.read_bytes(), path)


def expect_root(root: Element, expected: str | tuple[str, ...], name: str | os.PathLike, what: str) -> None:
    """Stop unless the root element is `expected` (one tag or a tuple of accepted tags); `what` names the kind."""
    accepted = (expected,) if isinstance(expected, str) else expected
    if root.tag not in accepted:
        tags = " or ".join(f"<{t}>" for t in accepted)
        raise MedrankError(f"{name}: expected root {tags} ({what}), got <{root.tag}>")


def _int_attr(elem: Element, attr: str, path: Path, what: str) -> int | None:
    value = elem.get(attr)
    if value is None or not value.strip():
        return None
    try:
        return int(value)
    except ValueError:
        raise MedrankError(f"{path}: {what}: {attr}={value!r} is not an integer") from None


def _elements(
    path: str | os.PathLike, root_tags: str | tuple[str, ...], what: str, tag: str
) -> Iterator[tuple[Path, int, Element]]:
    """(path, 1-based number, element) of every `tag` element of an XML file whose root is one of `root_tags`;
    a file with none of them stops."""
    path = Path(path)
    root = read_xml_file(path)
    expect_root(root, root_tags, path, what)
    n = 0
    for n, elem in enumerate(root.iter(tag), 1):
        yield path, n, elem
    if n == 0:
        raise MedrankError(f"{path}: no <{tag}> elements (expected at least one in {what})")


def _child(elem: Element, tag: str, path: Path, what: str) -> Element:
    child = elem.find(tag)
    if child is None:
        raise MedrankError(f"{path}: {what} has no <{tag}> element")
    return child


def _required(elem: Element, attr: str, path: Path, what: str) -> str:
    value = (elem.get(attr) or "").strip()
    if not value:
        raise MedrankError(f"{path}: {what} has no {attr} attribute")
    return value


def read_task3(path: str | os.PathLike, split: str) -> pd.DataFrame:
    """One row per (question, answer) of a Task 3 file; rank/score/label are null where absent (test).

    The file must be the split's kind: root `TASK3_ROOTS[split]` (any Task 3 root for another split name), every
    <Question> with a QID, a <QuestionText> and at least one <Answer> (AID, <AnswerText>), and in labelled splits
    every answer with ReferenceRank and ReferenceScore."""
    expected = TASK3_ROOTS.get(split, tuple(TASK3_ROOTS.values()))
    labelled = split in layout.LABELLED_SPLITS
    rows = []
    for path, q_no, question in _elements(path, expected, f"a MEDIQA 2019 Task 3 {split} file", "Question"):
        qid = _required(question, "QID", path, f"Question #{q_no}")
        question_raw = _child(question, "QuestionText", path, f"Question {qid}").text or ""
        question_clean = normalize_text(question_raw)
        answers = question.find("AnswerList")
        answer_elems = list(answers.iter("Answer")) if answers is not None else []
        if not answer_elems:
            raise MedrankError(f"{path}: Question {qid} has no <Answer> (expected at least one in <AnswerList>)")
        for pos, answer in enumerate(answer_elems, 1):
            aid = _required(answer, "AID", path, f"Question {qid} answer #{pos}")
            what = f"answer {aid}"
            url = (answer.findtext("AnswerURL") or "").strip()
            answer_raw = _child(answer, "AnswerText", path, what).text or ""
            if labelled:
                for attr in ("ReferenceRank", "ReferenceScore"):
                    _required(answer, attr, path, f"{what} of labelled split {split!r}")
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
    "split",
    "qid",
    "question",
    "question_raw",
    "aid",
    "answer",
    "answer_raw",
    "url",
    "source",
    "answer_pos",
    "system_rank",
    "reference_rank",
    "reference_score",
    "label",
]

_BOOL = {"true": 1, "false": 0}


def read_rqe(path: str | os.PathLike, split: str) -> pd.DataFrame:
    """One row per Task 2 pair; `label` 1 = the CHQ entails the FAQ (null when unlabelled, as in test).

    The file must be the split's kind: root `RQE_ROOTS[split]` (any Task 2 root for another split name), every
    <pair> with a pid, a <chq> and a <faq>, and in labelled splits a true/false value."""
    expected = RQE_ROOTS.get(split, tuple(RQE_ROOTS.values()))
    labelled = split in RQE_LABELLED
    rows = []
    for path, n, pair in _elements(path, expected, f"a MEDIQA 2019 Task 2 RQE {split} file", "pair"):
        pid = _required(pair, "pid", path, f"pair #{n}")
        value = pair.get("value")
        if labelled:
            value = _required(pair, "value", path, f"pair {pid} of labelled split {split!r}")
        if value is not None and value.strip().lower() not in _BOOL:
            raise MedrankError(f"{path}: pair {pid}: value={value!r} is not true/false")
        chq, faq = (_child(pair, tag, path, f"pair {pid}").text for tag in ("chq", "faq"))
        rows.append(
            {
                "split": split,
                "pid": pid,
                "chq": normalize_text(chq),
                "faq": normalize_text(faq),
                "pair_type": pair.get("type"),
                "label": None if value is None else _BOOL[value.strip().lower()],
            }
        )
    df = pd.DataFrame(rows, columns=["split", "pid", "chq", "faq", "pair_type", "label"])
    df["label"] = df["label"].astype("Int8")
    return df
