"""Every raw-data parser checks the file is the kind it expects (root element, required elements/attributes,
at least one record, decodable bytes) and stops with one MedrankError line naming the file: expected vs found.

Regression tests for the reliability probes (an HTML 404 page in place of the Task 3 validation XML, an XML
declaring an unknown encoding, a latin-1 SICK.txt), one test per parser rule, and hypothesis families (random
root tags, random byte corruption) that may only ever give a valid parse or a MedrankError.
"""

from __future__ import annotations

import functools
import io
import re
import tarfile
import tempfile
import zipfile
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from medrank.data import clean, consumer, mediqa, medquad, nli, squad
from medrank.data.clean import build_tables
from medrank.core.errors import MedrankError
from tests.helpers.raw import QRELS_ANSWERS, write_liveqa_questions, write_meqsum, write_qrels_zip
from tests.helpers.raw import FIX, make_raw_dir

HTML_404 = b"<html><head><title>404 Not Found</title></head><body><h1>Not Found</h1></body></html>"
VAL = mediqa.TASK3_FILES["val"]


def _one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def _write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return path


# ---------------------------------------------------------------- the probes


def test_html_404_in_place_of_the_validation_xml_stops_build_tables(tmp_path):
    raw = make_raw_dir(tmp_path)
    _write(raw / VAL, HTML_404)
    with pytest.raises(MedrankError) as e:
        build_tables(raw)
    assert _one_line(e) == (
        f"{raw / VAL}: expected root <MEDIQA2019-Task3-QA-ValidationSet> (a MEDIQA 2019 Task 3 val file), got <html>"
    )


def test_xml_declaring_an_unknown_encoding_is_one_line_with_the_byte_offset(tmp_path):
    text = (FIX / "raw" / VAL).read_text(encoding="utf-8").replace('encoding="UTF-8"', 'encoding="x-unknown-9"')
    path = _write(tmp_path / "val.xml", text)
    with pytest.raises(MedrankError) as e:
        mediqa.read_task3(path, "val")
    assert _one_line(e) == f"{path}: unknown encoding 'x-unknown-9' declared at byte 30"


def test_latin1_sick_is_one_line_with_the_byte_offset(tmp_path):
    data = (FIX / "raw" / nli.SICK_FILE).read_bytes()
    at = data.index(b"A group of kids")
    path = _write(tmp_path / "SICK.txt", data[:at] + b"Caf\xe9 " + data[at:])
    with pytest.raises(MedrankError) as e:
        nli.read_sick(path)
    assert _one_line(e) == f"{path}: not UTF-8 text (byte 0xe9 at offset {at + 3}: invalid continuation byte)"


# ---------------------------------------------------------------- XML: the kind of file


def test_another_splits_file_in_place_of_validation_is_refused(tmp_path):
    path = _write(tmp_path / "val.xml", (FIX / "raw" / mediqa.TASK3_FILES["train_alexa"]).read_bytes())
    with pytest.raises(
        MedrankError,
        match=r"expected root <MEDIQA2019-Task3-QA-ValidationSet> .*, got "
        r"<MEDIQA2019-Task3-QA-TrainingSet2-Alexa>$",
    ):
        mediqa.read_task3(path, "val")


def test_rqe_test_root_is_its_own_and_any_task_root_fits_an_unnamed_split(tmp_path):
    rqe_test = FIX / "raw" / mediqa.RQE_FILES["test"]
    assert len(mediqa.read_rqe(rqe_test, "test")) == 1  # <MEDIQA-2019-RQE-Test-Set>, unlike its file name
    assert len(mediqa.read_task3(FIX / "raw" / VAL, "my_split")) == 2
    with pytest.raises(MedrankError, match=r"expected root <MEDIQA2019-Task3-QA-TrainingSet1-LiveQAMed> or .* got <x>"):
        mediqa.read_task3(_write(tmp_path / "x.xml", "<x/>"), "my_split")


_Q = '<Question QID="1"><QuestionText>q</QuestionText><AnswerList>{}</AnswerList></Question>'
_A = '<Answer AID="1_Answer1"{}><AnswerURL>#</AnswerURL><AnswerText>a</AnswerText></Answer>'
_LABELS = ' SystemRank="1" ReferenceRank="1" ReferenceScore="4"'


@pytest.mark.parametrize(
    "split, body, message",
    [
        ("val", "", r"no <Question> elements \(expected at least one in a MEDIQA 2019 Task 3 val file\)"),
        ("test", "<Question><QuestionText>q</QuestionText></Question>", "Question #1 has no QID attribute"),
        (
            "test",
            '<Question QID="1"><AnswerList>' + _A.format("") + "</AnswerList></Question>",
            "Question 1 has no <QuestionText> element",
        ),
        ("test", _Q.format(""), r"Question 1 has no <Answer> \(expected at least one in <AnswerList>\)"),
        (
            "test",
            '<Question QID="1"><QuestionText>q</QuestionText></Question>',
            r"Question 1 has no <Answer> \(expected at least one in <AnswerList>\)",
        ),
        (
            "test",
            _Q.format('<Answer AID="1_Answer1"><AnswerURL>#</AnswerURL></Answer>'),
            "answer 1_Answer1 has no <AnswerText> element",
        ),
        ("test", _Q.format("<Answer><AnswerText>a</AnswerText></Answer>"), "Question 1 answer #1 has no AID attribute"),
        (
            "val",
            _Q.format(_A.format(' ReferenceRank="1"')),
            "answer 1_Answer1 of labelled split 'val' has no ReferenceScore attribute",
        ),
        (
            "train_alexa",
            _Q.format(_A.format(' ReferenceScore="4"')),
            "answer 1_Answer1 of labelled split 'train_alexa' has no ReferenceRank attribute",
        ),
    ],
)
def test_task3_required_elements_and_attributes(tmp_path, split, body, message):
    _assert_refused(
        tmp_path / "t3.xml", mediqa.TASK3_ROOTS[split], body, lambda p: mediqa.read_task3(p, split), message
    )


def _assert_refused(path, root: str, body: str, read, message: str) -> None:
    """`<root>body</root>` written to `path` and read: exactly one MedrankError line, `path: message`."""
    _refused(path, f"<{root}>{body}</{root}>", read, message)


def _refused(path: Path, data: bytes | str, read, message: str, sep: str = ": ") -> None:
    """`data` written to `path` and read: exactly one MedrankError line matching `path<sep>message`."""
    _write(path, data)
    with pytest.raises(MedrankError) as e:
        read(path)
    assert re.fullmatch(f"{re.escape(str(path))}{sep}{message}", _one_line(e))


def test_task3_minimal_labelled_file_parses(tmp_path):
    root = mediqa.TASK3_ROOTS["val"]
    path = _write(tmp_path / "t3.xml", f"<{root}>{_Q.format(_A.format(_LABELS))}</{root}>")
    df = mediqa.read_task3(path, "val")
    assert list(df["label"]) == [1] and list(df["aid"]) == ["1_Answer1"]


@pytest.mark.parametrize(
    "split, body, message",
    [
        ("test", "", r"no <pair> elements \(expected at least one in a MEDIQA 2019 Task 2 RQE test file\)"),
        ("test", "<pair><chq>a</chq><faq>b</faq></pair>", "pair #1 has no pid attribute"),
        ("test", '<pair pid="1"><chq>a</chq></pair>', "pair 1 has no <faq> element"),
        ("test", '<pair pid="1"><faq>b</faq></pair>', "pair 1 has no <chq> element"),
        (
            "train",
            '<pair pid="1"><chq>a</chq><faq>b</faq></pair>',
            "pair 1 of labelled split 'train' has no value attribute",
        ),
        (
            "val",
            '<pair pid="1" value="maybe"><chq>a</chq><faq>b</faq></pair>',
            "pair 1: value='maybe' is not true/false",
        ),
    ],
)
def test_rqe_required_elements_and_attributes(tmp_path, split, body, message):
    _assert_refused(tmp_path / "rqe.xml", mediqa.RQE_ROOTS[split], body, lambda p: mediqa.read_rqe(p, split), message)


@pytest.mark.parametrize(
    "data, message",
    [
        (b"<a>\xe9t\xe9</a>", r"not UTF-8 text \(byte 0xe9 at offset 3: invalid continuation byte\)"),
        (b'<?xml version="1.0" encoding="us-ascii"?><a>\xe9</a>', r"not us-ascii text \(byte 0xe9 at offset 44: .*\)"),
        (b'<?xml version="1.0" encoding="utf-32"?><a/>', r"not utf-32 text \(byte 0x3c at offset 0: .*\)"),
        (
            b'<?xml version="1.0" encoding="shift_jis"?><a/>',
            r"XML encoding 'shift_jis' \(declared at byte 30\) not supported by the parser \(.*\)",
        ),
        (b"<?xml version='1.0' encoding='rot13'?><a/>", "unknown encoding 'rot13' declared at byte 30"),
        (b'<?xml version="1.0" encoding=""?><a/>', "unknown encoding '' declared at byte 30"),
    ],
)
def test_xml_encoding_problems_are_one_line(data, message):
    with pytest.raises(MedrankError) as e:
        mediqa.parse_xml(data, "f.xml")
    assert re.fullmatch(f"f\\.xml: {message}", _one_line(e))


@pytest.mark.parametrize(
    "data",
    [
        b'<?xml version="1.0" encoding="ISO-8859-1"?><a>\xe9</a>',
        b'<?xml version="1.0" encoding="windows-1252"?><a>\xe9</a>',
        b"\xef\xbb\xbf<a>\xc3\xa9</a>",
        '<?xml version="1.0" encoding="UTF-16"?><a>é</a>'.encode("utf-16"),
    ],
)
def test_xml_in_declared_single_byte_or_bom_encodings_still_parses(data):
    assert mediqa.parse_xml(data, "f.xml").text == "é"


# ---------------------------------------------------------------- MedQuAD


def _medquad_tar(tmp_path: Path, files: dict[str, bytes | str]) -> Path:
    path = tmp_path / "m.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            data = data.encode("utf-8") if isinstance(data, str) else data
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


_DOC = '<Document id="1"><Focus>f</Focus><QAPairs><QAPair pid="1"><Question qid="1-1">q?</Question>{}</QAPair></QAPairs></Document>'


@pytest.mark.parametrize(
    "files, message",
    [
        (
            {"MedQuAD/1_X/1.xml": HTML_404},
            r"m\.tar\.gz:MedQuAD/1_X/1\.xml: expected root <Document> or <doc> or <DiseaseFile> \(a MedQuAD document\), got <html>",
        ),
        (
            {"MedQuAD/1_X/1.xml": '<Document id="1"><Focus>f</Focus></Document>'},
            r"m\.tar\.gz:MedQuAD/1_X/1\.xml: <Document> has no <QAPairs> element \(expected in a MedQuAD document\)",
        ),
        ({"MedQuAD/1_X/1.xml": _DOC.format("")}, r"m\.tar\.gz:MedQuAD/1_X/1\.xml: QA pair #1 has no Answer element"),
        (
            {"MedQuAD/readme.txt": "not QA"},
            r"m\.tar\.gz: no MedQuAD QA pairs \(expected <collection>/<file>\.xml documents\), found 0 documents",
        ),
        (
            {"MedQuAD/1_X/1.xml": b'<Document id="1"><Focus>\xff</Focus></Document>'},
            r"m\.tar\.gz:MedQuAD/1_X/1\.xml: not UTF-8 text \(byte 0xff at offset 24: invalid start byte\)",
        ),
    ],
)
def test_medquad_document_kind(tmp_path, files, message):
    with pytest.raises(MedrankError) as e:
        medquad.read_medquad(_medquad_tar(tmp_path, files))
    assert re.fullmatch(f".*{message}", _one_line(e))


def test_medquad_document_without_pairs_is_allowed_but_not_an_archive_without_any(tmp_path):
    empty_doc = '<Document id="2"><Focus>f</Focus><QAPairs/></Document>'  # as six real NIDDK files
    df, counts = medquad.read_medquad(
        _medquad_tar(tmp_path, {"MedQuAD/1_X/1.xml": _DOC.format("<Answer>a</Answer>"), "MedQuAD/1_X/2.xml": empty_doc})
    )
    assert counts == {"files": 2, "qa_pairs": 1}
    with pytest.raises(MedrankError, match="no MedQuAD QA pairs .* found 1 documents"):
        medquad.read_medquad(_medquad_tar(tmp_path, {"MedQuAD/1_X/2.xml": empty_doc}))


# ---------------------------------------------------------------- SICK, MedNLI


@pytest.mark.parametrize(
    "text, message",
    [
        (HTML_404.decode(), r"header lacks column\(s\) pair_ID, .*, SemEval_set \(expected SICK's\), got '<html>.*'"),
        ("", r"header lacks column\(s\) pair_ID, .* got '\(empty file\)'"),
        ("pair_ID\tsentence_A\tsentence_B\tentailment_label\tSemEval_set\r\n", r"no SICK pairs after the header .*"),
        (
            "pair_ID\tsentence_A\tsentence_B\tentailment_label\tSemEval_set\n1\ta\tb\tNEUTRAL\n",
            r"2: 4 tab-separated fields, expected 5 as in the header",
        ),
        (
            "pair_ID\tsentence_A\tsentence_B\tentailment_label\tSemEval_set\n\n1\ta\tb\tNEUTRAL\tTRAIN\tx\n",
            r"3: 6 tab-separated fields, expected 5 as in the header",
        ),
    ],
)
def test_sick_kind(tmp_path, text, message):
    _refused(tmp_path / "SICK.txt", text, nli.read_sick, message, sep=":? ?")


def test_sick_with_a_utf8_bom_parses(tmp_path):
    path = _write(tmp_path / "SICK.txt", b"\xef\xbb\xbf" + (FIX / "raw" / nli.SICK_FILE).read_bytes())
    assert len(nli.read_sick(path)) == 3


@pytest.mark.parametrize(
    "data, message",
    [
        (b"\n\n", r"no MedNLI records \(expected JSON lines with sentence1, sentence2, gold_label\)"),
        (b'{"sentence1": "a\xe9"}\n', r"not UTF-8 text \(byte 0xe9 at offset 16: .*\)"),
        (
            b'{"sentence1": 1, "sentence2": "b", "gold_label": "neutral", "pairID": 1}\n',
            r"1: not a MedNLI record \(sentence1, sentence2, gold_label must be strings\)",
        ),
        (b"[1, 2]\n", r"1: not a MedNLI record \(TypeError: .*\)"),
    ],
)
def test_mednli_kind(tmp_path, data, message):
    _refused(tmp_path / "mli_dev_v1.jsonl", data, nli.read_mednli, message, sep=":? ?")


# ---------------------------------------------------------------- SQuAD


@pytest.mark.parametrize(
    "files, message",
    [
        (
            {"explore/1.1/dev/A.html": HTML_404},
            r"x\.tar\.gz:explore/1\.1/dev/A\.html: not a SQuAD-explorer article page \(expected <div class=\"para-wrap\"> "
            r"paragraph blocks, found none\)",
        ),
        (
            {"explore/1.1/dev/index.html": HTML_404},
            r"x\.tar\.gz: no SQuAD questions \(expected SQuAD-explorer <article>\.html pages in the archive\)",
        ),
        (
            {"explore/1.1/dev/A.html": b'<div class="para-wrap"><pre>caf\xe9</pre></div>'},
            r"x\.tar\.gz:explore/1\.1/dev/A\.html: not UTF-8 text \(byte 0xe9 at offset 31: .*\)",
        ),
    ],
)
def test_squad_page_kind(tmp_path, files, message):
    path = _medquad_tar(tmp_path, files).rename(tmp_path / "x.tar.gz")
    with pytest.raises(MedrankError) as e:
        squad.read_squad(path, "dev")
    assert re.fullmatch(f".*{message}", _one_line(e))


# ---------------------------------------------------------------- consumer sources


def test_meqsum_with_a_header_but_no_pairs(tmp_path):
    path = write_meqsum(tmp_path / "m.xlsx", [("1.txt", None, "orphan summary")])
    with pytest.raises(MedrankError, match=r"m\.xlsx: no MeQSum pairs \(expected rows with a CHQ and a Summary"):
        consumer.read_meqsum(path)


def test_meqsum_with_a_corrupt_sheet_is_one_line(tmp_path):
    path = write_meqsum(tmp_path / "m.xlsx", [("1.txt", "a question", "a summary")])
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("xl/worksheets/sheet1.xml")
    data = bytearray(path.read_bytes())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)  # the member's deflate stream
    data[start : start + 8] = b"\xff" * 8
    path.write_bytes(bytes(data))
    with pytest.raises(MedrankError, match=r"m\.xlsx: unreadable xlsx workbook \(error: Error -3 while decompressing"):
        consumer.read_meqsum(path)


def test_liveqa_question_kind(tmp_path):
    root = consumer.LIVEQA_ROOT
    path = _write(
        tmp_path / "q.xml", f'<{root}><NLM-QUESTION qid="TQ1"><NLM-Summary>s</NLM-Summary></NLM-QUESTION></{root}>'
    )
    with pytest.raises(MedrankError, match=r"q\.xml: NLM-QUESTION TQ1 has no <Original-Question> element$"):
        consumer.read_liveqa_questions(path)
    with pytest.raises(MedrankError, match=r"q\.xml: no <NLM-QUESTION> elements$"):
        consumer.read_liveqa_questions(_write(path, f"<{root}/>"))
    with pytest.raises(MedrankError, match=rf"q\.xml: expected root <{root}> \(.*\), got <html>$"):
        consumer.read_liveqa_questions(_write(path, HTML_404))


def test_qrels_undecodable_or_empty_files(tmp_path):
    nist = _write(tmp_path / "nist.txt", "1 3 An answer.\n")
    zip_path = write_qrels_zip(tmp_path / "q.zip", ["1 4-Excellent NINDS_0000007_Sec1.txt"], QRELS_ANSWERS)
    assert len(consumer.read_liveqa_qrels(zip_path, nist)[0]) == 2
    with pytest.raises(MedrankError, match=r"nist\.txt: not UTF-8 text \(byte 0xe9 at offset 7: .*\)$"):
        consumer.read_liveqa_qrels(zip_path, _write(nist, b"1 3 Caf\xe9\n"))
    with pytest.raises(
        MedrankError, match=r"nist\.txt: no judgments \(expected '<number> <grade> <answer text>' lines\)$"
    ):
        consumer.read_liveqa_qrels(zip_path, _write(nist, "\n"))
    empty = write_qrels_zip(tmp_path / "e.zip", [""], QRELS_ANSWERS)
    with pytest.raises(MedrankError, match=r"e\.zip:All-qrels_.*\.txt: no judgments"):
        consumer.read_liveqa_qrels(empty, nist)
    latin1 = tmp_path / "l.zip"
    with zipfile.ZipFile(latin1, "w") as z:
        z.writestr("a/qrels.txt", "1 4-Excellent X_1_Sec1.txt\n")
        z.writestr("a/answers.csv", b"AnswerID,Answer\r\nX_1_Sec1.txt,caf\xe9\r\n")
    with pytest.raises(MedrankError, match=r"l\.zip:answers\.csv: not UTF-8 text \(byte 0xe9 at offset 33: .*\)$"):
        consumer.read_liveqa_qrels(latin1, nist)


# ---------------------------------------------------------------- build_tables: every split present


@pytest.mark.parametrize(
    "reader, split, message",
    [
        ("read_task3", "val", "answers split 'val' has no questions, expected > 0"),
        ("read_rqe", "test", "rqe_pairs split 'test' has no pairs, expected > 0"),
    ],
)
def test_build_tables_needs_every_labelled_and_test_split(tmp_path, monkeypatch, reader, split, message):
    raw = make_raw_dir(tmp_path)
    parse = getattr(mediqa, reader)

    def without_split(path, s):  # a parser that let an empty split through
        df = parse(path, s)
        return df.iloc[0:0] if s == split else df

    monkeypatch.setattr(clean.mediqa, reader, without_split)
    files = mediqa.TASK3_FILES if reader == "read_task3" else mediqa.RQE_FILES
    with pytest.raises(MedrankError) as e:
        build_tables(raw)
    assert _one_line(e) == f"{raw / files[split]}: {message}"


# ---------------------------------------------------------------- properties

_XML_NAME = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.-]{0,24}", fullmatch=True)
_XML_READERS = [
    *[
        (mediqa.read_task3, split, FIX / "raw" / rel, mediqa.TASK3_ROOTS[split])
        for split, rel in mediqa.TASK3_FILES.items()
    ],
    *[(mediqa.read_rqe, split, FIX / "raw" / rel, mediqa.RQE_ROOTS[split]) for split, rel in mediqa.RQE_FILES.items()],
]
_SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize(
    "reader, split, fixture, root", _XML_READERS, ids=[f"{r.__name__}-{s}" for r, s, *_ in _XML_READERS]
)
@_SETTINGS
@given(tag=_XML_NAME)
def test_any_other_root_tag_is_refused_naming_it(tmp_path, reader, split, fixture, root, tag):
    text = fixture.read_text(encoding="utf-8").replace(f"<{root}>", f"<{tag}>").replace(f"</{root}>", f"</{tag}>")
    path = _write(tmp_path / "f.xml", text)
    if tag == root:
        assert len(reader(path, split)) > 0
        return
    with pytest.raises(MedrankError) as e:
        reader(path, split)
    assert _one_line(e).endswith(f", got <{tag}>")


def _parse_or_medrank_error(parse, path: Path) -> None:
    """The contract: a table, or one MedrankError line naming the file; never anything else."""
    try:
        out = parse(path)
    except MedrankError as e:
        assert "\n" not in str(e) and str(path) in str(e)
    else:
        assert isinstance(out, pd.DataFrame)


_CORRUPTIBLE = {
    "task3_val": (FIX / "raw" / VAL, lambda p: mediqa.read_task3(p, "val")),
    "rqe_train": (FIX / "raw" / mediqa.RQE_FILES["train"], lambda p: mediqa.read_rqe(p, "train")),
    "sick": (FIX / "raw" / nli.SICK_FILE, nli.read_sick),
    "mednli": (FIX / "mednli" / "mli_train_v1.jsonl", nli.read_mednli),
    "medquad_doc": (
        FIX / "medquad_src/MedQuAD/6_NINDS_QA/0000007.xml",
        lambda p: pd.DataFrame(medquad.parse_document(mediqa.parse_xml(p.read_bytes(), p), "6_NINDS_QA", "1", str(p))),
    ),
    # written by _fixture_bytes
    "liveqa_questions": (Path("liveqa.xml"), consumer.read_liveqa_questions),
    "meqsum": (Path("meqsum.xlsx"), consumer.read_meqsum),
}


@functools.cache  # once: an xlsx holds its creation time, and hypothesis needs the same bytes every example
def _fixture_bytes(kind: str) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        if kind == "liveqa_questions":
            return write_liveqa_questions(Path(tmp) / "fixture.xml").read_bytes()
        if kind == "meqsum":
            return write_meqsum(Path(tmp) / "fixture.xlsx", [("1.txt", "a question", "a summary")]).read_bytes()
    return _CORRUPTIBLE[kind][0].read_bytes()


@st.composite
def _corrupted(draw, data: bytes) -> bytes:
    """`data` with a random slice replaced by random bytes (or random bytes altogether)."""
    if draw(st.booleans()) and draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=200))
    start = draw(st.integers(0, len(data)))
    end = draw(st.integers(start, min(len(data), start + 40)))
    return data[:start] + draw(st.binary(max_size=12)) + data[end:]


@pytest.mark.parametrize("kind", sorted(_CORRUPTIBLE))
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_corrupted_files_parse_or_give_one_medrank_error(tmp_path, kind, data):
    fixture, parse = _CORRUPTIBLE[kind]
    path = _write(tmp_path / fixture.name, data.draw(_corrupted(_fixture_bytes(kind))))
    _parse_or_medrank_error(parse, path)


@_SETTINGS
@given(
    decl=st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=16), body=st.binary(max_size=20)
)
def test_any_declared_encoding_parses_or_gives_one_medrank_error(decl, body):
    data = b'<?xml version="1.0" encoding="' + decl.replace('"', "").encode() + b'"?><a>' + body + b"</a>"
    try:
        mediqa.parse_xml(data, "f.xml")
    except MedrankError as e:
        assert "\n" not in str(e) and str(e).startswith("f.xml: ")
