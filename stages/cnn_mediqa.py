"""DVC stage `cnn_mediqa`: the SQuAD-trained CNN applied to MEDIQA Task 3 (question vs answer sentences).

Writes per-answer CNN scores for every split (an optional feature for the baseline/MTL models), val/test
submissions (rank by score; label = score / the question's best score >= a threshold that maximises accuracy
on the two training sets: raw scores are not comparable across sources, e.g. mean 0.19 on LiveQA vs 0.49 on
Alexa questions, and a raw threshold labelled every validation answer 0) and the validation metrics with the
project's scorer.
"""

from medrank.core import layout
from medrank.core.io import read_parquet, write_json, write_parquet
from medrank.stage.runner import run
from medrank.encoders.runtime import runtime_info
from medrank.models import cnn
from medrank.models import cnn_mediqa as M
from medrank.params import load_params, step_params
from medrank.selection.metrics import gold_from_answers, score_task3
from medrank.selection.submission import write_task3_submission
from medrank.steps import save_step
from medrank.text.sentences import split_rule


def main(params_path: str = "params.yaml") -> None:
    p = load_params(params_path)
    cnn.pin_threads()
    answers = read_parquet(layout.CLEAN_ANSWERS)
    ranker = cnn.CnnRanker.load(layout.CNN_MODEL)
    scored = answers[["split", "qid", "aid", "label"]].reset_index(drop=True)
    scored = scored.join(
        cnn.cnn_answer_scores(ranker, answers.reset_index(drop=True), p.cnn.mediqa_aggregation, split_rule)
    )
    write_parquet(scored.drop(columns="label"), layout.CNN_SCORES, cnn.CNN_MEDIQA_SCORES)
    save_step("cnn_scores", step_params(p, "cnn_scores"))

    relative, threshold = M.keep_rule(scored)
    for split in (layout.VAL_SPLIT, layout.TEST_SPLIT):
        write_task3_submission(
            layout.task3_submission(split, "cnn"), M.submission_rows(scored, relative, threshold, split)
        )

    out: dict = {"aggregation": p.cnn.mediqa_aggregation, "relative_threshold": threshold}
    # fp32 on one thread: scores agree bit for bit only where the kernels do (word2vec's BLAS, conv1d: flags, ATen level)
    out["runtime"] = runtime_info("cpu", precision="fp32")
    out["val"] = score_task3(
        gold_from_answers(answers, layout.VAL_SPLIT), layout.task3_submission(layout.VAL_SPLIT, "cnn")
    )
    out.update(M.held_out(scored, relative, answers, p.seed))
    out.update(M.ranking_by_source(scored))
    write_json(layout.metrics_file("cnn_mediqa"), out)


if __name__ == "__main__":
    run(main)
