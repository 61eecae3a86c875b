"""Baseline features (paper §4.4): one answer table, one fitted `FeatureBuilder` for training and inference.

Flow: `answer_table` gathers, per candidate answer, everything the groups read (source, length, CHiQA rank,
text, 1-best entailed answer, N-best RQE and ANLI scores, bi-encoder cosines, question-type agreement);
`FeatureBuilder.fit` learns what depends on training rows (source categories, scaling) and `transform` returns
the model matrix.
The TF-IDF vocabulary is fitted on MedQuAD answers only (medrank.task3.bow), never on MEDIQA text.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import numpy as np
import pandas as pd
import scipy.sparse as sp

from medrank.task3.bow import tfidf_rows
from medrank.core.errors import MedrankError
from medrank.params.groups import GROUPS, REGISTRY, SCORE_COLUMNS, SCORE_FILES

if TYPE_CHECKING:
    from sklearn.feature_extraction.text import TfidfVectorizer

log = logging.getLogger(__name__)

# ---------------------------------------------------------------- answer table


JUDGED_LIST = "#judged"  # suffix of the gid of a question's judged-answer list


def question_key(answers: pd.DataFrame) -> pd.Series:
    """Question id unique across splits (qids repeat between the training sets and test)."""
    return answers["split"].astype(str) + ":" + answers["qid"].astype(str)


def chiqa_rank(answers: pd.DataFrame) -> pd.Series:
    """CHiQA system rank; test files have none but list answers in the same order (FINDINGS), so position. NaN for
    the judged LiveQA answers (no CHiQA list): FeatureBuilder gives them an explicit missing-rank indicator."""
    return answers["system_rank"].astype("Float64").fillna(answers["answer_pos"].astype("Float64")).astype(float)


def check_n_applied(entailed: pd.DataFrame, n_candidates: int, column: str = "rank") -> None:
    """N is applied once, by `select_entailed` (stage retrieve); the tables made from its output (the retrieved table,
    the NLI grid rows) are only checked: an entailed rank above N is another run's table, never filtered here."""
    top = int(entailed[column].max()) if len(entailed) else 0
    if top > n_candidates:
        raise MedrankError(
            f"entailed answers of rank up to {top} for n_candidates {n_candidates}: the tables come from another "
            "run of the retrieve stage (re-run it and the stages after it)"
        )


def answer_table(
    answers: pd.DataFrame,
    *,
    entailed: pd.DataFrame | None = None,
    anli: pd.DataFrame | None = None,
    n_candidates: int = 3,
    **scores: np.ndarray,
) -> pd.DataFrame:
    """One row per candidate answer (input order kept) with the raw inputs of every available group.

    answers: normalized answers (schemas.NORMALIZED_ANSWERS). entailed: the retrieve stage's table (split, qid,
    rank 1 = best, rqe_score, passes_threshold, entailed_answer, rqe_cls). anli: the embed stage's NLI grid rows
    (split, qid, aid, entailed_kind, entailed_rank, anli); only `rqe` rows are used. As in the paper, an
    entailed candidate that did not pass the threshold T (the retrieve stage's top-1 fallback) or is missing
    (fewer than N passed) contributes 0 to rqe_i / anli_i / rqe_emb_i and no text to entailed_text. `scores`: per-answer
    columns of the groups other stages score (SCORE_COLUMNS: bienc_cos, qa_score, ...; `read_answer_scores`).
    """
    qkey = question_key(answers)
    judged = (
        answers["judged"].fillna(False).astype(bool)
        if "judged" in answers.columns
        else pd.Series(False, index=answers.index)
    )
    t = pd.DataFrame(
        {
            # gid: the answer list (per-question features, ranker pairs, metrics); qkey: the question (folds). The judged
            # LiveQA answers of a question form their own list beside its CHiQA list (medrank.data.judged)
            "gid": qkey.where(~judged, qkey + JUDGED_LIST).to_numpy(),
            "qkey": qkey.to_numpy(),
            "judged": judged.to_numpy(),
            "split": answers["split"].astype(str).to_numpy(),
            "qid": answers["qid"].astype(str).to_numpy(),
            "aid": answers["aid"].astype(str).to_numpy(),
            "source": answers["source"].fillna("unknown").astype(str).to_numpy(),
            "n_sentences": answers["answer_sentences"].map(len).astype(float).to_numpy(),
            "chiqa_rank": chiqa_rank(answers).to_numpy(),
            "answer_text": answers["answer_norm"].fillna("").astype(str).to_numpy(),
            "label": answers["label"].astype("Float64").to_numpy(),
            "reference_rank": answers["reference_rank"].astype("Float64").to_numpy(),
            "reference_score": answers["reference_score"].astype("Float64").to_numpy(),
        }
    )
    if t.duplicated(["gid", "aid"]).any():
        raise MedrankError("answers table has duplicate (split, qid, aid) rows")
    ranks = range(1, n_candidates + 1)
    passed = None
    if entailed is not None:
        e = entailed.assign(gid=question_key(entailed))
        missing = sorted(set(t["qkey"]) - set(e["gid"]))
        if missing:  # retrieval keeps >= 1 row per question (top-1 fallback), so a gap means another run's table
            raise MedrankError(
                f"retrieved table lacks {len(missing)} questions (e.g. {missing[0]}): re-run the retrieve stage"
            )
        check_n_applied(e, n_candidates)  # N: applied once, by stage retrieve
        e = e[e["passes_threshold"].astype(bool)]
        passed = set(zip(e["gid"], e["rank"].astype(int)))
        by_rank = {i: e[e["rank"] == i].drop_duplicates("gid").set_index("gid") for i in ranks}
        for i in ranks:
            t[f"rqe_{i}"] = t["qkey"].map(by_rank[i]["rqe_score"]).fillna(0.0).astype(float).to_numpy()
        # object first: with no entailed answer at all the mapped column is float NaN, which a str fill would upcast
        entailed = t["qkey"].map(by_rank[1]["entailed_answer"]).astype(object)
        t["entailed_text"] = entailed.fillna("").astype(str).to_numpy()
        if "rqe_cls" in e.columns and len(e):
            hidden = len(e["rqe_cls"].iloc[0])
            for i in ranks:
                vec = by_rank[i]["rqe_cls"].map(lambda v: np.asarray(v, dtype=np.float32))
                zero = np.zeros(hidden, dtype=np.float32)
                t[f"rqe_emb_{i}"] = [vec.get(g, zero) for g in t["qkey"]]
    if anli is not None:
        if passed is None:
            raise MedrankError("ANLI features need the retrieved table (which entailed answers passed T)")
        a = anli[anli["entailed_kind"] == "rqe"]
        a = a.assign(gid=question_key(a))
        a = a[[(g, int(r)) in passed for g, r in zip(a["gid"], a["entailed_rank"])]]
        value = dict(zip(zip(a["gid"], a["aid"], a["entailed_rank"].astype(int)), a["anli"].astype(float)))
        need = [(g, x, i) for g, x in zip(t["qkey"], t["aid"]) for i in ranks if (g, i) in passed]
        lacking = [k for k in need if k not in value]
        if lacking:
            raise MedrankError(
                f"NLI grid lacks {len(lacking)} (answer, entailed answer) pairs (e.g. {lacking[0]}): re-run the embed stage"
            )
        for i in ranks:
            t[f"anli_{i}"] = [value.get((g, x, i), 0.0) for g, x in zip(t["qkey"], t["aid"])]
    unknown = sorted(set(scores) - set(SCORE_COLUMNS))
    if unknown:
        raise MedrankError(f"unknown per-answer score {unknown[0]!r} (expected one of {', '.join(SCORE_COLUMNS)})")
    for col, values in scores.items():
        if values is not None:
            if len(values) != len(t):
                raise MedrankError(f"{col}: {len(values)} values for {len(t)} answers")
            t[col] = np.asarray(values, dtype=float)
    return t


def cap_questions(answers: pd.DataFrame, per_split: int | None) -> pd.DataFrame:
    """Answers of the first `per_split` questions of each split by (split, qid): the tiny profiles' cap
    (the retrieve stage keeps the same questions); None = all."""
    if not per_split:
        return answers
    keep = answers.drop_duplicates(["split", "qid"]).sort_values(["split", "qid"], kind="stable")
    keep = keep.groupby("split", sort=True).head(per_split)[["split", "qid"]]
    return answers.merge(keep, on=["split", "qid"])


def aligned_scores(answers: pd.DataFrame, scores: pd.DataFrame, column: str, source: str) -> np.ndarray:
    """`scores[column]` (a per-answer table keyed by split, qid, aid) aligned to the rows of `answers`."""
    key = ["split", "qid", "aid"]
    if scores.duplicated(key).any():
        raise MedrankError(f"{source}: duplicate (split, qid, aid) rows")
    merged = answers[key].astype(str).merge(scores[key + [column]].astype({k: str for k in key}), on=key, how="left")
    lacking = merged[column].isna()
    if lacking.any():
        first = merged.loc[lacking, key].iloc[0]
        raise MedrankError(
            f"{source}: no {column} for {int(lacking.sum())} answers (e.g. {first['split']}/{first['aid']}): re-run its stage"
        )
    return merged[column].to_numpy(dtype=float)


def read_answer_scores(
    answers: pd.DataFrame, groups: set[str] | Sequence[str], extra: dict | None = None
) -> dict[str, np.ndarray]:
    """The per-answer scores other stages wrote (medrank.params.groups.SCORE_FILES) that `groups` read, aligned to `answers`;
    `extra` ({score file: more rows of it}) adds rows the file lacks (analysis/judged_rows.py: the judged answers')."""
    from medrank.core.io import read_parquet

    wanted = [
        (col, path) for group, (_, path) in SCORE_FILES.items() if group in groups for col in REGISTRY[group].columns
    ]
    tables = {path: read_parquet(path) for _, path in wanted}  # bienc, heading and qtype share one file: read once
    for path, rows in (extra or {}).items():
        if path in tables:
            tables[path] = pd.concat([tables[path], rows], ignore_index=True)
    return {col: aligned_scores(answers, tables[path], col, str(path)) for col, path in wanted}


def required_columns(groups: Sequence[str], n_candidates: int) -> list[str]:
    """Answer-table columns the given feature groups read."""
    cols: list[str] = []
    for g in groups:
        if g not in REGISTRY:
            raise MedrankError(f"unknown feature group '{g}' (expected one of {', '.join(GROUPS)})")
        cols += REGISTRY[g].columns
        if REGISTRY[g].per_candidate:
            cols += [f"{g}_{i}" for i in range(1, n_candidates + 1)]
    return cols


# ---------------------------------------------------------------- question-relative values


def relative_to_question(values: np.ndarray, gid: np.ndarray) -> dict[str, np.ndarray]:
    """Value minus the question's best and mean, and its rank in the question (1 = highest) / answers."""
    s = pd.Series(np.asarray(values, dtype=float))
    g = pd.Series(np.asarray(gid))
    by = s.groupby(g, sort=False)
    n = by.transform("size").to_numpy(dtype=float)
    # method="first": ties ranked by input order, so the value is deterministic
    rank = by.rank(ascending=False, method="first").to_numpy()
    return {
        "minus_max": (s - by.transform("max")).to_numpy(),
        "minus_mean": (s - by.transform("mean")).to_numpy(),
        "rank_frac": rank / n,
    }


# ---------------------------------------------------------------- builder


@dataclass
class FeatureBuilder:
    """Feature groups -> a sparse matrix; `fit` on training rows, `transform` any rows (same code path).

    Dense features are standardised with training means/sds; sources seen fewer than `min_source_count`
    times in training share one 'other' column. `tfidf` is fitted beforehand on MedQuAD (see `fit_tfidf`).
    """

    groups: tuple[str, ...]
    n_candidates: int = 3
    tfidf: TfidfVectorizer | None = None
    min_source_count: int = 5
    sources_: list[str] = field(default_factory=list)
    mean_: np.ndarray | None = None
    scale_: np.ndarray | None = None
    dense_names_: list[str] = field(default_factory=list)
    rank_missing_: bool = False  # some training rows had no CHiQA rank: a chiqa_rank_missing column

    def __post_init__(self) -> None:
        self.groups = tuple(self.groups)
        if not self.groups:
            raise MedrankError("no feature groups selected")
        required_columns(self.groups, self.n_candidates)  # validates the names
        if "bow" in self.groups and self.tfidf is None:
            raise MedrankError("feature group 'bow' needs a TF-IDF vectorizer fitted on MedQuAD")

    def _check(self, table: pd.DataFrame) -> None:
        missing = [c for c in required_columns(self.groups, self.n_candidates) if c not in table.columns]
        if missing:
            raise MedrankError(
                f"feature groups {list(self.groups)} need answer-table columns {missing} (input stage not run?)"
            )

    def _dense(self, table: pd.DataFrame) -> tuple[np.ndarray, list[str]]:
        cols: list[np.ndarray] = []
        names: list[str] = []
        gid = table["gid"].to_numpy()
        if "metadata" in self.groups:
            n_sent = table["n_sentences"].to_numpy(dtype=float)
            rank = table["chiqa_rank"].to_numpy(dtype=float)
            missing = np.isnan(rank)
            if missing.any() and not self.rank_missing_:
                raise MedrankError(
                    f"chiqa_rank missing for {int(missing.sum())} rows, but the model was fitted on rows that all have one"
                )
            filled = np.where(missing, 0.0, rank)
            cols += [
                n_sent,
                np.log1p(n_sent),
                filled,
                np.divide(1.0, filled, out=np.zeros_like(filled), where=~missing),
            ]
            names += ["n_sentences", "log_n_sentences", "chiqa_rank", "chiqa_rank_inv"]
            if self.rank_missing_:  # training rows without a CHiQA rank (judged answers): said, not a silent zero
                cols.append(missing.astype(float))
                names.append("chiqa_rank_missing")
        if "rqe" in self.groups:
            for i in range(1, self.n_candidates + 1):
                cols.append(table[f"rqe_{i}"].to_numpy(dtype=float))
                names.append(f"rqe_{i}")
        if "rqe_emb" in self.groups:
            for i in range(1, self.n_candidates + 1):
                emb = np.stack(table[f"rqe_emb_{i}"].to_list()).astype(float)
                cols += list(emb.T)
                names += [f"rqe_emb_{i}_{j}" for j in range(emb.shape[1])]
        if "anli" in self.groups:
            for i in range(1, self.n_candidates + 1):
                cols.append(table[f"anli_{i}"].to_numpy(dtype=float))
                names.append(f"anli_{i}")
        for group, col in ((g, s.score) for g, s in REGISTRY.items() if s.score is not None):
            if group in self.groups:
                score = table[col].to_numpy(dtype=float)
                rel = relative_to_question(score, gid)
                cols += [score, rel["minus_max"], rel["minus_mean"], rel["rank_frac"]]
                names += [col, f"{col}_minus_max", f"{col}_minus_mean", f"{group}_rank_frac"]
                extra = [c for c in REGISTRY[group].columns if c != col]
                cols += [table[c].to_numpy(dtype=float) for c in extra]
                names += extra
        if not cols:
            return np.zeros((len(table), 0)), names
        return np.column_stack(cols), names

    def fit(self, table: pd.DataFrame) -> "FeatureBuilder":
        """Learn source categories and dense scaling from training rows."""
        self._check(table)
        if "metadata" in self.groups:
            counts = table["source"].value_counts()
            self.sources_ = sorted(counts[counts >= self.min_source_count].index)
            self.rank_missing_ = bool(table["chiqa_rank"].isna().any())
        dense, self.dense_names_ = self._dense(table)
        self.mean_ = dense.mean(axis=0)
        sd = dense.std(axis=0)
        self.scale_ = np.where(sd > 1e-12, sd, 1.0)  # constant columns stay 0 after centring
        return self

    def transform(self, table: pd.DataFrame) -> sp.csr_matrix:
        """Feature matrix (rows in table order) for any rows, with the fitted categories and scaling."""
        if self.mean_ is None:
            raise MedrankError("FeatureBuilder.transform called before fit")
        self._check(table)
        dense, _ = self._dense(table)
        blocks = [sp.csr_matrix((dense - self.mean_) / self.scale_)]
        if "metadata" in self.groups:
            idx = {s: i for i, s in enumerate(self.sources_)}
            other = len(self.sources_)
            cols = np.array([idx.get(s, other) for s in table["source"]], dtype=np.int64)
            blocks.append(
                sp.csr_matrix((np.ones(len(table)), (np.arange(len(table)), cols)), shape=(len(table), other + 1))
            )
        if "bow" in self.groups:
            blocks.append(tfidf_rows(self.tfidf, table["answer_text"].tolist()))
            blocks.append(tfidf_rows(self.tfidf, table["entailed_text"].tolist()))
        return sp.hstack(blocks, format="csr", dtype=np.float64)

    def fit_transform(self, table: pd.DataFrame) -> sp.csr_matrix:
        return self.fit(table).transform(table)

    @property
    def feature_names(self) -> list[str]:
        names = list(self.dense_names_)
        if "metadata" in self.groups:
            names += [f"source={s}" for s in self.sources_] + ["source=other"]
        if "bow" in self.groups:
            vocab = list(self.tfidf.get_feature_names_out())
            names += [f"answer:{w}" for w in vocab] + [f"entailed:{w}" for w in vocab]
        return names


# ---------------------------------------------------------------- persistence (plain JSON, no pickles)


def builder_to_json(builder: "FeatureBuilder") -> dict:
    """FeatureBuilder state as plain JSON (TF-IDF as vocabulary + idf), no pickles in the model folder."""
    d = {
        "groups": list(builder.groups),
        "n_candidates": builder.n_candidates,
        "min_source_count": builder.min_source_count,
        "sources_": list(builder.sources_),
        "mean_": np.asarray(builder.mean_).tolist(),
        "scale_": np.asarray(builder.scale_).tolist(),
        "dense_names_": list(builder.dense_names_),
        "rank_missing_": builder.rank_missing_,
        "tfidf": None,
    }
    if builder.tfidf is not None:
        v = builder.tfidf
        d["tfidf"] = {
            "params": {
                k: v.get_params()[k]
                for k in ("lowercase", "stop_words", "sublinear_tf", "token_pattern", "min_df", "max_features")
            },
            "vocabulary": {k: int(i) for k, i in v.vocabulary_.items()},
            "idf": v.idf_.tolist(),
        }
    return d


def builder_from_json(d: dict) -> "FeatureBuilder":
    """The FeatureBuilder that `builder_to_json` wrote."""
    tfidf = None
    if d.get("tfidf"):
        t = d["tfidf"]
        tfidf = TfidfVectorizer(**t["params"], dtype=np.float32, vocabulary=t["vocabulary"])
        tfidf.idf_ = np.asarray(t["idf"], dtype=np.float64)
    b = FeatureBuilder(
        tuple(d["groups"]), n_candidates=d["n_candidates"], tfidf=tfidf, min_source_count=d["min_source_count"]
    )
    b.sources_ = list(d["sources_"])
    b.mean_ = np.asarray(d["mean_"], dtype=float)
    b.scale_ = np.asarray(d["scale_"], dtype=float)
    b.dense_names_ = list(d["dense_names_"])
    b.rank_missing_ = bool(d.get("rank_missing_", False))
    return b
