"""Analysis stage `cnn_crossenc` (analysis/dvc.yaml): a MiniLM cross-encoder fine-tuned briefly on SQuAD-train sentence
pairs, scored on the dev sample of stage cnn_squad's table (same seed, same questions): the row a pretrained
transformer gives beside the CNN. No default system reads it, so `dvc repro` does not pay its fine-tune.

Writes data/interim/cnn/crossenc_dev_scores.parquet (one score per dev-sample sentence) and metrics/cnn_crossenc.json
(`dev_sample`: MRR, MAP, P@1 as in metrics/cnn_squad.json, with the run's training record)."""

from medrank.core import layout
from medrank.core.io import read_parquet, write_json, write_parquet
from medrank.stage.runner import run
from medrank.data.squad_sentences import sample_questions
from medrank.models.cnn_crossenc import DEV_SCORES, crossenc_dev_scores
from medrank.params import load_params


def main(params_path: str = "params.yaml") -> None:
    p = load_params(params_path)
    pairs = read_parquet(layout.SQUAD_SENTENCES)
    dev = sample_questions(pairs[pairs["split"] == "dev"], p.cnn.sample_questions, p.seed)
    scores, metrics = crossenc_dev_scores(pairs, dev, p.cnn, p.seed, p.device)
    write_parquet(scores, layout.CROSSENC_DEV_SCORES, DEV_SCORES)
    write_json(layout.metrics_file("cnn_crossenc"), metrics)


if __name__ == "__main__":
    run(main)
