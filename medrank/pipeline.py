"""The trained pipeline on new input (the `medrank rank` command): clean → normalize → retrieve → embed → MTL.

It calls the same library functions as the stages (medrank.text, medrank.retrieval, medrank.encoders.extract,
medrank.models.mtl) with the same params, so a new question is treated like a test question. Heavy imports
happen inside functions: medrank.cli imports this module for its `rank` entry and must stay instant.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from medrank.errors import MedrankError

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)

MAX_ANSWERS = 1000  # more candidates than any MEDIQA question by far; bounds the pairwise work (n²)
MODEL_DIR = "models/mtl"
CNN_DIR = "models/cnn"  # stage cnn_train; read when the MTL uses the cnn feature group
QA_DIR = "models/qa"  # stage qa; read when the MTL uses the qa feature group
_QID = "q"
_SPLIT = "input"


# ---------------------------------------------------------------- input


@dataclass(frozen=True)
class Candidate:
    id: str
    text: str
    url: str


@dataclass(frozen=True)
class RankInput:
    question: str
    answers: tuple[Candidate, ...]


def parse_rank_input(raw: str | bytes, where: str = "input") -> RankInput:
    """Validate `{"question": str, "answers": [{"id"?, "text", "url"?}, ...]}`; MedrankError names the problem."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise MedrankError(f"{where}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if not raw.strip():
        raise MedrankError(f"{where}: empty input (expected a JSON object with 'question' and 'answers')")
    try:
        obj = json.loads(raw)
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
        if not isinstance(text, str):
            raise MedrankError(f"{what}: 'text' must be a string")
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
    return RankInput(q, tuple(out))


def read_rank_input(path: str) -> RankInput:
    """Read the JSON input from a file path, or stdin for '-'."""
    import sys

    if path == "-":
        return parse_rank_input(sys.stdin.buffer.read(), "<stdin>")
    p = Path(path)
    if not p.is_file():
        raise MedrankError(f"{path}: input file not found")
    return parse_rank_input(p.read_bytes(), path)


# ---------------------------------------------------------------- pipeline


@dataclass
class RankPipeline:
    """Loaded components; `rank` scores one question's candidate answers."""

    normalize: Callable[[str], str]
    split_sentences: Callable[[str], list[str]]
    docs: pd.DataFrame  # MedQuAD pairs with answers: qa_id, <question_col>, answer_norm, answer_sentences, collection
    question_col: str
    rqe: Any  # medrank.encoders.cross_encoder.CrossEncoder
    nli: Any
    bi: Any | None  # medrank.encoders.extract.SentenceEncoder (prefilter) or None
    model: Any  # medrank.models.mtl.MTLBag
    decision: dict
    n_candidates: int
    rqe_threshold: float | None
    bm25_top_k: int
    max_sentences: int
    prefilter_top_k: int | None
    precision: str = "fp32"
    batch_size: int = 64
    bienc: Any | None = None  # SentenceEncoder for the question-answer / -heading cosine features, when the model uses them
    cnn: Any | None = None  # medrank.models.cnn.CnnRanker for the cnn_score feature, when the model uses it
    cnn_aggregation: str = "max"
    qa: Any | None = None  # CrossEncoder (stage qa) for the qa_score feature, when the model uses it

    @classmethod
    def from_params(cls, params_path: str | Path = "params.yaml", model_dir: str | Path = MODEL_DIR, cnn_dir: str | Path = CNN_DIR,
                    qa_dir: str | Path = QA_DIR) -> "RankPipeline":  # fmt: skip
        """Components named by params.yaml (normalize, retrieve, embed sections) and the trained MTL model."""
        from medrank.encoders.cross_encoder import CrossEncoder
        from medrank.encoders.extract import SentenceEncoder
        from medrank.io import read_parquet
        from medrank.models.mtl import MTLBag
        from medrank.params import load_params
        from medrank.retrieval import medquad_documents
        from medrank.text.normalize import make_pipeline

        p = load_params(params_path)
        model, meta = MTLBag.load(model_dir)
        if "decision" not in meta:
            raise MedrankError(f"{model_dir}/mtl.json: no decision rule (retrain with the mtl stage)")
        normalizer, splitter, _ = make_pipeline(p.normalize)  # coreference is optional and slow: not used here
        rp, ep = p.retrieve, p.embed
        qcol = "question_norm" if rp.question_text == "normalized" else "question"
        medquad = read_parquet(Path(rp.normalized_dir) / "medquad.parquet")
        docs = medquad_documents(medquad, qcol, "answer_norm")
        precision = ep.precision if ep.precision != "auto" else "fp32"
        rqe = CrossEncoder.load(rp.rqe_model, device=p.device, precision=precision)
        nli = CrossEncoder.load(ep.nli_model, device=p.device, precision=precision)
        bi = SentenceEncoder(ep.bi_encoder, device=p.device) if ep.prefilter_top_k is not None else None
        bienc = None
        if {"bienc", "heading"} & set(model.builder.groups):
            bienc = SentenceEncoder(meta.get("bienc_model", p.bienc.model), device=p.device, max_length=int(meta.get("bienc_max_length", p.bienc.max_length)))
        cnn = None
        if "cnn" in model.builder.groups:
            from medrank.models.cnn import CnnRanker

            if not Path(cnn_dir).is_dir():
                raise MedrankError(f"{cnn_dir}: the model uses the cnn feature group but the CNN is missing (run `dvc repro cnn_train`)")
            cnn = CnnRanker.load(cnn_dir)
        qa = None
        if "qa" in model.builder.groups:
            if not Path(qa_dir).is_dir():
                raise MedrankError(f"{qa_dir}: the model uses the qa feature group but the QA cross-encoder is missing (run `dvc repro qa`)")
            qa = CrossEncoder.load(qa_dir, device=p.device, precision=precision)
        return cls(
            normalize=lambda t: normalizer(t).text, split_sentences=splitter, docs=docs, question_col=qcol,
            rqe=rqe, nli=nli, bi=bi, model=model, decision=meta["decision"],
            n_candidates=int(meta.get("n_candidates", p.n_candidates)), rqe_threshold=p.rqe_threshold,
            bm25_top_k=rp.bm25_top_k, max_sentences=ep.max_sentences, prefilter_top_k=ep.prefilter_top_k,
            precision=precision, batch_size=ep.batch_size, bienc=bienc,
            cnn=cnn, cnn_aggregation=str(meta.get("cnn_aggregation", p.cnn.mediqa_aggregation)), qa=qa,
        )  # fmt: skip

    # ------------------------------------------------------------ steps
    def _answers_table(self, inp: RankInput, question_norm: str) -> pd.DataFrame:
        import pandas as pd

        from medrank.data.mediqa import source_of
        from medrank.text.clean import clean_answer, normalize_text

        rows = []
        for pos, a in enumerate(inp.answers, start=1):
            clean = clean_answer(a.text)
            norm = self.normalize(clean) if clean else ""
            rows.append(
                {
                    "split": _SPLIT, "qid": _QID, "question": normalize_text(inp.question), "aid": a.id,
                    "answer": clean, "url": a.url, "source": source_of(a.url), "answer_pos": pos,
                    "system_rank": None, "reference_rank": None, "reference_score": None, "label": None,
                    "question_norm": question_norm, "answer_norm": norm,
                    "answer_sentences": self.split_sentences(norm) if norm else [],
                }
            )  # fmt: skip
        df = pd.DataFrame(rows)
        for c in ("system_rank", "reference_rank", "reference_score", "label"):
            df[c] = df[c].astype("Float64")
        df["answer_pos"] = df["answer_pos"].astype("Int32")
        return df

    def _retrieve(self, question: str) -> pd.DataFrame:
        import numpy as np
        import pandas as pd

        from medrank.encoders.extract import label_index
        from medrank.retrieval import bm25_candidates, select_entailed

        idx, bm25 = bm25_candidates([question], self.docs[self.question_col].tolist(), self.bm25_top_k)
        docs = self.docs.iloc[idx[0]].reset_index(drop=True)
        pairs = [(question, t) for t in docs[self.question_col]]
        probs, cls = self.rqe.predict(pairs, batch_size=self.batch_size, return_embeddings=True, show_progress=False, precision=self.precision)
        cands = pd.DataFrame(
            {
                "split": _SPLIT, "qid": _QID, "bm25_rank": np.arange(1, len(docs) + 1), "bm25_score": bm25[0],
                "qa_id": docs["qa_id"].to_numpy(), "rqe_score": probs[:, label_index(self.rqe.label_names, "entail", 1)],
                "_row": np.arange(len(docs)),
            }
        )  # fmt: skip
        chosen = select_entailed(cands, self.n_candidates, self.rqe_threshold)
        d = docs.iloc[chosen["_row"].to_numpy()]
        return chosen.assign(
            entailed_answer=d["answer_norm"].to_numpy(),
            sentences=[list(s) for s in d["answer_sentences"]],
            rqe_cls=[cls[i].astype(np.float16) for i in chosen["_row"]],
        )

    def _grids(self, answers: pd.DataFrame, retrieved: pd.DataFrame) -> pd.DataFrame:
        import numpy as np

        from medrank.encoders.extract import answer_pairs, grid_table, plan_grids

        a = answers[["split", "qid", "aid", "reference_rank", "answer_sentences"]].rename(columns={"answer_sentences": "sentences"})
        pairs = answer_pairs(a, retrieved, augment_top=0)
        vectors = None
        if self.prefilter_top_k is not None and self.bi is not None:
            sents = sorted({s for col in ("sentences_a", "sentences_e") for ss in pairs[col] for s in list(ss)[: self.max_sentences]})
            vectors = dict(zip(sents, self.bi.encode(sents)))
        plan = plan_grids(pairs, self.max_sentences, self.prefilter_top_k, vectors)
        probs, cls = self.nli.predict(plan.cells, batch_size=self.batch_size, return_embeddings=True, show_progress=False, precision=self.precision)
        return grid_table(pairs, plan, probs, cls.astype(np.float16), self.nli.label_names)

    def rank(self, inp: RankInput) -> pd.DataFrame:
        """One row per input answer: id, url, kept, rank (1.. for kept answers, else None), prob, pair_score."""
        from dataclasses import replace

        import pandas as pd

        from medrank.models.mtl import Decision, build_mtl_data, decide, ensemble

        if not inp.answers:
            return empty_result()
        question_norm = self.normalize(inp.question)
        answers = self._answers_table(inp, question_norm)
        retrieved = self._retrieve(question_norm)
        grid = self._grids(answers, retrieved)
        scores = {}
        if self.bienc is not None:  # as stage bienc (medrank.features.bienc_cosines): unit vectors, fp32
            from medrank.features import answer_heading

            q = self.bienc.encode([question_norm])[0]
            texts = answers["answer_norm"].fillna("").astype(str)
            groups = self.model.builder.groups
            if "bienc" in groups:
                scores["bienc_cos"] = (self.bienc.encode(texts.tolist()) @ q).astype(float)
            if "heading" in groups:
                scores["heading_cos"] = (self.bienc.encode(texts.map(answer_heading).tolist()) @ q).astype(float)
        if self.cnn is not None:  # as stage cnn_mediqa: question vs the cleaned answer's sentences
            from medrank.models.cnn import answer_scores
            from medrank.text.sentences import split_rule

            scores["cnn_score"] = answer_scores(self.cnn, answers, self.cnn_aggregation, split_rule)["cnn_score"].to_numpy()
        if self.qa is not None:  # as stage qa: (normalized question, normalized answer), P(answered)
            pairs = [(question_norm, a) for a in answers["answer_norm"].fillna("").astype(str)]
            scores["qa_score"] = self.qa.predict(pairs, batch_size=self.batch_size, show_progress=False)[:, 1].astype(float)
        data = build_mtl_data(answers, grid, retrieved, n_candidates=self.n_candidates, scores=scores)
        f, p = self.model.predict(data)
        ens = ensemble(f, p, self.decision["ensemble"])
        dec = Decision(**{k: self.decision[k] for k in ("ensemble", "rank_by", "threshold", "prior_shift", "min_keep")})
        # label shift cannot be re-estimated from one question: EM is skipped here (prior_shift none)
        out = decide(ens, float(self.decision["threshold_used"]), replace(dec, prior_shift="none"))
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
                "pair_score": out["pair_score"].to_numpy(dtype=float),
            }
        )


# ---------------------------------------------------------------- output


def empty_result() -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame({"id": pd.Series(dtype=object), "url": pd.Series(dtype=object), "kept": pd.Series(dtype=bool),
                         "rank": pd.Series(dtype=object), "prob": pd.Series(dtype=float), "pair_score": pd.Series(dtype=float)})  # fmt: skip


def format_result(question: str, result: pd.DataFrame, fmt: str = "json", show_all: bool = False) -> str:
    """Kept answers in ranked order (JSON or a plain table); with show_all the filtered ones follow."""
    import pandas as pd

    mask = result["kept"].to_numpy(dtype=bool)
    kept = result.loc[mask].sort_values("rank")
    dropped = result.loc[~mask].sort_values("prob", ascending=False, kind="stable")
    rows = [kept] + ([dropped] if show_all else [])
    table = pd.concat(rows, ignore_index=True) if rows else kept

    def _num(x: float) -> float | None:
        return None if x is None or not math.isfinite(float(x)) else round(float(x), 6)

    if fmt == "json":
        items = [
            {"rank": None if pd.isna(r["rank"]) else int(r["rank"]), "id": r["id"], "kept": bool(r["kept"]), "filter_score": _num(r["prob"]),
             "rank_score": _num(r["pair_score"]), **({"url": r["url"]} if r["url"] else {})}
            for _, r in table.iterrows()
        ]  # fmt: skip
        return json.dumps({"question": question, "n_answers": int(len(result)), "n_kept": int(len(kept)), "answers": items}, indent=2)
    lines = [f"{'rank':>4}  {'id':<20} {'filter':>7} {'rank_score':>10}  url"]
    for _, r in table.iterrows():
        rk = "-" if pd.isna(r["rank"]) else str(int(r["rank"]))
        lines.append(f"{rk:>4}  {str(r['id'])[:20]:<20} {r['prob']:7.3f} {r['pair_score']:10.3f}  {r['url']}")
    lines.append(f"{len(kept)} of {len(result)} answers kept")
    return "\n".join(lines)


# ---------------------------------------------------------------- the `medrank rank` command


def add_rank_arguments(p) -> None:
    p.add_argument("input", nargs="?", default="-", help='JSON file {"question": ..., "answers": [{"id", "text", "url"}, ...]}; "-" or none = stdin')
    p.add_argument("--format", choices=("json", "table"), default="json", help="output format (default json)")
    p.add_argument("--all", action="store_true", help="also list the filtered-out answers (after the kept ones)")
    p.add_argument("--params", default="params.yaml", help="params file naming the models and corpus (default params.yaml)")
    p.add_argument("--model-dir", default=MODEL_DIR, help=f"trained MTL model folder (default {MODEL_DIR})")


def rank_command(args) -> None:
    inp = read_rank_input(args.input)  # validate before loading any model
    if not inp.answers:
        result = empty_result()  # nothing to rank: no model is loaded
    else:
        result = RankPipeline.from_params(args.params, args.model_dir).rank(inp)
    print(format_result(inp.question, result, args.format, args.all))


# (help, add_arguments, handler) for medrank.cli.COMMANDS
RANK_COMMAND = (
    "rank a question's candidate answers with the trained pipeline: kept answers in ranked order",
    add_rank_arguments,
    rank_command,
)
