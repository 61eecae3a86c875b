"""Expansion of curated medical abbreviations ("COPD" -> "chronic obstructive pulmonary disease").

Matching is case-sensitive and whole-token ("CT" but not "ct" or "CTs"), never inside hyphenated
compounds ("anti-CCP", pronunciation guides like "MI-o-kar-DI-tis"). A definition already in the
text is not duplicated: "long form (ABBR)" and "ABBR (long form)" both become "long form".
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

from medrank.core.errors import MedrankError
from medrank.core.io import decode_utf8
from medrank.text.matcher import PhraseMatcher

_WORDS = re.compile(r"[^\W_]+")
_OPEN_PAREN_TAIL = re.compile(r"\(\s*$")
_CLOSE_PAREN_HEAD = re.compile(r"^\s*\)")
_PAREN_AFTER = re.compile(r"^\s*\(([^()]{1,200})\)")


def default_list_path() -> Path:
    """The curated list shipped with medrank (see medrank/text/resources/README.md)."""
    return Path(str(resources.files("medrank.text") / "resources" / "abbreviations.tsv"))


def load_abbreviations(path: str | Path | None = None) -> dict[str, str]:
    """Read `abbreviation<TAB>expansion[<TAB>note]` lines ('#' comments); duplicates are an error."""
    path = Path(path) if path is not None else default_list_path()
    if not path.exists():
        raise MedrankError(f"{path}: abbreviation list not found")
    out: dict[str, str] = {}
    for lineno, line in enumerate(decode_utf8(path.read_bytes(), path).splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        cols = line.split("\t")
        if len(cols) < 2 or not cols[0].strip() or not cols[1].strip():
            raise MedrankError(f"{path}:{lineno}: expected 'abbreviation<TAB>expansion'")
        abbr, expansion = cols[0].strip(), cols[1].strip()
        if abbr in out and out[abbr] != expansion:
            raise MedrankError(f"{path}:{lineno}: '{abbr}' listed twice with different expansions")
        out[abbr] = expansion
    return out


def _sentence_start(text: str, pos: int) -> bool:
    """True when `pos` starts the text, a line, or follows a sentence end ("... ends. HBP is")."""
    j = pos - 1
    while j >= 0 and text[j].isspace():
        if text[j] == "\n":
            return True
        j -= 1
    while j >= 0 and text[j] in "\"'\u201d\u2019)]":
        j -= 1
    return j < 0 or text[j] in ".!?"


def _capitalize(s: str) -> str:
    # an expansion starting a sentence keeps the sentence's capital (and the splitter's boundary cue)
    return s[:1].upper() + s[1:]


def _words(s: str) -> str:
    return " ".join(_WORDS.findall(s.lower()))


class AbbreviationExpander:
    """Expand listed abbreviations in text; `expand` returns (text, number of expansions)."""

    def __init__(self, abbreviations: dict[str, str]):
        self.abbreviations = dict(abbreviations)
        self._matcher = PhraseMatcher(self.abbreviations.items(), case_sensitive=True, skip_hyphenated=True)
        self._long_words = {a: _words(e) for a, e in self.abbreviations.items()}

    def __len__(self) -> int:
        return len(self._matcher)

    def expand(self, text: str, sentence_case: bool = True) -> tuple[str, int]:
        """Expand every listed abbreviation; `sentence_case` capitalises expansions that start a sentence."""
        matches = self._matcher.find(text)
        if not matches:
            return text, 0
        parts: list[str] = []
        pos = n = 0
        for m in matches:
            if m.start < pos:  # swallowed by the previous "ABBR (long form)"
                continue
            n += 1
            abbr = text[m.start : m.end]
            long_words = self._long_words.get(abbr, _words(m.replacement))
            head = text[pos : m.start]
            tail = text[m.end :]
            if _OPEN_PAREN_TAIL.search(head) and (close := _CLOSE_PAREN_HEAD.match(tail)):
                before = _words(text[max(0, m.start - len(m.replacement) - 40) : m.start])
                if before == long_words or before.endswith(" " + long_words):
                    # "long form (ABBR)": drop the parenthesis and the space before it
                    parts.append(_OPEN_PAREN_TAIL.sub("", head).rstrip())
                    pos = m.end + close.end()
                    continue
            defined = _PAREN_AFTER.match(tail)
            if defined and _words(defined.group(1)) == long_words:
                # "ABBR (long form)": keep the long form once
                parts.append(head)
                parts.append(
                    _capitalize(m.replacement) if sentence_case and _sentence_start(text, m.start) else m.replacement
                )
                pos = m.end + defined.end()
                continue
            parts.append(head)
            parts.append(
                _capitalize(m.replacement) if sentence_case and _sentence_start(text, m.start) else m.replacement
            )
            pos = m.end
        parts.append(text[pos:])
        return "".join(parts), n
