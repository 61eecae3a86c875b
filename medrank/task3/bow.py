"""The bow feature group's TF-IDF: fitted on MedQuAD answers only (the paper's choice; no MEDIQA text), and its rows
memoised per vectorizer and text (CV refits the feature builder many times on the same answers)."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import numpy as np
import scipy.sparse as sp

if TYPE_CHECKING:
    from sklearn.feature_extraction.text import TfidfVectorizer


def medquad_tfidf(max_features: int) -> TfidfVectorizer:
    """The bow group's TF-IDF, fitted on the normalized MedQuAD answers (never on MEDIQA text)."""
    from medrank.core.io import read_parquet
    from medrank.core.layout import MEDQUAD

    return fit_tfidf(read_parquet(MEDQUAD, columns=["answer_norm"])["answer_norm"].dropna().tolist(), max_features)


def fit_tfidf(corpus: Sequence[str], max_features: int, min_df: int = 2) -> TfidfVectorizer:
    """TF-IDF vectorizer fitted on `corpus` (MedQuAD answers: the paper's choice; no MEDIQA text)."""
    from sklearn.feature_extraction.text import TfidfVectorizer  # here: stages that never fit one skip sklearn (~0.8 s)

    vec = TfidfVectorizer(
        lowercase=True,
        stop_words="english",
        sublinear_tf=True,
        min_df=min_df,
        max_features=max_features,
        token_pattern=r"(?u)\b[a-zA-Z][a-zA-Z0-9-]+\b",  # words, not bare numbers
        dtype=np.float32,
    )
    vec.fit(list(corpus))
    return vec


@dataclass
class _RowMemo:
    index: dict[str, int] = field(default_factory=dict)
    matrix: sp.csr_matrix | None = None


_BOW_MEMO: "weakref.WeakKeyDictionary[TfidfVectorizer, _RowMemo]" = weakref.WeakKeyDictionary()


def tfidf_rows(tfidf: TfidfVectorizer, texts: Sequence[str]) -> sp.csr_matrix:
    """`tfidf.transform(texts)`, memoised per vectorizer and text: CV refits the builder many times on the
    same answers, and tokenising them again dominated its run time."""
    memo = _BOW_MEMO.setdefault(tfidf, _RowMemo())
    new = [t for t in dict.fromkeys(texts) if t not in memo.index]
    if new:
        rows = tfidf.transform(new).tocsr()
        memo.matrix = rows if memo.matrix is None else sp.vstack([memo.matrix, rows], format="csr")
        start = len(memo.index)
        memo.index.update({t: start + i for i, t in enumerate(new)})
    if not len(texts):
        return sp.csr_matrix((0, len(tfidf.vocabulary_)), dtype=np.float32)
    return memo.matrix[[memo.index[t] for t in texts]]
