"""SQuAD v1.1 rebuilt from the official SQuAD-explorer HTML pages (paragraphs, questions, answer strings).

Page structure (one page per article): repeated `<div class="para-wrap">` blocks, each holding the
paragraph in `<pre>...</pre>` and one `<div class="qa-wrap"...>` per question with
`<strong class="question">` and one `<span class="answer">` per gold answer. The markup is generated
and flat, so a few regexes are exact and ~50x faster than a DOM parser.
"""

from __future__ import annotations

import html
import logging
import os
import re
import tarfile
from pathlib import Path

import pandas as pd

from medrank.errors import MedrankError

log = logging.getLogger(__name__)

SQUAD_FILES = {
    "train": "squad/squad-explorer-v1.1-train-html-0b3c8e8.tar.gz",
    "dev": "squad/squad-explorer-v1.1-dev-html-e0c66cf.tar.gz",
}
COLUMNS = ["split", "article", "paragraph_id", "paragraph", "question_id", "question", "answers"]

_PARA_SPLIT = re.compile(r'<div class="para-wrap">')
_PRE = re.compile(r"<pre>(.*?)</pre>", re.S)
_QA_SPLIT = re.compile(r'<div class="qa-wrap"')
_QUESTION = re.compile(r'<strong class="question">(.*?)</strong>', re.S)
_ANSWER = re.compile(r'<span class="answer">(.*?)</span>', re.S)
_TITLE = re.compile(r'<h1 id="title">(.*?)</h1>', re.S)


def _text(fragment: str) -> str:
    # Same normalisation for paragraphs and answers, so every answer stays a substring of its paragraph.
    return " ".join(html.unescape(fragment).split())


def parse_article(page: str, split: str, fallback_title: str, name: str) -> list[dict]:
    """Rows (one per question) of one explorer article page."""
    title_m = _TITLE.search(page)
    article = _text(title_m.group(1)) if title_m else fallback_title
    rows = []
    for p_idx, block in enumerate(_PARA_SPLIT.split(page)[1:]):
        pre = _PRE.search(block)
        if pre is None:
            raise MedrankError(f"{name}: paragraph block {p_idx} has no <pre> paragraph")
        paragraph = _text(pre.group(1))
        paragraph_id = f"{article}#{p_idx}"
        for q_idx, qa in enumerate(_QA_SPLIT.split(block)[1:]):
            question = _QUESTION.search(qa)
            if question is None:
                raise MedrankError(f"{name}: paragraph {p_idx} question block {q_idx} has no question")
            rows.append(
                {
                    "split": split,
                    "article": article,
                    "paragraph_id": paragraph_id,
                    "paragraph": paragraph,
                    "question_id": f"{paragraph_id}#{q_idx}",
                    "question": _text(question.group(1)),
                    "answers": [_text(a) for a in _ANSWER.findall(qa)],
                }
            )
    return rows


def read_squad(path: str | os.PathLike, split: str, max_articles: int | None = None) -> pd.DataFrame:
    """All questions of one SQuAD-explorer tarball (articles in name order, the first `max_articles`)."""
    path = Path(path)
    if not path.is_file():
        raise MedrankError(f"{path}: raw file not found (run the acquire stage)")
    rows: list[dict] = []
    try:
        with tarfile.open(path, mode="r:gz") as tar:
            members = sorted(
                (m for m in tar.getmembers() if m.isfile() and m.name.endswith(".html")),
                key=lambda m: m.name,
            )
            members = [m for m in members if Path(m.name).name != "index.html"]
            for member in members[:max_articles]:
                page = tar.extractfile(member).read().decode("utf-8", errors="replace")
                rows.extend(parse_article(page, split, Path(member.name).stem, f"{path}:{member.name}"))
    except (tarfile.TarError, EOFError, OSError) as e:
        raise MedrankError(f"{path}: unreadable tar.gz archive ({e})") from None
    df = pd.DataFrame(rows, columns=COLUMNS)
    log.info("SQuAD %s: %d articles, %d questions", split, df["article"].nunique(), len(df))
    return df
