"""MEDIQA 2019 scorers with the official evaluator's semantics (Task 3 QA, Task 2 RQE), plus ranx IR metrics.

Reference: Eval_Scripts/mediqa2019_evaluator_allTasks_final.py (`_evaluate_task_3`, `_evaluate_task_2`).
Where the official script crashes or reads a header as data, the rule used here is stated in the docstring.
"""

from __future__ import annotations

import csv
import functools
import io
import os
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from medrank.core.errors import MedrankError
from medrank.core.io import read_text_capped

Table = pd.DataFrame | str | os.PathLike

TASK3_COLUMNS = ["qid", "aid", "label"]
TASK2_COLUMNS = ["pair_id", "label"]
TASK2_HEADER = ["pair_id", "label"]
_LABELS = {"0": 0, "1": 1}
# a gold or submission file is at most a few thousand rows (MEDIQA's largest is under 100 KB): refuse a bigger one
# before reading it, rather than spend seconds and memory on a file that cannot be one (8 MiB cost 26 s and 947 MB)
MAX_TABLE_BYTES = 1 << 20


# ---------------------------------------------------------------- reading


def _read_csv_rows(path: Table, n_fields: int, what: str, header: Sequence[str] | None = None) -> pd.DataFrame:
    """Read a headerless CSV as strings, one row per non-blank line, with a `_where` column ("line N").

    If `header` is given, a first line equal to it is skipped (it is optional).
    """
    path = Path(path)
    if not path.exists():
        raise MedrankError(f"{path}: {what} file not found")
    if path.is_dir():
        raise MedrankError(f"{path}: a folder, not a {what} file")
    reader = csv.reader(io.StringIO(read_text_capped(path, MAX_TABLE_BYTES, f"a {what} file"), newline=""))
    rows: list[list[str]] = []
    where: list[str] = []
    try:
        for fields in reader:
            if not fields or (len(fields) == 1 and fields[0].strip() == ""):
                continue  # pandas skips blank lines
            if header is not None and not rows and fields == list(header):
                header = None
                continue
            if len(fields) != n_fields:
                raise MedrankError(
                    f"{path}: line {reader.line_num}: expected {n_fields} comma-separated fields, got {len(fields)}"
                )
            rows.append(fields)
            where.append(f"line {reader.line_num}")
    except csv.Error as e:
        raise MedrankError(f"{path}: malformed CSV ({e})") from None
    if not rows:
        raise MedrankError(f"{path}: {what} file has no rows")
    return pd.DataFrame(rows, columns=TASK3_COLUMNS if n_fields == 3 else TASK2_COLUMNS).assign(_where=where)


def _normalise(
    table: Table, columns: list[str], what: str, header: Sequence[str] | None = None
) -> tuple[pd.DataFrame, str]:
    """Return (frame of string ids + int label + `_where`, source name) from a path or a DataFrame."""
    if isinstance(table, pd.DataFrame):
        source = f"<{what} DataFrame>"
        missing = [c for c in columns if c not in table.columns]
        if missing:
            raise MedrankError(f"{source}: missing columns {missing} (need {columns})")
        if table.empty and what == "gold":
            raise MedrankError(f"{source}: gold has no rows")
        df = pd.DataFrame({c: _text_column(table[c], c == "label") for c in columns})
        df["_where"] = [f"row {i}" for i in range(1, len(df) + 1)]
    else:
        source = str(table)
        df = _read_csv_rows(table, len(columns), what, header)
    # labels: the official script compares the *string* label with '1', so only exact 0/1 count
    bad = ~df["label"].isin(list(_LABELS))
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        hint = " (Task 3 files have no header line)" if header is None and i == 0 else ""
        raise MedrankError(f"{source}: {df['_where'].iat[i]}: label must be 0 or 1, got {df['label'].iat[i]!r}{hint}")
    df["label"] = df["label"].map(_LABELS).astype("int64")
    for c in columns[:-1]:
        empty = df[c].isna() | (df[c] == "")
        if empty.any():
            i = int(np.flatnonzero(empty.to_numpy())[0])
            raise MedrankError(f"{source}: {df['_where'].iat[i]}: empty {c}")
    key = columns[:-1]
    dup = df.duplicated(key).to_numpy()
    if dup.any():
        i = int(np.flatnonzero(dup)[0])
        ids = tuple(df[c].iat[i] for c in key)
        first = int(np.flatnonzero((df[key] == pd.Series(ids, index=key)).all(axis=1).to_numpy())[0])
        raise MedrankError(
            f"{source}: {df['_where'].iat[i]}: duplicate row for {', '.join(ids)} (first at {df['_where'].iat[first]}); "
            "the official script silently keeps the first, medrank refuses"
        )
    return df.reset_index(drop=True), source


def _text_column(col: pd.Series, is_label: bool) -> np.ndarray:
    """A DataFrame column as the strings a file would hold (`_as_text` per cell); a column that already holds
    only str, or only ints, is converted in one step (the score stage scores ~700 tables)."""
    values = col.to_numpy(dtype=object)
    if pd.api.types.is_integer_dtype(col.dtype) and not col.hasnans:
        return col.astype("int64").astype(str).to_numpy(dtype=object)
    if pd.api.types.infer_dtype(values, skipna=False) == "string":
        return values
    return np.array([_as_text(v, is_label) for v in values], dtype=object)


def _as_text(v: object, is_label: bool = False) -> str | None:
    """DataFrame cell -> the string a file would hold (ints '1', bools '0'/'1'; float labels 0.0/1.0 too)."""
    if v is None or (not isinstance(v, str) and pd.api.types.is_scalar(v) and pd.isna(v)):
        return None
    if isinstance(v, (bool, np.bool_, np.integer)):
        return str(int(v))
    if is_label and isinstance(v, (float, np.floating)) and float(v) in (0.0, 1.0):
        return str(int(v))
    return str(v)


def read_task3_gold(path: str | os.PathLike) -> pd.DataFrame:
    """Official QA gold (no header; qid,aid,label rows, reference-rank order within a question) -> qid, aid, label."""
    df, _ = _normalise(path, TASK3_COLUMNS, "gold")
    return df[TASK3_COLUMNS]


def read_task3_submission(path: str | os.PathLike) -> pd.DataFrame:
    """Task 3 submission (no header; qid,aid,label in ranked order) -> qid, aid, label; malformed -> MedrankError."""
    df, _ = _normalise(path, TASK3_COLUMNS, "submission")
    return df[TASK3_COLUMNS]


def gold_from_answers(answers: pd.DataFrame, split: str | None = None) -> pd.DataFrame:
    """Task 3 gold (qid, aid, label) from the cleaned answers table (schemas.ANSWERS).

    Rows without reference_rank (test) are dropped; questions keep their order of first appearance, answers
    are sorted by reference_rank; label = reference_score >= 3 (the official rule).
    """
    df = answers if split is None else answers[answers["split"] == split]
    df = df[df["reference_rank"].notna()]
    if df.empty:
        raise MedrankError(f"no answers with a reference_rank{'' if split is None else f' in split {split!r}'}")
    if df["reference_score"].isna().any():
        raise MedrankError("answers with a reference_rank but no reference_score")
    if df.duplicated(["qid", "aid"]).any():
        raise MedrankError("answers table has duplicate (qid, aid) rows")
    q_order = pd.Series(range(df["qid"].nunique()), index=pd.unique(df["qid"]))
    out = df.assign(_q=df["qid"].map(q_order).to_numpy(), _r=df["reference_rank"].astype("int64").to_numpy())
    out = out.sort_values(["_q", "_r"], kind="stable")
    return pd.DataFrame(
        {
            "qid": out["qid"].astype(str).to_numpy(dtype=object),
            "aid": out["aid"].astype(str).to_numpy(dtype=object),
            "label": (out["reference_score"].astype("int64") >= 3).astype("int64").to_numpy(),
        }
    )


# ---------------------------------------------------------------- Task 3


def _lex_ranks(ids: Sequence[str]) -> list[int]:
    # the official script hands the id *strings* to spearmanr, which ranks them lexicographically
    order = {a: r for r, a in enumerate(sorted(ids))}
    return [order[a] for a in ids]


@functools.lru_cache(maxsize=1 << 16)
def _permutation_rho(x: tuple[int, ...], y: tuple[int, ...]) -> float:
    """scipy.stats.spearmanr(x, y)[0] for two permutations of 0..n-1 (no ties), the same bits: its ranks are then
    x + 1 and y + 1, correlated by the same np.corrcoef call; ~6x faster, and remembered per pair of permutations
    (a question's kept answers recur across folds, rules and weights: the stages score ~30,000 questions)."""
    return float(np.corrcoef(np.column_stack((x, y)).astype(float) + 1.0, rowvar=False)[1, 0])


def score_task3(gold: Table, submission: Table) -> dict:
    """Accuracy, Precision, MRR and Spearman's rho of a Task 3 submission, as the official `_evaluate_task_3`.

    - accuracy: submitted rows whose "qid_aid_label" string equals a gold row's, / number of gold rows.
    - precision: micro over all rows submitted with label 1: share whose answer is labelled 1 in the gold.
    - mrr: per gold question, 1/position of the first submitted row that has label 1 and a gold-correct answer,
      positions counting ALL submitted rows of that question (label-0 rows too); averaged over gold questions
      (absent questions count 0).
    - spearman: per gold question, scipy spearmanr(kept correct answer ids in submission order, the same ids in
      gold order) on the id STRINGS, i.e. the lexicographic ranks of the i-th submitted and the i-th reference
      id are correlated; questions with < 2 kept answers (NaN rho) are left out of the mean.
    - spearman_true: per question with >= 2 kept correct answers, Spearman between each answer's position in
      the submission and its position in the gold (reference rank); mean over those questions (0.0 if none).
    Rules where the official script crashes: no row submitted with label 1 -> precision 0.0
    (ZeroDivisionError there); no question with a defined rho -> spearman 0.0 (ZeroDivisionError there);
    a gold question without any correct answer is kept (its label-1 rows count as wrong, MRR 0, no rho;
    KeyError there). Malformed input (unknown qid or (qid, aid), label not 0/1, duplicate (qid, aid) - the
    official script keeps the first - wrong field count, missing/empty file) -> MedrankError.
    """
    g, s = _checked_task3(gold, submission)
    return _aggregate_task3(_task3_rows(g, s), n_gold_rows=len(g), n_submitted_rows=len(s))


def task3_by_question(gold: Table, submission: Table) -> pd.DataFrame:
    """Per gold question, the parts score_task3 sums (same rules): qid, gold_rows, matches (accuracy),
    predicted_positive, correct_positive (precision), rr (MRR), rho / rho_true (NaN with < 2 kept correct).

    Summing the parts over any multiset of questions gives that multiset's official scores (`task3_scores_of`),
    which is what a question bootstrap needs (`paired_bootstrap`)."""
    return _task3_rows(*_checked_task3(gold, submission))


def task3_scores_of(rows: pd.DataFrame) -> dict:
    """Accuracy, precision, MRR, Spearman (official / true) of task3_by_question rows (repeats allowed)."""
    if rows.empty:
        raise MedrankError("no questions to score")
    return _aggregate_task3(rows, n_gold_rows=int(rows["gold_rows"].sum()), n_submitted_rows=None)


def _checked_task3(gold: Table, submission: Table) -> tuple[pd.DataFrame, pd.DataFrame]:
    g, gsrc = _normalise(gold, TASK3_COLUMNS, "gold")
    s, ssrc = _normalise(submission, TASK3_COLUMNS, "submission")
    gold_pairs = set(zip(g["qid"].tolist(), g["aid"].tolist()))
    if set(zip(s["qid"].tolist(), s["aid"].tolist())) <= gold_pairs:
        return g, s
    gold_qids = set(g["qid"].tolist())
    for qid, aid, where in zip(s["qid"].tolist(), s["aid"].tolist(), s["_where"].tolist()):
        if (qid, aid) not in gold_pairs:
            if qid not in gold_qids:
                raise MedrankError(f"{ssrc}: {where}: question id {qid!r} is not in the gold ({gsrc})")
            raise MedrankError(
                f"{ssrc}: {where}: answer id {aid!r} is not a candidate of question {qid!r} in the gold ({gsrc})"
            )
    return g, s


def _task3_rows(g: pd.DataFrame, s: pd.DataFrame) -> pd.DataFrame:
    # plain lists: iterating pandas' string columns element by element is ~10x slower (the score stage scores ~700 times)
    g_rows = list(zip(g["qid"].tolist(), g["aid"].tolist(), g["label"].tolist()))
    s_rows = list(zip(s["qid"].tolist(), s["aid"].tolist(), s["label"].tolist()))
    # accuracy on the joined strings, exactly as the official script matches entries (counted per row's question)
    gold_entries = {f"{q}_{a}_{l}" for q, a, l in g_rows}
    matches: dict[str, int] = {}
    for q, a, l in s_rows:
        matches[q] = matches.get(q, 0) + (f"{q}_{a}_{l}" in gold_entries)

    questions = list(pd.unique(g["qid"]))
    correct: dict[str, list[str]] = {q: [] for q in questions}
    for q, a, l in g_rows:
        if l == 1:
            correct[q].append(a)
    gold_rows = g["qid"].value_counts()
    by_q: dict[str, list[tuple[str, int]]] = {}
    for q, a, l in s_rows:
        by_q.setdefault(q, []).append((a, l))

    rows = []
    for q in questions:
        gold_correct = set(correct[q])
        kept: list[str] = []
        predicted_positive, rr = 0, 0.0
        for position, (a, l) in enumerate(by_q.get(q, []), start=1):
            if l != 1:
                continue
            predicted_positive += 1
            if a in gold_correct:
                if not kept:
                    rr = 1.0 / position
                kept.append(a)
        rho = rho_true = float("nan")
        if len(kept) >= 2:  # spearmanr gives NaN for 0 or 1 items: excluded from both means
            kept_set = set(kept)
            reference = [a for a in correct[q] if a in kept_set]
            rho = _permutation_rho(tuple(_lex_ranks(kept)), tuple(_lex_ranks(reference)))  # = scipy.stats.spearmanr
            ref_pos = {a: i for i, a in enumerate(reference)}
            rho_true = _permutation_rho(tuple(range(len(kept))), tuple(ref_pos[a] for a in kept))
        rows.append((q, int(gold_rows[q]), matches.get(q, 0), predicted_positive, len(kept), rr, rho, rho_true))
    return pd.DataFrame(
        rows, columns=["qid", "gold_rows", "matches", "predicted_positive", "correct_positive", "rr", "rho", "rho_true"]
    )


def _aggregate_task3(rows: pd.DataFrame, n_gold_rows: int, n_submitted_rows: int | None) -> dict:
    predicted_positive = int(rows["predicted_positive"].sum())
    correct_positive = int(rows["correct_positive"].sum())
    # sums in question order, one float at a time, as the official script accumulates them (same last bits)
    rho, rho_true = rows["rho"].dropna().tolist(), rows["rho_true"].dropna().tolist()
    return {
        "accuracy": int(rows["matches"].sum()) / n_gold_rows,
        "precision": correct_positive / predicted_positive if predicted_positive else 0.0,
        "mrr": sum(rows["rr"].tolist()) / len(rows),
        "spearman": sum(rho) / len(rho) if rho else 0.0,
        "spearman_true": sum(rho_true) / len(rho) if rho else 0.0,
        "n_questions": len(rows),
        "n_gold_rows": n_gold_rows,
        "n_submitted_rows": n_submitted_rows,
        "n_predicted_positive": predicted_positive,
        "n_correct_positive": correct_positive,
        "n_spearman_questions": len(rho),
    }


def paired_bootstrap(
    a: pd.DataFrame,
    b: pd.DataFrame,
    resamples: int,
    seed: int,
    metrics: Sequence[str] = ("accuracy", "precision", "mrr", "spearman_true"),
) -> dict:
    """System a minus system b on the same questions (task3_by_question rows of each): the observed
    difference per metric, its 95% percentile interval over `resamples` question resamples (drawn with
    replacement, the same draw for both systems) and the shares of resamples in which a scores higher / lower."""
    if list(a["qid"]) != list(b["qid"]):
        raise MedrankError("paired bootstrap: the two systems were scored on different questions")
    if resamples < 1:
        raise MedrankError("paired bootstrap: resamples must be >= 1")
    TIE = 1e-9  # the same scores summed in another order differ in the last bits: a tie, not a win
    rng = np.random.default_rng(seed)
    observed_a, observed_b = task3_scores_of(a), task3_scores_of(b)
    idx = np.stack([rng.integers(len(a), size=len(a)) for _ in range(resamples)])  # one draw per resample, as ever
    sa, sb = _resampled_scores(a, idx), _resampled_scores(b, idx)
    diffs = {m: sa[m] - sb[m] for m in metrics}
    return {
        m: {
            "diff": round(observed_a[m] - observed_b[m], 4),
            "ci95": [round(float(np.percentile(d, 2.5)), 4), round(float(np.percentile(d, 97.5)), 4)],
            "p_better": round(float(np.mean(d > TIE)), 4),
            "p_worse": round(float(np.mean(d < -TIE)), 4),
        }
        for m, d in diffs.items()
    }


def _resampled_scores(rows: pd.DataFrame, idx: np.ndarray) -> dict[str, np.ndarray]:
    """task3_scores_of(rows.iloc[i]) for each row i of `idx` (resamples x questions), the same bits: integer counts
    summed exactly, float parts summed left to right (np.cumsum accumulates in order, as the official loop; a NaN
    rho taken as 0.0 adds nothing), all resamples at once."""

    def total(col: str) -> np.ndarray:
        return rows[col].to_numpy()[idx].sum(axis=1)

    def ordered_sum(values: np.ndarray) -> np.ndarray:
        return np.cumsum(values, axis=1)[:, -1]

    rr, rho, rho_true = (rows[c].to_numpy(dtype=float)[idx] for c in ("rr", "rho", "rho_true"))
    defined = (~np.isnan(rho)).sum(axis=1)
    predicted, correct = total("predicted_positive"), total("correct_positive")
    with np.errstate(divide="ignore", invalid="ignore"):
        return {
            "accuracy": total("matches") / total("gold_rows"),
            "precision": np.where(predicted > 0, correct / np.maximum(predicted, 1), 0.0),
            "mrr": ordered_sum(rr) / idx.shape[1],
            "spearman": np.where(defined > 0, ordered_sum(np.nan_to_num(rho, nan=0.0)) / np.maximum(defined, 1), 0.0),
            "spearman_true": np.where(
                defined > 0, ordered_sum(np.nan_to_num(rho_true, nan=0.0)) / np.maximum(defined, 1), 0.0
            ),
        }


# ---------------------------------------------------------------- Task 2


def read_task2_table(path: str | os.PathLike, what: str = "submission") -> pd.DataFrame:
    """RQE gold or submission (`pair_id,label`, optional header line) -> pair_id, label."""
    df, _ = _normalise(path, TASK2_COLUMNS, what, header=TASK2_HEADER)
    return df[TASK2_COLUMNS]


def score_task2(gold: Table, submission: Table) -> dict:
    """Task 2 (RQE) accuracy: submitted (pair_id, label) rows equal to a gold row, / number of gold pairs.

    Difference from the official `_evaluate_task_2`: it reads the gold header line `pair_id,label` as a data
    row, so its denominator is n_pairs + 1 and a submission that also starts with that header gets one free
    match: official = (n_correct + has_header) / (n_pairs + 1). Here a leading header line is optional in both
    files and never counted. Unknown pair ids, labels not 0/1 and duplicate pair ids -> MedrankError.
    """
    g, gsrc = _normalise(gold, TASK2_COLUMNS, "gold", header=TASK2_HEADER)
    s, ssrc = _normalise(submission, TASK2_COLUMNS, "submission", header=TASK2_HEADER)
    gold_label = dict(zip(g["pair_id"], g["label"]))
    n_correct = 0
    for pid, label, where in zip(s["pair_id"], s["label"], s["_where"]):
        if pid not in gold_label:
            raise MedrankError(f"{ssrc}: {where}: pair id {pid!r} is not in the gold ({gsrc})")
        n_correct += int(gold_label[pid] == label)
    return {"accuracy": n_correct / len(g), "n_gold_rows": len(g), "n_submitted_rows": len(s), "n_correct": n_correct}


# ---------------------------------------------------------------- IR metrics (ranx)


def ir_metrics(
    qrels: pd.DataFrame, run: pd.DataFrame, metrics: Iterable[str] = ("mrr", "map", "precision@1", "ndcg")
) -> dict[str, float]:
    """ranx metrics of `run` (qid, aid, score: higher = better) against `qrels` (qid, aid, label: relevance).

    Unlike the official MRR this ranks every run answer by score (labels ignored). Every qrels question counts
    (one missing from the run or without a relevant answer scores 0); run questions absent from qrels are dropped.
    """
    from ranx import Qrels, Run, evaluate  # lazy: ranx JIT-compiles (seconds) on first use

    qrels_dict: dict[str, dict[str, int]] = {}
    for q, a, l in zip(qrels["qid"], qrels["aid"], qrels["label"]):
        qrels_dict.setdefault(str(q), {})[str(a)] = int(l)
    run_dict: dict[str, dict[str, float]] = {}
    for q, a, sc in zip(run["qid"], run["aid"], run["score"]):
        if not np.isfinite(sc):
            raise MedrankError(f"run score for ({q}, {a}) is not finite: {sc}")
        run_dict.setdefault(str(q), {})[str(a)] = float(sc)
    run_dict = {q: d for q, d in run_dict.items() if q in qrels_dict}
    if not run_dict:
        raise MedrankError("run shares no question with the qrels")
    metrics = list(metrics)
    out = evaluate(Qrels(qrels_dict), Run(run_dict), metrics, make_comparable=True)
    if len(metrics) == 1:
        out = {metrics[0]: out}
    return {k: float(v) for k, v in out.items()}


# Plausible positive rates of a set a user brings: the labelled sources span 0.27 (LiveQA) to 0.47 (Alexa); a new
# population may lie further out on either side.
SHIFT_PRIORS = tuple(float(x) for x in np.round(np.arange(0.20, 0.651, 0.05), 2))


def rank_metrics(
    pairs: pd.DataFrame, scores: np.ndarray, metrics: Sequence[str] = ("mrr", "map", "precision@1")
) -> dict:
    """MRR / MAP / P@1 over the questions of sentence pairs (question_id, sent_idx; relevance = `label`): `ir_metrics`
    (ranx). The CNN's answer-sentence selection scores with it (medrank.data.squad_sentences builds the pairs)."""
    ids = pd.DataFrame({"qid": pairs["question_id"].to_numpy(), "aid": pairs["sent_idx"].astype(str).to_numpy()})
    res = ir_metrics(
        ids.assign(label=pairs["label"].to_numpy()), ids.assign(score=np.asarray(scores, dtype=np.float64)), metrics
    )
    return {m: round(float(res[m]), 4) for m in metrics}
