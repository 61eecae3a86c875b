"""Consumer-question sources beside MEDIQA: MeQSum (xlsx), the TREC 2017 LiveQA-Med test questions and their
judged answers (MedQuAD qrels zip, NIST qrels), and the hygiene filter that drops MEDIQA 2019 test questions."""

from __future__ import annotations

import csv
import io
import logging
import os
import re
import zipfile
import zlib
from pathlib import Path

import pandas as pd

from medrank.data.mediqa import expect_root, read_xml_file
from medrank.core.errors import MedrankError
from medrank.core.io import decode_utf8
from medrank.text.clean import clean_answer, normalize_text

log = logging.getLogger(__name__)

# Raw files (relative to the raw data dir), as pinned in medrank/data/sources.py.
MEQSUM_FILE = "meqsum/MeQSum_ACL2019_BenAbacha_Demner-Fushman.xlsx"
LIVEQA_QUESTIONS_FILE = "liveqa_med_2017/TREC-2017-LiveQA-Medical-Test-Questions-w-summaries.xml"
LIVEQA_QRELS_ZIP = "liveqa_med_2017/QA-TestSet-LiveQA-Med-Qrels-2479-Answers.zip"
LIVEQA_NIST_QRELS = "liveqa_med_2017/TREC-2017-LiveQA-Medical-qrels-NIST-692.txt"

MEQSUM_HEADER = ("File", "CHQ", "Summary")
LIVEQA_ROOT = "LiveQA2017-Medical-Test-Set-Full"
MEDQUAD_LABELS = {1: "Incorrect", 2: "Related", 3: "Incomplete", 4: "Excellent"}

# AnswerID prefix (ADAM_0003147_Sec1) -> MedQuAD collection folder (the qa_id's first part).
MEDQUAD_COLLECTION_BY_PREFIX = {
    "CancerGov": "1_CancerGov_QA",
    "GARD": "2_GARD_QA",
    "GHR": "3_GHR_QA",
    "MPlusHealthTopics": "4_MPlus_Health_Topics_QA",
    "NIDDK": "5_NIDDK_QA",
    "NINDS": "6_NINDS_QA",
    "NIHSeniorHealth": "7_SeniorHealth_QA",
    "NHLBI": "8_NHLBI_QA_XML",
    "CDC": "9_CDC_QA",
    "ADAM": "10_MPlus_ADAM_QA",  # answers removed upstream: never in the clean MedQuAD table
    "MPlusDrugs": "11_MPlusDrugs_QA",  # idem
    "MPlusHerbsSuppls": "12_MPlusHerbsSupplements_QA",  # idem
}
_ANSWER_ID_RE = re.compile(r"(?P<prefix>[A-Za-z]+)_(?P<doc>\d+(?:_\d+)?)_Sec(?P<sec>\d+)")

# ---------------------------------------------------------------- hygiene: MEDIQA 2019 test questions

MIN_OVERLAP_WORDS = 10  # containment / near-duplicate rules only on texts at least this long (no short FAQ hits)
NEAR_DUPLICATE_JACCARD = 0.9  # word-set Jaccard of a near duplicate (MeQSum copies: >= 0.96; the rest: <= 0.47)
# De-identification placeholders ([NAME], [LOCATION], [CONTACT], ...): one copy of a question has them, the
# MEDIQA copy has them removed, so they never count as words.
_PLACEHOLDER_RE = re.compile(r"\[[A-Z]+\]")
_NON_ALNUM_RE = re.compile(r"[\W_]+")
_SUBJECT_MESSAGE_RE = re.compile(r"\s*(?:SUBJECT:(?P<subject>.*?))?MESSAGE:(?P<message>.*)", re.S)


def normalise_question(text: str | None) -> str:
    """Matching key: `normalize_text` (entities, tags, NFKC), placeholders like [NAME] dropped, lowercase, every
    run of non-alphanumerics one space, stripped."""
    text = _PLACEHOLDER_RE.sub(" ", normalize_text(text))
    return _NON_ALNUM_RE.sub(" ", text.lower()).strip()


def join_subject_message(subject: str | None, message: str | None) -> str:
    """A consumer question as MEDIQA Task 3 writes it: "SUBJECT. MESSAGE" (cleaned parts; either may be empty)."""
    subject, message = normalize_text(subject), normalize_text(message)
    return f"{subject}. {message}" if subject and message else subject or message


def question_variants(text: str | None) -> set[str]:
    """Normalised texts a question may appear as: whole, and without its subject (the part before the first
    ". ", MEDIQA's "SUBJECT. MESSAGE" join) when that leaves `MIN_OVERLAP_WORDS` words: a short remainder
    ("what are its causes") is no evidence of the same question."""
    cleaned = normalize_text(text)
    out = {normalise_question(cleaned)}
    _, sep, message = cleaned.partition(". ")
    message = normalise_question(message)
    if sep and len(message.split()) >= MIN_OVERLAP_WORDS:
        out.add(message)
    out.discard("")
    return out


def test_question_keys(answers: pd.DataFrame, rqe_pairs: pd.DataFrame) -> set[str]:
    """Normalised MEDIQA 2019 test questions (Task 2 test CHQs and FAQs, Task 3 test questions) and their
    subject-less variants. Test text is unlabelled and used for this filter only."""
    texts = [
        *rqe_pairs.loc[rqe_pairs["split"] == "test", "chq"],
        *rqe_pairs.loc[rqe_pairs["split"] == "test", "faq"],
        *answers.loc[answers["split"] == "test", "question"].drop_duplicates(),
    ]
    keys: set[str] = set()
    for text in texts:
        keys |= question_variants(text)
    return keys


test_question_keys.__test__ = False  # type: ignore[attr-defined]  # a library function, not a pytest test


def _contains(long: str, short: str) -> bool:
    return f" {short} " in f" {long} "


def overlap_rule(text: str | None, keys: set[str], _long_keys: list[tuple[str, frozenset]] | None = None) -> str | None:
    """Which rule (if any) makes `text` a copy of a test question; see `drop_test_overlap`."""
    variants = question_variants(text)
    if variants & keys:
        return "exact"
    long_keys = _long_keys if _long_keys is not None else _long(keys)
    long_variants = [v for v in variants if len(v.split()) >= MIN_OVERLAP_WORDS]
    for v in long_variants:
        if any(_contains(v, k) or _contains(k, v) for k, _ in long_keys):
            return "containment"
    for v in long_variants:
        words = frozenset(v.split())
        if any(len(words & kw) >= NEAR_DUPLICATE_JACCARD * len(words | kw) for _, kw in long_keys):
            return "near_duplicate"
    return None


def _long(keys: set[str]) -> list[tuple[str, frozenset]]:
    return [(k, frozenset(k.split())) for k in sorted(keys) if len(k.split()) >= MIN_OVERLAP_WORDS]


def drop_test_overlap(df: pd.DataFrame, column: str, keys: set[str]) -> tuple[pd.DataFrame, int]:
    """Drop rows whose `column` is a MEDIQA 2019 test question (`keys`: `test_question_keys`); return the kept
    rows and how many were dropped.

    A text matches when one of its `question_variants` (whole; without the "SUBJECT." prefix)
      - equals a key (exact normalised equality), or
      - contains a key, or lies inside one, as a run of whole words, the shorter side having at least
        `MIN_OVERLAP_WORDS` words (a copy with or without its subject line, or cut short), or
      - is a near duplicate of a key: word-set Jaccard >= `NEAR_DUPLICATE_JACCARD`, both at least
        `MIN_OVERLAP_WORDS` words (the same message de-identified differently: "1964" vs "YEAR").
    On MeQSum: 47 whole-text equal, 17 more equal without the subject, 3 contained, 1 near duplicate (68, each
    read: real copies); no other text comes close (best Jaccard 0.47), and short texts (FAQs) only match exactly.
    """
    long_keys = _long(keys)
    hit = df[column].map(lambda t: overlap_rule(t, keys, long_keys) is not None).to_numpy(dtype=bool)
    return df[~hit].reset_index(drop=True), int(hit.sum())


# ---------------------------------------------------------------- MeQSum


# what a truncated or corrupt workbook raises, at load or while streaming rows (SyntaxError: XML ParseError)
_UNREADABLE_XLSX = (zipfile.BadZipFile, zlib.error, EOFError, KeyError, OSError, ValueError, SyntaxError)


def _meqsum_cells(path: Path) -> tuple[tuple, list[tuple]]:
    """Header row and the first three cells of every other row of sheet 1; an unreadable workbook (not a zip, a
    corrupt member: also found while streaming rows) is one line."""
    import openpyxl  # only this reader needs it
    from openpyxl.utils.exceptions import InvalidFileException

    try:
        book = openpyxl.load_workbook(path, read_only=True, data_only=True)
        try:
            if not book.worksheets:  # e.g. a corrupt member name: the workbook lists no readable sheet
                raise MedrankError(f"{path}: unreadable xlsx workbook (no worksheet)")
            rows = book.worksheets[0].iter_rows(values_only=True)
            header = tuple(next(rows, ()))
            body = [(tuple(r[:3]) + (None, None, None))[:3] for r in rows]
        finally:
            book.close()
    except _UNREADABLE_XLSX + (InvalidFileException,) as e:
        raise MedrankError(f"{path}: unreadable xlsx workbook ({type(e).__name__}: {e})") from None
    return header, body


def read_meqsum(path: str | os.PathLike) -> pd.DataFrame:
    """MeQSum pairs (sheet 1, header File, CHQ, Summary): one row per non-empty (chq, summary), text cleaned;
    a CHQ written "SUBJECT: s MESSAGE: m" becomes "s. m", as MEDIQA writes consumer questions."""
    path = Path(path)
    if not path.is_file():
        raise MedrankError(f"{path}: raw file not found (run the acquire stage)")
    cells, body = _meqsum_cells(path)
    header = tuple(str(c).strip() if c is not None else "" for c in cells)
    # the sheet is 1,023 columns wide, every one past the third empty
    if header[:3] != MEQSUM_HEADER or any(header[3:]):
        got = ", ".join(c for c in header if c) or "(empty)"
        raise MedrankError(f"{path}: sheet 1 header is [{got}], expected [{', '.join(MEQSUM_HEADER)}]")
    out = []
    for file, chq, summary in body:
        m = _SUBJECT_MESSAGE_RE.fullmatch(str(chq or ""))
        chq = join_subject_message(m["subject"], m["message"]) if m else normalize_text(str(chq or ""))
        out.append({"file": normalize_text(str(file or "")), "chq": chq, "summary": normalize_text(str(summary or ""))})
    df = pd.DataFrame(out, columns=["file", "chq", "summary"])
    df = df[(df["chq"] != "") & (df["summary"] != "")].reset_index(drop=True)
    if df.empty:
        raise MedrankError(f"{path}: no MeQSum pairs (expected rows with a CHQ and a Summary under the header)")
    return df


# ---------------------------------------------------------------- LiveQA-Med 2017 test questions


def _texts(elem, path: str) -> list[str]:
    return [t for t in (normalize_text("".join(e.itertext())) for e in elem.findall(path)) if t]


def read_liveqa_questions(xml_path: str | os.PathLike, answers: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per <NLM-QUESTION>; `mediqa_qid` is the MEDIQA Task 3 `train_liveqa` question with the same
    normalised text, found in `answers` (the clean answers table; null without it or without a match)."""
    xml_path = Path(xml_path)
    root = read_xml_file(xml_path)
    expect_root(root, LIVEQA_ROOT, xml_path, "the TREC 2017 LiveQA-Med test questions")
    rows = []
    for n, q in enumerate(root.iter("NLM-QUESTION"), 1):
        lq_id = (q.get("qid") or "").strip()
        if not re.fullmatch(r"TQ\d+", lq_id):
            raise MedrankError(f"{xml_path}: NLM-QUESTION #{n}: qid={lq_id!r} is not TQ<number>")
        if q.find("Original-Question") is None:
            raise MedrankError(f"{xml_path}: NLM-QUESTION {lq_id} has no <Original-Question> element")
        subject = normalize_text(q.findtext("Original-Question/SUBJECT"))
        message = normalize_text(q.findtext("Original-Question/MESSAGE"))
        rows.append(
            {
                "lq_id": lq_id,
                "number": int(lq_id[2:]),
                "subject": subject,
                "message": message,
                "question": join_subject_message(subject, message),
                "nist_paraphrase": normalize_text(q.findtext("NIST-PARAPHRASE")),
                "nlm_summary": normalize_text(q.findtext("NLM-Summary")),
                "foci": _texts(q, "ANNOTATIONS/FOCUS"),
                "types": _texts(q, "ANNOTATIONS/TYPE"),
            }
        )
    if not rows:
        raise MedrankError(f"{xml_path}: no <NLM-QUESTION> elements")
    df = pd.DataFrame(rows)
    df["number"] = df["number"].astype("int32")
    df["mediqa_qid"] = None if answers is None else mediqa_qids(df["question"], answers)
    return df


def mediqa_qids(questions: pd.Series, answers: pd.DataFrame) -> pd.Series:
    """The `train_liveqa` qid whose question has the same `normalise_question` text (null when none or several)."""
    train = answers.loc[answers["split"] == "train_liveqa", ["qid", "question"]].drop_duplicates()
    by_key = train.assign(key=train["question"].map(normalise_question)).groupby("key")["qid"].unique()
    unique = {k: v[0] for k, v in by_key.items() if len(v) == 1}
    return questions.map(lambda q: unique.get(normalise_question(q)))


# ---------------------------------------------------------------- LiveQA-Med 2017 judged answers

_MEDQUAD_ANSWER_RE = re.compile(r"Question:(?P<question>.*?)\nURL:(?P<url>.*?)\nAnswer:(?P<answer>.*)", re.S)
_ALSO_CALLED_RE = re.compile(r"\s*\(Also called:.*\)\s*$", re.S)
QRELS_COLUMNS = ["number", "answer_id", "grade", "source", "question", "answer", "medquad_qa_id"]


def _zip_members(zip_path: Path) -> dict[str, bytes]:
    """The zip's files in memory by base name (folders and macOS `__MACOSX/` resource forks skipped)."""
    try:
        with zipfile.ZipFile(zip_path) as z:
            return {
                i.filename.rsplit("/", 1)[-1]: z.read(i)
                for i in z.infolist()
                if not i.is_dir() and not i.filename.startswith("__MACOSX/")
            }
    except (zipfile.BadZipFile, OSError) as e:
        raise MedrankError(f"{zip_path}: unreadable zip archive ({e})") from None


def _one_member(members: dict[str, bytes], suffix: str, zip_path: Path) -> tuple[str, str]:
    found = [n for n in members if n.lower().endswith(suffix)]
    if len(found) != 1:
        raise MedrankError(f"{zip_path}: expected one {suffix} file, found {found or 'none'}")
    return found[0], decode_utf8(members[found[0]], f"{zip_path}:{found[0]}")


def _medquad_answers(text: str, where: str) -> dict[str, tuple[str, str]]:
    """AnswerID (no .txt) -> (MedQuAD question, answer) from the CSV `AnswerID,Answer`."""
    reader = csv.reader(io.StringIO(text, newline=""))
    header = next(reader, [])
    if header != ["AnswerID", "Answer"]:
        raise MedrankError(f"{where}: header is {header}, expected ['AnswerID', 'Answer']")
    out: dict[str, tuple[str, str]] = {}
    for line, row in enumerate(reader, 2):
        if len(row) != 2:
            raise MedrankError(f"{where}:{line}: expected 2 fields, got {len(row)}")
        m = _MEDQUAD_ANSWER_RE.fullmatch(row[1])
        if m is None:
            raise MedrankError(f"{where}:{line}: Answer does not read 'Question: ... URL: ... Answer: ...'")
        # every exported answer ends with a stray ")" (unbalanced): drop it so the text equals MedQuAD's
        answer = re.sub(r"\)\s*$", "", m["answer"])
        question = _ALSO_CALLED_RE.sub("", m["question"])  # synonyms appended to the MedQuAD question
        out[row[0].removesuffix(".txt")] = (normalize_text(question), clean_answer(answer))
    return out


def _grade(value: str, where: str) -> int:
    try:
        grade = int(value)
    except ValueError:
        raise MedrankError(f"{where}: grade {value!r} is not an integer") from None
    if grade not in MEDQUAD_LABELS:
        raise MedrankError(f"{where}: grade {grade} is not in 1-4")
    return grade


def read_liveqa_qrels(
    zip_path: str | os.PathLike, nist_path: str | os.PathLike, medquad: pd.DataFrame | None = None
) -> tuple[pd.DataFrame, dict[str, int]]:
    """Judged answers to the LiveQA-Med 2017 test questions, grades 1-4: the MedQuAD answers of the qrels zip
    (source "medquad", `medquad_qa_id` linked to the clean `medquad` table when given, see `link_medquad`) and
    the NIST-judged participant answers (source "nist", answer_id "nist-<n>-<line>", question null). NIST
    grade -2 (spam / unjudgeable in TREC LiveQA) rows are dropped and counted."""
    zip_path, nist_path = Path(zip_path), Path(nist_path)
    for p in (zip_path, nist_path):
        if not p.is_file():
            raise MedrankError(f"{p}: raw file not found (run the acquire stage)")
    members = _zip_members(zip_path)
    qrels_name, qrels_text = _one_member(members, ".txt", zip_path)
    csv_name, csv_text = _one_member(members, ".csv", zip_path)
    texts = _medquad_answers(csv_text, f"{zip_path}:{csv_name}")
    rows = []
    for line, text in enumerate(qrels_text.splitlines(), 1):
        if not text.strip():
            continue
        where = f"{zip_path}:{qrels_name}:{line}"
        m = re.fullmatch(r"(\d+) (-?\d+)-(\w+) (\S+)\.txt", text.strip())
        if m is None:
            raise MedrankError(f"{where}: not '<number> <grade>-<Label> <AnswerID>.txt'")
        grade = _grade(m[2], where)
        if m[3] != MEDQUAD_LABELS[grade]:
            raise MedrankError(f"{where}: label {m[3]!r} does not name grade {grade}")
        if m[4] not in texts:
            raise MedrankError(f"{where}: answer {m[4]} is not in {csv_name}")
        question, answer = texts[m[4]]
        rows.append(
            {
                "number": int(m[1]),
                "answer_id": m[4],
                "grade": grade,
                "source": "medquad",
                "question": question,
                "answer": answer,
            }
        )
    n_medquad = len(rows)
    if not n_medquad:
        expected = "'<number> <grade>-<Label> <AnswerID>.txt' lines"
        raise MedrankError(f"{zip_path}:{qrels_name}: no judgments (expected {expected})")
    nist_dropped = 0
    for line, text in enumerate(decode_utf8(nist_path.read_bytes(), nist_path).splitlines(), 1):
        if not text.strip():
            continue
        m = re.fullmatch(r"(\d+) (-?\d+) (.*)", text, re.S)
        if m is None:
            raise MedrankError(f"{nist_path}:{line}: not '<number> <grade> <answer text>'")
        if m[2] == "-2":
            nist_dropped += 1
            continue
        grade = _grade(m[2], f"{nist_path}:{line}")
        rows.append(
            {
                "number": int(m[1]),
                "answer_id": f"nist-{m[1]}-{line}",
                "grade": grade,
                "source": "nist",
                "question": None,
                "answer": clean_answer(m[3]),
            }
        )
    if len(rows) + nist_dropped == n_medquad:
        raise MedrankError(f"{nist_path}: no judgments (expected '<number> <grade> <answer text>' lines)")
    df = pd.DataFrame(rows, columns=QRELS_COLUMNS[:-1])
    df["question"] = df["question"].astype(object).where(df["question"].notna(), None)  # None, not NaN
    df["number"] = df["number"].astype("int32")
    df["grade"] = df["grade"].astype("int8")
    df["medquad_qa_id"] = None if medquad is None else link_medquad(df, medquad)
    return df, {
        "medquad_judgments": n_medquad,
        "nist_judgments": len(df) - n_medquad,
        "nist_grade_minus2_dropped": nist_dropped,
    }


def link_medquad(qrels: pd.DataFrame, medquad: pd.DataFrame) -> pd.Series:
    """`qa_id` in the clean MedQuAD table of each "medquad" qrels answer (null where absent).

    The AnswerID names the collection and file (GHR_0000804_Sec2 -> 3_GHR_QA/0000804/...), but its Sec number is
    not the qid's number in every collection (NHLBI, NIDDK, SeniorHealth, CDC differ), so the answer is found by
    text: the row of the same file with the same normalised question and answer; else the only row of that file
    with the same question; else the row of the same collection with the same question and answer (a repeated
    document whose copy the clean table dropped). ADAM, Drugs and Herbs answers were removed from MedQuAD
    upstream: never found.
    """
    parts = medquad["qa_id"].str.split("/", n=2, expand=True)
    table = pd.DataFrame(
        {
            "qa_id": medquad["qa_id"],
            "collection": parts[0],
            "file": parts[1],
            "q": medquad["question"].map(normalise_question),
            "a": medquad["answer"].map(normalise_question),
        }
    )
    by_file_qa = table.groupby(["collection", "file", "q", "a"])["qa_id"].first().to_dict()
    by_file_q = table.groupby(["collection", "file", "q"])["qa_id"].unique().to_dict()
    by_coll_qa = table.groupby(["collection", "q", "a"])["qa_id"].first().to_dict()  # first = table order
    cache: dict[tuple[str, str, str], str | None] = {}

    def find(answer_id: str, question: str, answer: str) -> str | None:
        m = _ANSWER_ID_RE.fullmatch(answer_id)
        collection = MEDQUAD_COLLECTION_BY_PREFIX.get(m["prefix"]) if m else None
        if collection is None:
            return None
        q, a = normalise_question(question), normalise_question(answer)
        same_q = by_file_q.get((collection, m["doc"], q), [])
        return (
            by_file_qa.get((collection, m["doc"], q, a))
            or (same_q[0] if len(same_q) == 1 else None)
            or by_coll_qa.get((collection, q, a))
        )

    def lookup(row) -> str | None:
        if row.source != "medquad":
            return None
        key = (row.answer_id, row.question, row.answer)
        if key not in cache:
            cache[key] = find(*key)
        return cache[key]

    return pd.Series([lookup(r) for r in qrels.itertuples(index=False)], index=qrels.index, dtype=object)


def answer_id_prefix(answer_id: str) -> str:
    """Collection prefix of a qrels answer_id (GHR_0000804_Sec2 -> GHR; nist-3-17 -> nist)."""
    m = _ANSWER_ID_RE.fullmatch(answer_id)
    return m["prefix"] if m else answer_id.split("-", 1)[0]
