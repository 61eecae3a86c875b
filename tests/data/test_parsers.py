"""Raw-data parsers: MEDIQA Task 3/Task 2 XML, MedQuAD tarball, SICK/MedNLI, SQuAD-explorer HTML.

Fixture tests run on the tiny hand-made files in tests/fixtures/clean; the real-data tests check the
published counts on the mirror beside the repo (skipped without it).
"""

import shutil
from pathlib import Path

import pandas as pd
import pytest

from medrank.data import mediqa, medquad, nli, squad
from medrank.data.clean import build_tables, drop_exact_duplicates
from medrank.core.errors import MedrankError
from tests.helpers.raw import make_raw_dir, tar_dir
from tests.helpers import FIXTURES

FIX = FIXTURES / "clean"


@pytest.fixture
def raw_dir(tmp_path) -> Path:
    return make_raw_dir(tmp_path)


# ---------------------------------------------------------------- safe XML


@pytest.mark.parametrize(
    "name, reason",
    [
        ("billion_laughs.xml", "entity declaration"),
        ("external_entity.xml", "entity declaration"),
        ("external_dtd.xml", "DTD"),
    ],
)
def test_unsafe_xml_rejected_with_one_line_naming_the_file(name, reason):
    path = FIX / "unsafe" / name
    with pytest.raises(MedrankError) as e:
        mediqa.read_task3(path, "test")
    msg = str(e.value)
    assert msg == f"{path}: rejected unsafe XML ({reason})"
    assert "\n" not in msg


def test_malformed_xml_names_file_and_line():
    path = FIX / "unsafe" / "truncated.xml"
    with pytest.raises(MedrankError, match=r"truncated\.xml: malformed XML at line 9, column \d+: no element found"):
        mediqa.read_task3(path, "test")


def test_unsafe_xml_inside_medquad_tarball_names_the_member(tmp_path):
    src = tmp_path / "MedQuAD" / "2_GARD_QA"
    src.mkdir(parents=True)
    shutil.copy(FIX / "unsafe" / "billion_laughs.xml", src / "0000001.xml")
    tar_path = tmp_path / "m.tar.gz"
    tar_dir(tmp_path / "MedQuAD", tar_path, "MedQuAD")
    with pytest.raises(MedrankError, match=r"m\.tar\.gz:MedQuAD/2_GARD_QA/0000001\.xml: rejected unsafe XML"):
        medquad.read_medquad(tar_path)


def test_missing_raw_file_is_one_clear_error(tmp_path):
    with pytest.raises(MedrankError, match="raw file not found"):
        mediqa.read_task3(tmp_path / "nope.xml", "val")
    with pytest.raises(MedrankError, match="raw data folder not found"):
        build_tables(tmp_path / "missing")


# ---------------------------------------------------------------- Task 3


def test_task3_rows_ranks_labels_and_cleaning():
    df = mediqa.read_task3(FIX / "raw" / mediqa.TASK3_FILES["train_liveqa"], "train_liveqa")
    assert list(df["aid"]) == ["1_Answer1", "1_Answer2", "1_Answer3", "2_Answer1"]
    assert list(df["answer_pos"]) == [1, 2, 3, 1]
    assert list(df["reference_score"]) == [3, 4, 2, 1]
    assert list(df["label"]) == [1, 1, 0, 0]  # score >= 3
    assert list(df["source"]) == ["mayoclinic", "medlineplus", "unknown", "gard"]
    first = df.iloc[0]
    assert first["question"] == "Noonan syndrome. What are the references with noonan syndrome?"
    assert first["answer"].endswith("there's no family history involved.")  # entities out, nested tags too
    assert "&apos;" not in first["answer"] and "<b>" not in first["answer"]
    assert df.iloc[1]["answer"] == "Noonan syndrome: A geneticist is often needed."
    assert "Updated by:" in df.iloc[1]["answer_raw"]  # raw kept
    assert df.iloc[2]["answer"] == "Blood Clots (Summary): Treatments for blood clots include blood thinners."
    assert df.iloc[3]["answer"] == "Celiac disease damages the small intestine."


def test_task3_test_file_has_null_ranks_and_labels():
    df = mediqa.read_task3(FIX / "raw" / mediqa.TASK3_FILES["test"], "test")
    assert len(df) == 2
    for col in ("system_rank", "reference_rank", "reference_score", "label"):
        assert df[col].isna().all(), col
    assert df.iloc[1]["answer"] == "Keep the rash covered - Washing your hands often"


def test_task3_bad_rank_names_file_and_answer(tmp_path):
    path = tmp_path / "bad.xml"
    path.write_text(
        '<MEDIQA2019-Task3-QA-TestSet><Question QID="1"><QuestionText>q</QuestionText><AnswerList>'
        '<Answer AID="1_Answer1" SystemRank="one"><AnswerURL>#</AnswerURL><AnswerText>a</AnswerText></Answer>'
        "</AnswerList></Question></MEDIQA2019-Task3-QA-TestSet>"
    )
    with pytest.raises(MedrankError, match=r"bad\.xml: answer 1_Answer1: SystemRank='one' is not an integer"):
        mediqa.read_task3(path, "test")


@pytest.mark.parametrize(
    "url, source",
    [
        ("https://www.nlm.nih.gov/medlineplus/ency/article/001656.htm", "medlineplus"),
        ("https://medlineplus.gov/druginfo/meds/a616004.html", "medlineplus"),
        ("https://ghr.nlm.nih.gov/condition/noonan-syndrome", "ghr"),
        ("https://www.mayoclinic.org/diseases-conditions/x", "mayoclinic"),
        ("https://rarediseases.info.nih.gov/diseases/10955/noonan-syndrome", "gard"),
        ("https://www.niddk.nih.gov/health-information/diabetes", "niddk"),
        ("https://nei.nih.gov/health/uveitis/uveitis", "nei"),
        ("https://www.womenshealth.gov/a-z-topics/depression", "womenshealth"),
        ("http://www.nhs.co.uk/conditions/x", "nhs"),
        ("https://WWW.MAYOCLINIC.ORG/x", "mayoclinic"),
        ("#", "unknown"),
        ("", "unknown"),
        (None, "unknown"),
    ],
)
def test_source_of(url, source):
    assert mediqa.source_of(url) == source


# ---------------------------------------------------------------- Task 2


def test_rqe_labels_types_and_unlabelled_test():
    train = mediqa.read_rqe(FIX / "raw" / mediqa.RQE_FILES["train"], "train")
    assert list(train["label"]) == [1, 0, 0]
    assert train.iloc[0]["chq"] == "How should I treat polymenorrhea in a 14-year-old girl?"
    assert train.iloc[1]["chq"] == "Let's give these immunizations. That's right isn't it?"
    assert list(train["pair_type"])[:2] == ["originalQ-shortQ", "originalQ-shortRandQ"]
    val = mediqa.read_rqe(FIX / "raw" / mediqa.RQE_FILES["val"], "val")
    assert val["pair_type"].isna().all() and list(val["label"]) == [0, 1]
    test = mediqa.read_rqe(FIX / "raw" / mediqa.RQE_FILES["test"], "test")
    assert test["label"].isna().all() and len(test) == 1


def test_exact_duplicates_dropped_but_conflicting_keys_stop():
    train = mediqa.read_rqe(FIX / "raw" / mediqa.RQE_FILES["train"], "train")
    deduped, dropped = drop_exact_duplicates(train, "rqe_pairs")
    assert dropped == 1 and list(deduped["pid"]) == ["1", "2"]
    conflicting = train.copy()
    conflicting.loc[2, "faq"] = "something else"
    with pytest.raises(MedrankError, match=r"rqe_pairs: 2 rows share a key \['split', 'pid'\] but differ"):
        drop_exact_duplicates(conflicting, "rqe_pairs")


# ---------------------------------------------------------------- MedQuAD


def test_medquad_reads_both_xml_dialects_from_the_tarball(raw_dir):
    df, counts = medquad.read_medquad(raw_dir / medquad.MEDQUAD_FILE)
    assert counts == {"files": 5, "qa_pairs": 9}
    assert df["qa_id"].is_unique
    ninds = df[df["collection"] == "6_NINDS_QA"].iloc[0]  # the <doc>/<pair> dialect
    assert ninds["focus"] == "Holmes-Adie" and ninds["document_id"] == "0000007"
    assert ninds["question_type"] == "information" and ninds["answer"].startswith("Holmes-Adie syndrome (HAS)")
    # the same qid in two split CancerGov files stays two rows
    cancer = df[df["collection"] == "1_CancerGov_QA"]
    assert set(cancer["qa_id"]) >= {"1_CancerGov_QA/0000013_2_1/0000013_2-1", "1_CancerGov_QA/0000013_2_2/0000013_2-1"}
    first = cancer.iloc[0]
    assert first["answer"] == (
        "Key Points - Male breast cancer is a disease in which malignant cells form in the breast. "
        "- Radiation exposure may increase risk."
    )
    assert "\n" in first["answer_raw"]


def test_medquad_table_drops_and_counts_empty_and_duplicate_pairs(raw_dir):
    tables, counts = build_tables(raw_dir)
    mq = counts["medquad"]
    assert mq["qa_pairs"] == 9
    assert mq["empty_answers_dropped"] == 3  # two ADAM pairs + one answer that was only an agency credit
    assert mq["emptied_by_cleaning"] == 1
    assert mq["duplicate_question_answer_dropped"] == 1  # "Surgery is used." twice for the same question
    assert mq["rows"] == len(tables["medquad"]) == 9 - 3 - 1
    assert (tables["medquad"]["answer"] != "").all()


# ---------------------------------------------------------------- NLI


def test_sick_splits_and_lowercase_labels():
    df = nli.read_sick(FIX / "raw" / nli.SICK_FILE)
    assert list(df["split"]) == ["train", "dev", "test"]
    assert list(df["label"]) == ["neutral", "entailment", "contradiction"]
    assert df.iloc[1]["premise"] == 'A man says "hello"'  # bare quotes survive (no CSV quoting)
    assert set(df["dataset"]) == {"sick"}


def test_sick_bad_label_and_header(tmp_path):
    bad = tmp_path / "SICK.txt"
    bad.write_text((FIX / "raw" / nli.SICK_FILE).read_text().replace("NEUTRAL", "MAYBE"))
    with pytest.raises(MedrankError, match=r"SICK\.txt:2: label 'MAYBE' is not one of"):
        nli.read_sick(bad)
    bad.write_text("a\tb\n1\t2\n")
    with pytest.raises(MedrankError, match="header lacks column"):
        nli.read_sick(bad)


def test_mednli_folder_and_single_file():
    df = nli.read_mednli(FIX / "mednli")
    assert len(df) == 4 and set(df["dataset"]) == {"mednli"}
    assert df.groupby("split").size().to_dict() == {"dev": 1, "train": 3}
    assert set(df["label"]) == {"entailment", "contradiction", "neutral"}
    dev = df[df["split"] == "dev"].iloc[0]
    assert dev["premise"] == "Patient is afebrile." and dev["label"] == "entailment"
    one = nli.read_mednli(FIX / "mednli" / "mli_dev_v1.jsonl")
    assert list(one["pair_id"]) == ["e1f2a3b4-66c7-11e7-9c45-f45c89b91419"]


def test_mednli_errors(tmp_path):
    with pytest.raises(MedrankError, match="licence-gated"):
        nli.read_mednli(tmp_path / "absent")
    bad = tmp_path / "mli_train_v1.jsonl"
    bad.write_text('{"sentence1": "a"}\n')
    with pytest.raises(MedrankError, match=r"mli_train_v1\.jsonl:1: not a MedNLI record \(KeyError"):
        nli.read_mednli(bad)


def test_build_tables_adds_mednli_when_given(raw_dir):
    tables, counts = build_tables(raw_dir, mednli_dir=FIX / "mednli")
    assert set(counts["nli"]["by_split"]) == {"mednli/dev", "mednli/train", "sick/dev", "sick/test", "sick/train"}
    assert len(tables["nli"]) == 3 + 4


# ---------------------------------------------------------------- SQuAD


def test_squad_rebuilds_paragraphs_questions_answers(raw_dir):
    df = squad.read_squad(raw_dir / squad.SQUAD_FILES["train"], "train")
    assert list(df["article"].unique()) == ["Fixture_article", "Second_article"]  # index.html skipped
    assert list(df["question_id"])[:3] == ["Fixture_article#0#0", "Fixture_article#0#1", "Fixture_article#1#0"]
    assert df.iloc[1]["question"] == "How many were missing?"
    assert df.iloc[1]["answers"] == ["18,222 missing"]
    assert df.iloc[2]["answers"] == ['"Great Wenchuan earthquake"']
    assert df.iloc[3]["paragraph"] == "Beyoncé was born in Houston."
    for para, answers in zip(df["paragraph"], df["answers"]):
        assert all(a in para for a in answers)
    dev = squad.read_squad(raw_dir / squad.SQUAD_FILES["dev"], "dev")
    assert [len(a) for a in dev["answers"]] == [3, 2]


def test_squad_max_articles_caps_each_split(raw_dir):
    df = squad.read_squad(raw_dir / squad.SQUAD_FILES["train"], "train", max_articles=1)
    assert set(df["article"]) == {"Fixture_article"} and len(df) == 3


def test_squad_bad_archive(tmp_path):
    bad = tmp_path / "x.tar.gz"
    bad.write_bytes(b"not a tarball")
    with pytest.raises(MedrankError, match=r"x\.tar\.gz: unreadable tar\.gz archive"):
        squad.read_squad(bad, "train")


def test_squad_paragraph_without_pre_is_an_error():
    page = '<div class="para-wrap"><p>no pre here</p></div>'
    with pytest.raises(MedrankError, match="page.html: paragraph block 0 has no <pre>"):
        squad.parse_article(page, "train", "A", "page.html")


# ---------------------------------------------------------------- real data (mirror beside the repo)


@pytest.fixture(scope="module")
def real_tables():
    from tests.conftest import SHARED_DATA

    if not SHARED_DATA.is_dir():
        pytest.skip(f"mirror {SHARED_DATA} not present")
    return build_tables(SHARED_DATA)


def test_real_task3_counts_exact(real_tables):
    tables, counts = real_tables
    got = {s: (c["questions"], c["answers"]) for s, c in counts["answers"]["by_split"].items()}
    assert got == {"train_liveqa": (104, 839), "train_alexa": (104, 862), "val": (25, 234), "test": (150, 1107)}
    assert {s: c["positive"] for s, c in counts["answers"]["by_split"].items()} == {
        "train_liveqa": 229,
        "train_alexa": 405,
        "val": 94,
        "test": None,
    }
    answers = tables["answers"]
    assert (answers["answer"] != "").all()
    assert not answers.duplicated(["split", "aid"]).any()
    assert counts["answers"]["boilerplate_rule_hits"]["adam_credits"] == 348
    assert not answers["answer"].str.contains("Updated by:").any()


def test_real_val_labels_match_official_ground_truth(real_tables):
    from tests.conftest import SHARED_DATA

    gold_path = SHARED_DATA / "mediqa2019/Eval_Scripts/data/QA_validationSet_ground_truth.txt"
    if not gold_path.is_file():
        pytest.skip(f"{gold_path} not present")
    gold = pd.read_csv(gold_path, header=None, names=["qid", "aid", "gold"], dtype=str)
    gold["gold_pos"] = gold.groupby("qid").cumcount()
    val = real_tables[0]["answers"].query("split == 'val'")
    merged = val.merge(gold, on=["qid", "aid"], how="outer", indicator=True)
    assert (merged["_merge"] == "both").all()
    assert (merged["label"].astype(int) == merged["gold"].astype(int)).all()
    # gold lists correct answers in reference-rank order
    for _, g in merged[merged["label"] == 1].groupby("qid"):
        assert list(g.sort_values("gold_pos")["reference_rank"]) == sorted(g["reference_rank"])


def test_real_rqe_medquad_nli_squad_counts(real_tables):
    tables, counts = real_tables
    rqe = counts["rqe_pairs"]["by_split"]
    assert rqe == {
        "train": {"pairs": 8588, "positive": 4655},
        "val": {"pairs": 302, "positive": 129},
        "test": {"pairs": 230, "positive": None},
    }
    mq = counts["medquad"]
    # 47,441 <QAPair> + 16 <pair> in four old-format NINDS files (= the 47,457 of the MedQuAD readme)
    assert (mq["files"], mq["qa_pairs"]) == (11274, 47457)
    assert mq["empty_answers_dropped"] - mq["emptied_by_cleaning"] == 47457 - 16423
    assert mq["rows"] == 16423 - mq["emptied_by_cleaning"] - mq["duplicate_question_answer_dropped"]
    assert tables["medquad"]["qa_id"].is_unique and len(mq["by_collection"]) == 9
    sick = counts["nli"]["by_split"]
    assert {k: v["pairs"] for k, v in sick.items()} == {"sick/train": 4439, "sick/dev": 495, "sick/test": 4906}
    sq = counts["squad"]["by_split"]
    assert (sq["train"]["questions"], sq["train"]["answers"], sq["train"]["articles"]) == (87599, 87599, 442)
    assert (sq["dev"]["questions"], sq["dev"]["answers"], sq["dev"]["articles"]) == (10570, 34726, 48)
    s = tables["squad"]
    assert all(a in p for p, answers in zip(s["paragraph"], s["answers"]) for a in answers)


def test_tarball_read_needs_no_extraction(raw_dir):
    # reading must not write anything beside the tarball
    before = {p for p in raw_dir.rglob("*")}
    medquad.read_medquad(raw_dir / medquad.MEDQUAD_FILE)
    squad.read_squad(raw_dir / squad.SQUAD_FILES["dev"], "dev")
    assert {p for p in raw_dir.rglob("*")} == before
