"""Sentence splitting with one output contract for every backend: the text cut at boundary
offsets, each piece stripped, empty pieces dropped, so no non-space character is ever lost."""

from __future__ import annotations

import re
from typing import Callable, Literal, Sequence

from medrank.core.errors import MedrankError

SplitterName = Literal["rule", "pysbd", "stanza"]

# words that end with "." without ending a sentence (lower-cased, without the dot)
_NO_BREAK_AFTER = frozenset(
    """mr mrs ms dr prof sr jr st vs etc e.g i.e eg ie fig figs vol approx ca cf al inc ltd co corp dept
    univ jan feb mar apr jun jul aug sep sept oct nov dec u.s u.k ph.d m.d b.s m.s mt ft gen gov sen rep rev""".split()
)
# "." / "!" / "?" (runs allowed), closing quotes or brackets, then the whitespace that is cut
_CANDIDATE = re.compile(r"[.!?]+[\"'\u201d\u2019)\]]*(\s+)")
# a capital or digit, possibly after an opening quote/bracket or a list bullet ("green. - Ears are ...")
_NEXT_STARTS_SENTENCE = re.compile(r"(?:[-\u2022*]\s+)?[\"'\u201c\u2018(\[]?[A-Z0-9\u00c0-\u00de]")
_LAST_WORD = re.compile(r"(\S+?)[.!?]+[\"'\u201d\u2019)\]]*$")
_NEWLINES = re.compile(r"\n\s*")


def cut(text: str, offsets: Sequence[int]) -> list[str]:
    """Cut `text` at `offsets`; strip pieces and drop empty ones."""
    pieces: list[str] = []
    prev = 0
    for off in sorted(set(offsets)):
        if 0 < off < len(text):
            pieces.append(text[prev:off])
            prev = off
    pieces.append(text[prev:])
    return [p.strip() for p in pieces if p.strip()]


def rule_boundaries(text: str) -> list[int]:
    """Boundary offsets: line breaks, "?"/"!" before whitespace, "." before a capital or digit
    unless it closes an abbreviation, an initial ("J.") or a decimal."""
    offsets = [m.end() for m in _NEWLINES.finditer(text)]
    for m in _CANDIDATE.finditer(text):
        after = m.end()
        if after >= len(text):
            continue
        punct = m.group()
        if "?" not in punct and "!" not in punct:
            if not _NEXT_STARTS_SENTENCE.match(text, after):
                continue
            word = _LAST_WORD.search(text, max(0, m.start() - 40), m.start(1))
            last = word.group(1).lower().lstrip("(\"'\u201c\u2018[") if word else ""
            if last in _NO_BREAK_AFTER or (len(last) == 1 and last.isalpha()):
                continue
        offsets.append(after)
    return offsets


def split_rule(text: str) -> list[str]:
    """Fast regex sentence splitter (the default)."""
    return cut(text, rule_boundaries(text))


class PysbdSplitter:
    """pysbd's rule-based segmenter, mapped back onto the original text (pysbd may alter spacing)."""

    def __init__(self) -> None:
        import pysbd

        self._seg = pysbd.Segmenter(language="en", clean=False)

    def __call__(self, text: str) -> list[str]:
        if not text.strip():
            return []
        offsets: list[int] = []
        pos = 0
        for seg in self._seg.segment(text):
            seg = seg.strip()
            if not seg:
                continue
            found = text.find(seg, pos)
            if found < 0:  # pysbd rewrote this piece: no boundary rather than a wrong one
                continue
            offsets.append(found)
            pos = found + len(seg)
        return cut(text, offsets)


class StanzaSplitter:
    """Stanza's neural tokenizer (English models must be installed; nothing is downloaded)."""

    def __init__(self, stanza_dir: str | None = None) -> None:
        from medrank.text.coref import stanza_pipeline

        self._nlp = stanza_pipeline("tokenize", stanza_dir)

    def __call__(self, text: str) -> list[str]:
        if not text.strip():
            return []
        doc = self._nlp(text)
        return cut(text, [s.tokens[0].start_char for s in doc.sentences if s.tokens])


def make_splitter(name: SplitterName, stanza_dir: str | None = None) -> Callable[[str], list[str]]:
    """The sentence splitter named in `normalize.sentence_splitter`."""
    if name == "rule":
        return split_rule
    if name == "pysbd":
        return PysbdSplitter()
    if name == "stanza":
        return StanzaSplitter(stanza_dir)
    raise MedrankError(f"normalize.sentence_splitter: unknown splitter '{name}' (rule, pysbd or stanza)")
