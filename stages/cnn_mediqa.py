"""DVC stage `cnn_mediqa`: the SQuAD-trained CNN applied to MEDIQA Task 3 (question vs answer sentences).

Writes per-answer CNN scores for every split (an optional feature for the baseline/MTL models), val/test
submissions (rank by score; label = score / the question's best score >= a threshold that maximises accuracy
on the two training sets: raw scores are not comparable across sources, e.g. mean 0.19 on LiveQA vs 0.49 on
Alexa questions, and a raw threshold labelled every validation answer 0) and the validation metrics with the
project's scorer.
"""

import numpy as np
import torch

from medrank.core import layout
from medrank.selection.decision import best_cut_threshold, relative_to_question_best
from medrank.encoders.runtime import runtime_info
from medrank.selection.experiment import answer_truth, held_out_scores
from medrank.task3.features import question_key
from medrank.core.io import read_parquet, write_json, write_parquet
from medrank.selection.metrics import gold_from_answers, ir_metrics, score_task3
from medrank.models.cnn import CNN_MEDIQA_SCORES, CnnRanker, cnn_answer_scores
from medrank.params import load_params, step_params
from medrank.core.runner import run
from medrank.serving.steps import save_step
from medrank.selection.submission import write_task3_submission
from medrank.text.sentences import split_rule


def main(params_path: str = "params.yaml") -> None:
    p = load_params(params_path)
    # the network is small: on 2 shared cores one thread was 10x faster than two (thread sync dominates)
    torch.set_num_threads(1)
    answers = read_parquet(layout.CLEAN_ANSWERS)
    ranker = CnnRanker.load(layout.CNN_MODEL)
    scored = answers[["split", "qid", "aid", "label"]].reset_index(drop=True)
    scored = scored.join(
        cnn_answer_scores(ranker, answers.reset_index(drop=True), p.cnn.mediqa_aggregation, split_rule)
    )
    write_parquet(scored.drop(columns="label"), layout.CNN_SCORES, CNN_MEDIQA_SCORES)
    save_step("cnn_scores", step_params(p, "cnn_scores"))

    # qids repeat across splits (both training sets start at 1): group by split and qid
    relative = relative_to_question_best(scored["cnn_score"], scored["split"] + "/" + scored["qid"])
    is_train = scored["split"].isin(layout.TRAIN_SPLITS).to_numpy()
    threshold = best_cut_threshold(relative[is_train], scored.loc[is_train, "label"].to_numpy())
    for split in (layout.VAL_SPLIT, layout.TEST_SPLIT):
        part = scored["split"] == split
        sub = scored.loc[part, ["qid", "aid"]].assign(
            label=(relative[part.to_numpy()] >= threshold).astype(int), score=scored.loc[part, "cnn_score"].to_numpy()
        )
        write_task3_submission(layout.task3_submission(split, "cnn"), sub)

    out: dict = {"aggregation": p.cnn.mediqa_aggregation, "relative_threshold": threshold}
    # fp32 on one thread: scores agree bit for bit only where the kernels do (word2vec's BLAS, conv1d: flags, ATen level)
    out["runtime"] = runtime_info("cpu", precision="fp32")
    out["val"] = score_task3(
        gold_from_answers(answers, layout.VAL_SPLIT), layout.task3_submission(layout.VAL_SPLIT, "cnn")
    )
    # the keep threshold, the CNN's only MEDIQA-fitted part, chosen on the other folds' / sources' rows
    rescored = scored.assign(prob=relative, rank_key=scored["cnn_score"], gid=question_key(scored))
    truth = answer_truth(answers, layout.LABELLED_SPLITS)
    out.update(held_out_scores(rescored, truth, layout.LABELLED_SPLITS, k=5, seed=p.seed))
    # ranking quality alone (every answer ranked by score; relevance = reference_score >= 3), per labelled split
    for split in layout.LABELLED_SPLITS:
        part = scored[scored["split"] == split]
        qrels = part[["qid", "aid"]].assign(label=part["label"].astype(int))
        run_ = part[["qid", "aid"]].assign(score=part["cnn_score"].to_numpy(dtype=np.float64))
        out[f"{split}_ranx"] = {
            k: round(v, 4) for k, v in ir_metrics(qrels, run_, ("mrr", "map", "precision@1")).items()
        }
    write_json(layout.metrics_file("cnn_mediqa"), out)


if __name__ == "__main__":
    run(main)
