"""RQE retrieval logic: BM25 candidates, N/T selection with the top-1 fallback, coverage (paper Table 3)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from medrank.core.errors import MedrankError
from medrank.task3.retrieval import bm25_candidates, coverage, medquad_documents, select_entailed


@pytest.fixture
def cands() -> pd.DataFrame:
    # q1: a clear ranking; q2: nothing above 0.5 (fallback); q3: a tie broken by BM25 rank; q4 in another split
    rows = [
        ("val", "q1", 1, "a", 0.60),
        ("val", "q1", 2, "b", 0.95),
        ("val", "q1", 3, "c", 0.20),
        ("val", "q1", 4, "d", 0.80),
        ("val", "q1", 5, "e", 0.75),
        ("val", "q2", 1, "f", 0.30),
        ("val", "q2", 2, "g", 0.45),
        ("val", "q2", 3, "h", 0.10),
        ("val", "q3", 2, "i", 0.72),
        ("val", "q3", 1, "j", 0.72),
        ("val", "q3", 3, "k", 0.71),
        ("test", "q1", 1, "l", 0.99),
    ]
    return pd.DataFrame(rows, columns=["split", "qid", "bm25_rank", "qa_id", "rqe_score"])


def _picked(df: pd.DataFrame, split: str, qid: str) -> list[str]:
    g = df[(df.split == split) & (df.qid == qid)].sort_values("rank")
    assert g["rank"].tolist() == list(range(1, len(g) + 1))
    return g["qa_id"].tolist()


def test_top_n_above_threshold(cands):
    out = select_entailed(cands, n_candidates=3, threshold=0.7)
    assert _picked(out, "val", "q1") == ["b", "d", "e"]
    assert _picked(out, "val", "q3") == ["j", "i", "k"]  # equal scores: better BM25 rank first
    assert _picked(out, "test", "q1") == ["l"]  # keys are (split, qid): same qid in two splits stay apart
    assert out[out.qid != "q2"]["passes_threshold"].all()


def test_fewer_than_n_pass_keeps_only_those(cands):
    out = select_entailed(cands, n_candidates=3, threshold=0.9)
    assert _picked(out, "val", "q1") == ["b"]


def test_fallback_to_top1_when_none_passes(cands):
    out = select_entailed(cands, n_candidates=3, threshold=0.5)
    assert _picked(out, "val", "q2") == ["g"]
    row = out[(out.split == "val") & (out.qid == "q2")].iloc[0]
    assert not row.passes_threshold
    assert _picked(out, "val", "q1") == ["b", "d", "e"]
    # every question always has at least one entailed question
    assert out.groupby(["split", "qid"]).size().min() == 1 and out[["split", "qid"]].drop_duplicates().shape[0] == 4


def test_no_threshold_is_plain_top_n(cands):
    out = select_entailed(cands, n_candidates=2, threshold=None)
    assert _picked(out, "val", "q1") == ["b", "d"]
    assert _picked(out, "val", "q2") == ["g", "f"]
    assert out["passes_threshold"].all()
    assert len(select_entailed(cands, n_candidates=50, threshold=None)) == len(cands)
    with pytest.raises(MedrankError):
        select_entailed(cands, n_candidates=0, threshold=None)


def test_coverage_counts_questions_with_a_candidate_at_t(cands):
    cov = coverage(cands, [0.5, 0.7, 0.9])
    assert cov["all"]["T=0.5"] == {"covered": 3, "questions": 4, "fraction": 0.75}
    assert cov["all"]["T=0.9"]["covered"] == 2  # val q1 (0.95) and test q1 (0.99)
    assert cov["val"]["T=0.7"]["covered"] == 2 and cov["val"]["T=0.7"]["questions"] == 3
    assert cov["test"]["T=0.9"]["fraction"] == 1.0


def test_bm25_ranks_the_matching_question_first():
    docs = [
        "What are the symptoms of asthma ?",
        "What causes diabetes ?",
        "How to treat high blood pressure ?",
        "What are the symptoms of diabetes ?",
    ]
    idx, scores = bm25_candidates(["symptoms of type 2 diabetes", "the of and"], docs, top_k=3)
    assert idx.shape == (2, 3) and idx[0, 0] == 3 and scores[0, 0] > scores[0, 1]
    # a query of stopwords only still gets k candidates (score 0) for the cross-encoder to judge
    assert len(set(idx[1])) == 3 and np.all(scores[1] == 0)
    idx, _ = bm25_candidates(["asthma"], docs, top_k=10)
    assert idx.shape == (1, 4)  # k capped at the number of documents
    with pytest.raises(MedrankError):
        bm25_candidates(["x"], [], top_k=3)


def test_medquad_documents_drop_empty_and_duplicate_pairs():
    mq = pd.DataFrame(
        {"qa_id": ["b", "a", "c", "d"], "question_norm": ["q1", "q1", "q2", "q3"], "answer_norm": ["x", "x", "y", " "]}
    )
    docs = medquad_documents(mq, "question_norm", "answer_norm")
    assert docs["qa_id"].tolist() == ["a", "c"]  # the smallest qa_id of duplicates, whatever the input order


def test_judged_retrieval_scores_rankings_and_selection_against_graded_judgments():
    from medrank.task3.retrieval import judged_retrieval

    # question 1 (MEDIQA qid "7"): relevant m2 (grade 4) and m3 (judged 2 and 3: best grade counts); m1 graded 1
    qrels = pd.DataFrame(
        {
            "number": [1, 1, 1, 1, 2, 1],
            "answer_id": ["a1", "a2", "a3", "a3", "b1", "x"],
            "grade": [1, 4, 2, 3, 4, 4],
            "source": ["medquad"] * 5 + ["nist"],
            "medquad_qa_id": ["m1", "m2", "m3", "m3", None, None],
        }
    )
    liveqa = pd.DataFrame({"number": [1, 2], "mediqa_qid": ["7", "8"]})
    cands = pd.DataFrame(
        {
            "split": "train_liveqa",
            "qid": "7",
            "bm25_rank": [1, 2, 3, 4],
            "qa_id": ["m1", "m9", "m3", "m2"],
            "rqe_score": [0.2, 0.9, 0.8, 0.1],
        }
    )
    chosen = pd.DataFrame({"split": "train_liveqa", "qid": "7", "rank": [1, 2], "qa_id": ["m9", "m3"]})
    out = judged_retrieval(cands, chosen, qrels, liveqa, ks=(1, 2, 4))
    # question 2 has no relevant answer in the MedQuAD table (its judged answer has no qa_id): not judged here
    assert out["questions_judged"] == 1 and out["relevant_pairs"] == 2
    # by RQE: m9, m3, m1, m2 -> first relevant at 2; by BM25: m1, m9, m3, m2 -> first relevant at 3
    assert out["by_rqe"] == {"mrr": 0.5, "recall@1": 0.0, "recall@2": 0.5, "recall@4": 1.0}
    assert out["by_bm25"]["mrr"] == round(1 / 3, 4) and out["by_bm25"]["recall@2"] == 0.0
    assert out["selected"] == {"questions": 1, "hit_rate": 1.0, "precision": 0.5, "mrr": 0.5, "per_question": 2.0}
