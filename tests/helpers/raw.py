"""Raw-data writers for the tests: the consumer-question sources (MeQSum xlsx, LiveQA-Med questions, qrels) written on
the fly, and a data/raw-shaped folder built from the fixtures (`make_raw_dir`)."""

from __future__ import annotations

import csv
import io
import shutil
import tarfile
import zipfile
from pathlib import Path

import openpyxl

from medrank.data import consumer, medquad, squad
from tests.helpers import FIXTURES

FIX = FIXTURES / "clean"


def write_meqsum(path: Path, rows: list[tuple], header: tuple = consumer.MEQSUM_HEADER) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    book = openpyxl.Workbook()
    sheet = book.active
    sheet.append(list(header))
    for row in rows:
        sheet.append(list(row))
    book.save(path)
    return path


def _question_xml(
    lq_id: str, subject: str, message: str, paraphrase: str, summary: str, foci: list[str], types: list[str]
) -> str:
    annotations = "".join(f'<FOCUS fid="F{i}" fcategory="Problem">{f}</FOCUS>' for i, f in enumerate(foci, 1))
    annotations += "".join(f'<TYPE tid="T{i}" hasFocus="F1">{t}</TYPE>' for i, t in enumerate(types, 1))
    return (
        f'<NLM-QUESTION qid="{lq_id}"><Original-Question qfile="1.txt">'
        f"<SUBJECT>{subject}</SUBJECT><MESSAGE>{message}</MESSAGE></Original-Question>"
        f"<NIST-PARAPHRASE>{paraphrase}</NIST-PARAPHRASE><NLM-Summary>{summary}</NLM-Summary>"
        f"<ANNOTATIONS>{annotations}</ANNOTATIONS>"
        "<ReferenceAnswers><RefAnswer aid='x'><ANSWER>not read</ANSWER></RefAnswer></ReferenceAnswers></NLM-QUESTION>"
    )


LIVEQA_FIXTURE = [
    # (lq_id, subject, message, paraphrase, summary, foci, types); the texts of the fixture's train_liveqa questions
    (
        "TQ1",
        "Noonan syndrome",
        "\n\t\tWhat are the references with noonan syndrome? [NAME]\n\t",
        "Noonan and references?",
        "What is Noonan syndrome?",
        ["noonan syndrome", "polycystic renal disease"],
        ["EFFECT", "INFORMATION"],
    ),
    (
        "TQ2",
        "celiac disease\t",
        "",
        "What is celiac disease?",
        "What is celiac disease?",
        ["celiac disease"],
        ["INFORMATION"],
    ),
]


def write_liveqa_questions(path: Path, questions=LIVEQA_FIXTURE, root: str = consumer.LIVEQA_ROOT) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    body = "".join(_question_xml(*q) for q in questions)
    path.write_text(f'<?xml version="1.0" encoding="UTF-8"?>\n<{root}>{body}</{root}>\n', encoding="utf-8")
    return path


def medquad_csv_answer(question: str, answer: str, url: str = "https://example.org/x") -> str:
    # the export's layout, stray trailing ")" included
    return f"Question: {question}\nURL: {url}\nAnswer: {answer}) \n"


def write_qrels_zip(path: Path, qrels_lines: list[str], answers: dict[str, str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO(newline="")
    writer = csv.writer(buf, lineterminator="\r\n")
    writer.writerow(["AnswerID", "Answer"])
    writer.writerows(answers.items())
    folder = "QA-TestSet-LiveQA-Med-Qrels-2479-Answers"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{folder}/", "")
        z.writestr(
            f"{folder}/All-qrels_LiveQAMed2017-TestQuestions_2479_Judged-Answers.txt", "\n".join(qrels_lines) + "\n"
        )
        z.writestr(
            f"__MACOSX/{folder}/._All-qrels_LiveQAMed2017-TestQuestions_2479_Judged-Answers.txt", b"\x00\x05junk"
        )
        z.writestr(f"{folder}/All-2479-Answers-retrieved-from-MedQuAD.csv", buf.getvalue())
        z.writestr(f"__MACOSX/{folder}/._All-2479-Answers-retrieved-from-MedQuAD.csv", b"\x00\x05junk")
    return path


QRELS_FIXTURE = [
    "1 4-Excellent NINDS_0000007_Sec1.txt",
    "1 1-Incorrect ADAM_0000001_Sec1.txt",
    "2 2-Related NINDS_0000007_Sec1.txt",
]
QRELS_ANSWERS = {
    "NINDS_0000007_Sec1.txt": medquad_csv_answer(
        "what is holmes-adie syndrome ? (Also called: Adie syndrome; Adie's pupil)",
        "Holmes-Adie syndrome (HAS) is a neurological disorder affecting the pupil of the eye.",
    ),
    "ADAM_0000001_Sec1.txt": medquad_csv_answer("What is (are) Ear wax ?", "Ear wax is made by glands."),
}
NIST_FIXTURE = (
    "1 3 Noonan syndrome is a &quot;genetic&quot; disorder.\n2 -2 Brigadier General John Gibbon\n2 1 Eat more bread.\n"
)


def write_consumer_sources(raw: Path) -> None:
    """The four consumer-question raw files in a data/raw-shaped folder (for make_raw_dir's stage tests).

    The second MeQSum CHQ is the fixture's Task 2 test CHQ up to case and punctuation: the filter drops it."""
    write_meqsum(
        raw / consumer.MEQSUM_FILE,
        [
            (
                "14348.txt",
                "who makes bromocriptine\ni am wondering what company makes it",
                "Who manufactures bromocriptine?",
            ),
            (
                "1-2.xml.txt",
                "SUBJECT: Atypical Pnuemonia\nMESSAGE: What is the possibility of atypical pneumonia occurring AGAIN??",
                "Can atypical pneumonia recur?",
            ),
        ],
    )
    write_liveqa_questions(raw / consumer.LIVEQA_QUESTIONS_FILE)
    write_qrels_zip(raw / consumer.LIVEQA_QRELS_ZIP, QRELS_FIXTURE, QRELS_ANSWERS)
    (raw / consumer.LIVEQA_NIST_QRELS).write_text(NIST_FIXTURE, encoding="utf-8")


def tar_dir(src: Path, dest: Path, arcname: str) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest, "w:gz") as tar:
        tar.add(src, arcname=arcname)


def make_raw_dir(tmp: Path) -> Path:
    """A raw folder shaped like data/raw, built from the fixtures (tarballs made on the fly)."""
    raw = tmp / "raw"
    shutil.copytree(FIX / "raw", raw)
    tar_dir(FIX / "medquad_src" / "MedQuAD", raw / medquad.MEDQUAD_FILE, "MedQuAD")
    for split, rel in squad.SQUAD_FILES.items():
        tar_dir(FIX / "squad_src" / split, raw / rel, f"squad-explorer-v1.1/explore/1.1/{split}")
    write_consumer_sources(raw)  # MeQSum xlsx, LiveQA-Med questions and qrels, written on the fly
    return raw
