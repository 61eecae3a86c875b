"""Skip-gram word embeddings (gensim Word2Vec) for the CNN re-ranker: train, save, load."""

from __future__ import annotations

import json
import logging
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

from medrank.data.squad_sentences import tokenize
from medrank.core.errors import MedrankError
from medrank.core.io import atomic_path, sha256_file, write_json, write_text
from medrank.text.sentences import split_rule

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WordVectors:
    """Vocabulary (most frequent first) and its float32 vectors, row i for words[i]."""

    words: list[str]
    vectors: np.ndarray

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def save(self, out_dir: str | Path, meta: dict | None = None) -> None:
        out_dir = Path(out_dir)
        with atomic_path(out_dir / "vectors.npy") as tmp:
            with open(tmp, "wb") as f:
                np.save(f, self.vectors.astype(np.float32))
        write_text(out_dir / "vocab.txt", "\n".join(self.words) + "\n")
        sums = {name: sha256_file(out_dir / name) for name in ("vectors.npy", "vocab.txt")}  # checked at every load
        write_json(out_dir / "meta.json", {"n_words": len(self.words), "dim": self.dim, "sha256": sums, **(meta or {})})

    @classmethod
    def load(cls, out_dir: str | Path) -> "WordVectors":
        out_dir = Path(out_dir)
        if not (out_dir / "vectors.npy").exists():
            raise MedrankError(f"{out_dir}: no word vectors (run the cnn_word2vec stage)")
        try:
            sums = json.loads((out_dir / "meta.json").read_text(encoding="utf-8")).get("sha256") or {}
        except (OSError, ValueError, AttributeError):
            sums = {}
        for name in ("vectors.npy", "vocab.txt"):
            if sums.get(name) != sha256_file(out_dir / name):
                raise MedrankError(
                    f"{out_dir / name}: no sha256 recorded in meta.json, or the file differs from it; restore it with "
                    "`dvc checkout cnn_word2vec` (or `dvc pull`), or re-run `dvc repro cnn_word2vec`"
                )
        words = (out_dir / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
        vectors = np.load(out_dir / "vectors.npy")
        if len(words) != len(vectors):
            raise MedrankError(f"{out_dir}: vocab.txt has {len(words)} words but vectors.npy {len(vectors)} rows")
        return cls(words, vectors)


def training_texts(squad: pd.DataFrame, medquad: pd.DataFrame | None) -> tuple[list[str], int]:
    """SQuAD-train paragraphs (dev text stays unseen until evaluation), each once, plus the non-blank MedQuAD
    answers when `medquad` is given; and how many texts are SQuAD paragraphs."""
    texts = squad[squad["split"] == "train"].drop_duplicates("paragraph_id")["paragraph"].tolist()
    n_squad = len(texts)
    if medquad is not None:
        texts += [a for a in medquad["answer"].dropna() if a.strip()]
    return texts, n_squad


def corpus_sentences(texts: Iterable[str]) -> list[list[str]]:
    """Token lists of every sentence of `texts` (kept in memory: gensim walks it once per epoch)."""
    out = []
    for text in texts:
        for sent in split_rule(text):
            toks = tokenize(sent)
            if toks:
                out.append(toks)
    return out


def _stable_hash(s: str) -> int:
    # gensim (4.x) draws the first vocabulary's vectors from one seeded RNG, but seeds the vector of a word added
    # later (seeded_vector) with hashfxn(word + seed): Python's hash() is salted per process, crc32 is not
    return zlib.crc32(s.encode("utf-8"))


def train_word2vec(
    texts: Iterable[str], dim: int, window: int, min_count: int, epochs: int, seed: int, workers: int = 1
) -> WordVectors:
    """Skip-gram with negative sampling over the sentences of `texts` (one worker = reproducible: gensim's workers race
    for batches, and with its default 3 the vectors differed run to run)."""
    from gensim.models import Word2Vec

    corpus = corpus_sentences(texts)
    model = Word2Vec(
        sentences=corpus,
        vector_size=dim,
        window=window,
        min_count=min_count,
        sg=1,
        negative=5,
        epochs=epochs,
        seed=seed,
        workers=workers,
        hashfxn=_stable_hash,
    )
    log.info("word2vec: %d words, %d tokens per epoch", len(model.wv), model.corpus_total_words)
    return WordVectors(list(model.wv.index_to_key), np.asarray(model.wv.vectors, dtype=np.float32))
