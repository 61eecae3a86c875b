"""DVC stage `cnn_data`: SQuAD as answer-sentence selection (question, paragraph sentence, contains-answer label)."""

from pathlib import Path

from medrank.data.sentence_selection import SENTENCE_PAIRS, build_sentence_pairs
from medrank.io import read_parquet, write_json, write_parquet
from medrank.params import load_params
from medrank.runner import run

PAIRS = "data/interim/cnn/squad_sentences.parquet"
STATS = "data/interim/cnn/squad_sentences_stats.json"


def main() -> None:
    p = load_params()
    squad = read_parquet(Path(p.clean.out_dir) / "squad.parquet")
    pairs, stats = build_sentence_pairs(squad)
    write_parquet(pairs, PAIRS, SENTENCE_PAIRS)
    write_json(STATS, stats)


if __name__ == "__main__":
    run(main)
