"""MedQuAD parser: QA pairs read straight from the upstream tarball (no extraction to disk)."""

from __future__ import annotations

import logging
import os
import tarfile
from pathlib import Path
from xml.etree.ElementTree import Element

import pandas as pd

from medrank.data.mediqa import expect_root, parse_xml
from medrank.core.errors import MedrankError
from medrank.text.clean import clean_answer, normalize_text

log = logging.getLogger(__name__)

MEDQUAD_FILE = "medquad/MedQuAD-577bd37.tar.gz"
# Most files are <Document>; four NINDS files <doc>, one CDC file <DiseaseFile>.
ROOTS = ("Document", "doc", "DiseaseFile")
COLUMNS = [
    "qa_id",
    "collection",
    "document_id",
    "url",
    "focus",
    "question_type",
    "question",
    "answer",
    "answer_raw",
]


def _first(elem: Element, *tags: str) -> Element | None:
    # Most files use <Document>/<QAPair>/<Question>; four NINDS files use <doc>/<pair>/<question>, one CDC
    # file <DiseaseFile>: accept every spelling.
    for tag in tags:
        found = elem.find(tag)
        if found is not None:
            return found
    return None


def parse_document(root: Element, collection: str, file_stem: str, name: str) -> list[dict]:
    """All QA pairs of one MedQuAD XML document (answers kept even when empty; the caller decides).

    The document must be MedQuAD's kind: a root in `ROOTS` holding <QAPairs>, each pair a <Question> and an
    <Answer> (a document may hold no pair: six NIDDK files do)."""
    expect_root(root, ROOTS, name, "a MedQuAD document")
    document_id = root.get("id") or root.get("docid") or root.get("fid") or file_stem
    url = (root.get("url") or "").strip()
    focus_el = _first(root, "Focus", "doctitle-focus")
    focus = normalize_text(focus_el.text if focus_el is not None else "")
    pairs = _first(root, "QAPairs", "qaPairs")
    if pairs is None:
        raise MedrankError(f"{name}: <{root.tag}> has no <QAPairs> element (expected in a MedQuAD document)")
    rows = []
    for n, pair in enumerate(list(pairs), 1):
        if pair.tag not in ("QAPair", "pair"):
            continue
        question = _first(pair, "Question", "question")
        answer = _first(pair, "Answer", "answer")
        for tag, elem in (("Question", question), ("Answer", answer)):
            if elem is None:
                raise MedrankError(f"{name}: QA pair #{n} has no {tag} element")
        qid = (question.get("qid") or f"{document_id}-{pair.get('pid') or n}").strip()
        answer_raw = "".join(answer.itertext())
        rows.append(
            {
                # qids repeat across collections and across the split CancerGov files (0000013_2_1.xml and
                # 0000013_2_2.xml both hold 0000013_2-1): the file path makes the id unique.
                "qa_id": f"{collection}/{file_stem}/{qid}",
                "collection": collection,
                "document_id": document_id,
                "url": url,
                "focus": focus,
                "question_type": (question.get("qtype") or "").strip() or None,
                "question": normalize_text("".join(question.itertext())),
                "answer": clean_answer(answer_raw),
                "answer_raw": answer_raw,
            }
        )
    return rows


def read_medquad(path: str | os.PathLike) -> tuple[pd.DataFrame, dict[str, int]]:
    """All MedQuAD QA pairs (empty answers included) and file/pair counts, read member by member."""
    path = Path(path)
    if not path.is_file():
        raise MedrankError(f"{path}: raw file not found (run the acquire stage)")
    rows: list[dict] = []
    n_files = 0
    try:
        with tarfile.open(path, mode="r:gz") as tar:
            for member in tar:
                if not (member.isfile() and member.name.endswith(".xml")):
                    continue
                parts = member.name.split("/")
                if len(parts) < 3:
                    continue  # top-level files are documentation, not QA documents
                collection, file_stem = parts[-2], parts[-1][: -len(".xml")]
                data = tar.extractfile(member).read()
                root = parse_xml(data, f"{path}:{member.name}")
                rows.extend(parse_document(root, collection, file_stem, f"{path}:{member.name}"))
                n_files += 1
    except (tarfile.TarError, EOFError, OSError) as e:
        raise MedrankError(f"{path}: unreadable tar.gz archive ({e})") from None
    if not rows:
        raise MedrankError(
            f"{path}: no MedQuAD QA pairs (expected <collection>/<file>.xml documents), found {n_files} documents"
        )
    df = pd.DataFrame(rows, columns=COLUMNS)
    log.info("MedQuAD: %d files, %d QA pairs", n_files, len(df))
    return df, {"files": n_files, "qa_pairs": len(df)}
