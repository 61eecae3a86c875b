"""Where every artifact lives (relative to the repository root) and the names of the data splits.

The one home of paths: stages, `medrank rank` and tests import them from here; dvc.yaml stays the declaration
of the DAG and tests/pipeline/test_layout.py holds the two equal (every path here is declared there, and back).
Paths are not params: a knob that names a folder invites a stage to write (or delete) where it does not own.
"""

from __future__ import annotations

from pathlib import Path

# ---------------------------------------------------------------- splits
TRAIN_SPLITS = ("train_liveqa", "train_alexa")  # MEDIQA Task 3 training sets (LiveQA, Alexa)
VAL_SPLIT = "val"
TEST_SPLIT = "test"  # unlabelled: never a training or selection input
LABELLED_SPLITS = (*TRAIN_SPLITS, VAL_SPLIT)

# ---------------------------------------------------------------- data
PARAMS_FILE = Path("params.yaml")  # every stage's knobs (medrank.params)
PARAMS_SCHEMA = Path("data/params_schema.json")  # check_params: the schema params.yaml was validated against
RAW = Path("data/raw")  # acquire: byte-exact upstream files
CLEAN = Path("data/interim/clean")  # clean: one parquet per table (medrank.data.schemas.TABLES)
NORMALIZED = Path("data/interim/normalized")  # normalize: the same tables with normalized text + sentences
ANSWERS = NORMALIZED / "answers.parquet"
MEDQUAD = NORMALIZED / "medquad.parquet"
RQE_PAIRS = NORMALIZED / "rqe_pairs.parquet"
JUDGED = (
    NORMALIZED / "liveqa_qrels.parquet"
)  # judged LiveQA answers of the train_liveqa questions (medrank.data.judged)
CLEAN_ANSWERS = CLEAN / "answers.parquet"
CLEAN_NLI = CLEAN / "nli.parquet"
CLEAN_RQE_PAIRS = CLEAN / "rqe_pairs.parquet"
CLEAN_MEDQUAD = CLEAN / "medquad.parquet"
CLEAN_SQUAD = CLEAN / "squad.parquet"
CLEAN_MEQSUM = CLEAN / "meqsum.parquet"  # consumer question -> summary pairs, MEDIQA test overlap dropped
CLEAN_LIVEQA_QUESTIONS = CLEAN / "liveqa_questions.parquet"  # TREC 2017 LiveQA-Med test = MEDIQA train_liveqa
CLEAN_LIVEQA_QRELS = CLEAN / "liveqa_qrels.parquet"  # graded (1-4) answers to those questions
RQE_VAL_GOLD = RAW / "mediqa2019/Eval_Scripts/data/RQE_validationSet_ground_truth.txt"
DISEASE_ONTOLOGY = (
    RAW / "disease_ontology/doid-ebd679f.obo.gz"
)  # normalize.disease_ontology's default (open vocabulary)

PROCESSED = Path("data/processed")
RETRIEVED = PROCESSED / "retrieved.parquet"  # retrieve: the N entailed MedQuAD questions per question
RQE_CANDIDATES = PROCESSED / "rqe_candidates.parquet"  # retrieve: every BM25 candidate with its RQE score
EMBEDDINGS = PROCESSED / "embeddings"  # embed
NLI_GRID = EMBEDDINGS / "nli_grid.parquet"
BIENC = PROCESSED / "bienc.parquet"  # bienc: bienc_cos, heading_cos, qtype_agree, qtype_match per answer
QA_SCORES = PROCESSED / "qa_scores.parquet"  # qa (analysis/dvc.yaml): qa_score per answer
QA_GRADED_SCORES = PROCESSED / "qa_graded_scores.parquet"  # qa_graded (analysis/dvc.yaml): qa_graded_score per answer
PASSAGE_SCORES = PROCESSED / "passage_scores.parquet"  # passages: passage_max_cos per answer
AGREE_SCORES = PROCESSED / "agree_scores.parquet"  # agree (analysis/dvc.yaml): agree_max_cos, agree_mean_cos per answer
QA_BIENC_SCORES = (
    PROCESSED / "qa_bienc_scores.parquet"
)  # qa_bienc (analysis/dvc.yaml): qa_bienc_cos per answer, cross-fitted
CNN_SCORES = PROCESSED / "cnn_mediqa_scores.parquet"  # cnn_mediqa: cnn_score per answer
BASELINE_PREDICTIONS = PROCESSED / "baseline" / "predictions.parquet"
MTL_PREDICTIONS = PROCESSED / "mtl_predictions.parquet"
TASK2_PROBS = PROCESSED / "task2_probs.parquet"  # finetune_rqe: P(entailed) of every val (out-of-fold) and test pair

# content-addressed extraction caches (persist: reused by `dvc exp run`)
CACHE_RQE = Path("data/cache/rqe")
CACHE_EMBED = Path("data/cache/embed")
CACHE_BIENC = Path("data/cache/bienc")
CACHE_PASSAGES = Path("data/cache/passages")

CNN_INTERIM = Path("data/interim/cnn")
SQUAD_SENTENCES = CNN_INTERIM / "squad_sentences.parquet"
SQUAD_SENTENCES_STATS = CNN_INTERIM / "squad_sentences_stats.json"
CROSSENC_DEV_SCORES = CNN_INTERIM / "crossenc_dev_scores.parquet"

# ---------------------------------------------------------------- models
# the stages analysis/dvc.yaml runs that save something `medrank rank` may load: DVC names them
# `analysis/dvc.yaml:<stage>` (the MTL's path since system_choice picked the baseline, and the passage group's step;
# tests/pipeline/test_layout.py)
ANALYSIS_DVC_YAML = "analysis/dvc.yaml"
ANALYSIS_MODEL_STAGES = frozenset({"finetune_nli", "retrieve", "embed", "mtl", "passages"})


def dvc_target(stage: str) -> str:
    """A stage as `dvc repro` takes it from the repository's root."""
    return f"{ANALYSIS_DVC_YAML}:{stage}" if stage in ANALYSIS_MODEL_STAGES else stage


MODELS = Path("models")
BASE_MODELS = MODELS / "base"  # acquire_models: pinned pretrained encoders by name (<name>/, MANIFEST.json)
NLI_MODEL = MODELS / "nli"  # finetune_nli
RQE_MODEL = MODELS / "rqe"  # finetune_rqe
RQE_BI_MODEL = (
    RQE_MODEL / "bi_encoder"
)  # the fine-tuned RQE bi-encoder, when the chosen recipe uses one (outside the CE's fingerprint)
QA_MODEL = MODELS / "qa"
WORD2VEC_MODEL = MODELS / "word2vec"
CNN_MODEL = MODELS / "cnn"
BASELINE_MODEL = MODELS / "baseline"  # baseline: val/ (train only) and final/ (train + val)
MTL_MODEL = MODELS / "mtl"  # mtl: the final (train + val) bag; val/ = the train-only bag
SYSTEM = MODELS / "system.json"  # score: which system (and weight, thresholds) makes the submissions
STEPS = MODELS / "steps"  # each step of `medrank rank` as the stage that runs it saved it (medrank.steps)
STEP_DIRS = {
    step: STEPS / step for step in ("normalize", "retrieve", "grids", "answer_scores", "passages", "cnn_scores")
}  # stages normalize, retrieve, embed, bienc, passages, cnn_mediqa (params.STEP_PARAMS: which stage, which params keys)


def finetuned_model(task: str) -> Path:
    return MODELS / task


# ---------------------------------------------------------------- committed outputs
METRICS = Path("metrics")
PLOTS = Path("plots")
SUBMISSIONS = Path("submissions")


def metrics_file(name: str) -> Path:
    return METRICS / f"{name}.json"


# outputs their stage reads back or swaps in itself (acquire, acquire_models and clean replace all of theirs
# atomically, the caches grow): the stage runner never moves them aside (medrank.core.stash)
KEPT_OUTPUTS = frozenset(
    {RAW, BASE_MODELS, CLEAN, METRICS / "data.json", CACHE_RQE, CACHE_EMBED, CACHE_BIENC, CACHE_PASSAGES}
)


def plots_dir(name: str) -> Path:
    return PLOTS / name


def task3_submission(split: str, system: str | None = None) -> Path:
    """submissions/task3_<split>[_<system>].csv (no system: the final system's file)."""
    return SUBMISSIONS / (f"task3_{split}_{system}.csv" if system else f"task3_{split}.csv")


TASK2_SUBMISSIONS = {"val": SUBMISSIONS / "task2_val.csv", "test": SUBMISSIONS / "task2_test.csv"}
NLI_SUBMISSIONS = {"val": SUBMISSIONS / "nli_sick_dev.csv", "test": SUBMISSIONS / "nli_sick_test.csv"}
ERROR_ANALYSIS = PLOTS / "error_analysis"
