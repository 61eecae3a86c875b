"""Coreference resolution (stanza): pronouns that refer to an entity are replaced by the entity's
name, as the paper did with CoreNLP. Optional: stanza and its English models must be installed."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Sequence

from medrank.core.errors import MedrankError

log = logging.getLogger(__name__)

# mentions replaced by their chain's representative; possessives get "'s"
_PRONOUNS = frozenset("he she it they him them this these those".split())
_POSSESSIVES = frozenset("his her its their".split())

_DOWNLOAD_HINT = (
    "install the English models once on a machine with internet: "
    "python -c \"import stanza; stanza.download('en', processors='tokenize,coref')\" "
    "(or point normalize.stanza_dir at a copied stanza_resources folder)"
)


def stanza_pipeline(processors: str, stanza_dir: str | None = None) -> Any:
    """An English stanza pipeline that never downloads; one clear MedrankError when unavailable."""
    try:
        import stanza
    except ImportError:
        raise MedrankError(
            f"stanza is not installed (needed for '{processors}'): pip install 'medrank[stanza]', "
            "or use normalize.sentence_splitter: rule and normalize.coref: false"
        ) from None
    model_dir = stanza_dir or os.environ.get("STANZA_RESOURCES_DIR") or stanza.resources.common.DEFAULT_MODEL_DIR
    try:
        # download_method=None: this machine is offline; a missing model must fail, not hang on a download
        return stanza.Pipeline("en", dir=model_dir, processors=processors, download_method=None, logging_level="WARN")
    except (FileNotFoundError, OSError, ValueError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise MedrankError(
            f"stanza English models for '{processors}' not found in {model_dir} ({first}); {_DOWNLOAD_HINT}"
        ) from None


@dataclass(frozen=True)
class Mention:
    start: int  # character offsets into the text
    end: int


@dataclass(frozen=True)
class Chain:
    representative: str  # the entity's name (its longest mention)
    mentions: tuple[Mention, ...]


def resolve(text: str, chains: Sequence[Chain]) -> tuple[str, int]:
    """Replace pronoun mentions by their chain's representative; returns (text, replacements)."""
    edits: list[tuple[int, int, str]] = []
    for chain in chains:
        rep = chain.representative.strip()
        if not rep or rep == "_" or rep.lower() in _PRONOUNS | _POSSESSIVES:
            continue
        for m in chain.mentions:
            word = text[m.start : m.end]
            low = word.lower()
            if low in _PRONOUNS:
                new = rep
            elif low in _POSSESSIVES:
                new = rep + "'s"
            else:
                continue
            if word[:1].isupper() and new[:1].islower():
                new = new[0].upper() + new[1:]
            edits.append((m.start, m.end, new))
    if not edits:
        return text, 0
    edits.sort()
    parts: list[str] = []
    pos = n = 0
    for start, end, new in edits:
        if start < pos:  # overlapping mentions from two chains: keep the first
            continue
        parts += [text[pos:start], new]
        pos = end
        n += 1
    parts.append(text[pos:])
    return "".join(parts), n


def chains_from_stanza(doc: Any) -> list[Chain]:
    """Character-offset chains from a stanza Document with `.coref` (zero-anaphora mentions skipped)."""
    out: list[Chain] = []
    for chain in getattr(doc, "coref", None) or []:
        mentions = []
        for m in chain.mentions:
            if not isinstance(m.start_word, int) or not isinstance(m.end_word, int) or m.end_word <= m.start_word:
                continue
            words = doc.sentences[m.sentence].words[m.start_word : m.end_word]
            first, last = words[0].parent, words[-1].parent
            if first.start_char is None or last.end_char is None:
                continue
            mentions.append(Mention(first.start_char, last.end_char))
        out.append(Chain(chain.representative_text, tuple(mentions)))
    return out


class StanzaCoref:
    """Callable text -> (resolved text, replacements) backed by stanza's coref model."""

    def __init__(self, stanza_dir: str | None = None) -> None:
        self._nlp = stanza_pipeline("tokenize,coref", stanza_dir)

    def __call__(self, text: str) -> tuple[str, int]:
        if not text.strip():
            return text, 0
        return resolve(text, chains_from_stanza(self._nlp(text)))


def make_coref(name: str | bool, stanza_dir: str | None = None) -> StanzaCoref | None:
    """The resolver named in `normalize.coref` (False = off)."""
    if name is False or name is None:
        return None
    if name == "stanza":
        return StanzaCoref(stanza_dir)
    raise MedrankError(f"normalize.coref: unknown value {name!r} (false or stanza)")
