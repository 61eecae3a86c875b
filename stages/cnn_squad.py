"""DVC stage `cnn_squad`: one ranx table (MRR, MAP, P@1) on SQuAD dev: word overlap, BM25, the CNN, the cross-encoder."""

import json

import numpy as np
import torch

from medrank.data import sentence_selection as ss
from medrank.errors import MedrankError
from medrank.io import read_parquet, write_json
from medrank.models.cnn import CnnRanker
from medrank.params import load_params
from medrank.runner import run

PAIRS = "data/interim/cnn/squad_sentences.parquet"
STATS = "data/interim/cnn/squad_sentences_stats.json"
MODEL = "models/cnn"
CROSSENC_SCORES = "data/interim/cnn/crossenc_dev_scores.parquet"
CROSSENC_META = "data/interim/cnn/crossenc_meta.json"
OUT = "metrics/cnn_squad.json"


def main() -> None:
    p = load_params()
    # the network is small: on 2 shared cores one thread was 10x faster than two (thread sync dominates)
    torch.set_num_threads(1)
    pairs = read_parquet(PAIRS)
    dev = pairs[pairs["split"] == "dev"].reset_index(drop=True)
    ranker = CnnRanker.load(MODEL)
    scores = {
        "word_overlap": ss.tie_break(ss.word_overlap_scores(dev), p.seed),
        "idf_overlap": ss.tie_break(ss.idf_overlap_scores(dev, ranker.encoder.idf), p.seed),
        "bm25": ss.tie_break(ss.bm25_scores(dev), p.seed),
        "cnn": ranker.predict(dev["question"].tolist(), dev["sentence"].tolist()),
    }
    full = {"n_questions": int(dev["question_id"].nunique())}
    full.update({name: ss.rank_metrics(dev, s) for name, s in scores.items()})

    # the sample every system is scored on, the cross-encoder included (its inference is the costly part)
    sample_ids = set(ss.sample_questions(dev, p.cnn.sample_questions, p.seed)["question_id"])
    mask = dev["question_id"].isin(sample_ids).to_numpy()
    sample_rows = dev[mask].reset_index(drop=True)
    sample = {"n_questions": len(sample_ids)}
    sample.update({name: ss.rank_metrics(sample_rows, s[mask]) for name, s in scores.items()})
    ce_meta = json.loads(open(CROSSENC_META, encoding="utf-8").read())
    ce = read_parquet(CROSSENC_SCORES)
    if ce_meta.get("skipped"):
        sample["cross_encoder"] = "skipped (cnn.crossenc_train_pairs = 0)"
    else:
        merged = sample_rows[["question_id", "sent_idx"]].merge(ce, on=["question_id", "sent_idx"], how="left")
        if merged["score"].isna().any():
            raise MedrankError(f"{CROSSENC_SCORES} does not cover the dev sample: re-run the cnn_crossenc stage")
        sample["cross_encoder"] = ss.rank_metrics(sample_rows, merged["score"].to_numpy(dtype=np.float64))
        sample["cross_encoder_train_pairs"] = ce_meta["train_pairs"]

    train = json.loads(open(f"{MODEL}/train.json", encoding="utf-8").read())
    write_json(
        OUT,
        {
            "dev": full,
            "dev_sample": sample,
            "cnn_train": {k: train[k] for k in ("train_questions", "train_pairs", "val_questions", "best_epoch")},
            "data": json.loads(open(STATS, encoding="utf-8").read()),
        },
    )


if __name__ == "__main__":
    run(main)
