"""Text cleaner (unit + hypothesis properties) and the `clean` stage end to end on the fixtures."""

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from medrank.data.schemas import TABLES
from medrank.text.clean import BOILERPLATE, TAG_RE, boilerplate_rules_hit, clean_answer, normalize_text
from tests.conftest import error_lines, run_module, write_params
from tests.helpers.raw import FIX, make_raw_dir

# One real (shortened) example per boilerplate rule: raw text -> cleaned text.
RULE_EXAMPLES = {
    "adam_credits": (
        "Couples may want genetic counseling. Updated by: Chad Haldeman-Englert, MD, FACMG, Fullerton Genetics "
        "Center, Asheville, NC. Review provided by VeriMed Healthcare Network. Also reviewed by David Zieve, MD, "
        "MHA, Isla Ogilvie, PhD, and the A.D.A.M. Editorial team.",
        "Couples may want genetic counseling.",
    ),
    "review_date": ("Ear wax (Review Date 5/21/2016): Ear wax protects.", "Ear wax: Ear wax protects."),
    "spanish_link": (
        "- Washing your hands oftenRead about this topic in Spanish. Lea sobre este tema en espanol. Next.",
        "- Washing your hands often Next.",
    ),
    "nav_arrows": (
        "Read more about how FMR1 changes. « Condition Information What causes it? » Because FXTAS occurs",
        "Read more about how FMR1 changes. Because FXTAS occurs",
    ),
    "top_link": ("- Shy, but friendly [top] Next", "- Shy, but friendly Next"),
    "citation_markers": (
        "in adulthood. [8] Studies [8] [9] show a 3-fold [1,2] rate.",
        "in adulthood. Studies show a 3-fold rate.",
    ),
    "gard_view_list": ("- Short neck - View complete list of signs and symptoms... Making a", "- Short neck Making a"),
    "gard_related_diseases": (
        "Treatment depends on symptoms. The following diseases are related to Noonan syndrome. If you have a "
        "question about any of these diseases, you can contact GARD. Noonan syndrome 1 Noonan syndrome 2",
        "Treatment depends on symptoms.",
    ),
    "medlineplus_resources": (
        "- MedlinePlus Encyclopedia: Noonan Syndrome These resources from MedlinePlus offer information about the "
        "diagnosis and management of various health conditions: - Diagnostic Tests - Drug Therapy",
        "- MedlinePlus Encyclopedia: Noonan Syndrome",
    ),
    "trailing_agency": (
        "Treatments include blood thinners.       NIH: National Heart, Lung, and Blood Institute",
        "Treatments include blood thinners.",
    ),
}


def test_every_rule_has_a_real_example():
    assert set(RULE_EXAMPLES) == {rule.name for rule in BOILERPLATE}


@pytest.mark.parametrize("rule", sorted(RULE_EXAMPLES))
def test_boilerplate_rule(rule):
    raw, expected = RULE_EXAMPLES[rule]
    assert rule in boilerplate_rules_hit(normalize_text(raw))
    assert clean_answer(raw) == expected


@pytest.mark.parametrize(
    "text",
    [
        "Report it to the Centers for Disease Control and Prevention",  # agency inside a sentence stays
        "Updated guidance says: take it daily.",  # not the A.D.A.M. credit
        "Take [one] tablet",  # not a footnote
        "Doses < 5 mg and > 2 mg; a<b",  # comparisons are not tags
    ],
)
def test_content_that_looks_like_boilerplate_is_kept(text):
    assert clean_answer(text) == text


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("<p>First</p><p>second</p> <b>bo</b>ld", "First second bold"),
        ("there&apos;s &amp; &#233;t&eacute; &nbsp;x", "there's & été x"),
        ("&amp;lt;b&amp;gt;double&amp;lt;/b&amp;gt;", "double"),  # double-escaped tags go too
        ("ﬁne\u00a0print\u200bhere\u00ad!", "fine print here!"),  # NFKC, zero-width space, soft hyphen
        ("a\t\tb\r\n\n c  ", "a b c"),
        ("<!-- a > comment -->kept", "kept"),
        ("＜b＞wide＜/b＞", "wide"),  # fullwidth brackets become a tag under NFKC: removed as well
        (None, ""),
        ("", ""),
    ],
)
def test_normalize_text(raw, expected):
    assert normalize_text(raw) == expected


# ---------------------------------------------------------------- properties

_PIECES = st.sampled_from(
    [
        "<b>",
        "</p>",
        "<br/>",
        "<",
        ">",
        "&amp;",
        "&lt;",
        "&gt;",
        "&#60;",
        "&",
        ";",
        "＜",
        "＞",
        "ﬁ",
        "\u00a0",
        "\u200b",
        "\n",
        " ",
        "\t",
        "Updated by:",
        "NIH: National Eye Institute",
        "«",
        "»",
        "[1]",
        "(Review Date 1/2/2019)",
        "Centers for Disease Control and Prevention",
        ".",
        "a",
        "Z",
        "é",
        "e\u0301",
        "\x00",
        "\ud800",
    ]
)
_TEXT = st.one_of(st.text(), st.lists(st.one_of(_PIECES, st.text(max_size=3)), max_size=30).map("".join))


def _well_formed(out: str) -> None:
    assert TAG_RE.search(out) is None
    assert out == " ".join(out.split())  # single spaces, no tabs/newlines, stripped
    out.encode("utf-8")  # no lone surrogates left (parquet needs valid UTF-8)


@settings(max_examples=300, deadline=None)
@given(_TEXT)
def test_normalize_text_properties(text):
    out = normalize_text(text)
    _well_formed(out)
    assert normalize_text(out) == out


@settings(max_examples=300, deadline=None)
@given(_TEXT)
def test_clean_answer_properties(text):
    out = clean_answer(text)
    _well_formed(out)
    assert clean_answer(out) == out
    assert boilerplate_rules_hit(out) == []


# ---------------------------------------------------------------- the stage


def _write_params(workdir, **clean):
    write_params(workdir, {"clean": clean})  # the repository's params.yaml, `clean` keys overridden


def _workdir(tmp_path) -> Path:
    """A project folder with the fixture raw data at data/raw (medrank.core.layout.RAW)."""
    work = tmp_path / "work"
    make_raw_dir(work / "data")
    return work


def test_stage_writes_tables_with_schemas_and_counts(tmp_path):
    work = _workdir(tmp_path)
    _write_params(work, squad_max_articles=1, mednli_dir=str(FIX / "mednli"))
    r = run_module("stages.clean", cwd=work)
    assert r.returncode == 0, r.stderr
    for name, schema in TABLES.items():
        table = pq.read_table(work / "data/interim/clean" / f"{name}.parquet")
        assert table.schema.equals(schema, check_metadata=False), name
    counts = json.loads((work / "metrics/data.json").read_text())
    assert counts["answers"]["by_split"]["train_liveqa"] == {"questions": 2, "answers": 4, "positive": 2}
    assert counts["answers"]["by_split"]["test"] == {"questions": 1, "answers": 2, "positive": None}
    assert counts["rqe_pairs"]["duplicates_dropped"] == 1
    assert counts["squad"]["by_split"]["train"]["articles"] == 1 and counts["squad"]["max_articles"] == 1
    assert counts["nli"]["rows"] == 7
    answers = pq.read_table(work / "data/interim/clean/answers.parquet").to_pandas()
    assert len(answers) == 4 + 2 + 2 + 2  # every Task 3 row kept
    assert answers.loc[answers["split"] == "test", "label"].isna().all()
    assert not list(work.glob("data/interim/clean/.*.tmp"))  # atomic writes leave no temp files


@pytest.mark.parametrize(
    "content, message",
    [
        ((FIX / "unsafe" / "billion_laughs.xml").read_bytes(), "rejected unsafe XML (entity declaration)"),
        # a server's 404 page saved in place of the file: was exit 0 with the validation split silently gone
        (
            b"<html><head><title>404 Not Found</title></head><body><h1>Not Found</h1></body></html>",
            "expected root <MEDIQA2019-Task3-QA-ValidationSet> (a MEDIQA 2019 Task 3 val file), got <html>",
        ),
    ],
    ids=["unsafe", "html_404"],
)
def test_stage_bad_raw_data_is_one_error_line(tmp_path, content, message):
    work = _workdir(tmp_path)
    (work / "data/raw/mediqa2019/MEDIQA_Task3_QA/MEDIQA2019-Task3-QA-ValidationSet.xml").write_bytes(content)
    _write_params(work)
    r = run_module("stages.clean", cwd=work)
    assert r.returncode == 2
    assert error_lines(r.stderr) == [
        f"error: data/raw/mediqa2019/MEDIQA_Task3_QA/MEDIQA2019-Task3-QA-ValidationSet.xml: {message}"
    ]
    assert not (work / "data/interim/clean").exists()
