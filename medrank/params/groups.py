"""The Task 3 feature groups, one registry: the answer-table columns each group reads, the per-answer score another
stage writes for it (and that stage's file), where it may be used, and how the served pipeline computes it for new
answers (the saved step it reads, its scorer). medrank.task3.features builds from it, medrank.params validates
against it, the stages read their score files through it, medrank.steps.score_step serves from it. It sits in params
(below every other package) so that validating params.yaml imports no Task 3 code: a scorer is named, not imported.

A new per-answer group is its function and scorer (e.g. in medrank/task3/answer_scores.py), its stage, its entry
here and its params section; dvc.yaml and params.yaml name them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from medrank.core import layout as L


@dataclass(frozen=True)
class Group:
    columns: tuple[str, ...] = ()  # answer-table columns it reads
    score: str | None = None  # a per-answer score: expanded into itself and its place among the question's answers
    file: Path | None = None  # the stage output holding the group's columns
    per_candidate: bool = False  # also reads <group>_i for each of the n_candidates entailed answers
    judged: bool = False  # its inputs exist for the judged LiveQA answers (medrank.data.judged)
    analysis: bool = False  # computed by analysis/dvc.yaml only: a candidate of the analysis rows, never a default's
    # reads stage retrieve's entailed MedQuAD answers (anli: embed's NLI grids too): analysis/dvc.yaml stages since
    # system_choice picked the baseline (issue 63), so the default baseline may not read it; the MTL's stage may
    retrieval: bool = False
    stacked: bool = False  # another model's held-out scores, computed inside each MTL fit (no stage, no file)
    step: str | None = None  # the saved step (models/steps/<step>) whose recipe its scorer reads when served
    serve: str | None = (
        None  # "module:function": scorer(ctx) -> score(answers, groups) -> {column: array}; None: not served
    )


_A = "medrank.task3.answer_scores:"

REGISTRY: dict[str, Group] = {
    "metadata": Group(("source", "n_sentences", "chiqa_rank"), judged=True),
    "bow": Group(("answer_text", "entailed_text"), judged=True, retrieval=True),
    "rqe": Group(per_candidate=True, judged=True, retrieval=True),
    "rqe_emb": Group(per_candidate=True, judged=True, retrieval=True),
    "anli": Group(per_candidate=True, retrieval=True),
    "bienc": Group(("bienc_cos",), "bienc_cos", L.BIENC, judged=True, step="answer_scores", serve=_A + "cosine_scorer"),
    "heading": Group(
        ("heading_cos",), "heading_cos", L.BIENC, judged=True, step="answer_scores", serve=_A + "cosine_scorer"
    ),
    "qtype": Group(
        ("qtype_agree", "qtype_match"),
        "qtype_agree",
        L.BIENC,
        judged=True,
        step="answer_scores",
        serve=_A + "qtype_scorer",
    ),
    "cnn": Group(("cnn_score",), "cnn_score", L.CNN_SCORES, step="cnn_scores", serve="medrank.models.cnn:cnn_scorer"),
    "qa": Group(("qa_score",), "qa_score", L.QA_SCORES, analysis=True, serve=_A + "qa_scorer"),
    "qa_graded": Group(("qa_graded_score",), "qa_graded_score", L.QA_GRADED_SCORES, analysis=True),
    # analysis since the acceptance rule refused it (nested LOSO: it loses on validation; RESULTS): stage passages
    "passage": Group(
        ("passage_max_cos",),
        "passage_max_cos",
        L.PASSAGE_SCORES,
        analysis=True,
        step="passages",
        serve=_A + "passage_scorer",
    ),
    "qa_bienc": Group(("qa_bienc_cos",), "qa_bienc_cos", L.QA_BIENC_SCORES, analysis=True),
    # the Task 3 README's own suggestion: the answer's agreement with the entailed MedQuAD questions' answers (bienc's
    # mpnet cosine, the best and the mean over the entailed ones): stage agree
    "agree": Group(("agree_max_cos", "agree_mean_cos"), "agree_max_cos", L.AGREE_SCORES, analysis=True),
    # issue 61's early fusion, "the MTL fed the baseline's score": the baseline's rank score and probability as MTL
    # inputs, cross-fitted inside every MTL fit (its training questions out of fold, its held-out ones by a baseline
    # fitted on the training questions: medrank.models.baseline_protocols.stacked_scores); nested_loso's rows only
    "stacked": Group(("stacked_rank_score", "stacked_prob"), "stacked_rank_score", stacked=True),
}

GROUPS = tuple(REGISTRY)
# groups whose scores analysis/dvc.yaml computes: a full `dvc repro` does not train models the default systems never
# read; adopting one moves its stage to dvc.yaml
ANALYSIS_GROUPS = tuple(g for g, s in REGISTRY.items() if s.analysis)
JUDGED_GROUPS = tuple(g for g, s in REGISTRY.items() if s.judged)
RETRIEVAL_GROUPS = frozenset(g for g, s in REGISTRY.items() if s.retrieval)
STACKED_GROUPS = tuple(g for g, s in REGISTRY.items() if s.stacked)  # computed inside a fit: no stage computes them
BIENC_GROUPS = tuple(g for g, s in REGISTRY.items() if s.file == L.BIENC)  # the groups stage bienc writes
# per-answer scores of other stages, by group: (its score column, file)
SCORE_FILES = {g: (s.score, s.file) for g, s in REGISTRY.items() if s.score is not None and s.file is not None}
# the answer-table columns those stages write (medrank.task3.features.answer_table's per-answer scores)
SCORE_COLUMNS = tuple(c for g, s in REGISTRY.items() if s.file is not None for c in s.columns)
