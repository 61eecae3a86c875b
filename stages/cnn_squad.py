"""DVC stage `cnn_squad`: one ranx table (MRR, MAP, P@1) on SQuAD dev: word overlap, IDF overlap, BM25 and the CNN.

The fine-tuned MiniLM cross-encoder's row on the same dev sample is analysis/dvc.yaml's `cnn_crossenc` (a 200 s
fine-tune no default system reads); RESULTS shows both in one table."""

import json

from medrank.core import layout
from medrank.core.io import read_parquet, write_json
from medrank.models.cnn import CnnRanker, pin_threads, squad_comparison
from medrank.params import load_params
from medrank.stage.runner import run


def _read_json(path) -> dict:
    return json.loads(open(path, encoding="utf-8").read())


def main(params_path: str = "params.yaml") -> None:
    p = load_params(params_path)
    pin_threads()
    pairs = read_parquet(layout.SQUAD_SENTENCES)
    dev = pairs[pairs["split"] == "dev"].reset_index(drop=True)
    ranker = CnnRanker.load(layout.CNN_MODEL)
    out = squad_comparison(dev, ranker, p.cnn.sample_questions, p.seed)
    train = _read_json(layout.CNN_MODEL / "train.json")
    out["cnn_train"] = {k: train[k] for k in ("train_questions", "train_pairs", "val_questions", "best_epoch")}
    out["data"] = _read_json(layout.SQUAD_SENTENCES_STATS)
    write_json(layout.metrics_file("cnn_squad"), out)


if __name__ == "__main__":
    run(main)
