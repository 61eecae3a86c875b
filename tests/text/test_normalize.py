"""Normalize stage: phrase matcher, abbreviations, concept vocabularies, sentences, coreference, tables."""

from __future__ import annotations

import csv
import json
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from medrank.core import layout
from medrank.data.schemas import ANSWERS, LIVEQA_QRELS, MEDQUAD, NORMALIZED_TABLES, RQE_PAIRS
from medrank.core.errors import MedrankError
from medrank.core.io import write_parquet
from medrank.params import NormalizeParams, load_params
from medrank.text.abbreviations import AbbreviationExpander, default_list_path, load_abbreviations
from medrank.text.concepts import (
    ConceptNormalizer,
    VocabularyFilter,
    disease_ontology_entries,
    iter_disease_ontology,
    load_stoplist,
    umls_entries,
)
from medrank.text.coref import Chain, Mention, make_coref, resolve, stanza_pipeline
from medrank.text.matcher import PhraseMatcher, tokens
from medrank.text.normalize import TABLES, TextNormalizer, build_normalizer, normalize_table
from medrank.text.sentences import PysbdSplitter, cut, make_splitter, split_rule
from tests.conftest import write_params
from tests.helpers import FIXTURES

FIX = FIXTURES / "normalize"
SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _nows(s: str) -> str:
    return "".join(s.split())


# ---------------------------------------------------------------- phrase matcher


def test_matcher_leftmost_longest_whole_tokens():
    m = PhraseMatcher(
        [("heart attack", "myocardial infarction"), ("heart", "cardiac organ"), ("ms", "multiple sclerosis")]
    )
    text = "A heart attack, items and Heart  attack; heart-attack hurts the heart"
    out, n = m.replace(text)
    # "ms" inside "items" is not a token; "heart-attack" has an extra "-" token; whitespace runs are ignored
    assert out == (
        "A myocardial infarction, items and Myocardial infarction; cardiac organ-attack hurts the cardiac organ"
    )
    assert n == 4


def test_matcher_preferred_name_protects_and_ambiguity_drops():
    entries = [
        ("cold", "common cold"),
        ("common cold", "common cold"),  # the preferred name itself
        ("cold sore", "herpes labialis"),
        ("ALS", "one"),
        ("als", "two"),  # same key case-insensitively, different targets: dropped
    ]
    m = PhraseMatcher(entries)
    assert m.report.n_ambiguous == 1
    assert m.replace("a common cold, a cold sore, a cold") == ("a common cold, a herpes labialis, a common cold", 2)
    assert m.replace("ALS and als") == ("ALS and als", 0)


def test_matcher_case_sensitive_and_hyphen_rule():
    m = PhraseMatcher([("MI", "myocardial infarction")], case_sensitive=True, skip_hyphenated=True)
    assert m.replace("MI, mi, Mi, MI-o-kar-DI-tis, anti-MI and (MI).") == (
        "myocardial infarction, mi, Mi, MI-o-kar-DI-tis, anti-MI and (myocardial infarction).",
        2,
    )


def test_matcher_survives_marker_characters_and_unicode():
    m = PhraseMatcher([("flu", "influenza")])
    text = "İstanbul \ufdd0flu\ufdd1 FLU 🤒 flu"
    out, n = m.replace(text)
    assert out == "İstanbul \ufdd0influenza\ufdd1 Influenza 🤒 influenza" and n == 3


def _reference(text: str, phrases: dict[tuple[str, ...], str]) -> list[tuple[int, int, str]]:
    """Brute-force leftmost-longest over tokens (what the automaton must reproduce)."""
    import re

    spans = [m.span() for m in re.finditer(r"\w+|[^\w\s]", text)]
    toks = [text[a:b].lower() for a, b in spans]
    longest = max(len(k) for k in phrases)
    out, i = [], 0
    while i < len(toks):
        for n in range(min(longest, len(toks) - i), 0, -1):
            rep = phrases.get(tuple(toks[i : i + n]))
            if rep is not None:
                if rep != " ".join(toks[i : i + n]):
                    out.append((spans[i][0], spans[i + n - 1][1], rep))
                i += n
                break
        else:
            i += 1
    return out


_WORDS = ["a", "b", "c", "d", "x", "-", ",", "A", "B"]
_PHRASES = {
    ("a",): "ONE",
    ("a", "b"): "TWO",
    ("a", "b", "c", "d"): "FOUR",
    ("b", "c"): "b c",  # a preferred name: matched, left alone
    ("c", "-", "d"): "CD",
    ("d",): "DEE",
}


@FAST
@given(
    st.lists(st.sampled_from(_WORDS), max_size=30),
    st.lists(st.sampled_from([" ", "  ", "\n", ""]), min_size=30, max_size=30),
)
def test_matcher_matches_bruteforce_reference(words, seps):
    # join without a separator only where that keeps the tokens apart (punctuation)
    parts = []
    for w, s in zip(words, seps):
        if parts and not s and (w[0].isalnum() and parts[-1][-1].isalnum()):
            s = " "
        parts.append(s + w)
    text = "".join(parts)
    m = PhraseMatcher([(" ".join(k), v) for k, v in _PHRASES.items()])
    got = [(x.start, x.end, x.replacement) for x in m.find(text)]
    assert got == _reference(text, _PHRASES)


# ---------------------------------------------------------------- abbreviations


def test_shipped_abbreviation_list_is_consistent():
    abbr = load_abbreviations()
    assert len(abbr) > 200
    assert abbr["COPD"] == "chronic obstructive pulmonary disease"
    # stop-word-like entries the paper warns about are not there
    for bad in ["IS", "BE", "ON", "IV", "DO", "US", "ALL", "TEN", "MEN"]:
        assert bad not in abbr
    # expansions never contain a listed abbreviation, so expanding twice changes nothing
    for a, long_form in abbr.items():
        assert not set(tokens(long_form)) & set(abbr), (a, long_form)


def test_shipped_abbreviations_come_from_the_source_list():
    src = SHARED / "abbreviations" / "wikipedia_abbreviation_database.csv"
    if not src.exists():
        pytest.skip(f"source list not found at {src}")
    with open(src, encoding="utf-8") as f:
        known = {row["abr"].strip() for row in csv.DictReader(f)}
    missing = set(load_abbreviations()) - known
    assert not missing


def test_abbreviation_expansion_rules():
    exp = AbbreviationExpander(
        {"COPD": "chronic obstructive pulmonary disease", "CT": "computed tomography", "HPV": "human papillomavirus"}
    )
    # case-sensitive; an expansion that starts a sentence is capitalised
    assert (
        exp.expand("COPD and copd. Then COPD")[0]
        == "Chronic obstructive pulmonary disease and copd. Then chronic obstructive pulmonary disease"
    )
    # a definition in the text is not duplicated, either way round
    assert exp.expand("Chronic obstructive pulmonary disease (COPD) is common.") == (
        "Chronic obstructive pulmonary disease is common.",
        1,
    )
    assert exp.expand("HPV (human papillomavirus) causes warts")[0] == "Human papillomavirus causes warts"
    assert exp.expand("a CT scan (CT) and CTs")[0] == "a computed tomography scan (computed tomography) and CTs"


def test_abbreviation_list_errors(tmp_path):
    p = tmp_path / "a.tsv"
    p.write_text("# c\nAB\talpha beta\nAB\tsomething else\n", encoding="utf-8")
    with pytest.raises(MedrankError, match="listed twice"):
        load_abbreviations(p)
    p.write_text("AB only-one-column\n", encoding="utf-8")
    with pytest.raises(MedrankError, match="expected"):
        load_abbreviations(p)
    with pytest.raises(MedrankError, match="not found"):
        load_abbreviations(tmp_path / "missing.tsv")
    assert default_list_path().exists()


# ---------------------------------------------------------------- concept vocabularies


def _filter(**kw) -> VocabularyFilter:
    return VocabularyFilter(stoplist=load_stoplist(), **kw)


def test_disease_ontology_parser_and_filters():
    terms = dict(iter_disease_ontology(FIX / "doid_tiny.obo"))
    assert "obsolete heart disease" not in terms  # is_obsolete
    assert terms["myocardial infarction"] == ["heart attack", "MI"]  # EXACT only
    entries = set(disease_ontology_entries(FIX / "doid_tiny.obo", _filter(min_chars=3)))
    assert ("heart attack", "myocardial infarction") in entries
    assert ("Bronchial inflammation", "bronchitis") in entries  # SNOMED "(disorder)" tag stripped
    assert ("flu", "influenza") in entries
    assert not any(s == "MI" for s, _ in entries)  # acronyms are left to the abbreviation list
    assert not any(s == "chronic bronchitis" for s, _ in entries)  # narrower than its target
    assert not any(s == "stroke" for s, _ in entries)  # curated stoplist
    assert not any(s.startswith("head cold") for s, _ in entries)  # index-style string with a comma
    assert not any(s == "cold" for s, _ in entries)  # curated stoplist: "cold weather" is not a disease
    norm = ConceptNormalizer(entries)
    assert norm.normalize("Heart attack or high blood pressure? Not a common cold.") == (
        "Myocardial infarction or hypertension? Not a common cold.",
        2,
    )


def test_disease_ontology_missing_file(tmp_path):
    with pytest.raises(MedrankError, match="not found"):
        disease_ontology_entries(tmp_path / "nope.obo", _filter())
    bad = tmp_path / "bad.obo"
    bad.write_text("format-version: 1.2\n", encoding="utf-8")
    with pytest.raises(MedrankError, match="no \\[Term\\]"):
        disease_ontology_entries(bad, _filter())


def test_umls_mrconso_loader():
    entries = set(umls_entries(FIX / "MRCONSO_tiny.RRF", _filter(min_chars=3)))
    names = {n for _, n in entries}
    assert names == {"Myocardial Infarction", "Influenza", "Hypertensive disease"}  # English preferred names only
    assert ("Heart Attack", "Myocardial Infarction") in entries
    assert ("myocardial infarct", "Myocardial Infarction") in entries
    assert ("Flu", "Influenza") in entries
    surfaces = {s for s, _ in entries}
    assert "Infarctus du myocarde" not in surfaces  # not English
    assert "cardiac infarction obsolete" not in surfaces  # SUPPRESS=O
    assert "Infarction, Myocardial" not in surfaces  # inverted index form
    only_msh = {s for s, _ in umls_entries(FIX / "MRCONSO_tiny.RRF", _filter(min_chars=3), sources=["MSH"])}
    assert "grippe" not in only_msh and "Flu" in only_msh
    norm = ConceptNormalizer(entries)
    assert norm.normalize("a heart attack and the flu")[0] == "a Myocardial Infarction and the Influenza"


def test_the_saved_step_normalizes_the_same_and_never_copies_umls(tmp_path):
    """The normalize step saved and loaded back normalizes as the fitted one; with a licensed UMLS file the concept
    entries stay out of models/ (the step records the path and re-reads the user's file at load)."""
    from medrank.params import Params
    from medrank.steps.normalize_step import NormalizeStep

    text = "The flu and a heart attack (MI) raise BP."
    umls = Params(normalize={"umls_mrconso": str(FIX / "MRCONSO_tiny.RRF"), "min_term_chars": 3})
    fitted = NormalizeStep.fit(umls)
    fitted.save(tmp_path / "models")
    saved = tmp_path / "models" / "steps" / "normalize"
    assert (saved / "abbreviations.parquet").is_file() and not (saved / "concepts.parquet").exists()
    loaded = NormalizeStep.load(tmp_path / "models")
    assert loaded.normalizer(text) == fitted.normalizer(text) and "Influenza" in loaded.normalizer(text).text
    # an open vocabulary (here: none but the abbreviations) is saved whole and needs no file at load
    plain = NormalizeStep.fit(Params(normalize={"preferred_names": False}))
    plain.save(tmp_path / "plain")
    assert NormalizeStep.load(tmp_path / "plain").normalizer(text) == plain.normalizer(text)


def test_umls_loader_errors(tmp_path):
    with pytest.raises(MedrankError, match="not found"):
        umls_entries(tmp_path / "MRCONSO.RRF", _filter())
    bad = tmp_path / "MRCONSO.RRF"
    bad.write_text("C1|ENG|P\n", encoding="utf-8")
    with pytest.raises(MedrankError, match="18"):
        umls_entries(bad, _filter())


def test_umls_param_switches_vocabulary():
    p = NormalizeParams(umls_mrconso=str(FIX / "MRCONSO_tiny.RRF"), min_term_chars=3, expand_abbreviations=False)
    assert build_normalizer(p)("heart attack").text == "Myocardial Infarction"


# ---------------------------------------------------------------- the combined normalizer


@pytest.fixture(scope="module")
def tiny_normalizer() -> TextNormalizer:
    abbr = AbbreviationExpander({"MI": "myocardial infarction", "HBP": "high blood pressure", "TB": "tuberculosis"})
    concepts = ConceptNormalizer(disease_ontology_entries(FIX / "doid_tiny.obo", _filter(min_chars=3)))
    return TextNormalizer(abbr, concepts)


def test_normalizer_chains_abbreviations_into_concepts(tiny_normalizer):
    r = tiny_normalizer("After an MI, HBP and the flu are risks.")
    assert r.text == "After an myocardial infarction, hypertension and the influenza are risks."
    assert (r.expansions, r.concept_replacements) == (2, 2)


def test_names_with_abbreviations_converge():
    # a preferred name containing a listed abbreviation must not grow on every pass
    from medrank.text.normalize import close_under_abbreviations

    abbr = AbbreviationExpander({"IgA": "immunoglobulin A"})
    entries = [
        ("selective IgA deficiency disease", "selective IgA deficiency disease"),
        ("immunoglobulin A deficiency", "selective IgA deficiency disease"),
    ]
    n = TextNormalizer(abbr, ConceptNormalizer(close_under_abbreviations(entries, abbr)))
    once = n("IgA deficiency? immunoglobulin A deficiency and selective IgA deficiency disease.").text
    assert once == (
        "Selective immunoglobulin A deficiency disease? selective immunoglobulin A deficiency disease "
        "and selective immunoglobulin A deficiency disease."
    )
    assert n(once).text == once


_VOCAB_TEXT = st.sampled_from(
    [
        "MI",
        "HBP",
        "TB",
        "heart attack",
        "Heart Attack",
        "high blood pressure",
        "flu",
        "grippe",
        "diabetes",
        "common cold",
        "hyperpiesia",
        "cold",
        "(MI)",
        "heart",
        "attack",
        "zqa",
        "zqb",
        ",",
        ".",
        "-",
        "İ",
        "ß",
        "🤒",
        "\ufdd0",
        "x-MI",
    ]
)


@FAST
@given(st.lists(st.one_of(_VOCAB_TEXT, st.text(max_size=8)), max_size=25))
def test_normalizer_is_idempotent(tiny_normalizer, parts):
    text = " ".join(parts)
    once = tiny_normalizer(text).text
    assert tiny_normalizer(once).text == once


@FAST
@given(st.lists(st.one_of(_VOCAB_TEXT, st.from_regex(r"zq[a-z]{1,5}", fullmatch=True)), max_size=25))
def test_normalizer_loses_no_other_text(tiny_normalizer, parts):
    text = " ".join(parts)
    out = tiny_normalizer(text).text
    # words outside the vocabularies survive, in order; nothing becomes empty
    assert [t for t in tokens(out) if t.startswith("zq")] == [t for t in tokens(text) if t.startswith("zq")]
    assert bool(out.strip()) == bool(text.strip())


@FAST
@given(st.text(max_size=300))
def test_normalizer_any_unicode_text(tiny_normalizer, text):
    out = tiny_normalizer(text).text
    assert isinstance(out, str)
    assert tiny_normalizer(out).text == out
    assert TextNormalizer()(text).text == text  # no vocabularies: identity


def test_huge_input_is_fast(tiny_normalizer):
    unit = "Patients with an MI or the flu (influenza) often have high blood pressure; zq. "
    text = unit * 30_000  # ~2.4 MB
    t0 = time.perf_counter()
    r = tiny_normalizer(text)
    assert time.perf_counter() - t0 < 30
    assert r.expansions == 30_000 and r.concept_replacements == 60_000
    assert r.text.count("myocardial infarction") == 30_000


@pytest.mark.checkout
def test_real_vocabularies_on_known_phrases():
    do = Path("data/raw/disease_ontology/doid-ebd679f.obo.gz")
    if not do.exists():
        do = SHARED / "disease_ontology" / "doid-ebd679f.obo.gz"
    if not do.exists():
        pytest.skip("Disease Ontology file not found (run the acquire stage)")
    n = build_normalizer(NormalizeParams(disease_ontology=str(do)))
    r = n("My father had a heart attack and COPD; he also has shingles and kidney stones.")
    assert r.text == (
        "My father had a myocardial infarction and chronic obstructive pulmonary disease; "
        "he also has herpes zoster and nephrolithiasis."
    )
    assert n(r.text).text == r.text
    # stoplisted and stop-word forms are never replaced
    assert (
        n("I had a stroke and a rash. It is all on the side.").text
        == "I had a stroke and a rash. It is all on the side."
    )


# ---------------------------------------------------------------- sentences


def test_rule_splitter_examples():
    assert split_rule("Dr. Smith saw J. Doe on Jan. 3. It was fine, e.g. Aspirin 2.5 mg helped.") == [
        "Dr. Smith saw J. Doe on Jan. 3.",
        "It was fine, e.g. Aspirin 2.5 mg helped.",
    ]
    assert split_rule("what is this? help me!! ok") == ["what is this?", "help me!!", "ok"]
    assert split_rule("Eyes are blue. - Ears are low. - Nose") == ["Eyes are blue.", "- Ears are low.", "- Nose"]
    assert split_rule('He said "Stop." Then left.\nNew line') == ['He said "Stop."', "Then left.", "New line"]
    assert split_rule("") == [] and split_rule("   \n ") == []


@FAST
@given(st.text(alphabet=st.sampled_from(list("ab A.?!\n\"')-5é ")), max_size=200))
def test_rule_splitter_loses_nothing(text):
    sents = split_rule(text)
    assert _nows("".join(sents)) == _nows(text)
    assert all(s and s == s.strip() for s in sents)


@FAST
@given(st.text(max_size=200))
def test_pysbd_splitter_loses_nothing(text):
    sents = PYSBD(text)
    assert _nows("".join(sents)) == _nows(text)


PYSBD = PysbdSplitter()


def test_cut_contract():
    assert cut("ab cd ef", [3, 3, 0, 100, 6]) == ["ab", "cd", "ef"]
    assert cut("", []) == []


def test_make_splitter_and_stanza_errors(tmp_path, monkeypatch):
    assert make_splitter("rule") is split_rule
    monkeypatch.setitem(sys.modules, "stanza", None)  # as if not installed
    with pytest.raises(MedrankError, match="stanza is not installed"):
        make_splitter("stanza")
    with pytest.raises(MedrankError, match="stanza is not installed"):
        make_coref("stanza")


def test_stanza_without_models_is_a_clear_error(tmp_path):
    pytest.importorskip("stanza")
    with pytest.raises(MedrankError, match="models .* not found"):
        stanza_pipeline("tokenize,coref", str(tmp_path))
    with pytest.raises(MedrankError, match="models .* not found"):
        make_splitter("stanza", str(tmp_path))


# ---------------------------------------------------------------- coreference


def test_coref_resolve_replaces_pronouns_only():
    text = "Aspirin thins blood. It helps, and its effect lasts. The drug is cheap."
    chain = Chain("Aspirin", (Mention(0, 7), Mention(21, 23), Mention(35, 38), Mention(53, 61)))
    assert resolve(text, [chain]) == (
        "Aspirin thins blood. Aspirin helps, and Aspirin's effect lasts. The drug is cheap.",
        2,
    )
    assert resolve(text, []) == (text, 0)
    assert resolve(text, [Chain("it", (Mention(21, 23),))]) == (text, 0)  # pronoun representative: skipped
    assert make_coref(False) is None


# ---------------------------------------------------------------- tables and the stage


def _tiny_tables() -> dict[str, pd.DataFrame]:
    answers = pd.DataFrame(
        {
            "split": ["train_liveqa", "train_liveqa", "test"],
            "qid": ["1", "1", "2"],
            "question": ["Is a heart attack after an MI likely?", "Is a heart attack after an MI likely?", None],
            "question_raw": ["q", "q", None],
            "aid": ["1_Answer1", "1_Answer2", "2_Answer1"],
            "answer": ["The flu is common. It passes. HBP is not.", "", "Grippe? Yes."],
            "answer_raw": ["a", "", "b"],
            "url": ["u", "u", "u"],
            "source": ["s", "s", "s"],
            "answer_pos": [1, 2, 1],
            "system_rank": [1, 2, None],
            "reference_rank": [1, 2, None],
            "reference_score": [4, 1, None],
            "label": [1, 0, None],
        }
    )
    rqe = pd.DataFrame(
        {
            "split": ["train"],
            "pid": ["1"],
            "chq": ["my flu"],
            "faq": ["what is influenza?"],
            "pair_type": [None],
            "label": [1],
        }
    )
    medquad = pd.DataFrame(
        {
            "qa_id": ["c/d/1", "c/d/2"],
            "collection": ["c", "c"],
            "document_id": ["d", "d"],
            "url": ["u", "u"],
            "focus": ["Flu", "Flu"],
            "question_type": ["information", "symptoms"],
            "question": ["What is (are) Flu ?", "What are the symptoms of Flu ?"],
            "answer": ["Flu is an infection. Dr. Lee says rest.", None],
            "answer_raw": ["x", None],
        }
    )
    qrels = pd.DataFrame(
        {
            "number": [1],
            "answer_id": ["GHR_1_Sec1"],
            "grade": [3],
            "source": ["medquad"],
            "question": ["What is (are) Flu ?"],
            "answer": ["HBP and the flu. Rest."],
            "medquad_qa_id": [None],
        }
    )
    return {"answers": answers, "rqe_pairs": rqe, "medquad": medquad, "liveqa_qrels": qrels}


def test_normalize_table_keeps_rows_and_originals(tiny_normalizer):
    tables = _tiny_tables()
    out, stats = normalize_table(tables["answers"], TABLES["answers"], tiny_normalizer, split_rule)
    assert len(out) == 3 and list(out.columns[: len(ANSWERS.names)]) == ANSWERS.names
    assert out["answer"].tolist() == tables["answers"]["answer"].tolist()  # originals kept
    assert out["question_norm"].iloc[0] == "Is a myocardial infarction after an myocardial infarction likely?"
    assert out["question_norm"].iloc[2] is None
    assert out["answer_sentences"].tolist() == [
        ["The influenza is common.", "It passes.", "Hypertension is not."],
        [],
        ["Influenza?", "Yes."],
    ]
    assert stats["question"] == {"texts": 2, "changed": 2, "expansions": 2, "concept_replacements": 2}
    assert stats["answer"]["changed"] == 2 and stats["answer_sentences"]["texts"] == 2
    assert stats["answer_sentences"]["max"] == 3


def _write_inputs(clean_dir: Path) -> None:
    schemas = {"answers": ANSWERS, "rqe_pairs": RQE_PAIRS, "medquad": MEDQUAD, "liveqa_qrels": LIVEQA_QRELS}
    for name, df in _tiny_tables().items():
        write_parquet(df, clean_dir / f"{name}.parquet", schemas[name])


def test_stage_end_to_end(tmp_path, monkeypatch):
    from stages import normalize as stage

    _write_inputs(tmp_path / layout.CLEAN)
    write_params(tmp_path, {"normalize": {"disease_ontology": str(FIX / "doid_tiny.obo"), "min_term_chars": 3}})
    monkeypatch.chdir(tmp_path)
    stage.main()
    for name, schema in NORMALIZED_TABLES.items():
        table = pq.read_table(tmp_path / layout.NORMALIZED / f"{name}.parquet")
        assert table.schema.equals(schema, check_metadata=False)
        assert table.num_rows == len(_tiny_tables()[name])
    metrics = json.loads((tmp_path / "metrics" / "normalize.json").read_text())
    assert metrics["rqe_pairs"]["chq"]["concept_replacements"] == 1
    assert metrics["medquad"]["answer_sentences"]["texts"] == 1
    assert metrics["total"]["texts"] == 2 + 3 + 2 + 3 + 1  # answers q+a, rqe chq+faq, medquad q+a (non-null), judged a
    assert metrics["liveqa_qrels"]["answer"]["expansions"] == 1  # HBP
    assert metrics["vocabulary"]["abbreviations"] > 200


def test_stage_missing_input_is_clear(tmp_path, monkeypatch):
    from stages import normalize as stage

    write_params(tmp_path, {"normalize": {"disease_ontology": str(FIX / "doid_tiny.obo")}})
    monkeypatch.chdir(tmp_path)  # no data/interim/clean here
    with pytest.raises(MedrankError, match="not found"):
        stage.main()


def test_params_section(tmp_path):
    p = tmp_path / "params.yaml"
    p.write_text("normalize:\n  coref: true\n", encoding="utf-8")
    with pytest.raises(MedrankError, match="normalize.coref"):
        load_params(p)
    n = load_params(write_params(tmp_path, {"normalize": {"sentence_splitter": "pysbd", "coref": "stanza"}})).normalize
    assert (n.sentence_splitter, n.coref) == ("pysbd", "stanza")
    assert NormalizeParams().coref is False
