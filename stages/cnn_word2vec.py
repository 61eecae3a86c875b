"""DVC stage `cnn_word2vec`: skip-gram word vectors on SQuAD-train contexts (+ MedQuAD answers) for the CNN."""

from pathlib import Path

from medrank.embeddings import train_word2vec
from medrank.io import read_parquet
from medrank.params import load_params
from medrank.runner import run

OUT_DIR = "models/word2vec"


def main() -> None:
    p = load_params()
    c = p.cnn
    clean = Path(p.clean.out_dir)
    squad = read_parquet(clean / "squad.parquet", columns=["split", "paragraph_id", "paragraph"])
    # train contexts only: SQuAD dev text stays unseen until evaluation
    texts = squad[squad["split"] == "train"].drop_duplicates("paragraph_id")["paragraph"].tolist()
    n_squad = len(texts)
    if c.w2v_medquad:
        medquad = read_parquet(clean / "medquad.parquet", columns=["answer"])
        texts += [a for a in medquad["answer"].dropna() if a.strip()]
    vectors = train_word2vec(texts, c.w2v_dim, c.w2v_window, c.w2v_min_count, c.w2v_epochs, p.seed)
    vectors.save(OUT_DIR, meta={"squad_paragraphs": n_squad, "medquad_answers": len(texts) - n_squad})


if __name__ == "__main__":
    run(main)
