"""DVC stage `cnn_data`: SQuAD as answer-sentence selection (question, paragraph sentence, contains-answer label)."""

from medrank.core import layout
from medrank.data.squad_sentences import SENTENCE_PAIRS, build_sentence_pairs
from medrank.core.io import read_parquet, write_json, write_parquet
from medrank.params import load_params
from medrank.stage.runner import run


def main(params_path: str = "params.yaml") -> None:
    load_params(params_path)  # validated like every stage's, though no knob is read
    pairs, stats = build_sentence_pairs(read_parquet(layout.CLEAN_SQUAD))
    write_parquet(pairs, layout.SQUAD_SENTENCES, SENTENCE_PAIRS)
    write_json(layout.SQUAD_SENTENCES_STATS, stats)


if __name__ == "__main__":
    run(main)
