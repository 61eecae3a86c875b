"""The inference path as step objects: each is fitted (or configured) by its stage, saved under models/, loaded by
`medrank rank`, and transforms frames the same way in both places.

    NormalizeStep   answers table -> normalized texts + sentences            stage normalize
    RetrieveStep    questions -> scored BM25 candidates -> the N entailed    stage retrieve
    GridStep        answers + entailed answers -> NLI grid rows              stage embed
    AnswerScores    answers -> per-answer scores (bienc, qtype, cnn, qa)     stages bienc, cnn_mediqa (+ models)
    SystemStep      grids + scores -> filter probability, keep, order        stages baseline / mtl / score

A stage builds its step (`fit` from its params and inputs), `save`s it (medrank.steps: models/steps/<step>/) and
calls `transform` on every question, writing the extraction caches; `InferencePipeline.load(models/)` loads the same
steps and runs them on one question, reading the caches when they are there (never writing them).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from medrank import layout
from medrank.errors import MedrankError
from medrank.steps import load_recipe, load_step, normalizer_state_of, normalizer_state_tables, save_step

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from medrank.params import Params

Fit = Literal["final", "val"]


def model_dir(path: Path, what: str, stage: str) -> Path:
    if not path.is_dir():
        raise MedrankError(f"{path}: the {what} model is missing (run `dvc repro {stage}`)")
    return path


# ---------------------------------------------------------------- normalize
@dataclass
class NormalizeStep:
    """Abbreviations, preferred names and sentences (params.normalize; the vocabularies are its fitted state)."""

    p: Params
    state: Any  # medrank.text.normalize.NormalizerState
    normalizer: Any = field(init=False)
    splitter: Any = field(init=False)

    def __post_init__(self) -> None:
        from medrank.text.sentences import make_splitter

        self.normalizer = self.state.normalizer()
        self.splitter = make_splitter(self.p.normalize.sentence_splitter, self.p.normalize.stanza_dir)

    @classmethod
    def fit(cls, p: Params) -> "NormalizeStep":
        """Read the vocabularies the section names (abbreviation list, Disease Ontology or UMLS)."""
        from medrank.text.normalize import normalizer_state

        return cls(p, normalizer_state(p.normalize))

    def save(self, models_dir: str | os.PathLike = layout.MODELS) -> Path:
        from medrank.params import step_params

        return save_step("normalize", step_params(self.p, "normalize"), normalizer_state_tables(self.state), models_dir)

    @classmethod
    def load(cls, models_dir: str | os.PathLike = layout.MODELS) -> "NormalizeStep":
        saved = load_step("normalize", models_dir)
        return cls(load_recipe({"normalize": saved}, str(models_dir)), normalizer_state_of(saved))

    def transform(self, table: pd.DataFrame, spec: Any, coref: Any = None, desc: str = "normalize"):
        """(normalized table, stats) of one table (medrank.text.normalize.TABLES[name])."""
        from medrank.text.normalize import normalize_table

        return normalize_table(table, spec, self.normalizer, self.splitter, coref, desc=desc)


# ---------------------------------------------------------------- retrieve
@dataclass
class RetrieveStep:
    """BM25 candidates from MedQuAD scored by the RQE cross-encoder; the N entailed (score >= T, else the top-1)."""

    p: Params  # n_candidates, rqe_threshold, retrieve
    docs: pd.DataFrame  # retrieval.saved_documents
    rqe: Any  # CrossEncoder

    @property
    def question_col(self) -> str:
        return self.p.retrieve.question_column

    @classmethod
    def fit(cls, p: Params, medquad: pd.DataFrame, rqe: Any) -> "RetrieveStep":
        from medrank.retrieval import medquad_documents, saved_documents

        qcol = p.retrieve.question_column
        return cls(p, saved_documents(medquad_documents(medquad, qcol, "answer_norm"), qcol), rqe)

    def save(self, models_dir: str | os.PathLike = layout.MODELS) -> Path:
        from medrank.params import step_params

        return save_step("retrieve", step_params(self.p, "retrieve"), {"medquad": self.docs}, models_dir)

    @classmethod
    def load(cls, models_dir: str | os.PathLike = layout.MODELS, device: str = "auto") -> "RetrieveStep":
        from medrank.encoders.cross_encoder import CrossEncoder

        saved = load_step("retrieve", models_dir)
        p = load_recipe({"retrieve": saved}, str(models_dir))
        path = model_dir(Path(models_dir) / layout.RQE_MODEL.name, "rqe", "finetune_rqe")
        return cls(p, saved.tables["medquad"], CrossEncoder.load(path, device=device, precision=p.retrieve.precision))

    def score(self, questions: pd.DataFrame, cache_root: str | os.PathLike, **kw: Any):
        """ScoredCandidates of `questions` (retrieval.questions_table); `kw`: read_only, shard_size, backend, ..."""
        from medrank.retrieval import score_candidates

        rp = self.p.retrieve
        return score_candidates(
            questions,
            self.docs,
            self.rqe,
            cache_root,
            question_col=self.question_col,
            bm25_top_k=rp.bm25_top_k,
            precision=rp.precision,
            batch_size=rp.batch_size,
            **kw,
        )

    def entailed(self, scored: pd.DataFrame) -> pd.DataFrame:
        """The N entailed MedQuAD questions of each question (N applied here, once) with their answers."""
        from medrank.retrieval import attach_entailed, select_entailed

        chosen = select_entailed(scored, self.p.n_candidates, self.p.rqe_threshold)
        return attach_entailed(chosen, self.docs, self.question_col)

    def transform(self, answers: pd.DataFrame, cache_root: str | os.PathLike, **kw: Any) -> pd.DataFrame:
        from medrank.retrieval import questions_table

        return self.entailed(self.score(questions_table(answers, self.question_col, None), cache_root, **kw).table)


# ---------------------------------------------------------------- NLI grids
@dataclass
class GridStep:
    """NLI sentence grids of every (candidate answer, entailed answer) pair (params.embed)."""

    p: Params  # embed
    nli: Any  # CrossEncoder
    prefilter: Any | None  # SentenceEncoder of embed.bi_encoder, with embed.prefilter_top_k

    @classmethod
    def fit(cls, p: Params, nli: Any, device: str = "auto") -> "GridStep":
        from medrank.encoders.sentence_encoder import SentenceEncoder

        ep = p.embed
        return cls(p, nli, SentenceEncoder(ep.bi_encoder, device=device) if ep.prefilter_top_k is not None else None)

    def save(self, models_dir: str | os.PathLike = layout.MODELS) -> Path:
        from medrank.params import step_params

        return save_step("grids", step_params(self.p, "grids"), None, models_dir)

    @classmethod
    def load(cls, models_dir: str | os.PathLike = layout.MODELS, device: str = "auto") -> "GridStep":
        from medrank.encoders.cross_encoder import CrossEncoder

        p = load_recipe({"grids": load_step("grids", models_dir)}, str(models_dir))
        path = model_dir(Path(models_dir) / layout.NLI_MODEL.name, "nli", "finetune_nli")
        return cls.fit(p, CrossEncoder.load(path, device=device, precision=p.embed.precision), device)

    def transform(self, answers: pd.DataFrame, retrieved: pd.DataFrame, cache_root: str | os.PathLike, **kw: Any):
        """medrank.grids.Grids of `answers` (split, qid, aid, reference_rank, sentences) against `retrieved`
        (entailed answers as `sentences`); `kw`: read_only, show_progress, shard_size, backend."""
        from medrank.grids import answer_grids

        ep = self.p.embed
        return answer_grids(
            answers,
            retrieved,
            self.nli,
            cache_root,
            max_sentences=ep.max_sentences,
            prefilter_top_k=ep.prefilter_top_k,
            bi=self.prefilter,
            augment_top=ep.augment_top,
            precision=ep.precision,
            batch_size=ep.batch_size,
            bi_batch_size=ep.bi_batch_size,
            **kw,
        )


# ---------------------------------------------------------------- per-answer scores
@dataclass
class AnswerScores:
    """The per-answer scores the final system's feature groups read: bienc / heading cosines and question-type
    agreement (stage bienc's step), the CNN's answer score (cnn_mediqa's step + models/cnn), the QA cross-encoder's
    (models/qa: analysis stage qa, whose knobs are not saved: the qa section's defaults apply)."""

    p: Params
    groups: set[str]
    bienc: Any | None = None  # SentenceEncoder of groups bienc / heading
    qtypes: Any | None = None  # QuestionTypes of group qtype
    cnn: Any | None = None  # CnnRanker of group cnn
    qa: Any | None = None  # CrossEncoder of group qa

    @classmethod
    def load(cls, groups: set[str], models_dir: str | os.PathLike = layout.MODELS, device: str = "auto"):
        from medrank.encoders.cross_encoder import CrossEncoder
        from medrank.encoders.sentence_encoder import SentenceEncoder

        models_dir = Path(models_dir)
        steps = {}
        if groups & {"bienc", "heading", "qtype"}:
            steps["answer_scores"] = load_step("answer_scores", models_dir)
        if "cnn" in groups:
            steps["cnn_scores"] = load_step("cnn_scores", models_dir)
        p = load_recipe(steps, str(models_dir))
        out = cls(p, set(groups))
        if groups & {"bienc", "heading"}:
            out.bienc = SentenceEncoder(p.bienc.model, device=device, max_length=p.bienc.max_length)
        if "qtype" in groups:
            from medrank.models.qtype import QuestionTypes

            out.qtypes = QuestionTypes.from_tables(steps["answer_scores"].tables, p.seed)  # stage bienc's, not refitted
        if "cnn" in groups:
            from medrank.models.cnn import CnnRanker

            out.cnn = CnnRanker.load(model_dir(models_dir / layout.CNN_MODEL.name, "cnn", "cnn_train"))
        if "qa" in groups:
            path = model_dir(models_dir / layout.QA_MODEL.name, "qa", "qa")
            out.qa = CrossEncoder.load(path, device=device, precision=p.qa.predict_precision)
        return out

    def transform(
        self, answers: pd.DataFrame, cache_root: str | os.PathLike = layout.CACHE_BIENC
    ) -> dict[str, np.ndarray]:
        """Per-answer score columns aligned with `answers`, for the groups the system reads."""
        from medrank.answer_scores import answer_bienc_scores

        p, groups, out = self.p, self.groups, {}
        if groups & {"bienc", "heading"}:
            bp = p.bienc
            cos, _ = answer_bienc_scores(
                answers,
                self.bienc,
                cache_root=cache_root,
                batch_size=bp.batch_size,
                read_only=True,
                precision=bp.precision,
            )  # as stage bienc resolves it
            out.update({k: v for k, v in cos.items() if {"bienc_cos": "bienc", "heading_cos": "heading"}[k] in groups})
        if "qtype" in groups:
            from medrank.answer_scores import answer_qtype_scores

            out.update(answer_qtype_scores(answers, self.qtypes))
        if "cnn" in groups:
            from medrank.models.cnn import answer_scores
            from medrank.text.sentences import split_rule

            scored = answer_scores(self.cnn, answers, p.cnn.mediqa_aggregation, split_rule)
            out["cnn_score"] = scored["cnn_score"].to_numpy()
        if "qa" in groups:
            from medrank.answer_scores import qa_pairs

            probs = self.qa.predict(qa_pairs(answers), batch_size=p.qa.eval_batch_size, show_progress=False)
            out["qa_score"] = probs[:, 1]
        return out


def read_system(models_dir: str | os.PathLike = layout.MODELS) -> dict:
    """models/system.json (written by stage score): the final system, its MTL weight, keep rules and order."""
    path = Path(models_dir) / layout.SYSTEM.name
    if not path.is_file():
        raise MedrankError(f"{path}: no trained system (run `dvc repro score`)")
    try:
        system = json.loads(path.read_text(encoding="utf-8"))
        missing = [k for k in ("system", "mtl_weight", "keep", "order") if k not in system]
    except (ValueError, TypeError) as e:
        raise MedrankError(f"{path}: not a system file written by stage score ({type(e).__name__}: {e})") from None
    if missing:
        raise MedrankError(f"{path}: not a system file written by stage score (no {', '.join(missing)})")
    try:  # the saved decision, checked here: a doctored file stops with one line, not a traceback per question
        from medrank.decision import ORDERS, Keep

        for fit in ("val", "test"):
            Keep.from_json(system["keep"][fit])
        if system["order"] not in ORDERS:
            raise ValueError(f"order {system['order']!r}")
    except (KeyError, TypeError, ValueError) as e:
        raise MedrankError(
            f"{path}: the saved keep rule / order is not one stage score writes ({type(e).__name__}: {e})"
        ) from None
    return system


# ---------------------------------------------------------------- the final system
@dataclass
class SystemStep:
    """Stage score's decision (models/system.json) over the baseline's and / or the MTL's fitted models."""

    system: dict
    fit: Fit
    baseline: Any | None  # FittedBaseline
    mtl: Any | None  # MTLBag
    mtl_meta: dict | None

    @property
    def groups(self) -> set[str]:
        return set(self.baseline.builder.groups if self.baseline else ()) | set(
            self.mtl.builder.groups if self.mtl else ()
        )

    @classmethod
    def load(cls, models_dir: str | os.PathLike = layout.MODELS, fit: Fit = "final") -> "SystemStep":
        from medrank.models.baseline import FittedBaseline
        from medrank.models.mtl import MTLBag

        models_dir = Path(models_dir)
        if fit not in ("final", "val"):
            raise MedrankError(f"fit must be final or val, got {fit!r}")
        system = read_system(models_dir)
        baseline = mtl = meta = None
        if system["system"] in ("baseline", "ensemble"):
            baseline = FittedBaseline.load(models_dir / layout.BASELINE_MODEL.name / f"{fit}.json")
        if system["system"] in ("mtl", "ensemble"):
            mtl_dir = models_dir / layout.MTL_MODEL.name
            mtl, meta = MTLBag.load(mtl_dir / "val" if fit == "val" else mtl_dir)
        return cls(system, fit, baseline, mtl, meta)

    def transform(
        self, answers: pd.DataFrame, retrieved: pd.DataFrame, grid: pd.DataFrame, scores: dict, n_candidates: int
    ) -> pd.DataFrame:
        """apply_decision's rows (aid, prob, rank_key, label, score) of the answers."""
        from medrank.decision import Keep, apply_decision, combine_systems, decide
        from medrank.features import answer_table
        from medrank.models.mtl import build_mtl_data, ensemble

        systems = {}
        if self.mtl is not None:
            from medrank.params import MtlParams

            d = self.mtl_meta["decision"]
            # label shift cannot be re-estimated from one question: EM is skipped here (prior_shift none)
            rule = MtlParams(**{k: d[k] for k in ("ensemble", "rank_by", "threshold", "min_keep")})
            data = build_mtl_data(answers, grid, retrieved, n_candidates=n_candidates, scores=scores)
            dec = decide(ensemble(*self.mtl.predict(data), rule.ensemble), float(d["threshold_used"]), rule)
            systems["mtl"] = dec.assign(prob=dec["prob_mean"])
        if self.baseline is not None:
            anli = grid[["split", "qid", "aid", "entailed_kind", "entailed_rank", "anli"]]
            table = answer_table(answers, entailed=retrieved, anli=anli, n_candidates=n_candidates, **scores)
            pred = self.baseline.predict(table)
            systems["baseline"] = pred.assign(rank_key=pred["rank_score"])
        # the systems' rows combined at the MTL weight (0 = the baseline's, 1 = the MTL's), kept by the keep rule
        # fitted for this fit's target set, ordered by the order rule
        part = lambda df: df[["gid", "aid", "prob", "rank_key"]].assign(part=self.fit, fold=-1)  # noqa: E731
        name = self.system["system"]
        if name == "ensemble":
            rows = combine_systems(part(systems["mtl"]), part(systems["baseline"]), float(self.system["mtl_weight"]))
        else:
            rows = part(systems[name])
        keep = Keep.from_json(self.system["keep"]["val" if self.fit == "val" else "test"])
        return apply_decision(rows, keep, self.system["order"])


# ---------------------------------------------------------------- the whole path
@dataclass
class InferencePipeline:
    """normalize -> retrieve -> grids -> answer scores -> system, each step loaded from models/."""

    normalize: NormalizeStep
    retrieve: RetrieveStep
    grids: GridStep
    scores: AnswerScores
    system: SystemStep

    @classmethod
    def load(
        cls, models_dir: str | os.PathLike = layout.MODELS, fit: Fit = "final", device: str = "auto"
    ) -> "InferencePipeline":
        system = SystemStep.load(models_dir, fit)
        return cls(
            NormalizeStep.load(models_dir),
            RetrieveStep.load(models_dir, device),
            GridStep.load(models_dir, device),
            AnswerScores.load(system.groups, models_dir, device),
            system,
        )

    def transform(self, answers: pd.DataFrame) -> pd.DataFrame:
        """Decided rows of a cleaned answers table (medrank.rank.answers_table): the caches under data/cache are read
        when the working folder has them (the very values the stages computed), else every pair is computed."""
        from medrank.text.normalize import TABLES

        answers, _ = self.normalize.transform(answers, TABLES["answers"], desc="rank")
        retrieved = self.retrieve.transform(answers, layout.CACHE_RQE, read_only=True, show_progress=False)
        grid_in = answers[["split", "qid", "aid", "reference_rank", "answer_sentences"]]
        grids = self.grids.transform(
            grid_in.rename(columns={"answer_sentences": "sentences"}),
            retrieved.rename(columns={"entailed_sentences": "sentences"}),
            layout.CACHE_EMBED,
            read_only=True,
            show_progress=False,
        )
        scores = self.scores.transform(answers)
        return self.system.transform(answers, retrieved, grids.rows, scores, self.retrieve.p.n_candidates)
