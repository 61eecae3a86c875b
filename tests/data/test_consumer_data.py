"""Consumer-question sources (MeQSum xlsx, LiveQA-Med 2017 test questions and qrels) and the hygiene filter that
drops MEDIQA 2019 test questions. Fixtures are written in the test; real-data checks run on the mirror."""

from __future__ import annotations


import pandas as pd
import pytest

from medrank.data import consumer
from medrank.core.errors import MedrankError
from tests.helpers.raw import (
    LIVEQA_FIXTURE,
    NIST_FIXTURE,
    QRELS_ANSWERS,
    medquad_csv_answer,
    write_liveqa_questions,
    write_meqsum,
    write_qrels_zip,
)

# ---------------------------------------------------------------- MeQSum


def test_meqsum_rows_cleaned_and_empty_rows_dropped(tmp_path):
    path = write_meqsum(
        tmp_path / "m.xlsx",
        [
            (
                "1-1.xml.txt",
                "SUBJECT: who sells  cetirizine\nMESSAGE: I need to know who makes &quot;Cetirizine&quot;.",
                " Who manufactures cetirizine? ",
            ),
            ("2.txt", "MESSAGE: Is <b>aspirin</b> safe?", "Is aspirin safe?"),
            ("3.txt", "what is fragile x\nmy son has it", "What is fragile X?"),
            ("4.txt", None, "orphan summary"),
            ("5.txt", "orphan question", "   "),
        ],
    )
    df = consumer.read_meqsum(path)
    assert df.to_dict("records") == [
        {
            "file": "1-1.xml.txt",
            "chq": 'who sells cetirizine. I need to know who makes "Cetirizine".',
            "summary": "Who manufactures cetirizine?",
        },
        {"file": "2.txt", "chq": "Is aspirin safe?", "summary": "Is aspirin safe?"},
        {"file": "3.txt", "chq": "what is fragile x my son has it", "summary": "What is fragile X?"},
    ]


def test_meqsum_bad_header_is_one_line_naming_file_and_expected_header(tmp_path):
    path = write_meqsum(tmp_path / "m.xlsx", [("1.txt", "q", "s")], header=("File", "Question", "Summary"))
    with pytest.raises(MedrankError) as e:
        consumer.read_meqsum(path)
    assert str(e.value) == f"{path}: sheet 1 header is [File, Question, Summary], expected [File, CHQ, Summary]"
    not_xlsx = tmp_path / "n.xlsx"
    not_xlsx.write_text("File,CHQ,Summary\n")
    with pytest.raises(MedrankError, match=r"n\.xlsx: unreadable xlsx workbook"):
        consumer.read_meqsum(not_xlsx)


# ---------------------------------------------------------------- LiveQA questions


def _train_liveqa(*questions: tuple[str, str]) -> pd.DataFrame:
    return pd.DataFrame([{"split": "train_liveqa", "qid": qid, "question": q} for qid, q in questions])


def test_liveqa_questions_fields_and_mediqa_qid(tmp_path):
    path = write_liveqa_questions(tmp_path / "q.xml")
    answers = pd.concat(
        [
            # MEDIQA removed the de-identification placeholder; a test question with the same text is no match
            _train_liveqa(
                ("1", "Noonan syndrome. What are the references with noonan syndrome?"), ("2", "celiac disease")
            ),
            pd.DataFrame([{"split": "test", "qid": "9", "question": "celiac disease"}]),
        ]
    )
    df = consumer.read_liveqa_questions(path, answers)
    assert df.iloc[0].to_dict() == {
        "lq_id": "TQ1",
        "number": 1,
        "subject": "Noonan syndrome",
        "message": "What are the references with noonan syndrome? [NAME]",
        "question": "Noonan syndrome. What are the references with noonan syndrome? [NAME]",
        "nist_paraphrase": "Noonan and references?",
        "nlm_summary": "What is Noonan syndrome?",
        "foci": ["noonan syndrome", "polycystic renal disease"],
        "types": ["EFFECT", "INFORMATION"],
        "mediqa_qid": "1",
    }
    assert df.iloc[1][["question", "mediqa_qid"]].tolist() == ["celiac disease", "2"]
    assert df["number"].dtype == "int32"
    assert consumer.read_liveqa_questions(path)["mediqa_qid"].isna().all()


def test_liveqa_questions_wrong_root_or_unsafe_xml_is_an_error(tmp_path):
    wrong = write_liveqa_questions(tmp_path / "w.xml", root="MEDIQA2019-Task3-QA-TestSet")
    with pytest.raises(MedrankError) as e:
        consumer.read_liveqa_questions(wrong)
    assert str(e.value) == (
        f"{wrong}: expected root <{consumer.LIVEQA_ROOT}> (the TREC 2017 LiveQA-Med test questions), "
        "got <MEDIQA2019-Task3-QA-TestSet>"
    )
    dtd = tmp_path / "d.xml"
    dtd.write_text(f'<?xml version="1.0"?><!DOCTYPE x SYSTEM "http://example.org/x.dtd"><{consumer.LIVEQA_ROOT}/>')
    with pytest.raises(MedrankError, match=r"d\.xml: rejected unsafe XML \(DTD\)"):
        consumer.read_liveqa_questions(dtd)
    bad_id = write_liveqa_questions(tmp_path / "b.xml", [("Q7", *LIVEQA_FIXTURE[0][1:])])
    with pytest.raises(MedrankError, match=r"b\.xml: NLM-QUESTION #1: qid='Q7' is not TQ<number>"):
        consumer.read_liveqa_questions(bad_id)


# ---------------------------------------------------------------- LiveQA qrels


def _medquad_table() -> pd.DataFrame:
    rows = [
        # GHR_0000804: the Sec number (2) is not the qid's number (3): found by question + answer in the file
        ("3_GHR_QA/0000804/0000804-1", "What is (are) Foo syndrome ?", "Foo is rare."),
        ("3_GHR_QA/0000804/0000804-3", "What causes Foo syndrome ?", "Mutations in FOO cause it."),
        # NIDDK_0000037 is a copy of 0000027 that the clean table dropped: found in the collection
        ("5_NIDDK_QA/0000027/0000027-2", "What causes Causes of Diabetes ?", "Insulin resistance."),
        # MPlusHealthTopics_0000159: the answer differs (MedQuAD since edited), the question is the file's only one
        (
            "4_MPlus_Health_Topics_QA/0000159/0000159-1",
            "What is (are) Celiac Disease ?",
            "Celiac disease is an immune disease.",
        ),
    ]
    return pd.DataFrame(rows, columns=["qa_id", "question", "answer"])


def test_liveqa_qrels_join_split_and_link_to_medquad(tmp_path):
    answers = {
        "GHR_0000804_Sec2.txt": medquad_csv_answer(
            "What causes Foo syndrome ? (Also called: FS; Foo disease)", "Mutations in <i>FOO</i> cause it."
        ),
        "NIDDK_0000037_Sec2.txt": medquad_csv_answer("What causes Causes of Diabetes ?", "Insulin resistance."),
        "MPlusHealthTopics_0000159_Sec1.txt": medquad_csv_answer(
            "What is (are) Celiac Disease ?", "Celiac disease is an immune disease (older text)."
        ),
        "ADAM_0003147_Sec1.txt": medquad_csv_answer(
            "What is (are) Polycystic ovary syndrome ?", "PCOS is a condition."
        ),
    }
    lines = [
        "1 3-Incomplete GHR_0000804_Sec2.txt",
        "1 4-Excellent GHR_0000804_Sec2.txt",  # the same answer judged twice: both judgments kept
        "1 1-Incorrect ADAM_0003147_Sec1.txt",
        "2 2-Related NIDDK_0000037_Sec2.txt",
        "2 4-Excellent MPlusHealthTopics_0000159_Sec1.txt",
    ]
    zip_path = write_qrels_zip(tmp_path / "q.zip", lines, answers)
    nist = tmp_path / "nist.txt"
    nist.write_text(NIST_FIXTURE, encoding="utf-8")
    df, counts = consumer.read_liveqa_qrels(zip_path, nist, _medquad_table())
    assert counts == {"medquad_judgments": 5, "nist_judgments": 2, "nist_grade_minus2_dropped": 1}
    assert df.to_dict("records") == [
        {
            "number": 1,
            "answer_id": "GHR_0000804_Sec2",
            "grade": 3,
            "source": "medquad",
            "question": "What causes Foo syndrome ?",
            "answer": "Mutations in FOO cause it.",
            "medquad_qa_id": "3_GHR_QA/0000804/0000804-3",
        },
        {
            "number": 1,
            "answer_id": "GHR_0000804_Sec2",
            "grade": 4,
            "source": "medquad",
            "question": "What causes Foo syndrome ?",
            "answer": "Mutations in FOO cause it.",
            "medquad_qa_id": "3_GHR_QA/0000804/0000804-3",
        },
        {
            "number": 1,
            "answer_id": "ADAM_0003147_Sec1",
            "grade": 1,
            "source": "medquad",
            "question": "What is (are) Polycystic ovary syndrome ?",
            "answer": "PCOS is a condition.",
            "medquad_qa_id": None,
        },
        {
            "number": 2,
            "answer_id": "NIDDK_0000037_Sec2",
            "grade": 2,
            "source": "medquad",
            "question": "What causes Causes of Diabetes ?",
            "answer": "Insulin resistance.",
            "medquad_qa_id": "5_NIDDK_QA/0000027/0000027-2",
        },
        {
            "number": 2,
            "answer_id": "MPlusHealthTopics_0000159_Sec1",
            "grade": 4,
            "source": "medquad",
            "question": "What is (are) Celiac Disease ?",
            "answer": "Celiac disease is an immune disease (older text).",
            "medquad_qa_id": "4_MPlus_Health_Topics_QA/0000159/0000159-1",
        },
        {
            "number": 1,
            "answer_id": "nist-1-1",
            "grade": 3,
            "source": "nist",
            "question": None,
            "answer": 'Noonan syndrome is a "genetic" disorder.',
            "medquad_qa_id": None,
        },
        {
            "number": 2,
            "answer_id": "nist-2-3",
            "grade": 1,
            "source": "nist",
            "question": None,
            "answer": "Eat more bread.",
            "medquad_qa_id": None,
        },
    ]
    assert [consumer.answer_id_prefix(a) for a in df["answer_id"]] == [
        "GHR",
        "GHR",
        "ADAM",
        "NIDDK",
        "MPlusHealthTopics",
        "nist",
        "nist",
    ]


@pytest.mark.parametrize(
    "line, message",
    [
        ("1 4-Incorrect NINDS_0000007_Sec1.txt", r":1: label 'Incorrect' does not name grade 4"),
        ("1 5-Excellent NINDS_0000007_Sec1.txt", r":1: grade 5 is not in 1-4"),
        ("1 2-Related GHR_0000001_Sec1.txt", r":1: answer GHR_0000001_Sec1 is not in All-2479-Answers"),
        ("1 Related NINDS_0000007_Sec1.txt", r":1: not '<number> <grade>-<Label> <AnswerID>\.txt'"),
    ],
)
def test_liveqa_qrels_bad_lines_name_file_and_line(tmp_path, line, message):
    zip_path = write_qrels_zip(tmp_path / "q.zip", [line], QRELS_ANSWERS)
    nist = tmp_path / "nist.txt"
    nist.write_text(NIST_FIXTURE)
    with pytest.raises(
        MedrankError, match=r"q\.zip:All-qrels_LiveQAMed2017-TestQuestions_2479_Judged-Answers\.txt" + message
    ):
        consumer.read_liveqa_qrels(zip_path, nist)


# ---------------------------------------------------------------- hygiene


def test_normalise_question():
    assert (
        consumer.normalise_question("  Is it SAFE?? (aspirin) &amp; [NAME]\n ibuprofen…")
        == "is it safe aspirin ibuprofen"
    )
    assert consumer.normalise_question("Ｆｕｌｌ－width") == "full width"  # NFKC
    assert consumer.normalise_question(None) == ""


def _test_tables() -> tuple[pd.DataFrame, pd.DataFrame]:
    answers = pd.DataFrame(
        [
            {
                "split": "test",
                "qid": "1",
                "question": "Glaucoma. Can you mail me patient information about glaucoma, I was recently diagnosed?",
            },
            {
                "split": "test",
                "qid": "1",
                "question": "Glaucoma. Can you mail me patient information about glaucoma, I was recently diagnosed?",
            },
            {"split": "train_liveqa", "qid": "2", "question": "What is a training question about headaches?"},
        ]
    )
    rqe = pd.DataFrame(
        [
            {
                "split": "test",
                "chq": "Atypical pnuemonia.   what is the possibility of atypical pneumonia occurring again this year?",
                "faq": "What is glaucoma ?",
            },
            {"split": "test", "chq": "Diabetes. What are its causes?", "faq": "What causes diabetes ?"},
            {"split": "val", "chq": "Is a validation question ever a key?", "faq": "What is X?"},
        ]
    )
    return answers, rqe


def test_test_question_keys_cover_task2_task3_and_subjectless_variants():
    keys = consumer.test_question_keys(*_test_tables())
    assert keys == {
        "glaucoma can you mail me patient information about glaucoma i was recently diagnosed",
        "can you mail me patient information about glaucoma i was recently diagnosed",
        "atypical pnuemonia what is the possibility of atypical pneumonia occurring again this year",
        "what is the possibility of atypical pneumonia occurring again this year",
        "what is glaucoma",
        "diabetes what are its causes",  # its 4-word remainder is no key: too generic
        "what causes diabetes",
    }


def test_drop_test_overlap_drops_and_counts_copies_only():
    keys = consumer.test_question_keys(*_test_tables())
    pairs = pd.DataFrame(
        {
            "chq": [
                "ATYPICAL PNUEMONIA -- What is the possibility of atypical pneumonia occurring again  THIS year??",  # case/punct/space
                "What is the possibility of atypical pneumonia occurring again this year",  # without its subject
                "Eye trouble. Hi! Can you mail me patient information about glaucoma, I was recently diagnosed? Thanks",  # contains
                "What is glaucoma? My mother has it and I want to know if I can get it too from her",  # FAQ is short: kept
                "Can you mail me patient information about cataract, I was recently diagnosed with it?",  # differs: kept
                "what is glaucoma",  # equal to a test FAQ
                "Cancer. What are its causes?",  # another subject, the same generic remainder: kept
            ],
            "n": range(7),
        }
    )
    kept, dropped = consumer.drop_test_overlap(pairs, "chq", keys)
    assert dropped == 4
    assert kept["n"].tolist() == [3, 4, 6]
    rules = [consumer.overlap_rule(t, keys) for t in pairs["chq"]]
    assert rules == ["exact", "exact", "containment", None, None, "exact", None]


def test_near_duplicate_rule_catches_differently_deidentified_copies():
    body = "i am suffering from optic atrophy which led to loss of vision and inability to see since a fall in 1998"
    test = f"Hello, sex: male, date of birth: 1964, nationality: X, diagnosis: optic nerve atrophy, {body}"
    keys = consumer.question_variants(test)
    copy = f"Hello, sex: male, date of birth: YEAR, nationality: [LOCATION], diagnosis: optic nerve atrophy, {body}"
    other = "Hello, sex: female, date of birth: 1980, diagnosis: migraine, i am suffering from headaches since 2001"
    assert consumer.overlap_rule(copy, keys) == "near_duplicate"  # 29 of 31 words shared
    assert consumer.overlap_rule(other, keys) is None


# ---------------------------------------------------------------- the clean tables (fixture raw folder)


def test_build_tables_adds_consumer_tables_with_hygiene_counts(tmp_path):
    from medrank.data.clean import build_tables
    from tests.helpers.raw import make_raw_dir

    tables, counts = build_tables(make_raw_dir(tmp_path))
    assert tables["meqsum"]["file"].tolist() == ["14348.txt"]  # the copy of the Task 2 test CHQ is gone
    assert counts["hygiene"] == {
        "meqsum": {"pairs": 2, "dropped_test_overlap": 1},
        "liveqa_questions": {"questions": 2, "dropped_test_overlap": 0},
        "liveqa_qrels": {"judgments": 5, "dropped_with_test_overlap_question": 0},
    }
    assert tables["liveqa_questions"]["mediqa_qid"].tolist() == ["1", "2"]
    qrels = tables["liveqa_qrels"]
    assert qrels["medquad_qa_id"].tolist() == [
        "6_NINDS_QA/0000007/0000007-1",
        None,
        "6_NINDS_QA/0000007/0000007-1",
        None,
        None,
    ]
    assert counts["liveqa_qrels"]["medquad_qa_id"] == {
        "ADAM": {"matched": 0, "unmatched": 1},
        "NINDS": {"matched": 2, "unmatched": 0},
    }
    assert counts["liveqa_qrels"]["by_source_grade"] == {
        "medquad/1": 1,
        "medquad/2": 1,
        "medquad/4": 1,
        "nist/1": 1,
        "nist/3": 1,
    }


# ---------------------------------------------------------------- real data (mirror beside the repo)


def test_real_consumer_sources(shared_data):
    from medrank.data import mediqa

    answers = pd.concat([mediqa.read_task3(shared_data / mediqa.TASK3_FILES[s], s) for s in ("train_liveqa", "test")])
    rqe = mediqa.read_rqe(shared_data / mediqa.RQE_FILES["test"], "test")
    keys = consumer.test_question_keys(answers, rqe)

    meqsum = consumer.read_meqsum(shared_data / consumer.MEQSUM_FILE)
    assert len(meqsum) == 1000 and meqsum["file"].is_unique
    assert not meqsum["chq"].str.contains("SUBJECT:|MESSAGE:|&quot;").any()
    _, dropped = consumer.drop_test_overlap(meqsum, "chq", keys)
    assert dropped == 68  # 64 exact (47 on the whole text), 3 contained, 1 near duplicate

    questions = consumer.read_liveqa_questions(shared_data / consumer.LIVEQA_QUESTIONS_FILE, answers)
    assert len(questions) == 104 and questions["number"].tolist() == list(range(1, 105))
    assert (questions["mediqa_qid"] == questions["number"].astype(str)).all()  # every one is train_liveqa's
    # TQ74 is a MEDIQA Task 2 *test* CHQ (pairs 153, 191), though a Task 3 training question
    kept, dropped = consumer.drop_test_overlap(questions, "question", keys)
    assert dropped == 1 and "TQ74" not in set(kept["lq_id"])

    qrels, counts = consumer.read_liveqa_qrels(
        shared_data / consumer.LIVEQA_QRELS_ZIP, shared_data / consumer.LIVEQA_NIST_QRELS
    )
    assert counts == {"medquad_judgments": 2479, "nist_judgments": 674, "nist_grade_minus2_dropped": 18}
    medquad_grades = qrels.loc[qrels["source"] == "medquad", "grade"].value_counts().to_dict()
    assert medquad_grades == {1: 1436, 2: 678, 3: 223, 4: 142}  # SOURCES.md
