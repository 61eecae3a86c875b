"""Text normalization for every text the later stages read: coreference (optional), abbreviation
expansion, preferred concept names, sentence splitting. Originals are kept beside the results."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd
from tqdm import tqdm

from medrank.core.errors import MedrankError
from medrank.params import NormalizeParams
from medrank.text.abbreviations import AbbreviationExpander, load_abbreviations
from medrank.text.concepts import (
    ConceptNormalizer,
    VocabularyFilter,
    disease_ontology_entries,
    load_stoplist,
    umls_entries,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Normalized:
    text: str
    expansions: int = 0
    concept_replacements: int = 0


class TextNormalizer:
    """Abbreviations, then preferred names, repeated until nothing changes (so f(f(x)) == f(x))."""

    def __init__(
        self,
        abbreviations: AbbreviationExpander | None = None,
        concepts: ConceptNormalizer | None = None,
        max_passes: int = 4,
    ):
        self.abbreviations = abbreviations
        self.concepts = concepts
        self.max_passes = max_passes

    def __call__(self, text: str) -> Normalized:
        n_abbr = n_conc = 0
        for _ in range(self.max_passes):
            new = text
            if self.abbreviations is not None:
                new, k = self.abbreviations.expand(new)
                n_abbr += k
            if self.concepts is not None:
                new, k = self.concepts.normalize(new)
                n_conc += k
            if new == text:
                break
            text = new
        return Normalized(text, n_abbr, n_conc)


@dataclass(frozen=True)
class NormalizerState:
    """What a TextNormalizer is made of: the abbreviation list and the (surface form, preferred name) entries, each
    None when that pass is off. Saved by stage normalize (medrank.steps), so `medrank rank` needs no vocabulary file."""

    abbreviations: dict[str, str] | None
    concepts: list[tuple[str, str]] | None

    def normalizer(self) -> TextNormalizer:
        abbr = AbbreviationExpander(self.abbreviations) if self.abbreviations is not None else None
        return TextNormalizer(abbr, ConceptNormalizer(self.concepts) if self.concepts is not None else None)


def normalizer_state(p: NormalizeParams) -> NormalizerState:
    """The abbreviations and concept entries the `normalize` params section names (its files read here)."""
    abbreviations = load_abbreviations(p.abbreviation_list) if p.expand_abbreviations else None
    entries = None
    if p.preferred_names:
        vfilter = VocabularyFilter(
            min_chars=p.min_term_chars, max_tokens=p.max_term_tokens, stoplist=load_stoplist(p.concept_stoplist)
        )
        if p.umls_mrconso:
            entries = umls_entries(p.umls_mrconso, vfilter, p.umls_sources)
        else:
            entries = disease_ontology_entries(p.disease_ontology, vfilter)
        if abbreviations is not None:
            entries = close_under_abbreviations(entries, AbbreviationExpander(abbreviations))
    return NormalizerState(abbreviations, entries)


def build_normalizer(p: NormalizeParams) -> TextNormalizer:
    """The normalizer described by the `normalize` params section."""
    return normalizer_state(p).normalizer()


def close_under_abbreviations(entries: list[tuple[str, str]], abbr: AbbreviationExpander) -> list[tuple[str, str]]:
    """Write preferred names with their abbreviations expanded, and match surface forms in their
    expanded spelling too: text is expanded before concepts are matched, and a name like "selective
    IgA deficiency disease" would otherwise be re-expanded and re-replaced on every pass."""
    out: list[tuple[str, str]] = []
    for surface, name in entries:
        name_x = abbr.expand(name, sentence_case=False)[0]
        surface_x = abbr.expand(surface, sentence_case=False)[0]
        out.append((surface, name_x))
        if surface_x != surface:
            out.append((surface_x, name_x))
        if name_x != name:
            out.append((name_x, name_x))
    return out


@dataclass(frozen=True)
class TableSpec:
    texts: dict[str, str]  # input column -> normalized column
    sentences: dict[str, str] = field(default_factory=dict)  # normalized column -> list-of-sentences column
    coref: tuple[str, ...] = ()  # input columns that get coreference resolution first (answers)


TABLES: dict[str, TableSpec] = {
    "answers": TableSpec(
        {"question": "question_norm", "answer": "answer_norm"}, {"answer_norm": "answer_sentences"}, ("answer",)
    ),
    "rqe_pairs": TableSpec({"chq": "chq_norm", "faq": "faq_norm"}),
    "medquad": TableSpec(
        {"question": "question_norm", "answer": "answer_norm"}, {"answer_norm": "answer_sentences"}, ("answer",)
    ),
    # the judged LiveQA answers (extra training rows: medrank.data.judged); their MedQuAD question is a heading only
    "liveqa_qrels": TableSpec({"answer": "answer_norm"}, {"answer_norm": "answer_sentences"}, ("answer",)),
}


def _distribution(counts: np.ndarray) -> dict[str, float]:
    if counts.size == 0:
        return {"texts": 0}
    q = np.percentile(counts, [10, 50, 90])
    return {
        "texts": int(counts.size),
        "mean": round(float(counts.mean()), 3),
        "p10": float(q[0]),
        "median": float(q[1]),
        "p90": float(q[2]),
        "max": int(counts.max()),
        "total": int(counts.sum()),
    }


def normalize_table(
    df: pd.DataFrame,
    spec: TableSpec,
    normalizer: Callable[[str], Normalized],
    splitter: Callable[[str], list[str]],
    coref: Callable[[str], tuple[str, int]] | None = None,
    desc: str = "normalize",
) -> tuple[pd.DataFrame, dict]:
    """Add the normalized columns of `spec` to a copy of `df`; returns (table, stats).

    Each distinct text is processed once (questions repeat across their answers). Nulls stay null
    and get an empty sentence list."""
    out = df.copy()
    stats: dict = {"rows": int(len(df))}
    for col, norm_col in spec.texts.items():
        if col not in df.columns:
            raise MedrankError(f"{desc}: input table has no column '{col}'")
        values = df[col]
        present = values.notna()
        uniq = pd.unique(values[present])
        results: dict[str, tuple[str, int, int, int]] = {}
        use_coref = coref is not None and col in spec.coref
        for text in tqdm(uniq, desc=f"{desc}.{col}", unit="text", leave=False, mininterval=5):
            resolved, n_coref = coref(text) if use_coref else (text, 0)
            r = normalizer(resolved)
            results[text] = (r.text, r.expansions, r.concept_replacements, n_coref)
        mapped = values[present].map(results)
        out[norm_col] = pd.Series([None] * len(df), index=df.index, dtype=object)
        out.loc[present, norm_col] = mapped.map(lambda t: t[0])
        norm_texts = mapped.map(lambda t: t[0])
        col_stats = {
            "texts": int(present.sum()),
            "changed": int((norm_texts != values[present]).sum()),
            "expansions": int(mapped.map(lambda t: t[1]).sum()),
            "concept_replacements": int(mapped.map(lambda t: t[2]).sum()),
        }
        if use_coref:
            col_stats["coref_replacements"] = int(mapped.map(lambda t: t[3]).sum())
        stats[col] = col_stats
    for norm_col, sent_col in spec.sentences.items():
        cache: dict[str, list[str]] = {}
        sentences: list[list[str]] = []
        for text in tqdm(out[norm_col], desc=f"{desc}.{sent_col}", unit="text", leave=False, mininterval=5):
            if text is None or (isinstance(text, float) and np.isnan(text)):
                sentences.append([])
                continue
            if text not in cache:
                cache[text] = splitter(text)
            sentences.append(cache[text])
        out[sent_col] = sentences
        counts = np.array([len(s) for s, t in zip(sentences, out[norm_col]) if isinstance(t, str) and t.strip()])
        stats[sent_col] = _distribution(counts)
    if len(out) != len(df):  # never lose a row
        raise AssertionError(f"{desc}: {len(df)} rows in, {len(out)} out")
    return out, stats
