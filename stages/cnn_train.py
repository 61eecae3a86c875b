"""DVC stage `cnn_train`: train the Severyn & Moschitti CNN on SQuAD-train sentence selection."""

from medrank.core import layout
from medrank.core.io import read_parquet, write_json
from medrank.core.live import stage_live
from medrank.stage.runner import run
from medrank.models import cnn
from medrank.models.cnn_training import train_cnn
from medrank.models.word2vec import WordVectors
from medrank.params import load_params


def main(params_path: str = "params.yaml") -> None:
    p = load_params(params_path)
    cnn.pin_threads()
    pairs = read_parquet(layout.SQUAD_SENTENCES)
    vectors = WordVectors.load(layout.WORD2VEC_MODEL)
    with stage_live("cnn_train") as live:
        ranker, record = train_cnn(pairs, vectors, p.cnn, p.seed, live)
    ranker.save(layout.CNN_MODEL)
    write_json(layout.CNN_MODEL / "train.json", record)


if __name__ == "__main__":
    run(main)
