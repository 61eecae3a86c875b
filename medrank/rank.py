"""`medrank rank`: the trained pipeline on one new question, composed of the library functions the stages call.

clean + normalize (medrank.text.normalize.normalize_table) → retrieve (medrank.retrieval.score_candidates,
select_entailed, attach_entailed) → NLI grids (medrank.grids.answer_grids) → per-answer scores (bienc, heading,
cnn, qa) → the final system of stage score (models/system.json: the MTL, the baseline, or their ensemble at the
CV-chosen weight and threshold). Every knob comes from what the stages saved under models/ (each step's params and
tables in models/steps/, medrank.steps; the trained models; the decision), never from params.yaml or data/. The extraction caches are read, never written (they are
DVC outputs), so a question the pipeline has seen gets the very values the stages computed.

`fit="val"` uses the models trained on the two training sets only (what submissions/task3_val.csv comes from);
`fit="final"` (default) the models trained on train + validation (the test submission's).
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Sequence

from medrank import layout
from medrank.errors import MedrankError
from medrank.io import decode_utf8, read_text_capped

if TYPE_CHECKING:
    import pandas as pd

    from medrank.params import Params

log = logging.getLogger(__name__)

_SPLIT, _QID = "input", "q"  # one question, never a training split (no augmentation pairs)
Fit = Literal["final", "val"]


@dataclass(frozen=True)
class Candidate:
    id: str
    text: str
    url: str


@dataclass(frozen=True)
class RankInput:
    question: str
    answers: tuple[Candidate, ...]


MAX_ANSWERS = 100  # MEDIQA questions come with at most 11 candidates; bounds the pairwise work (n²)
MAX_INPUT_BYTES = 16 << 20  # refused before it is read or parsed
# the work bound (issue 36: a 15 MB question took 405 s and 6.8 GB): normalisation, sentence splitting and retrieval
# run over the whole text, so the text is capped, not only the model's tokens (MEDIQA: questions <= 931 characters,
# answers <= 55,065)
MAX_QUESTION_CHARS = 10_000
MAX_ANSWER_CHARS = 100_000
MAX_TOTAL_CHARS = 1_000_000  # question + every answer: about half a minute of work on 2 cores
MAX_INT_DIGITS = 30  # an integer id longer than this is not an id


def _no_duplicate_keys(where: str):
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in pairs:
            if k in out:
                raise MedrankError(f"{where}: duplicate key {k!r} in a JSON object (the last would win silently)")
            out[k] = v
        return out

    return hook


def _int(where: str):
    def parse(digits: str) -> int:
        if len(digits.lstrip("-")) > MAX_INT_DIGITS:
            raise MedrankError(f"{where}: an integer of {len(digits.lstrip('-'))} digits (at most {MAX_INT_DIGITS})")
        return int(digits)

    return parse


def parse_rank_input(raw: str | bytes, where: str = "input") -> RankInput:
    """Validate `{"question": str, "answers": [{"id"?, "text", "url"?}, ...]}`; MedrankError names the problem."""
    if isinstance(raw, bytes):
        raw = decode_utf8(raw, where)
    if not raw.strip():
        raise MedrankError(f"{where}: empty input (expected a JSON object with 'question' and 'answers')")
    try:
        obj = json.loads(raw, object_pairs_hook=_no_duplicate_keys(where), parse_int=_int(where))
    except json.JSONDecodeError as e:
        raise MedrankError(f"{where}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except RecursionError:
        raise MedrankError(f"{where}: JSON nested too deeply") from None
    if not isinstance(obj, dict):
        raise MedrankError(f"{where}: expected a JSON object with 'question' and 'answers', got {type(obj).__name__}")
    unknown = sorted(set(obj) - {"question", "answers"})
    if unknown:
        raise MedrankError(f"{where}: unknown key(s) {unknown} (expected 'question' and 'answers')")
    q = obj.get("question")
    if not isinstance(q, str) or not q.strip():
        raise MedrankError(f"{where}: 'question' must be a non-empty string")
    if len(q) > MAX_QUESTION_CHARS:
        raise MedrankError(f"{where}: 'question' has {len(q)} characters; at most {MAX_QUESTION_CHARS}")
    answers = obj.get("answers")
    if not isinstance(answers, list):
        raise MedrankError(f"{where}: 'answers' must be a list of objects with 'text' (got {type(answers).__name__})")
    if len(answers) > MAX_ANSWERS:
        raise MedrankError(f"{where}: {len(answers)} answers; at most {MAX_ANSWERS} per question")
    out: list[Candidate] = []
    seen: dict[str, int] = {}
    for i, a in enumerate(answers, start=1):
        what = f"{where}: answers[{i - 1}]"
        if not isinstance(a, dict):
            raise MedrankError(f"{what}: expected an object with 'text', got {type(a).__name__}")
        bad = sorted(set(a) - {"id", "text", "url"})
        if bad:
            raise MedrankError(f"{what}: unknown key(s) {bad} (expected 'id', 'text', 'url')")
        text = a.get("text")
        if not isinstance(text, str) or not text.strip():
            raise MedrankError(f"{what}: 'text' must be a non-empty string")
        if len(text) > MAX_ANSWER_CHARS:
            raise MedrankError(f"{what}: 'text' has {len(text)} characters; at most {MAX_ANSWER_CHARS}")
        aid = a.get("id", str(i))
        if isinstance(aid, bool) or not isinstance(aid, (str, int)) or str(aid).strip() == "":
            raise MedrankError(f"{what}: 'id' must be a non-empty string or an integer")
        aid = str(aid)
        if aid in seen:
            raise MedrankError(f"{what}: duplicate id {aid!r} (first at answers[{seen[aid] - 1}])")
        seen[aid] = i
        url = a.get("url", "")
        if url is None:
            url = ""
        if not isinstance(url, str):
            raise MedrankError(f"{what}: 'url' must be a string")
        out.append(Candidate(aid, text, url))
    total = len(q) + sum(len(c.text) for c in out)
    if total > MAX_TOTAL_CHARS:
        raise MedrankError(f"{where}: {total} characters of question and answers; at most {MAX_TOTAL_CHARS} per call")
    return RankInput(q, tuple(out))


def read_rank_input(path: str) -> RankInput:
    """Read the JSON input from a file path, or stdin for '-'."""
    if path == "-":
        data = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)  # no more than the cap is ever held
        if len(data) > MAX_INPUT_BYTES:
            raise MedrankError(
                f"<stdin>: more than {MAX_INPUT_BYTES >> 20} MiB, more than one question's answers can be"
            )
        return parse_rank_input(data, "<stdin>")
    p = Path(path)
    if not p.is_file():
        raise MedrankError(f"{path}: input file not found")
    return parse_rank_input(read_text_capped(p, MAX_INPUT_BYTES, "one question's answers"), path)


def read_system(models_dir: str | Path = layout.MODELS) -> dict:
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


@dataclass
class Ranker:
    """The loaded inference path; `rank` scores one question's candidate answers."""

    recipe: Params
    system: dict
    fit: Fit
    normalizer: Any
    splitter: Any
    docs: pd.DataFrame  # MedQuAD documents (medrank.retrieval.medquad_documents)
    rqe: Any  # CrossEncoder
    nli: Any
    prefilter: Any | None  # SentenceEncoder of the grid prefilter
    bienc: Any | None  # SentenceEncoder of groups bienc / heading, when a model reads them
    qtypes: Any | None  # QuestionTypes of group qtype, when a model reads it
    baseline: Any | None  # FittedBaseline
    mtl: Any | None  # MTLBag
    mtl_meta: dict | None
    cnn: Any | None  # CnnRanker, when a model reads the cnn group
    qa: Any | None  # CrossEncoder of stage qa, when a model reads the qa group

    @classmethod
    def load(cls, models_dir: str | Path = layout.MODELS, fit: Fit = "final") -> "Ranker":
        from medrank.encoders.cross_encoder import CrossEncoder
        from medrank.encoders.sentence_encoder import SentenceEncoder
        from medrank.models.baseline import FittedBaseline
        from medrank.models.mtl import MTLBag
        from medrank.steps import load_recipe, load_step, normalizer_state_of
        from medrank.text.sentences import make_splitter

        models_dir = Path(models_dir)
        if fit not in ("final", "val"):
            raise MedrankError(f"fit must be final or val, got {fit!r}")
        system = read_system(models_dir)
        name = system["system"]
        baseline = mtl = meta = None
        if name in ("baseline", "ensemble"):
            baseline = FittedBaseline.load(models_dir / layout.BASELINE_MODEL.name / f"{fit}.json")
        if name in ("mtl", "ensemble"):
            mtl_dir = models_dir / layout.MTL_MODEL.name
            mtl, meta = MTLBag.load(mtl_dir / "val" if fit == "val" else mtl_dir)
        groups = set(baseline.builder.groups if baseline else ()) | set(mtl.builder.groups if mtl else ())
        # each step as its stage saved it under models/steps/ (params and tables): nothing read from params.yaml or data/
        needed = ["normalize", "retrieve", "grids"]
        needed += ["answer_scores"] if groups & {"bienc", "heading", "qtype"} else []
        needed += ["cnn_scores"] if "cnn" in groups else []
        steps = {s: load_step(s, models_dir) for s in needed}
        p = load_recipe(steps, f"{models_dir / layout.STEPS.name}")
        normalizer = normalizer_state_of(steps["normalize"]).normalizer()
        splitter = make_splitter(p.normalize.sentence_splitter, p.normalize.stanza_dir)  # coreference: not used here
        cnn = qa = bienc = qtypes = None
        if groups & {"bienc", "heading"}:
            bienc = SentenceEncoder(p.bienc.model, device=p.device, max_length=p.bienc.max_length)
        if "qtype" in groups:
            from medrank.models.qtype import QuestionTypes

            qtypes = QuestionTypes(steps["answer_scores"].tables["qtype_train"], p.seed)  # as stage bienc fits it
        if "cnn" in groups:
            from medrank.models.cnn import CnnRanker

            cnn = CnnRanker.load(_model_dir(models_dir / layout.CNN_MODEL.name, "cnn", "cnn_train"))
        if "qa" in groups:
            qa = CrossEncoder.load(
                _model_dir(models_dir / layout.QA_MODEL.name, "qa", "qa"),
                device=p.device,
                precision=p.qa.predict_precision,
            )
        ep = p.embed
        return cls(
            recipe=p,
            system=system,
            fit=fit,
            normalizer=normalizer,
            splitter=splitter,
            docs=steps["retrieve"].tables["medquad"],
            rqe=CrossEncoder.load(
                _model_dir(models_dir / layout.RQE_MODEL.name, "rqe", "finetune_rqe"),
                device=p.device,
                precision=p.retrieve.precision,
            ),
            nli=CrossEncoder.load(
                _model_dir(models_dir / layout.NLI_MODEL.name, "nli", "finetune_nli"),
                device=p.device,
                precision=ep.precision,
            ),
            prefilter=SentenceEncoder(ep.bi_encoder, device=p.device) if ep.prefilter_top_k is not None else None,
            bienc=bienc,
            qtypes=qtypes,
            baseline=baseline,
            mtl=mtl,
            mtl_meta=meta,
            cnn=cnn,
            qa=qa,
        )

    # ------------------------------------------------------------ the stages' steps, one question
    def answers_table(self, inp: RankInput) -> pd.DataFrame:
        """The question's answers as stages clean + normalize make them (schemas.NORMALIZED_ANSWERS columns)."""
        import pandas as pd

        from medrank.data.mediqa import source_of
        from medrank.text.clean import clean_answer, normalize_text
        from medrank.text.normalize import TABLES, normalize_table

        df = pd.DataFrame(
            {
                "split": _SPLIT,
                "qid": _QID,
                "question": normalize_text(inp.question),
                "aid": [a.id for a in inp.answers],
                "answer": [clean_answer(a.text) for a in inp.answers],
                "url": [a.url for a in inp.answers],
                "source": [source_of(a.url) for a in inp.answers],
                "answer_pos": range(1, len(inp.answers) + 1),
            }
        )
        for c in ("system_rank", "reference_rank", "reference_score", "label"):
            df[c] = pd.Series([None] * len(df), dtype="Float64")
        df["answer_pos"] = df["answer_pos"].astype("Int32")
        out, _ = normalize_table(df, TABLES["answers"], self.normalizer, self.splitter, None, desc="rank")
        return out

    def retrieve(self, answers: pd.DataFrame) -> pd.DataFrame:
        """The N MedQuAD questions the question entails, as stage retrieve selects them."""
        from medrank.retrieval import attach_entailed, questions_table, score_candidates, select_entailed

        p = self.recipe
        qcol = p.retrieve.question_column
        scored = score_candidates(
            questions_table(answers, qcol, None),
            self.docs,
            self.rqe,
            layout.CACHE_RQE,
            question_col=qcol,
            bm25_top_k=p.retrieve.bm25_top_k,
            precision=p.retrieve.precision,
            batch_size=p.retrieve.batch_size,
            read_only=True,
            show_progress=False,
        )
        return attach_entailed(select_entailed(scored.table, p.n_candidates, p.rqe_threshold), self.docs, qcol)

    def grids(self, answers: pd.DataFrame, retrieved: pd.DataFrame) -> pd.DataFrame:
        """NLI_GRID rows of every (answer, entailed answer), as stage embed makes them."""
        from medrank.grids import answer_grids

        ep = self.recipe.embed
        a = answers[["split", "qid", "aid", "reference_rank", "answer_sentences"]].rename(
            columns={"answer_sentences": "sentences"}
        )
        g = answer_grids(
            a,
            retrieved.rename(columns={"entailed_sentences": "sentences"}),
            self.nli,
            layout.CACHE_EMBED,
            max_sentences=ep.max_sentences,
            prefilter_top_k=ep.prefilter_top_k,
            bi=self.prefilter,
            augment_top=ep.augment_top,
            precision=ep.precision,
            batch_size=ep.batch_size,
            bi_batch_size=ep.bi_batch_size,
            read_only=True,
            show_progress=False,
        )
        return g.rows

    def answer_scores(self, answers: pd.DataFrame, groups: set[str]) -> dict[str, Any]:
        """Per-answer scores of stages bienc (bienc_cos, heading_cos, qtype_agree, qtype_match), cnn_mediqa (cnn_score) and
        qa (qa_score)."""
        from medrank.answer_scores import answer_bienc_scores

        p, out = self.recipe, {}
        if groups & {"bienc", "heading"}:
            bp = p.bienc
            cos, _ = answer_bienc_scores(
                answers,
                self.bienc,
                cache_root=layout.CACHE_BIENC,
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

            out["cnn_score"] = answer_scores(self.cnn, answers, p.cnn.mediqa_aggregation, split_rule)[
                "cnn_score"
            ].to_numpy()
        if "qa" in groups:
            from medrank.answer_scores import qa_pairs

            out["qa_score"] = self.qa.predict(qa_pairs(answers), batch_size=p.qa.eval_batch_size, show_progress=False)[
                :, 1
            ]
        return out

    # ------------------------------------------------------------ the final system
    def rank(self, inp: RankInput) -> pd.DataFrame:
        """One row per input answer: id, url, kept, rank (1.. for kept answers, else None), prob, rank_score."""
        import numpy as np
        import pandas as pd

        from medrank.decision import Keep, apply_decision, combine_systems, decide
        from medrank.features import answer_table
        from medrank.models.mtl import build_mtl_data, ensemble

        if not inp.answers:
            return empty_result()
        answers = self.answers_table(inp)
        retrieved = self.retrieve(answers)
        grid = self.grids(answers, retrieved)
        groups = set(self.baseline.builder.groups if self.baseline else ()) | set(
            self.mtl.builder.groups if self.mtl else ()
        )
        scores = self.answer_scores(answers, groups)
        n = self.recipe.n_candidates
        name, systems = self.system["system"], {}
        if self.mtl is not None:
            from medrank.params import MtlParams

            d = self.mtl_meta["decision"]
            # label shift cannot be re-estimated from one question: EM is skipped here (prior_shift none)
            rule = MtlParams(**{k: d[k] for k in ("ensemble", "rank_by", "threshold", "min_keep")})
            data = build_mtl_data(answers, grid, retrieved, n_candidates=n, scores=scores)
            dec = decide(ensemble(*self.mtl.predict(data), rule.ensemble), float(d["threshold_used"]), rule)
            systems["mtl"] = dec.assign(prob=dec["prob_mean"])
        if self.baseline is not None:
            anli = grid[["split", "qid", "aid", "entailed_kind", "entailed_rank", "anli"]]
            table = answer_table(answers, entailed=retrieved, anli=anli, n_candidates=n, **scores)
            pred = self.baseline.predict(table)
            systems["baseline"] = pred.assign(rank_key=pred["rank_score"])
        # the score stage's decision: the systems' rows combined at its MTL weight (0 = the baseline's, 1 = the MTL's),
        # kept by the keep rule fitted for this fit's target set, ordered by its order rule
        part = lambda df: df[["gid", "aid", "prob", "rank_key"]].assign(part=self.fit, fold=-1)
        if name == "ensemble":
            rows = combine_systems(part(systems["mtl"]), part(systems["baseline"]), float(self.system["mtl_weight"]))
        else:
            rows = part(systems[name])
        out = apply_decision(
            rows, Keep.from_json(self.system["keep"]["val" if self.fit == "val" else "test"]), self.system["order"]
        )
        out = out.set_index("aid").loc[[a.id for a in inp.answers]].reset_index()
        order = out.sort_values("score", ascending=False, kind="stable")
        rank = {aid: i for i, aid in enumerate(order.loc[order["label"] == 1, "aid"], start=1)}
        return pd.DataFrame(
            {
                "id": out["aid"].to_numpy(),
                "url": [a.url for a in inp.answers],
                "kept": out["label"].to_numpy(dtype=bool),
                "rank": [rank.get(a) for a in out["aid"]],
                "prob": out["prob"].to_numpy(dtype=float),
                "rank_score": out["rank_key"].to_numpy(dtype=float) if "rank_key" in out else np.full(len(out), np.nan),
                "score": out["score"].to_numpy(dtype=float),
            }
        )


def _model_dir(path: Path, what: str, stage: str) -> Path:
    if not path.is_dir():
        raise MedrankError(f"{path}: the {what} model is missing (run `dvc repro {stage}`)")
    return path


def empty_result() -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame(
        {
            "id": pd.Series(dtype=object),
            "url": pd.Series(dtype=object),
            "kept": pd.Series(dtype=bool),
            "rank": pd.Series(dtype=object),
            "prob": pd.Series(dtype=float),
            "rank_score": pd.Series(dtype=float),
            "score": pd.Series(dtype=float),
        }
    )


def ranked_ids(result: pd.DataFrame) -> list[str]:
    """Every answer id in the order a submission file lists them (kept first, each part by descending score)."""
    return result.sort_values("score", ascending=False, kind="stable")["id"].tolist()


def rank_question(inp: RankInput, models_dir: str | Path = layout.MODELS, fit: Fit = "final") -> pd.DataFrame:
    """Load the trained system and rank one question (an empty answer list loads nothing)."""
    return Ranker.load(models_dir, fit).rank(inp) if inp.answers else empty_result()


def as_input(question: str, answers: Sequence[tuple[str, str, str]]) -> RankInput:
    """RankInput from (id, text, url) triples."""
    return RankInput(question, tuple(Candidate(str(i), t, u or "") for i, t, u in answers))
