"""SQuAD as answer-sentence selection, lexical features and lexical baselines.

Each question's candidates are the sentences of its paragraph (medrank.text.sentences.split_rule).
Relevance rule (SQuAD v1.1 from the explorer pages has answer strings but no character offsets, so the
span cannot be located): a sentence is relevant iff it contains one of the question's gold answer strings, compared
case-insensitively with whitespace collapsed, surrounding punctuation of the answer stripped, and the
match bounded by non-word characters (so "1" does not match inside "1990"). Ties/multiple matches:
every sentence containing any gold answer is relevant (a question may have several relevant
sentences; MAP accounts for all of them). Questions with no matching sentence (answer crosses a
sentence boundary) and questions whose every candidate matches (e.g. one-sentence paragraphs) are
dropped: neither can separate rankings, as in the "clean" TREC QA setting.
"""

from __future__ import annotations

import logging
import math
import re
from collections import Counter
from typing import Iterable, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from medrank.text.sentences import split_rule

log = logging.getLogger(__name__)

# One row per (question, candidate sentence) in data/interim/cnn/squad_sentences.parquet.
SENTENCE_PAIRS = pa.schema(
    [
        ("split", pa.string()),  # train | dev (SQuAD splits)
        ("article", pa.string()),
        ("paragraph_id", pa.string()),
        ("question_id", pa.string()),
        ("question", pa.string()),
        ("sent_idx", pa.int32()),  # 0-based position of the sentence in its paragraph
        ("sentence", pa.string()),
        ("label", pa.int8()),  # 1 = contains a gold answer string
    ]
)

# sklearn's English stop list, frozen here so features do not move with a library upgrade.
STOPWORDS = frozenset(
    """a about above across after afterwards again against all almost alone along already also although
    always am among amongst amoungst amount an and another any anyhow anyone anything anyway anywhere are
    around as at back be became because become becomes becoming been before beforehand behind being below
    beside besides between beyond both but by can cannot could did do does doing done down due during each
    eg eight either eleven else elsewhere enough etc even ever every everyone everything everywhere except
    few fifteen fifty first five for former formerly forty four from further get give go had has have he
    hence her here hereafter hereby herein hereupon hers herself him himself his how however hundred i ie
    if in inc indeed into is it its itself just keep last latter latterly least less ltd made many may me
    meanwhile might mine more moreover most mostly move much must my myself namely neither never nevertheless
    next nine no nobody none noone nor not nothing now nowhere of off often on once one only onto or other
    others otherwise our ours ourselves out over own part per perhaps please put rather re same see seem
    seemed seeming seems several she should show side since six sixty so some somehow someone something
    sometime sometimes somewhere still such take ten than that the their them themselves then thence there
    thereafter thereby therefore therein thereupon these they third this those three through throughout thru
    thus to together too top toward towards twelve twenty two un under until up upon us very via was we well
    were what whatever when whence whenever where whereafter whereas whereby wherein whereupon wherever
    whether which while whither who whoever whole whom whose why will with within without would yet you your
    yours yourself yourselves""".split()
)

_TOKEN_RE = re.compile(r"\w+(?:[-'’]\w+)*")


def tokenize(text: str) -> list[str]:
    """Lower-cased word tokens (punctuation dropped, hyphen/apostrophe compounds kept)."""
    return _TOKEN_RE.findall(text.lower())


def _normalize(text: str) -> str:
    return " ".join(text.lower().split())


def _answer_pattern(answers: Iterable[str]) -> re.Pattern | None:
    alts = []
    for a in answers:
        a = _normalize(a).strip(" .,;:!?\"'“”‘’()[]")
        if a:
            alts.append(re.escape(a))
    if not alts:
        return None
    # longest first so the alternation does not stop at a shorter prefix answer
    alts = sorted(set(alts), key=len, reverse=True)
    return re.compile(r"(?<!\w)(?:" + "|".join(alts) + r")(?!\w)")


def relevance_labels(sentences: Sequence[str], answers: Iterable[str]) -> list[int]:
    """1 for every sentence containing any gold answer string (see module docstring), else 0."""
    pat = _answer_pattern(answers)
    if pat is None:
        return [0] * len(sentences)
    return [int(pat.search(_normalize(s)) is not None) for s in sentences]


def build_sentence_pairs(squad: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """Turn the cleaned `squad` table into (question, sentence, label) rows; returns (rows, stats per split)."""
    split_cache: dict[tuple[str, str], list[str]] = {}
    rows: list[tuple] = []
    stats: dict[str, Counter] = {}
    for r in squad.itertuples(index=False):
        st = stats.setdefault(r.split, Counter())
        st["questions"] += 1
        key = (r.split, r.paragraph_id)
        sents = split_cache.get(key)
        if sents is None:
            sents = split_cache[key] = split_rule(r.paragraph)
        labels = relevance_labels(sents, list(r.answers))
        n_pos = sum(labels)
        if n_pos == 0:
            st["dropped_no_match"] += 1
            continue
        if n_pos == len(sents):
            st["dropped_all_relevant"] += 1
            continue
        st["kept"] += 1
        st["candidates"] += len(sents)
        st["relevant"] += n_pos
        st["multi_relevant"] += int(n_pos > 1)
        for i, (s, y) in enumerate(zip(sents, labels)):
            rows.append((r.split, r.article, r.paragraph_id, r.question_id, r.question, i, s, y))
    df = pd.DataFrame(rows, columns=SENTENCE_PAIRS.names)
    df["sent_idx"] = df["sent_idx"].astype("int32")
    df["label"] = df["label"].astype("int8")
    out = {}
    for split, st in stats.items():
        kept = max(st["kept"], 1)
        out[split] = {
            **dict(st),
            "mean_candidates": round(st["candidates"] / kept, 3),
            "mean_relevant": round(st["relevant"] / kept, 3),
        }
        log.info("squad %s: %s", split, out[split])
    return df, out


# ---------------------------------------------------------------- lexical features and baselines


class Idf:
    """Inverse document frequency over a sentence collection; unseen words get the maximum IDF."""

    def __init__(self, doc_freq: dict[str, int], n_docs: int):
        self.doc_freq = doc_freq
        self.n_docs = n_docs
        self._max = math.log(n_docs + 1)

    @classmethod
    def fit(cls, token_lists: Iterable[Sequence[str]]) -> "Idf":
        df: Counter = Counter()
        n = 0
        for toks in token_lists:
            df.update(set(toks))
            n += 1
        return cls(dict(df), n)

    def __call__(self, word: str) -> float:
        d = self.doc_freq.get(word)
        return self._max if d is None else math.log((self.n_docs + 1) / d)


FEATURE_NAMES = ["overlap", "idf_overlap", "overlap_nostop", "idf_overlap_nostop"]


def overlap_features(q_tokens: Sequence[str], s_tokens: Sequence[str], idf: Idf) -> list[float]:
    """Severyn & Moschitti's extra features: word overlap and IDF-weighted overlap, all words and non-stopwords."""
    q, s = set(q_tokens), set(s_tokens)
    qn = q - STOPWORDS
    out = []
    for qs in (q, qn):
        common = qs & s
        w_all = sum(idf(w) for w in qs)
        out.append(len(common) / len(qs) if qs else 0.0)
        out.append(sum(idf(w) for w in common) / w_all if w_all > 0 else 0.0)
    return [out[0], out[1], out[2], out[3]]


def word_overlap_scores(pairs: pd.DataFrame) -> np.ndarray:
    """Baseline: number of non-stopword question words found in the sentence."""
    return np.array(
        [len((set(tokenize(q)) - STOPWORDS) & set(tokenize(s))) for q, s in zip(pairs["question"], pairs["sentence"])],
        dtype=np.float64,
    )


def idf_overlap_scores(pairs: pd.DataFrame, idf: Idf) -> np.ndarray:
    """Baseline: summed IDF of the non-stopword question words found in the sentence."""
    out = np.empty(len(pairs))
    for i, (q, s) in enumerate(zip(pairs["question"], pairs["sentence"])):
        out[i] = sum(idf(w) for w in (set(tokenize(q)) - STOPWORDS) & set(tokenize(s)))
    return out


def bm25_scores(pairs: pd.DataFrame) -> np.ndarray:
    """Baseline: BM25 (bm25s, Lucene variant) of each candidate, IDF over all distinct sentences in `pairs`."""
    import bm25s

    sentences = pairs["sentence"].drop_duplicates().tolist()
    index = {s: i for i, s in enumerate(sentences)}
    retriever = bm25s.BM25()
    retriever.index([[t for t in tokenize(s) if t not in STOPWORDS] or [""] for s in sentences], show_progress=False)
    out = np.empty(len(pairs))
    questions = pairs["question"].to_numpy()
    cand = np.array([index[s] for s in pairs["sentence"]])
    # score each question once against the whole collection, then pick its candidates
    for _, pos in pairs.groupby("question_id", sort=False).indices.items():
        q_tokens = [t for t in tokenize(questions[pos[0]]) if t not in STOPWORDS]
        out[pos] = retriever.get_scores(q_tokens)[cand[pos]] if q_tokens else 0.0
    return out


def tie_break(scores: np.ndarray, seed: int) -> np.ndarray:
    """Add seeded jitter far below any score gap so tied candidates are ranked at random, not by position."""
    rng = np.random.default_rng(seed)
    scores = np.asarray(scores, dtype=np.float64)
    return scores + rng.uniform(0.0, 1e-6, size=len(scores))


def sample_questions(pairs: pd.DataFrame, n: int | None, seed: int) -> pd.DataFrame:
    """Rows of `n` questions drawn at random (seeded, independent of row order); all rows if n is None or larger."""
    qids = np.sort(pairs["question_id"].unique())
    if n is None or n >= len(qids):
        return pairs.reset_index(drop=True)
    keep = set(np.random.default_rng(seed).choice(qids, n, replace=False))
    return pairs[pairs["question_id"].isin(keep)].reset_index(drop=True)


def hold_out_articles(pairs: pd.DataFrame, n_articles: int, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Split rows by article into (train, held-out); at most half the articles are held out."""
    articles = np.sort(pairs["article"].unique())
    n = min(n_articles, len(articles) // 2)
    held = set(np.random.default_rng(seed).choice(articles, n, replace=False)) if n else set()
    mask = pairs["article"].isin(held)
    return pairs[~mask].reset_index(drop=True), pairs[mask].reset_index(drop=True)


def sample_pairs(pairs: pd.DataFrame, max_pairs: int, seed: int) -> pd.DataFrame:
    """Whole questions drawn at random (seeded) until at least `max_pairs` rows are collected."""
    sizes = pairs.groupby("question_id").size()
    order = np.random.default_rng(seed).permutation(np.sort(sizes.index.to_numpy()))
    n_q = int(np.searchsorted(np.cumsum(sizes.loc[order].to_numpy()), max_pairs) + 1)
    keep = set(order[:n_q])
    return pairs[pairs["question_id"].isin(keep)].reset_index(drop=True)
