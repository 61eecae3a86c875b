"""Analysis stage `cnn_crossenc` (analysis/dvc.yaml): a MiniLM cross-encoder fine-tuned briefly on SQuAD-train sentence
pairs, scored on the dev sample of stage cnn_squad's table (same seed, same questions): the row a pretrained
transformer gives beside the CNN. No default system reads it, so `dvc repro` does not pay its fine-tune.

Writes data/interim/cnn/crossenc_dev_scores.parquet (one score per dev-sample sentence) and metrics/cnn_crossenc.json
(`dev_sample`: MRR, MAP, P@1 as in metrics/cnn_squad.json, with the run's training record)."""

import logging

import pandas as pd
import pyarrow as pa

from medrank.core import layout
from medrank.data.sentence_selection import rank_metrics, sample_pairs, sample_questions
from medrank.encoders.models import DEFAULT_MODEL
from medrank.encoders.runtime import runtime_info
from medrank.encoders.cross_encoder import CrossEncoder
from medrank.core.io import read_parquet, write_json, write_parquet
from medrank.params import load_params
from medrank.core.runner import run

SCORES_SCHEMA = pa.schema([("question_id", pa.string()), ("sent_idx", pa.int32()), ("score", pa.float64())])

log = logging.getLogger("stages.cnn_crossenc")


def main(params_path: str = "params.yaml") -> None:
    p = load_params(params_path)
    c = p.cnn
    pairs = read_parquet(layout.SQUAD_SENTENCES)
    dev = sample_questions(pairs[pairs["split"] == "dev"], c.sample_questions, p.seed)
    if c.crossenc_train_pairs == 0:
        write_parquet(
            pd.DataFrame({"question_id": [], "sent_idx": [], "score": []}), layout.CROSSENC_DEV_SCORES, SCORES_SCHEMA
        )
        write_json(
            layout.metrics_file("cnn_crossenc"),
            {"skipped": True, "dev_sample": {"cross_encoder": "skipped (cnn.crossenc_train_pairs = 0)"}},
        )
        return
    train = sample_pairs(pairs[pairs["split"] == "train"], c.crossenc_train_pairs, p.seed)
    model = CrossEncoder.from_base(
        DEFAULT_MODEL, num_labels=2, max_length=c.crossenc_max_length, device=p.device, seed=p.seed
    )
    history = model.fit(
        list(zip(train["question"], train["sentence"])),
        train["label"].astype(int).tolist(),
        epochs=c.crossenc_epochs,
        lr=c.crossenc_lr,
        batch_size=c.crossenc_batch_size,
        seed=p.seed,
        threads=c.crossenc_threads,
    )
    # scored at the training precision (as fit's evaluation is), so the dev scores (the cross-encoder's row in
    # metrics/cnn_squad.json) are those of the model as trained
    probs = model.predict(list(zip(dev["question"], dev["sentence"])), batch_size=64, precision=model.train_precision)
    out = dev[["question_id", "sent_idx"]].assign(score=probs[:, 1].astype("float64"))
    write_parquet(out, layout.CROSSENC_DEV_SCORES, SCORES_SCHEMA)
    write_json(
        layout.metrics_file("cnn_crossenc"),
        {
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
        },
    )


if __name__ == "__main__":
    run(main)
