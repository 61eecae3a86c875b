"""Pure text cleaning: HTML/entities out, NFKC, one space between words, trailing site boilerplate dropped.

`normalize_text` is for any text (questions, premises); `clean_answer` also removes the web-page
boilerplate found in MEDIQA/MedQuAD answers (list `BOILERPLATE`). Both are idempotent: they repeat
their steps until nothing changes, so unescaping or deleting never leaves a new tag or entity behind.
"""

from __future__ import annotations

import functools
import html
import re
import sys
import unicodedata
from typing import NamedTuple

# An HTML tag or comment: "<" followed by a letter, "/", "!" or "?" (so "<5 mg" and "a < b" survive).
TAG_RE = re.compile(r"<!--.*?-->|<[A-Za-z/!?][^<>]*>", re.S)
_TAG_NAME_RE = re.compile(r"<\s*/?\s*([A-Za-z][A-Za-z0-9]*)")
# Tags that separate words when removed; inline ones (b, i, a, span, ...) are removed without a space.
_BLOCK_TAGS = frozenset(
    "address article aside blockquote br dd div dl dt figcaption figure footer h1 h2 h3 h4 h5 h6 header hr "
    "li main nav ol p pre section table tbody td tfoot th thead tr ul".split()
)
_MAX_ROUNDS = 50  # fixpoint guard; real text settles in 2 rounds

_AGENCIES = (
    r"NIH: [A-Z][A-Za-z,' -]*"  # MedlinePlus health-topic summaries end with the source institute
    r"|Centers for Disease Control and Prevention|Food and Drug Administration|Environmental Protection Agency"
    r"|Federal Emergency Management Agency|Agency for [A-Z][A-Za-z ]*|Administration on Aging"
    r"|Dept\. of Health and Human Services Office on Women's Health|United States Department of Agriculture"
    r"|Centers for Medicare and Medicaid Services|Genetics Home Reference"
)


class Rule(NamedTuple):
    """One boilerplate pattern; `needle` (a literal it must contain) or `tail` (only the last N chars can
    match) keeps the scan cheap."""

    name: str
    pattern: re.Pattern[str]
    repl: str
    needle: str | None = None
    tail: int | None = None


# Trailing / inline web-page boilerplate, applied in order to whitespace-normalised text. Found by reading
# the most frequent answer endings of the MEDIQA Task 3 and MedQuAD answers (tests/data/test_clean.py holds a
# real example of each); the replacement's surplus spaces are collapsed afterwards.
BOILERPLATE: tuple[Rule, ...] = (
    # A.D.A.M. encyclopedia credits: "Updated by: <author>. Review provided by VeriMed ... A.D.A.M. Editorial
    # team." The Pentagon paper drops any trailing sentences from "Updated by:" on.
    Rule("adam_credits", re.compile(r"\bUpdated by:.*$", re.S), "", "Updated by:"),
    # A.D.A.M. page titles: "Ear wax (Review Date 5/21/2016): ..."
    Rule("review_date", re.compile(r" ?\(Review Date [0-9/]+\)"), "", "(Review Date "),
    # MedlinePlus / NIA link to the Spanish page, often glued to the previous word ("oftenRead about ...").
    Rule(
        "spanish_link",
        re.compile(r"(?:Read about this topic in Spanish\.\s*)?Lea sobre este tema en espa(?:n|ñ)ol\.?"),
        " ",
        "Lea sobre este tema",
    ),
    # NICHD previous/next navigation: "« Condition Information What causes it? »", and stray arrows.
    Rule("nav_arrows", re.compile(r"«[^«»]{0,200}»|[«»]"), " ", None),
    Rule("top_link", re.compile(r"\[top\]"), " ", "[top]"),
    # GARD footnote markers: "[8]", "[1] [2]", "[3,4]".
    Rule("citation_markers", re.compile(r" ?\[\d+(?:\s*[,\u2013-]\s*\d+)*\]"), "", "["),
    Rule("gard_view_list", re.compile(r"-?\s*View complete list of signs and symptoms\.\.\."), " ", "View complete"),
    # GARD "related diseases" link list at the end of a page.
    Rule(
        "gard_related_diseases",
        re.compile(
            r"The following diseases are related to [^.]{0,300}\. "
            r"If you have a question about any of these diseases, you can contact GARD\..*$",
            re.S,
        ),
        "",
        "contact GARD.",
    ),
    # GHR: the same five MedlinePlus links closing every "management" answer.
    Rule(
        "medlineplus_resources",
        re.compile(
            r"These resources from MedlinePlus offer information about the diagnosis and management "
            r"of various health conditions:.*$",
            re.S,
        ),
        "",
        "These resources from MedlinePlus",
    ),
    # Source agency credited after the last sentence ("... fresher breath. NIH: National Heart, ...").
    Rule(
        "trailing_agency",
        re.compile(r"(?:(?<=[.!?:)\]])\s+|^|\s+(?=NIH: ))(?:" + _AGENCIES + r")\s*$"),
        "",
        tail=160,
    ),
)


def _tag_repl(m: re.Match[str]) -> str:
    name = _TAG_NAME_RE.match(m.group(0))
    return " " if name and name.group(1).lower() in _BLOCK_TAGS else ""


def strip_tags(text: str) -> str:
    """Remove HTML tags/comments once (block tags become a space)."""
    return TAG_RE.sub(_tag_repl, text)


@functools.cache
def _controls_re() -> re.Pattern[str]:
    # Cc (controls), Cf (zero-width, soft hyphen, BOM) and Cs (lone surrogates, unencodable in parquet);
    # built once on first use (a scan of all code points, ~0.2 s).
    ranges, start = [], None
    for cp in range(sys.maxunicode + 1):
        c = chr(cp)
        drop = c not in "\t\n\r" and unicodedata.category(c) in ("Cc", "Cf", "Cs")
        if drop and start is None:
            start = cp
        if not drop and start is not None:
            ranges.append((start, cp - 1))
            start = None
    if start is not None:
        ranges.append((start, sys.maxunicode))
    return re.compile("[" + "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in ranges) + "]+")


def _drop_controls(text: str) -> str:
    if text.isascii() and text.isprintable():
        return text
    # a zero-width space separates words: keep it as a space
    return _controls_re().sub(lambda m: " " if "\u200b" in m.group(0) else "", text)


def _normalize_once(text: str) -> str:
    text = html.unescape(text)
    text = strip_tags(text)
    text = unicodedata.normalize("NFKC", text)
    text = _drop_controls(text)
    return " ".join(text.split())


def _fixpoint(text: str, step) -> str:
    for _ in range(_MAX_ROUNDS):
        new = step(text)
        if new == text:
            return new
        text = new
    return text


def normalize_text(text: str | None) -> str:
    """Unescape entities, strip tags, NFKC, drop control chars, collapse whitespace (None -> "")."""
    if not text:
        return ""
    return _fixpoint(text, _normalize_once)


def _rule_matches(rule: Rule, text: str) -> re.Match[str] | None:
    if rule.needle is not None and rule.needle not in text:
        return None
    return rule.pattern.search(text, max(0, len(text) - rule.tail) if rule.tail else 0)


def strip_boilerplate(text: str) -> str:
    """Apply the `BOILERPLATE` rules once to whitespace-normalised text."""
    for rule in BOILERPLATE:
        if rule.tail:
            m = _rule_matches(rule, text)
            if m:
                text = text[: m.start()] + rule.repl + text[m.end() :]
        elif rule.needle is None or rule.needle in text:
            text = rule.pattern.sub(rule.repl, text)
    return " ".join(text.split())


def boilerplate_rules_hit(text: str) -> list[str]:
    """Names of the `BOILERPLATE` rules that match `text` (for counting what cleaning removed)."""
    return [rule.name for rule in BOILERPLATE if _rule_matches(rule, text)]


def clean_answer(text: str | None) -> str:
    """`normalize_text` plus removal of trailing web boilerplate (A.D.A.M. credits, agency lines, nav links)."""
    if not text:
        return ""
    return _fixpoint(text, lambda t: strip_boilerplate(_normalize_once(t)))
