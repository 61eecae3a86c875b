"""DVC stage `cnn_word2vec`: skip-gram word vectors on SQuAD-train contexts (+ MedQuAD answers) for the CNN."""

from medrank.core import layout
from medrank.core.io import read_parquet
from medrank.models.word2vec import train_word2vec, training_texts
from medrank.params import load_params
from medrank.stage.runner import run


def main(params_path: str = "params.yaml") -> None:
    p = load_params(params_path)
    c = p.cnn
    squad = read_parquet(layout.CLEAN_SQUAD, columns=["split", "paragraph_id", "paragraph"])
    medquad = read_parquet(layout.CLEAN_MEDQUAD, columns=["answer"]) if c.w2v_medquad else None
    texts, n_squad = training_texts(squad, medquad)
    vectors = train_word2vec(texts, c.w2v_dim, c.w2v_window, c.w2v_min_count, c.w2v_epochs, p.seed)
    vectors.save(layout.WORD2VEC_MODEL, meta={"squad_paragraphs": n_squad, "medquad_answers": len(texts) - n_squad})


if __name__ == "__main__":
    run(main)
