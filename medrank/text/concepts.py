"""Preferred concept names: map every listed synonym of a concept to one name ("heart attack" ->
"myocardial infarction") so that question and answer use the same words.

Vocabularies: the Human Disease Ontology (open; term names + EXACT synonyms) by default, or a
licensed UMLS MRCONSO.RRF (English strings -> the concept's English preferred name).
"""

from __future__ import annotations

import gzip
import io
import logging
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Iterable, Iterator

from medrank.core.errors import MedrankError
from medrank.core.io import decode_utf8
from medrank.text.matcher import PhraseMatcher, tokens

log = logging.getLogger(__name__)

# SNOMED CT semantic tags that DO copies into synonyms: "Lactocele (disorder)" names the same thing as "Lactocele"
_SEMANTIC_TAG = re.compile(
    r"\s*\((?:disorder|finding|morphologic abnormality|situation|clinical|disease|procedure|qualifier value|"
    r"body structure|observable entity|navigational concept|event|organism)\)\s*$",
    re.I,
)
# index-style or qualified strings that do not occur as such in running text
_UNNATURAL = re.compile(
    r"[,;:\[\]{}()<>|&@#=_*\"]|\bNOS\b|\bNEC\b|\bunspecified\b|\bnot otherwise\b|\bother specified\b", re.I
)


@dataclass
class VocabularyFilter:
    """Which surface forms may be replaced (preferred names are always kept: they only protect)."""

    min_chars: int = 4
    max_tokens: int = 8
    stoplist: frozenset[str] = field(default_factory=frozenset)  # lower-cased surface forms never replaced

    def clean(self, surface: str) -> str | None:
        """The usable surface form, or None when it should not be matched."""
        s = _SEMANTIC_TAG.sub("", " ".join(surface.split()))
        if len(s) < self.min_chars or _UNNATURAL.search(s):
            return None
        toks = tokens(s)
        if not toks or len(toks) > self.max_tokens:
            return None
        # acronym-like strings ("ALS", "IgA", "LQT") are left to the curated abbreviation list:
        # matched case-insensitively they would hit ordinary words and gene symbols
        if len(toks) == 1 and (s.isupper() or any(c.isupper() for c in s[1:])):
            return None
        if s.lower() in self.stoplist or not any(c.isalpha() for c in s):
            return None
        return s


def default_stoplist_path() -> Path:
    return Path(str(resources.files("medrank.text") / "resources" / "concept_stoplist.txt"))


def load_stoplist(path: str | Path | None = None) -> frozenset[str]:
    """Lower-cased surface forms that are never replaced: the curated list plus English stop words."""
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    path = Path(path) if path is not None else default_stoplist_path()
    words = {line.split("#", 1)[0].strip().lower() for line in decode_utf8(path.read_bytes(), path).splitlines()}
    return frozenset(w for w in words if w) | frozenset(ENGLISH_STOP_WORDS)


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return open(path, encoding="utf-8")


_OBO_SYNONYM = re.compile(r'^synonym: "((?:[^"\\]|\\.)*)" (\w+)')


def iter_disease_ontology(path: str | Path) -> Iterator[tuple[str, list[str]]]:
    """(name, EXACT synonyms) of every non-obsolete [Term] in an OBO file (plain or .gz)."""
    path = Path(path)
    if not path.exists():
        raise MedrankError(
            f"{path}: Disease Ontology file not found (run the acquire stage, or set normalize.disease_ontology)"
        )
    name: str | None = None
    synonyms: list[str] = []
    obsolete = in_term = False

    def flush() -> Iterator[tuple[str, list[str]]]:
        if in_term and name and not obsolete:
            yield name, synonyms

    with _open_text(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("["):
                yield from flush()
                in_term, name, synonyms, obsolete = line == "[Term]", None, [], False
            elif not in_term:
                continue
            elif line.startswith("name: "):
                name = line[6:].strip()
            elif line.startswith("synonym: "):
                m = _OBO_SYNONYM.match(line)
                if m and m.group(2) == "EXACT":
                    synonyms.append(m.group(1).replace('\\"', '"'))
            elif line.startswith("is_obsolete: true"):
                obsolete = True
        yield from flush()


def _narrower(surface: str, name: str) -> bool:
    """True when the name's words are a proper subset of the surface form's ("chronic bronchitis" ->
    "bronchitis"): such "synonyms" are narrower than the concept, and replacing them loses information."""
    s, n = set(tokens(surface.lower())), set(tokens(name.lower()))
    return n < s


def disease_ontology_entries(path: str | Path, vfilter: VocabularyFilter) -> list[tuple[str, str]]:
    """(surface, preferred name) pairs from the Disease Ontology, names included as themselves."""
    entries: list[tuple[str, str]] = []
    n_terms = 0
    for name, synonyms in iter_disease_ontology(path):
        n_terms += 1
        entries.append((name, name))
        for syn in synonyms:
            s = vfilter.clean(syn)
            if s is not None and not _narrower(s, name):
                entries.append((s, name))
    if not n_terms:
        raise MedrankError(f"{path}: no [Term] stanzas found (not an OBO file?)")
    log.info("Disease Ontology: %d terms, %d surface forms", n_terms, len(entries))
    return entries


# MRCONSO.RRF columns (UMLS Reference Manual, 3.3.4)
_CUI, _LAT, _TS, _STT, _ISPREF, _SAB, _STR, _SUPPRESS = 0, 1, 2, 4, 6, 11, 14, 16


def umls_entries(path: str | Path, vfilter: VocabularyFilter, sources: Iterable[str] = ()) -> list[tuple[str, str]]:
    """(surface, preferred name) pairs from MRCONSO.RRF: English, non-suppressed strings (of `sources`
    if given) mapped to the concept's English preferred name (TS=P, STT=PF, ISPREF=Y)."""
    path = Path(path)
    if not path.exists():
        raise MedrankError(f"{path}: UMLS MRCONSO.RRF not found (normalize.umls_mrconso)")
    keep_sab = set(sources)
    preferred: dict[str, str] = {}
    surfaces: list[tuple[str, str]] = []  # (cui, string)
    with _open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            cols = line.rstrip("\n").split("|")
            if len(cols) < 18:
                raise MedrankError(f"{path}:{lineno}: expected 18 '|'-separated MRCONSO columns, got {len(cols)}")
            if cols[_LAT] != "ENG":
                continue
            cui, s = cols[_CUI], cols[_STR]
            if cols[_TS] == "P" and cols[_STT] == "PF" and cols[_ISPREF] == "Y":
                preferred.setdefault(cui, s)
            if cols[_SUPPRESS] == "N" and (not keep_sab or cols[_SAB] in keep_sab):
                surfaces.append((cui, s))
    entries = [(name, name) for name in preferred.values()]
    for cui, s in surfaces:
        name = preferred.get(cui)
        if name is None or s == name:
            continue
        c = vfilter.clean(s)
        if c is not None and not _narrower(c, name):
            entries.append((c, name))
    log.info("UMLS: %d concepts with an English preferred name, %d surface forms", len(preferred), len(entries))
    if not preferred:
        raise MedrankError(f"{path}: no English preferred names (LAT=ENG, TS=P, STT=PF, ISPREF=Y) found")
    return entries


class ConceptNormalizer:
    """Replace concept synonyms by preferred names; `normalize` returns (text, number of replacements)."""

    def __init__(self, entries: Iterable[tuple[str, str]]):
        self._matcher = PhraseMatcher(entries, case_sensitive=False)
        log.info(
            "concept matcher: %d phrases (%d ambiguous dropped)",
            self._matcher.report.n_phrases,
            self._matcher.report.n_ambiguous,
        )

    def __len__(self) -> int:
        return len(self._matcher)

    @property
    def n_ambiguous(self) -> int:
        return self._matcher.report.n_ambiguous

    def normalize(self, text: str) -> tuple[str, int]:
        return self._matcher.replace(text)
