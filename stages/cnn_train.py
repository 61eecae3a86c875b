"""DVC stage `cnn_train`: train the Severyn & Moschitti CNN on SQuAD-train sentence selection."""

import logging

import torch
from dvclive import Live

from medrank.core import layout
from medrank.data.sentence_selection import Idf, hold_out_articles, rank_metrics, sample_questions, tokenize
from medrank.core.io import read_parquet, write_json
from medrank.models.cnn import CnnRanker, TrainConfig
from medrank.models.word2vec import WordVectors
from medrank.params import load_params
from medrank.core.runner import run

log = logging.getLogger("stages.cnn_train")


def main(params_path: str = "params.yaml") -> None:
    p = load_params(params_path)
    # the network is small: on 2 shared cores one thread was 10x faster than two (thread sync dominates)
    torch.set_num_threads(1)
    c = p.cnn
    torch.manual_seed(p.seed)
    pairs = read_parquet(layout.SQUAD_SENTENCES)
    train_all = pairs[pairs["split"] == "train"]
    idf = Idf.fit(tokenize(s) for s in train_all["sentence"].drop_duplicates())
    train, val = hold_out_articles(train_all, c.val_articles, p.seed)
    train = sample_questions(train, c.max_train_questions, p.seed)
    log.info(
        "training on %d questions (%d pairs); %d held-out questions",
        train["question_id"].nunique(),
        len(train),
        val["question_id"].nunique(),
    )
    arch = dict(
        overlap_dim=c.overlap_dim,
        conv_width=c.conv_width,
        n_filters=c.n_filters,
        hidden_size=c.hidden_size,
        dropout=c.dropout,
        max_tokens=c.max_tokens,
        train_embeddings=c.train_embeddings,
    )
    ranker = CnnRanker.create(WordVectors.load(layout.WORD2VEC_MODEL), idf, arch, seed=p.seed)
    enc_train = ranker.encoder.encode(train["question"].tolist(), train["sentence"].tolist())
    enc_val = ranker.encoder.encode(val["question"].tolist(), val["sentence"].tolist())
    tc = TrainConfig(
        optimizer=c.optimizer, lr=c.lr, l2=c.l2, epochs=c.epochs, batch_size=c.batch_size, patience=c.patience
    )

    with Live(str(layout.plots_dir("cnn_train")), save_dvc_exp=False, dvcyaml=None) as live:

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

        history = ranker.fit(enc_train, train["label"].to_numpy(), tc, p.seed, on_epoch)
    ranker.save(layout.CNN_MODEL)
    scored = [h for h in history if h["val_score"] is not None]
    write_json(
        layout.CNN_MODEL / "train.json",
        {
            "train_questions": int(train["question_id"].nunique()),
            "train_pairs": len(train),
            "val_questions": int(val["question_id"].nunique()),
            "best_epoch": max(scored, key=lambda h: h["val_score"])["epoch"] if scored else len(history),
            "history": history,
        },
    )


if __name__ == "__main__":
    run(main)
