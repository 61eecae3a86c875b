"""The SQuAD-trained CNN as a MEDIQA Task 3 system (stage cnn_mediqa): answers ranked by their CNN score (cnn.py's
`cnn_answer_scores`), kept where the score relative to the question's best passes a threshold fitted on the two
training sets, and the ranking's quality per labelled source."""

from __future__ import annotations

import numpy as np
import pandas as pd

from medrank.core import layout
from medrank.selection.decision import best_cut_threshold, relative_to_question_best
from medrank.selection.experiment import answer_truth, held_out_scores
from medrank.selection.metrics import ir_metrics
from medrank.task3.features import question_key


def keep_rule(scored: pd.DataFrame) -> tuple[np.ndarray, float]:
    """Each answer's score relative to its question's best, and the threshold on it that maximises accuracy on the two
    training sets: raw scores are not comparable across sources (mean 0.19 on LiveQA vs 0.49 on Alexa questions; a raw
    threshold labelled every validation answer 0)."""
    # qids repeat across splits (both training sets start at 1): group by split and qid
    relative = relative_to_question_best(scored["cnn_score"], scored["split"] + "/" + scored["qid"])
    is_train = scored["split"].isin(layout.TRAIN_SPLITS).to_numpy()
    return relative, best_cut_threshold(relative[is_train], scored.loc[is_train, "label"].to_numpy())


def submission_rows(scored: pd.DataFrame, relative: np.ndarray, threshold: float, split: str) -> pd.DataFrame:
    """`split`'s submission rows: qid, aid, label (relative score >= `threshold`), score (the CNN's: the order)."""
    part = scored["split"] == split
    return scored.loc[part, ["qid", "aid"]].assign(
        label=(relative[part.to_numpy()] >= threshold).astype(int), score=scored.loc[part, "cnn_score"].to_numpy()
    )


def held_out(scored: pd.DataFrame, relative: np.ndarray, answers: pd.DataFrame, seed: int) -> dict:
    """CV and LOSO scores of the keep threshold, the CNN's only MEDIQA-fitted part, chosen on the other folds' /
    sources' rows."""
    rescored = scored.assign(prob=relative, rank_key=scored["cnn_score"], gid=question_key(scored))
    truth = answer_truth(answers, layout.LABELLED_SPLITS)
    return held_out_scores(rescored, truth, layout.LABELLED_SPLITS, k=5, seed=seed)


def ranking_by_source(scored: pd.DataFrame) -> dict[str, dict]:
    """Ranking quality alone (every answer ranked by score; relevance = reference_score >= 3): MRR, MAP, P@1 per
    labelled split, as `<split>_ranx`."""
    out = {}
    for split in layout.LABELLED_SPLITS:
        part = scored[scored["split"] == split]
        qrels = part[["qid", "aid"]].assign(label=part["label"].astype(int))
        run_ = part[["qid", "aid"]].assign(score=part["cnn_score"].to_numpy(dtype=np.float64))
        out[f"{split}_ranx"] = {
            k: round(v, 4) for k, v in ir_metrics(qrels, run_, ("mrr", "map", "precision@1")).items()
        }
    return out
