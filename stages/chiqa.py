"""DVC stage `chiqa`: the CHiQA-order baseline (every answer kept, system order) for val and test."""

from pathlib import Path

from medrank.io import read_parquet, write_json
from medrank.metrics import gold_from_answers, score_task3
from medrank.params import load_params
from medrank.runner import run
from medrank.submission import write_task3_submission


def main() -> None:
    p = load_params()
    answers = read_parquet(Path(p.clean.out_dir) / "answers.parquet")
    # Test files carry no SystemRank but list answers in CHiQA order (FINDINGS.md): fall back to position.
    rank = answers["system_rank"].fillna(answers["answer_pos"]).astype(float)
    ranked = answers[["split", "qid", "aid"]].assign(label=1, score=-rank)
    for split in ("val", "test"):
        part = ranked[ranked["split"] == split].drop(columns="split")
        write_task3_submission(f"submissions/task3_{split}_chiqa.csv", part)
    gold = gold_from_answers(answers[answers["split"] == "val"])
    write_json("metrics/task3_val_chiqa.json", score_task3(gold, "submissions/task3_val_chiqa.csv"))


if __name__ == "__main__":
    run(main)
