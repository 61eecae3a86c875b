"""Explicit pyarrow schemas of the cleaned tables (data/interim/clean/<name>.parquet)."""

import pyarrow as pa

# Task 3: one row per (question, candidate answer). Test rows have null rank/score/label columns.
ANSWERS = pa.schema(
    [
        ("split", pa.string()),  # train_liveqa | train_alexa | val | test
        ("qid", pa.string()),
        ("question", pa.string()),  # cleaned
        ("question_raw", pa.string()),
        ("aid", pa.string()),
        ("answer", pa.string()),  # cleaned (boilerplate, HTML, entities removed; whitespace normalised)
        ("answer_raw", pa.string()),
        ("url", pa.string()),
        (
            "source",
            pa.string(),
        ),  # host of the URL without www./.nlm.nih.gov/.com etc: medlineplus, ghr, mayoclinic, ...
        ("answer_pos", pa.int32()),  # 1-based position in the file's AnswerList (AnswerN order)
        ("system_rank", pa.int32()),  # CHiQA rank; null for test
        ("reference_rank", pa.int32()),
        ("reference_score", pa.int32()),
        ("label", pa.int8()),  # reference_score >= 3 (official rule); null for test
    ]
)

# Task 2 (RQE): consumer health question (chq) entails FAQ?
RQE_PAIRS = pa.schema(
    [
        ("split", pa.string()),  # train | val | test
        ("pid", pa.string()),
        ("chq", pa.string()),
        ("faq", pa.string()),
        ("pair_type", pa.string()),  # train 'type' attribute; null for val and test (no attribute there)
        ("label", pa.int8()),  # 1 = entails; null for test
    ]
)

MEDQUAD = pa.schema(
    [
        ("qa_id", pa.string()),  # <collection>/<file stem>/<qid>, unique (qids repeat across files/collections)
        ("collection", pa.string()),  # e.g. 1_CancerGov_QA
        ("document_id", pa.string()),
        ("url", pa.string()),
        ("focus", pa.string()),
        ("question_type", pa.string()),
        ("question", pa.string()),
        ("answer", pa.string()),  # cleaned
        ("answer_raw", pa.string()),
    ]
)

NLI = pa.schema(
    [
        ("dataset", pa.string()),  # sick (default) | mednli | ... (optional user-supplied)
        ("split", pa.string()),  # train | dev | test  (SICK: TRAIN | TRIAL | TEST)
        ("pair_id", pa.string()),
        ("premise", pa.string()),
        ("hypothesis", pa.string()),
        ("label", pa.string()),  # entailment | neutral | contradiction
    ]
)

SQUAD = pa.schema(
    [
        ("split", pa.string()),  # train | dev
        ("article", pa.string()),
        ("paragraph_id", pa.string()),  # <article>#<index>, unique within split
        ("paragraph", pa.string()),
        ("question_id", pa.string()),  # <paragraph_id>#<index>
        ("question", pa.string()),
        ("answers", pa.list_(pa.string())),  # gold answer strings (dev has up to 3+)
    ]
)

# MeQSum: consumer health question -> expert summary (every summary is entailed by its CHQ). Pairs whose CHQ is a
# MEDIQA 2019 test question are dropped (medrank.data.consumer.drop_test_overlap; counted in metrics/data.json).
MEQSUM = pa.schema(
    [
        ("file", pa.string()),  # source file name of the question, unique
        ("chq", pa.string()),  # cleaned; "SUBJECT: s MESSAGE: m" written "s. m" as MEDIQA does
        ("summary", pa.string()),
    ]
)

# TREC 2017 LiveQA-Med test questions = MEDIQA Task 3 train_liveqa (same 104 questions); test overlap dropped.
LIVEQA_QUESTIONS = pa.schema(
    [
        ("lq_id", pa.string()),  # TQ1 ... TQ104
        ("number", pa.int32()),  # 1 ... 104: the qrels' question number
        ("subject", pa.string()),
        ("message", pa.string()),
        ("question", pa.string()),  # "subject. message", as MEDIQA Task 3 writes it
        ("nist_paraphrase", pa.string()),
        ("nlm_summary", pa.string()),
        ("foci", pa.list_(pa.string())),  # FOCUS annotations
        ("types", pa.list_(pa.string())),  # TYPE annotations (question types)
        ("mediqa_qid", pa.string()),  # qid of the same question in MEDIQA Task 3 train_liveqa
    ]
)

# Judged answers to those questions, grade 1-4 (Incorrect, Related, Incomplete, Excellent: the MEDIQA
# ReferenceScore scale). A (number, answer_id) pair may carry two judgments with different grades.
LIVEQA_QRELS = pa.schema(
    [
        ("number", pa.int32()),
        ("answer_id", pa.string()),  # medquad: e.g. GHR_0000804_Sec2; nist: nist-<number>-<line in the NIST file>
        ("grade", pa.int8()),
        ("source", pa.string()),  # medquad | nist (judged TREC participant answers)
        ("question", pa.string()),  # the MedQuAD question the answer belongs to; null for nist
        ("answer", pa.string()),  # cleaned like MedQuAD answers
        ("medquad_qa_id", pa.string()),  # the answer's qa_id in the clean MedQuAD table; null when absent (ADAM, ...)
    ]
)

TABLES = {
    "answers": ANSWERS,
    "rqe_pairs": RQE_PAIRS,
    "medquad": MEDQUAD,
    "nli": NLI,
    "squad": SQUAD,
    "meqsum": MEQSUM,
    "liveqa_questions": LIVEQA_QUESTIONS,
    "liveqa_qrels": LIVEQA_QRELS,
}

# normalize stage (data/interim/normalized/<name>.parquet): every cleaned column plus the normalized texts
# (abbreviations expanded, preferred concept names) and the answers' sentences (split after normalizing)
NORMALIZED_ANSWERS = pa.schema(
    list(ANSWERS)
    + [("question_norm", pa.string()), ("answer_norm", pa.string()), ("answer_sentences", pa.list_(pa.string()))]
)
NORMALIZED_RQE_PAIRS = pa.schema(list(RQE_PAIRS) + [("chq_norm", pa.string()), ("faq_norm", pa.string())])
NORMALIZED_MEDQUAD = pa.schema(
    list(MEDQUAD)
    + [("question_norm", pa.string()), ("answer_norm", pa.string()), ("answer_sentences", pa.list_(pa.string()))]
)
NORMALIZED_LIVEQA_QRELS = pa.schema(
    list(LIVEQA_QRELS) + [("answer_norm", pa.string()), ("answer_sentences", pa.list_(pa.string()))]
)
NORMALIZED_TABLES = {
    "answers": NORMALIZED_ANSWERS,
    "rqe_pairs": NORMALIZED_RQE_PAIRS,
    "medquad": NORMALIZED_MEDQUAD,
    "liveqa_qrels": NORMALIZED_LIVEQA_QRELS,
}
