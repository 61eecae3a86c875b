"""DVC stage `chiqa`: the CHiQA-order baseline (every answer kept, system order) for val and test."""

from medrank.core import layout
from medrank.core.io import read_parquet, write_json
from medrank.selection.metrics import gold_from_answers, score_task3
from medrank.params import load_params
from medrank.stage.runner import run
from medrank.selection.submission import write_task3_submission


def main(params_path: str = "params.yaml") -> None:
    load_params(params_path)  # validated like every stage's, though no knob is read
    answers = read_parquet(layout.CLEAN_ANSWERS)
    # Test files carry no SystemRank but list answers in CHiQA order (FINDINGS.md): fall back to position.
    rank = answers["system_rank"].fillna(answers["answer_pos"]).astype(float)
    ranked = answers[["split", "qid", "aid"]].assign(label=1, score=-rank)
    for split in (layout.VAL_SPLIT, layout.TEST_SPLIT):
        part = ranked[ranked["split"] == split].drop(columns="split")
        write_task3_submission(layout.task3_submission(split, "chiqa"), part)
    gold = gold_from_answers(answers[answers["split"] == layout.VAL_SPLIT])
    write_json(
        layout.metrics_file("task3_val_chiqa"), score_task3(gold, layout.task3_submission(layout.VAL_SPLIT, "chiqa"))
    )


if __name__ == "__main__":
    run(main)
