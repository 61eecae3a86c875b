"""The CNN trained on SQuAD-train sentence selection (stage cnn_train): questions of a few held-out articles pick the
best epoch by MAP (the paper selects on MAP), each epoch's loss and held-out MRR / MAP / P@1 logged as dvclive curves."""

from __future__ import annotations

import logging
from typing import Any

import pandas as pd
import torch

from medrank.data.squad_sentences import Idf, hold_out_articles, sample_questions, tokenize
from medrank.selection.metrics import rank_metrics
from medrank.models.cnn import CnnRanker, TrainConfig, architecture
from medrank.models.word2vec import WordVectors

log = logging.getLogger(__name__)


def train_cnn(pairs: pd.DataFrame, vectors: WordVectors, c, seed: int, live: Any) -> tuple[CnnRanker, dict]:
    """A CNN (`cnn` params section `c`) trained on the train split of `pairs` (stage cnn_data's sentence pairs), less the
    questions of `c.val_articles` held-out articles that choose its epoch: (ranker, the training record)."""
    torch.manual_seed(seed)
    train_all = pairs[pairs["split"] == "train"]
    idf = Idf.fit(tokenize(s) for s in train_all["sentence"].drop_duplicates())
    train, val = hold_out_articles(train_all, c.val_articles, seed)
    train = sample_questions(train, c.max_train_questions, seed)
    log.info(
        "training on %d questions (%d pairs); %d held-out questions",
        train["question_id"].nunique(),
        len(train),
        val["question_id"].nunique(),
    )
    ranker = CnnRanker.create(vectors, idf, architecture(c), seed=seed)
    enc_train = ranker.encoder.encode(train["question"].tolist(), train["sentence"].tolist())
    enc_val = ranker.encoder.encode(val["question"].tolist(), val["sentence"].tolist())

    def on_epoch(epoch: int, loss: float) -> float | None:
        live.log_metric("train_loss", loss)
        if not len(val):
            live.next_step()
            return None
        m = rank_metrics(val, ranker.predict_encoded(enc_val))
        live.log_metric("val_mrr", m["mrr"])
        live.log_metric("val_map", m["map"])
        live.log_metric("val_p_at_1", m["precision@1"])
        live.next_step()
        return m["map"]  # the paper selects on MAP

    history = ranker.fit(enc_train, train["label"].to_numpy(), TrainConfig.of(c), seed, on_epoch)
    scored = [h for h in history if h["val_score"] is not None]
    return ranker, {
        "train_questions": int(train["question_id"].nunique()),
        "train_pairs": len(train),
        "val_questions": int(val["question_id"].nunique()),
        "best_epoch": max(scored, key=lambda h: h["val_score"])["epoch"] if scored else len(history),
        "history": history,
    }
