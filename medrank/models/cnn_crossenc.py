"""The row a pretrained transformer gives beside the CNN on SQuAD (analysis stage cnn_crossenc): MiniLM fine-tuned
briefly on SQuAD-train sentence pairs, scored on the dev sample of stage cnn_squad's table."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa

from medrank.data.squad_sentences import sample_pairs
from medrank.selection.metrics import rank_metrics
from medrank.encoders.cross_encoder import CrossEncoder
from medrank.encoders.weights import DEFAULT_MODEL
from medrank.encoders.runtime import runtime_info

# data/interim/cnn/crossenc_dev_scores.parquet: one score per dev-sample sentence
DEV_SCORES = pa.schema([("question_id", pa.string()), ("sent_idx", pa.int32()), ("score", pa.float64())])


def crossenc_dev_scores(pairs: pd.DataFrame, dev: pd.DataFrame, c, seed: int, device: str) -> tuple[pd.DataFrame, dict]:
    """The cross-encoder (`cnn` params section `c`: crossenc_*) fine-tuned on `c.crossenc_train_pairs` train pairs of
    `pairs`, then P(relevant) of every `dev` sentence: (scores, metrics); none with `crossenc_train_pairs` 0 (skipped)."""
    if c.crossenc_train_pairs == 0:
        skipped = {"skipped": True, "dev_sample": {"cross_encoder": "skipped (cnn.crossenc_train_pairs = 0)"}}
        return pd.DataFrame({"question_id": [], "sent_idx": [], "score": []}), skipped
    train = sample_pairs(pairs[pairs["split"] == "train"], c.crossenc_train_pairs, seed)
    model = CrossEncoder.from_base(
        DEFAULT_MODEL, num_labels=2, max_length=c.crossenc_max_length, device=device, seed=seed
    )
    history = model.fit(
        list(zip(train["question"], train["sentence"])),
        train["label"].astype(int).tolist(),
        epochs=c.crossenc_epochs,
        lr=c.crossenc_lr,
        batch_size=c.crossenc_batch_size,
        seed=seed,
        threads=c.crossenc_threads,
    )
    # scored at the training precision (as fit's evaluation is), so the dev scores (the cross-encoder's row in
    # metrics/cnn_squad.json) are those of the model as trained
    probs = model.predict(list(zip(dev["question"], dev["sentence"])), batch_size=64, precision=model.train_precision)
    out = dev[["question_id", "sent_idx"]].assign(score=probs[:, 1].astype("float64"))
    return out, {
        "skipped": False,
        "base_model": DEFAULT_MODEL,
        "dev_sample": {
            "n_questions": int(dev["question_id"].nunique()),
            "cross_encoder": rank_metrics(dev, out["score"].to_numpy()),
            "cross_encoder_train_pairs": len(train),
        },
        "train_pairs": len(train),
        "train_questions": int(train["question_id"].nunique()),
        "history": history,
        "predict": model.last_predict_stats,
        # the weights depend on the training precision and the thread count (every core: recorded, not pinned)
        "runtime": runtime_info(
            model.device, train_precision=model.train_precision, predict_precision=model.train_precision
        ),
    }
