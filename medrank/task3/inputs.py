"""The baseline's inputs, read from the pipeline's outputs: its answer tables (the MTL's: models.mtl.read_mtl_data).

One home for what stages baseline, noise_band and the analysis stages that refit the baseline read, so a refit sees
exactly the rows the default saw.
"""

from __future__ import annotations


def load_tables(p, used: set[str], judged: bool = False, extra_scores: dict | None = None):
    """(answers, labelled, train, val, test, tfidf) answer tables with the feature inputs of the groups `used`;
    `judged`: the judged LiveQA answers join the labelled rows (train only: `judged` column); `extra_scores`: rows
    added to score files (features.read_answer_scores)."""
    from medrank.core import layout as L
    from medrank.data.judged import judged_answers, with_judged
    from medrank.task3.bow import medquad_tfidf
    from medrank.task3.features import answer_table, cap_questions, read_answer_scores
    from medrank.core.io import read_parquet

    answers = cap_questions(read_parquet(L.ANSWERS), p.max_questions_per_split)
    if judged:  # the judged LiveQA answers as extra training rows (medrank.data.judged)
        answers = with_judged(answers, judged_answers(read_parquet(L.JUDGED), answers))
    inputs: dict = read_answer_scores(answers, used, extra_scores)
    if used & {"bow", "rqe", "rqe_emb", "anli"}:
        inputs["entailed"] = read_parquet(L.RETRIEVED)
    if "anli" in used:
        inputs["anli"] = read_parquet(
            L.NLI_GRID, columns=["split", "qid", "aid", "entailed_kind", "entailed_rank", "anli"]
        )
    table = answer_table(answers, n_candidates=p.n_candidates, **inputs)
    tfidf = medquad_tfidf(p.baseline.bow_max_features) if "bow" in used else None
    labelled = table[table["split"] != L.TEST_SPLIT].reset_index(drop=True)
    train, val = labelled[labelled["split"].isin(L.TRAIN_SPLITS)], labelled[labelled["split"] == L.VAL_SPLIT]
    test = table[table["split"] == L.TEST_SPLIT].reset_index(drop=True)
    return answers, labelled, train, val, test, tfidf
