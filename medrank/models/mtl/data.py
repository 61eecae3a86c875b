"""MTL inputs (paper §4.5): one row per candidate answer and one per (candidate, entailed answer) pair, with the
pair's NLI sentence grid and the RQE vector of (question, entailed question)."""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from medrank.core.errors import MedrankError

log = logging.getLogger(__name__)

# per-pair values beside the grid; standardised with training statistics
PAIR_FEATURES = ("entailed_log_sentences", "rqe_score", "anli", "augmented")


@dataclass
class MTLData:
    """Model inputs: one row per candidate answer (`cand`) and one per (candidate, entailed answer) (`pairs`).

    cand: answer table (medrank.task3.features.answer_table) - gid, qid, aid, label, reference_rank, ... in row order.
    pairs: cand (int row into cand), entailed (str, unique within the question), augmented (bool), and the
    PAIR_FEATURES columns. grids[i] is the float16 array (grid rows, grid columns, H) of pairs row i; rqe[i] the RQE vector of (question, entailed question) (zeros for augmented rows).
    """

    cand: pd.DataFrame
    pairs: pd.DataFrame
    grids: list[np.ndarray]
    rqe: np.ndarray

    def __post_init__(self) -> None:
        self.cand = self.cand.reset_index(drop=True)
        self.pairs = self.pairs.reset_index(drop=True)
        n = len(self.pairs)
        if len(self.grids) != n or len(self.rqe) != n:
            raise MedrankError(f"MTL data: {n} pair rows but {len(self.grids)} grids and {len(self.rqe)} RQE vectors")
        missing = [c for c in ("cand", "entailed", "augmented", *PAIR_FEATURES) if c not in self.pairs.columns]
        if missing:
            raise MedrankError(f"MTL data: pair table lacks columns {missing}")
        if n and (self.pairs["cand"].min() < 0 or self.pairs["cand"].max() >= len(self.cand)):
            raise MedrankError("MTL data: pair rows point outside the candidate table")
        hs = {g.shape[2] for g in self.grids if g.ndim == 3}
        if any(g.ndim != 3 for g in self.grids) or len(hs) > 1:
            raise MedrankError(f"MTL data: grids must be 3-d (a, c, H) with one H, got H in {sorted(hs)}")
        self.pairs["gid"] = self.cand["gid"].to_numpy()[self.pairs["cand"].to_numpy()]

    def with_columns(self, columns: Mapping[str, np.ndarray]) -> "MTLData":
        """The same data (pairs, grids and their float32 copy shared, not copied) with `columns` added to `cand`:
        what one fit reads beside the shared inputs (a stacked group's scores differ per fit)."""
        bad = [k for k, v in columns.items() if len(v) != len(self.cand)]
        if bad:
            raise MedrankError(
                f"MTL data: column {bad[0]} has {len(columns[bad[0]])} rows, the candidates {len(self.cand)}"
            )
        out = copy.copy(self)
        out.cand = self.cand.assign(**{k: np.asarray(v) for k, v in columns.items()})
        return out

    @property
    def hidden_size(self) -> int:
        return int(self.grids[0].shape[2]) if self.grids else 0

    def grids32(self) -> list[np.ndarray]:
        """The grids as float32 (the network's dtype), converted once and kept: every epoch of every fit reads them
        (the forked fit workers share the parent's copy)."""
        if getattr(self, "_grids32", None) is None or len(self._grids32) != len(self.grids):
            self._grids32 = [np.asarray(g, dtype=np.float32) for g in self.grids]
        return self._grids32

    @property
    def rqe_size(self) -> int:
        return int(self.rqe.shape[1]) if self.rqe.ndim == 2 else 0

    def pair_rows(self, gids: Sequence[str], augmented: bool = True) -> np.ndarray:
        """Pair-row indices of the given questions (augmented rows only when `augmented`)."""
        m = self.pairs["gid"].isin(set(gids)).to_numpy().copy()
        if not augmented:
            m &= ~self.pairs["augmented"].to_numpy(dtype=bool)
        return np.flatnonzero(m)


def _as_grid(flat: np.ndarray, n_rows: int, n_cols: int, hidden: int) -> np.ndarray:
    if n_rows * n_cols == 0:
        return np.zeros((1, 1, hidden), dtype=np.float16)  # an answer without sentences: one empty cell
    return np.asarray(flat, dtype=np.float16).reshape(n_rows, n_cols, hidden)


def build_mtl_data(
    answers: pd.DataFrame,
    grid: pd.DataFrame,
    retrieved: pd.DataFrame,
    *,
    n_candidates: int,
    scores: dict[str, np.ndarray] | None = None,
) -> MTLData:
    """MTLData from the normalized answers, the embed stage's NLI grid rows (extract.NLI_GRID) and the retrieve
    stage's table (retrieval.retrieved_schema: rank, rqe_score, passes_threshold, entailed_answer, rqe_cls).

    Grids are (candidate sentences, selected entailed sentences, H). The entailed answers (N applied by stage
    retrieve and checked here; the top-1 fallback below T included, as the paper's §4.6) and augmentation pairs are used; a candidate
    without any entailed answer gets one empty 1×1 grid (entailed "none"), so every candidate can be scored.
    Answers of questions absent from `retrieved` (a capped tiny profile) are left out. `scores`: per-answer
    columns aligned with `answers` (bienc_cos, cnn_score), passed on to features.answer_table.
    """
    from medrank.task3.features import answer_table, check_n_applied, question_key

    scores = dict(scores or {})
    check_n_applied(retrieved, n_candidates)
    check_n_applied(grid[grid["entailed_kind"] != "augment"], n_candidates, "entailed_rank")
    have = set(zip(retrieved["split"].astype(str), retrieved["qid"].astype(str)))
    keep = np.array(
        [(s, q) in have for s, q in zip(answers["split"].astype(str), answers["qid"].astype(str))], dtype=bool
    )
    if not keep.all():
        log.info(
            "%d answers of %d questions without retrieval results left out",
            int((~keep).sum()),
            answers.loc[~keep, ["split", "qid"]].drop_duplicates().shape[0],
        )
        answers = answers[keep].reset_index(drop=True)
        scores = {k: np.asarray(v)[keep] for k, v in scores.items()}
    # a capped profile (embed.max_answers_per_question) embeds only some answers of a question: keep those
    in_grid = set(zip(grid["split"].astype(str), grid["qid"].astype(str), grid["aid"].astype(str)))
    q_in_grid = {(s, q) for s, q, _ in in_grid}
    keep = np.array(
        [
            (s, q, a) in in_grid or (s, q) not in q_in_grid
            for s, q, a in zip(answers["split"].astype(str), answers["qid"].astype(str), answers["aid"].astype(str))
        ],
        dtype=bool,
    )
    if not keep.all():
        log.info("%d answers without NLI grids (capped embed stage) left out", int((~keep).sum()))
        answers = answers[keep].reset_index(drop=True)
        scores = {k: np.asarray(v)[keep] for k, v in scores.items()}
    anli = grid[["split", "qid", "aid", "entailed_kind", "entailed_rank", "anli"]]
    cand = answer_table(answers, entailed=retrieved, anli=anli, n_candidates=n_candidates, **scores)
    row_of = {k: i for i, k in enumerate(zip(cand["gid"], cand["aid"]))}

    hidden = len(retrieved["rqe_cls"].iloc[0]) if len(retrieved) else 0
    g = grid.assign(gid=question_key(grid))
    cand_idx = np.array([row_of.get(k, -1) for k in zip(g["gid"], g["aid"])], dtype=np.int64)
    g = g[cand_idx >= 0].assign(cand=cand_idx[cand_idx >= 0]).reset_index(drop=True)
    grid_hidden = 0
    for k in range(len(g)):  # the first non-empty grid gives the NLI model's H
        if int(g["n_rows"].iat[k]) * int(g["n_cols"].iat[k]) > 0:
            grid_hidden = len(g["nli_cls"].iat[k]) // (int(g["n_rows"].iat[k]) * int(g["n_cols"].iat[k]))
            break
    grid_hidden = grid_hidden or max(hidden, 1)
    grids = [_as_grid(f, int(r), int(c), grid_hidden) for f, r, c in zip(g["nli_cls"], g["n_rows"], g["n_cols"])]
    rqe_key = {
        (str(s), str(q), int(r)): (float(sc), v)
        for s, q, r, sc, v in zip(
            retrieved["split"], retrieved["qid"], retrieved["rank"], retrieved["rqe_score"], retrieved["rqe_cls"]
        )
    }
    zero = np.zeros(hidden, dtype=np.float32)
    rvec, rscore = [], []
    for s, q, kind, r in zip(g["split"], g["qid"], g["entailed_kind"], g["entailed_rank"]):
        sc, v = rqe_key.get((str(s), str(q), int(r)), (0.0, zero)) if kind == "rqe" else (0.0, zero)
        rvec.append(np.asarray(v, dtype=np.float32))
        rscore.append(sc)
    pairs = pd.DataFrame(
        {
            "cand": g["cand"].to_numpy(),
            "entailed": (g["entailed_kind"].astype(str) + ":" + g["entailed_id"].astype(str)).to_numpy(),
            "augmented": (g["entailed_kind"] == "augment").to_numpy(dtype=float),
            "entailed_log_sentences": np.log1p(g["n_sentences_e"].to_numpy(dtype=float)),
            "rqe_score": np.asarray(rscore, dtype=float),
            "anli": g["anli"].to_numpy(dtype=float),
        }
    )
    # candidates no grid row covers (no retrieved answer): one empty pair so they are still scored
    missing = np.setdiff1d(np.arange(len(cand)), pairs.loc[pairs["augmented"] == 0, "cand"].to_numpy())
    if len(missing):
        log.warning("%d candidate answers have no entailed answer: scored from an empty grid", len(missing))
        extra = pd.DataFrame(
            {
                "cand": missing,
                "entailed": "none",
                "augmented": 0.0,
                "entailed_log_sentences": 0.0,
                "rqe_score": 0.0,
                "anli": 0.0,
            }
        )
        pairs = pd.concat([pairs, extra], ignore_index=True)
        grids += [np.zeros((1, 1, grid_hidden), dtype=np.float16) for _ in missing]
        rvec += [zero] * len(missing)
    rqe_arr = np.stack(rvec) if rvec else np.zeros((0, hidden), dtype=np.float32)
    return MTLData(cand, pairs, grids, rqe_arr)


def check_augmentation(data: MTLData, configs: dict, where: str = "params.yaml") -> None:
    """One error line when a config (name -> MtlParams) trains on augmentation pairs the data has none of (embed.augment_top
    0): augment: true would silently train like augment: false."""
    if data.pairs["augmented"].any():
        return
    wants = [name for name, cfg in configs.items() if cfg.augment]
    if wants:
        raise MedrankError(
            f"{where}: {wants[0]}: augment needs the embed stage's augmentation pairs and the NLI grids have none: "
            "set embed.augment_top > 0 (e.g. `dvc exp run -S embed.augment_top=3 -S mtl.augment=true`)"
        )


def read_mtl_data(p, groups: Iterable[str]) -> tuple[pd.DataFrame, MTLData]:
    """(answers, MTLData) of the answers of the retrieved questions (a capped profile retrieves for fewer: the same
    ones the bienc stage keeps), with the per-answer scores of `groups` (bienc / heading / cnn / qa ...)."""
    from medrank.core import layout as L
    from medrank.task3.features import read_answer_scores
    from medrank.core.io import read_parquet

    retrieved = read_parquet(L.RETRIEVED)
    answers = read_parquet(L.ANSWERS).merge(retrieved[["split", "qid"]].drop_duplicates(), on=["split", "qid"])
    scores = read_answer_scores(answers, set(groups))
    return answers, build_mtl_data(
        answers, read_parquet(L.NLI_GRID), retrieved, n_candidates=p.n_candidates, scores=scores
    )
