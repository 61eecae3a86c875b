"""`medrank rank`: the trained pipeline on one new question: the input checked and cleaned here, then the step objects
the stages save (medrank.steps.pipeline.InferencePipeline: normalize -> retrieve -> NLI grids -> answer scores -> the final
system of stage score), loaded from models/ alone, never from params.yaml or data/. The extraction caches are read
when the working folder has them, never written (they are DVC outputs), so a question the pipeline has seen gets the
very values the stages computed.

`fit="val"` uses the models trained on the two training sets only (what submissions/task3_val.csv comes from);
`fit="final"` (default) the models trained on train + validation (the test submission's).
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from medrank.core import layout
from medrank.core.errors import MedrankError
from medrank.core.io import decode_utf8, read_text_capped

if TYPE_CHECKING:
    from medrank.steps.system_step import Fit
    import pandas as pd


log = logging.getLogger(__name__)

_SPLIT, _QID = "input", "q"  # one question, never a training split (no augmentation pairs)


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
# `medrank rank` over a file of questions (`{"questions": [...]}`, /rank/batch's body): bounded in count, and in text by
# MAX_INPUT_BYTES (the file) and each question's caps
MAX_FILE_QUESTIONS = 1000


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


def _unicode(value: str, what: str) -> str:
    """`value` as text every later step can write: JSON's `\\ud800` escapes decode to a lone surrogate, which no UTF-8
    writer (pyarrow, the output) accepts (was a pyarrow traceback)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise MedrankError(
            f"{what} holds a lone surrogate (\\u{ord(value[e.start]):04x} at character {e.start}): not Unicode text"
        ) from None
    return value


class MalformedInput(MedrankError):
    """The input is not JSON text at all (not UTF-8, empty, a syntax error): `medrank serve` answers 400, not 422."""


def load_json(raw: str | bytes, where: str = "input") -> Any:
    """JSON text decoded with the input's guards (UTF-8, no duplicate keys, bounded integers and nesting)."""
    if isinstance(raw, bytes):
        try:
            raw = decode_utf8(raw, where)
        except MedrankError as e:
            raise MalformedInput(str(e)) from None
    if not raw.strip():
        raise MalformedInput(f"{where}: empty input (expected a JSON object with 'question' and 'answers')")
    try:
        return json.loads(raw, object_pairs_hook=_no_duplicate_keys(where), parse_int=_int(where))
    except json.JSONDecodeError as e:
        raise MalformedInput(f"{where}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except RecursionError:
        raise MalformedInput(f"{where}: JSON nested too deeply") from None


def parse_rank_input(raw: str | bytes, where: str = "input") -> RankInput:
    """Validate `{"question": str, "answers": [{"id"?, "text", "url"?}, ...]}`; MedrankError names the problem."""
    return rank_input(load_json(raw, where), where)


def rank_input(obj: Any, where: str = "input") -> RankInput:
    """One question's decoded JSON checked against the caps (MAX_*); MedrankError names the field and what was expected."""
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
    _unicode(q, f"{where}: 'question'")
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
        _unicode(text, f"{what}: 'text'")
        aid = a.get("id", str(i))
        if isinstance(aid, bool) or not isinstance(aid, (str, int)) or str(aid).strip() == "":
            raise MedrankError(f"{what}: 'id' must be a non-empty string or an integer")
        aid = _unicode(str(aid), f"{what}: 'id'")
        if aid in seen:
            raise MedrankError(f"{what}: duplicate id {aid!r} (first at answers[{seen[aid] - 1}])")
        seen[aid] = i
        url = a.get("url", "")
        if url is None:
            url = ""
        if not isinstance(url, str):
            raise MedrankError(f"{what}: 'url' must be a string")
        _unicode(url, f"{what}: 'url'")
        out.append(Candidate(aid, text, url))
    total = len(q) + sum(len(c.text) for c in out)
    if total > MAX_TOTAL_CHARS:
        raise MedrankError(f"{where}: {total} characters of question and answers; at most {MAX_TOTAL_CHARS} per call")
    return RankInput(q, tuple(out))


def batch_input(obj: Any, where: str, max_questions: int, max_total_chars: int | None = None) -> list[RankInput]:
    """`{"questions": [<one question's object>, ...]}` (POST /rank/batch's body, or a file for `medrank rank`): each
    question under `rank_input`'s caps, at most `max_questions`, and (`max_total_chars`) all of their text together."""
    if not isinstance(obj, dict) or set(obj) != {"questions"}:
        raise MedrankError(f"{where}: expected a JSON object with one key, 'questions' (a list of /rank bodies)")
    qs = obj["questions"]
    if not isinstance(qs, list) or not qs:
        raise MedrankError(f"{where}: 'questions' must be a non-empty list of objects with 'question' and 'answers'")
    if len(qs) > max_questions:
        raise MedrankError(f"{where}: {len(qs)} questions; at most {max_questions} per call")
    out = [rank_input(q, f"{where}: questions[{i}]") for i, q in enumerate(qs)]
    total = sum(len(q.question) + sum(len(a.text) for a in q.answers) for q in out)
    if max_total_chars is not None and total > max_total_chars:
        raise MedrankError(f"{where}: {total} characters of questions and answers; at most {max_total_chars} per call")
    return out


def read_rank_input(path: str) -> RankInput | list[RankInput]:
    """Read the JSON input from a file path, or stdin for '-': one question's object, or `{"questions": [...]}` (a
    file of up to MAX_FILE_QUESTIONS questions, ranked together: `rank_file`)."""
    if path == "-":
        data = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)  # no more than the cap is ever held
        if len(data) > MAX_INPUT_BYTES:
            raise MedrankError(f"<stdin>: more than {MAX_INPUT_BYTES >> 20} MiB, more than a rank input can be")
        where, raw = "<stdin>", data
    else:
        p = Path(path)
        if not p.exists():
            raise MedrankError(f"{path}: input file not found")
        if p.is_dir():
            raise MedrankError(f"{path}: a folder, not an input file")
        # a pipe (`<(cat in.json)`, /dev/stdin) is read as `medrank score` reads one: at most the cap is held
        where, raw = path, read_text_capped(p, MAX_INPUT_BYTES, "a rank input")
    obj = load_json(raw, where)
    if isinstance(obj, dict) and "questions" in obj:
        return batch_input(obj, where, MAX_FILE_QUESTIONS)
    return rank_input(obj, where)


def answers_table(inp: RankInput, qid: str = _QID) -> pd.DataFrame:
    """The question's answers as stage clean makes them (schemas.CLEAN answers columns, one question, no labels)."""
    import pandas as pd

    from medrank.data.mediqa import source_of
    from medrank.text.clean import clean_answer, normalize_text

    df = pd.DataFrame(
        {
            "split": _SPLIT,
            "qid": qid,
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
    return df


@dataclass
class Ranker:
    """The loaded inference pipeline (medrank.steps.pipeline); `rank` scores one question's candidate answers."""

    pipeline: Any  # InferencePipeline

    @classmethod
    def load(cls, models_dir: str | Path = layout.MODELS, fit: Fit = "final", adapt: bool = False) -> "Ranker":
        """`adapt`: a keep rule that adapts to its batch is re-fitted on a large enough `rank_batch` (SystemStep.adapt)."""
        from medrank.steps.pipeline import InferencePipeline

        return cls(InferencePipeline.load(models_dir, fit, adapt=adapt))

    def share_vectors(self, memo: Any) -> None:
        """Hold the vectors the bi-encoders compute in `memo` (medrank.encoders.memo.VectorMemo), read by later calls."""
        for enc in self.pipeline.scores.models.values():
            if hasattr(enc, "memo"):
                enc.memo = memo

    def rank(self, inp: RankInput) -> pd.DataFrame:
        """One row per input answer: id, url, kept, rank (1.. for kept answers, else None), prob, rank_score."""
        if not inp.answers:
            return empty_result()
        return _result(inp, self.pipeline.transform(answers_table(inp)))

    def rank_many(self, inputs: Sequence[RankInput]) -> list[pd.DataFrame]:
        """`rank` of several questions in one pass through the pipeline (one encoder call over all their texts: the
        micro-batches of `medrank serve`). One question alone is exactly `rank`; beside others its texts may share a
        batch of another padded width, so its scores may differ in the last bits."""
        if len(inputs) == 1:
            return [self.rank(inputs[0])]
        return self.rank_batch(inputs)[0]

    def rank_batch(self, inputs: Sequence[RankInput]) -> tuple[list[pd.DataFrame], dict | None]:
        """Every question's `rank` rows from one pass through the pipeline, and the keep rule they were decided by
        (SystemStep.keep_for; None when no question has an answer)."""
        import pandas as pd

        todo = [i for i, inp in enumerate(inputs) if inp.answers]
        out: list[pd.DataFrame] = [empty_result() for _ in inputs]
        if not todo:
            return out, None
        table = pd.concat([answers_table(inputs[i], f"{_QID}{i}") for i in todo], ignore_index=True)
        frame = self.pipeline.run(table)
        decided = frame.decided
        gid = decided["gid"].astype(str)
        for i in todo:
            rows = decided[gid == f"{_SPLIT}:{_QID}{i}"]  # ids repeat between questions; the question key does not
            out[i] = _result(inputs[i], rows)
        return out, frame.keep


def _result(inp: RankInput, out: pd.DataFrame) -> pd.DataFrame:
    """The decided rows of one question (InferencePipeline.transform) as `Ranker.rank` returns them."""
    import numpy as np
    import pandas as pd

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


def kept_and_dropped(result: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The kept answers in rank order and the dropped ones by descending filter probability."""
    mask = result["kept"].to_numpy(dtype=bool)
    kept = result.loc[mask].sort_values("rank")
    return kept, result.loc[~mask].sort_values("prob", ascending=False, kind="stable")


def result_record(question: str, result: pd.DataFrame, show_all: bool = False) -> dict:
    """`medrank rank`'s JSON output (and `medrank serve`'s): the kept answers in rank order, with show_all the
    dropped ones after them; scores rounded to 6 places, a non-finite one as null."""
    import math

    import pandas as pd

    kept, dropped = kept_and_dropped(result)

    def _num(x: float) -> float | None:
        return None if x is None or not math.isfinite(float(x)) else round(float(x), 6)

    items = [
        {
            "rank": None if pd.isna(r["rank"]) else int(r["rank"]),
            "id": r["id"],
            "kept": bool(r["kept"]),
            "filter_score": _num(r["prob"]),
            "rank_score": _num(r["rank_score"]),
            **({"url": r["url"]} if r["url"] else {}),
        }
        for _, r in (pd.concat([kept, dropped], ignore_index=True) if show_all else kept).iterrows()
    ]
    return {"question": question, "n_answers": int(len(result)), "n_kept": int(len(kept)), "answers": items}


def ranked_ids(result: pd.DataFrame) -> list[str]:
    """Every answer id in the order a submission file lists them (kept first, each part by descending score)."""
    return result.sort_values("score", ascending=False, kind="stable")["id"].tolist()


def rank_question(inp: RankInput, models_dir: str | Path = layout.MODELS, fit: Fit = "final") -> pd.DataFrame:
    """Load the trained system and rank one question (an empty answer list loads nothing)."""
    return Ranker.load(models_dir, fit).rank(inp) if inp.answers else empty_result()


def rank_file(
    inputs: Sequence[RankInput], models_dir: str | Path = layout.MODELS, fit: Fit = "final"
) -> tuple[list[pd.DataFrame], dict | None]:
    """`medrank rank` over a file of questions: ranked together, as one batch (a keep rule that adapts to its batch
    is re-fitted on it when it holds at least decision.MIN_BATCH_QUESTIONS questions); -> (results, keep rule)."""
    if not any(inp.answers for inp in inputs):
        return [empty_result() for _ in inputs], None
    return Ranker.load(models_dir, fit, adapt=True).rank_batch(inputs)


def as_input(question: str, answers: Sequence[tuple[str, str, str]]) -> RankInput:
    """RankInput from (id, text, url) triples."""
    return RankInput(question, tuple(Candidate(str(i), t, u or "") for i, t, u in answers))
