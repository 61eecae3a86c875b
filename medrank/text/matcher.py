"""Leftmost-longest phrase replacement at token boundaries, over one Aho–Corasick automaton.

Texts and phrases are tokenised the same way (`\\w+` runs and single punctuation marks) and written
with a start and an end marker around every token, so every automaton key begins at a token start
and ends at a token end: word boundaries hold by construction, and `iter_long` returns the
leftmost-longest non-overlapping matches in C. (Characters rather than token ids, because
pyahocorasick searches a node's children linearly: a token alphabet would make every step slow.)
Whitespace between tokens is not part of a phrase, so "heart  attack" matches "heart attack",
but "heart-attack" (an extra "-" token) does not.
"""

from __future__ import annotations

import logging
import re
from bisect import bisect_left
from dataclasses import dataclass
from itertools import accumulate
from typing import Iterable, NamedTuple

import ahocorasick

log = logging.getLogger(__name__)

TOKEN_RE = re.compile(r"\w+|[^\w\s]")
# token start / end markers: Unicode noncharacters (a text containing them gets U+FFFD in their place)
_START, _END = "\ufdd0", "\ufdd1"
_SEP = _END + _START


class Match(NamedTuple):
    start: int  # character offsets into the text
    end: int
    replacement: str


def tokens(text: str) -> list[str]:
    """The tokens phrase matching sees (word runs and single punctuation marks)."""
    return TOKEN_RE.findall(text)


@dataclass
class BuildReport:
    n_phrases: int = 0  # distinct keys in the automaton
    n_ambiguous: int = 0  # keys dropped: several replacements and none of them the phrase itself
    n_empty: int = 0  # phrases without any token


class PhraseMatcher:
    """Replace vocabulary phrases by their replacement strings (leftmost-longest, whole tokens)."""

    def __init__(self, entries: Iterable[tuple[str, str]], case_sensitive: bool = False, skip_hyphenated: bool = False):
        """`entries`: (phrase, replacement) pairs. A phrase key with several different replacements is
        dropped as ambiguous unless one replacement is the phrase itself (a preferred name wins)."""
        self.case_sensitive = case_sensitive
        self.skip_hyphenated = skip_hyphenated  # "anti-CCP", "MI-o-kar-DI-tis": leave hyphen-joined tokens alone
        self.report = BuildReport()
        by_key: dict[str, tuple[int, set[str], bool]] = {}
        for phrase, replacement in entries:
            toks = self._fold_all(tokens(phrase))
            if not toks:
                self.report.n_empty += 1
                continue
            key = _START + _SEP.join(toks) + _END
            identity = self._fold_all(tokens(replacement)) == toks
            n, reps, has_identity = by_key.get(key, (len(toks), set(), False))
            reps.add(replacement)
            by_key[key] = (n, reps, has_identity or identity)
        self._automaton = ahocorasick.Automaton()
        for key, (n, reps, has_identity) in by_key.items():
            if has_identity:
                # the phrase is itself a preferred name: matching it protects it from shorter
                # overlapping phrases, and replace() leaves it as written
                self._automaton.add_word(key, (n, None))
            elif len(reps) == 1:
                self._automaton.add_word(key, (n, next(iter(reps))))
            else:
                self.report.n_ambiguous += 1
                continue
            self.report.n_phrases += 1
        if self.report.n_phrases:
            self._automaton.make_automaton()
        log.debug("phrase matcher: %s", self.report)

    def __len__(self) -> int:
        return self.report.n_phrases

    def _fold_all(self, toks: list[str]) -> list[str]:
        return toks if self.case_sensitive else [t.lower() for t in toks]

    def find(self, text: str) -> list[Match]:
        """Non-identity matches in `text`, left to right; a preferred name matched as written yields nothing."""
        if not self.report.n_phrases or not text:
            return []
        scan = text
        if _START in scan or _END in scan:
            scan = scan.replace(_START, "\ufffd").replace(_END, "\ufffd")
        if self.case_sensitive:
            toks = TOKEN_RE.findall(scan)
        elif scan.isascii():
            toks = TOKEN_RE.findall(scan.lower())
        else:
            # per-token lower(): lower() of a whole non-ASCII text can change its tokens ("İ" -> "i̇")
            toks = [t.lower() for t in TOKEN_RE.findall(scan)]
        hits = [
            (last, n, replacement)
            for last, (n, replacement) in self._automaton.iter_long(_START + _SEP.join(toks) + _END)
            if replacement is not None
        ]
        if not hits:  # the common case: no offsets needed
            return []
        # ends[k] = offset just past token k's end marker in the scanned string
        ends = list(accumulate(len(t) + 2 for t in toks))
        spans = [m.span() for m in TOKEN_RE.finditer(text)]
        out: list[Match] = []
        for last_char, n, replacement in hits:
            last = bisect_left(ends, last_char + 1)
            start, end = spans[last - n + 1][0], spans[last][1]
            if self.skip_hyphenated and _hyphen_joined(text, start, end):
                continue
            out.append(Match(start, end, replacement))
        return out

    def replace(self, text: str) -> tuple[str, int]:
        """Return (text with every match replaced, number of replacements)."""
        matches = self.find(text)
        if not matches:
            return text, 0
        parts: list[str] = []
        pos = 0
        for m in matches:
            parts.append(text[pos : m.start])
            # case-insensitive phrases keep a sentence-initial capital; expansions are written as listed
            parts.append(m.replacement if self.case_sensitive else match_case(text[m.start : m.end], m.replacement))
            pos = m.end
        parts.append(text[pos:])
        return "".join(parts), len(matches)


def match_case(original: str, replacement: str) -> str:
    """Capitalise the replacement's first letter when the replaced text started with a capital."""
    if original[:1].isupper() and replacement[:1].islower():
        return replacement[0].upper() + replacement[1:]
    return replacement


def _hyphen_joined(text: str, start: int, end: int) -> bool:
    before = start >= 2 and text[start - 1] == "-" and text[start - 2].isalnum()
    after = end + 1 < len(text) and text[end] == "-" and text[end + 1].isalnum()
    return before or after
