"""Multi-task filter + pairwise re-ranker (paper §4.5-4.6, Appendix Tables 7-8).

For every (candidate answer c, entailed answer e) of a question: a conv encoder turns the NLI sentence-pair
grid (c sentences × selected e sentences × H [CLS] vectors) into a fixed vector by quadrant average pooling;
it is concatenated with
the RQE vector of (question, entailed question), the candidate's metadata features (medrank.features) and a
few per-pair values (entailed length, RQE score, ANLI) into the joint embedding. A filter head scores each
joint embedding, a pairwise head each ordered pair of candidates under the same entailed answer.
Loss per question = Σ_e (Σ_c BCE_filter + α Σ_pairs BCE_pair). Inference ensembles the N entailed answers
(sum | mean | max) and ranks by Σ_j P(i above j). The end of the module holds the CV recipe of the mtl
stage and the score stage's pieces (ensemble with the baseline, the paper's error analysis).
"""

from __future__ import annotations

import copy
import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Literal, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import torch
from torch import nn
from torch.nn import functional as F

from medrank.errors import MedrankError

log = logging.getLogger(__name__)

EnsembleMode = Literal["sum", "mean", "max"]
ENSEMBLE_MODES = ("sum", "mean", "max")
# per-pair values beside the grid; standardised with training statistics
PAIR_FEATURES = ("entailed_log_sentences", "rqe_score", "anli", "augmented")


# ---------------------------------------------------------------- configuration


@dataclass(frozen=True)
class MTLConfig:
    """Architecture and training knobs (the stage fills them from params.yaml `mtl`)."""

    proj_channels: int = 64  # the paper's 1×1 conv to H (768); here a param
    conv_channels: tuple[int, int, int, int] = (64, 64, 32, 32)  # the paper: 512, 512, 256, 256
    rqe_dim: int = 32  # linear projection of the RQE vector; 0 = leave the RQE vector out
    filter_hidden: tuple[int, ...] = (128, 32)
    pair_hidden: tuple[int, ...] = (128, 32)
    dropout: float = 0.2
    alpha: float = 2.0  # weight of the pairwise loss
    pair_scope: Literal["all", "valid_any", "valid_both"] = "all"  # training pairs: all, with >= 1 / 2 valid answers
    lr: float = 1e-3
    weight_decay: float = 1e-4
    max_epochs: int = 30
    patience: int = 5
    questions_per_batch: int = 8
    inner_val_frac: float = 0.15  # training questions held out for early stopping
    augment: bool = True  # use the augmentation pairs (higher-ranked candidates as entailed answers)
    max_cells_per_chunk: int = 40000  # padded grid cells encoded at once (memory bound)
    n_seeds: int = 1  # networks trained with different seeds (init, inner split, batch order); predictions averaged
    fixed_epochs: int | None = None  # None = early stopping on the inner split; N = exactly N epochs on all training questions
    nli_grid: bool = True  # False: no conv encoder, the joint embedding lacks the NLI grid (an ablation)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "MTLConfig":
        d = dict(d)
        for k in ("conv_channels", "filter_hidden", "pair_hidden"):
            d[k] = tuple(d[k])
        return cls(**d)


# ---------------------------------------------------------------- data


@dataclass
class MTLData:
    """Model inputs: one row per candidate answer (`cand`) and one per (candidate, entailed answer) (`pairs`).

    cand: answer table (medrank.features.answer_table) - gid, qid, aid, label, reference_rank, ... in row order.
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

    @property
    def hidden_size(self) -> int:
        return int(self.grids[0].shape[2]) if self.grids else 0

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

    Grids are (candidate sentences, selected entailed sentences, H). Entailed answers of rank <= n_candidates
    (the top-1 fallback below T included, as the paper's §4.6) and augmentation pairs are used; a candidate
    without any entailed answer gets one empty 1×1 grid (entailed "none"), so every candidate can be scored.
    Answers of questions absent from `retrieved` (a capped tiny profile) are left out. `scores`: per-answer
    columns aligned with `answers` (bienc_cos, cnn_score), passed on to features.answer_table.
    """
    from medrank.features import answer_table, question_key

    scores = dict(scores or {})
    retrieved = retrieved[retrieved["rank"] <= n_candidates]
    have = set(zip(retrieved["split"].astype(str), retrieved["qid"].astype(str)))
    keep = np.array([(s, q) in have for s, q in zip(answers["split"].astype(str), answers["qid"].astype(str))], dtype=bool)
    if not keep.all():
        log.info("%d answers of %d questions without retrieval results left out", int((~keep).sum()),
                 answers.loc[~keep, ["split", "qid"]].drop_duplicates().shape[0])  # fmt: skip
        answers = answers[keep].reset_index(drop=True)
        scores = {k: np.asarray(v)[keep] for k, v in scores.items()}
    grid = grid[(grid["entailed_kind"] == "augment") | (grid["entailed_rank"] <= n_candidates)]
    # a capped profile (embed.max_answers_per_question) embeds only some answers of a question: keep those
    in_grid = set(zip(grid["split"].astype(str), grid["qid"].astype(str), grid["aid"].astype(str)))
    q_in_grid = {(s, q) for s, q, _ in in_grid}
    keep = np.array([(s, q, a) in in_grid or (s, q) not in q_in_grid
                     for s, q, a in zip(answers["split"].astype(str), answers["qid"].astype(str), answers["aid"].astype(str))], dtype=bool)  # fmt: skip
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
        for s, q, r, sc, v in zip(retrieved["split"], retrieved["qid"], retrieved["rank"], retrieved["rqe_score"], retrieved["rqe_cls"])
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
        extra = pd.DataFrame({"cand": missing, "entailed": "none", "augmented": 0.0, "entailed_log_sentences": 0.0, "rqe_score": 0.0, "anli": 0.0})
        pairs = pd.concat([pairs, extra], ignore_index=True)
        grids += [np.zeros((1, 1, grid_hidden), dtype=np.float16) for _ in missing]
        rvec += [zero] * len(missing)
    rqe_arr = np.stack(rvec) if rvec else np.zeros((0, hidden), dtype=np.float32)
    return MTLData(cand, pairs, grids, rqe_arr)


# ---------------------------------------------------------------- network


class MaskedBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm over the valid cells only (grids are zero-padded to a common size within a batch)."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        if self.training:
            n = mask.sum().clamp(min=2.0)
            mean = (x * mask).sum(dim=(0, 2, 3)) / n
            var = (((x - mean[None, :, None, None]) ** 2) * mask).sum(dim=(0, 2, 3)) / n
            with torch.no_grad():
                m = self.momentum if self.momentum is not None else 0.1
                self.running_mean.mul_(1 - m).add_(m * mean.detach())
                self.running_var.mul_(1 - m).add_(m * var.detach() * n / (n - 1))
                self.num_batches_tracked += 1
        else:
            mean, var = self.running_mean, self.running_var
        y = (x - mean[None, :, None, None]) * torch.rsqrt(var[None, :, None, None] + self.eps)
        y = y * self.weight[None, :, None, None] + self.bias[None, :, None, None]
        return y * mask


# Appendix Table 8 after the 1×1 projection: (kernel, stride, padding, batch norm, ReLU); widths are params.
# The last conv is the output layer (no ReLU, as in the paper).
CONV_SPEC = ((3, 1, 2, True, True), (3, 2, 1, False, True), (2, 1, 1, True, True), (3, 1, 2, False, False))


def _out_size(n: torch.Tensor, k: int, s: int, p: int) -> torch.Tensor:
    return torch.div(n + 2 * p - k, s, rounding_mode="floor") + 1


def _mask(h: torch.Tensor, w: torch.Tensor, H: int, W: int) -> torch.Tensor:
    rows = torch.arange(H, device=h.device)[None, :] < h[:, None]
    cols = torch.arange(W, device=w.device)[None, :] < w[:, None]
    return (rows[:, :, None] & cols[:, None, :]).unsqueeze(1).float()


def quadrant_pool(x: torch.Tensor, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Average of each quadrant of the valid (h, w) region of x (B, C, H, W) → (B, 4C).

    Odd sides share their middle row/column between both halves, so every quadrant is non-empty.
    """
    B, C, H, W = x.shape
    r = torch.arange(H, device=x.device)[None, :]
    c = torch.arange(W, device=x.device)[None, :]
    top = r < torch.div(h + 1, 2, rounding_mode="floor")[:, None]
    bottom = (r >= torch.div(h, 2, rounding_mode="floor")[:, None]) & (r < h[:, None])
    left = c < torch.div(w + 1, 2, rounding_mode="floor")[:, None]
    right = (c >= torch.div(w, 2, rounding_mode="floor")[:, None]) & (c < w[:, None])
    quads = []
    for rm in (top, bottom):
        for cm in (left, right):
            m = (rm[:, :, None] & cm[:, None, :]).float().unsqueeze(1)  # B,1,H,W
            quads.append((x * m).sum(dim=(2, 3)) / m.sum(dim=(2, 3)).clamp(min=1.0))
    return torch.cat(quads, dim=1)


class GridEncoder(nn.Module):
    """Conv encoder of Appendix Table 8 over a batch of variable-size grids → (B, 4 × last width).

    The 1×1 projection runs on the packed valid cells (its padding in the paper only adds a frame of
    bias values); the rest runs on zero-padded maps with masks tracked through each conv's arithmetic,
    so a grid's vector does not depend on what it is batched with (in eval mode).
    """

    def __init__(self, hidden_size: int, proj_channels: int, conv_channels: Sequence[int]) -> None:
        super().__init__()
        if len(conv_channels) != len(CONV_SPEC):
            raise MedrankError(f"conv_channels needs {len(CONV_SPEC)} widths (Table 8), got {list(conv_channels)}")
        self.proj = nn.Linear(hidden_size, proj_channels)
        self.proj_bn = nn.BatchNorm1d(proj_channels)
        self.convs = nn.ModuleList()
        self.bns = nn.ModuleList()
        c_in = proj_channels
        for c_out, (k, s, p, bn, _) in zip(conv_channels, CONV_SPEC):
            self.convs.append(nn.Conv2d(c_in, c_out, k, stride=s, padding=p))
            self.bns.append(MaskedBatchNorm2d(c_out) if bn else nn.Identity())
            c_in = c_out
        self.out_dim = 4 * int(conv_channels[-1])

    def forward(self, cells: torch.Tensor, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """cells: (Σ h_i·w_i, hidden) rows of each grid in row-major order, grid after grid."""
        z = self.proj_bn(self.proj(cells))
        B, C = len(h), z.shape[1]
        Hm, Wm = int(h.max()), int(w.max())
        mask = _mask(h, w, Hm, Wm)  # B,1,H,W
        x = z.new_zeros(B, Hm, Wm, C)
        x[mask[:, 0].bool()] = z  # boolean-mask assignment fills in row-major order, matching `cells`
        x = x.permute(0, 3, 1, 2).contiguous()
        for conv, bn, (k, s, p, use_bn, relu) in zip(self.convs, self.bns, CONV_SPEC):
            x = conv(x)
            h, w = _out_size(h, k, s, p), _out_size(w, k, s, p)
            mask = _mask(h, w, x.shape[2], x.shape[3])
            x = bn(x, mask) if use_bn else x * mask
            if relu:
                x = F.relu(x)
        return quadrant_pool(x, h, w)


def _mlp(d_in: int, hidden: Sequence[int], dropout: float) -> nn.Sequential:
    """Table 7 style: Linear + BN + ReLU (+ dropout) per hidden layer, then Linear → 1 logit."""
    layers: list[nn.Module] = []
    for d in hidden:
        layers += [nn.Linear(d_in, d), nn.BatchNorm1d(d), nn.ReLU()]
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        d_in = d
    layers.append(nn.Linear(d_in, 1))
    return nn.Sequential(*layers)


class MTLNet(nn.Module):
    """Joint embedding (grid vector, projected RQE vector, metadata, pair values) + filter and pairwise heads."""

    def __init__(self, cfg: MTLConfig, hidden_size: int, rqe_size: int, meta_dim: int, pair_dim: int) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.encoder = GridEncoder(hidden_size, cfg.proj_channels, cfg.conv_channels) if cfg.nli_grid else None
        self.rqe_proj = nn.Linear(rqe_size, cfg.rqe_dim) if cfg.rqe_dim > 0 and rqe_size > 0 else None
        self.joint_dim = (self.encoder.out_dim if self.encoder is not None else 0) + (cfg.rqe_dim if self.rqe_proj is not None else 0) + meta_dim + pair_dim
        self.filter_head = _mlp(self.joint_dim, cfg.filter_hidden, cfg.dropout)
        self.pair_head = _mlp(2 * self.joint_dim, cfg.pair_hidden, cfg.dropout)

    def joint(self, cells, h, w, rqe, meta, pf) -> torch.Tensor:
        parts = [self.encoder(cells, h, w)] if self.encoder is not None else []
        if self.rqe_proj is not None:
            parts.append(self.rqe_proj(rqe))
        parts += [meta, pf]
        return torch.cat(parts, dim=1)

    def filter_logits(self, joint: torch.Tensor) -> torch.Tensor:
        return self.filter_head(joint).squeeze(1)

    def pair_logits(self, joint: torch.Tensor, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """Logit of "row i ranks above row j"; antisymmetric by construction (swap → negated logit)."""
        if len(i) == 0:
            return joint.new_zeros(0)
        both = torch.cat([torch.cat([joint[i], joint[j]], 1), torch.cat([joint[j], joint[i]], 1)], 0)
        g = self.pair_head(both).squeeze(1)
        return g[: len(i)] - g[len(i) :]


def mtl_loss(
    filter_logits: torch.Tensor,
    labels: torch.Tensor,
    pair_logits: torch.Tensor,
    pair_targets: torch.Tensor,
    alpha: float,
    n_questions: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(total, filter, pair): Σ BCE_filter + α Σ BCE_pair over the batch, divided by its number of questions."""
    lf = F.binary_cross_entropy_with_logits(filter_logits, labels, reduction="sum")
    lp = F.binary_cross_entropy_with_logits(pair_logits, pair_targets, reduction="sum") if len(pair_logits) else filter_logits.new_zeros(())
    n = max(n_questions, 1)
    return (lf + alpha * lp) / n, lf / n, lp / n


# ---------------------------------------------------------------- batches


def pair_index(groups: np.ndarray, ranks: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(i, j, target) for every unordered pair of rows in the same group; target 1 if i ranks above j.

    ranks: reference rank (lower = better) or None at inference (target 0, unused). Without ranks every
    pair i < j is returned; with ranks, pairs of equal rank are skipped.
    """
    ii: list[int] = []
    jj: list[int] = []
    for rows in pd.Series(np.arange(len(groups))).groupby(groups, sort=False).indices.values():
        rows = np.sort(rows)
        if len(rows) < 2:
            continue
        a, b = np.triu_indices(len(rows), k=1)
        ii.append(rows[a])
        jj.append(rows[b])
    if not ii:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32)
    i, j = np.concatenate(ii), np.concatenate(jj)
    if ranks is None:
        return i, j, np.zeros(len(i), np.float32)
    keep = ranks[i] != ranks[j]
    i, j = i[keep], j[keep]
    return i, j, (ranks[i] < ranks[j]).astype(np.float32)


@dataclass
class _Prepared:
    """Per-pair-row arrays for the model: metadata rows, standardised pair values, labels, ranks, groups."""

    meta: np.ndarray
    pf: np.ndarray
    labels: np.ndarray
    ranks: np.ndarray
    groups: np.ndarray  # "gid\0entailed": pairwise comparisons happen within a group


class _Batcher:
    def __init__(self, data: MTLData, prep: _Prepared, device: torch.device, max_cells: int) -> None:
        self.data, self.prep, self.device, self.max_cells = data, prep, device, max_cells

    def tensors(self, rows: np.ndarray) -> tuple:
        grids = [self.data.grids[r] for r in rows]
        h = torch.tensor([g.shape[0] for g in grids], dtype=torch.long)
        w = torch.tensor([g.shape[1] for g in grids], dtype=torch.long)
        cells = torch.from_numpy(np.concatenate([g.reshape(-1, g.shape[2]) for g in grids]).astype(np.float32))
        to = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(self.device)  # noqa: E731
        return (
            cells.to(self.device), h.to(self.device), w.to(self.device),
            to(self.data.rqe[rows]), to(self.prep.meta[rows]), to(self.prep.pf[rows]),
        )  # fmt: skip

    def joint(self, net: MTLNet, rows: np.ndarray) -> torch.Tensor:
        """Joint embeddings of `rows` (in order), grids encoded in size-sorted chunks to limit padding."""
        order = sorted(range(len(rows)), key=lambda k: (self.data.grids[rows[k]].shape[0], self.data.grids[rows[k]].shape[1]))
        chunks: list[list[int]] = [[]]
        hmax = wmax = 0
        for k in order:
            a, c = self.data.grids[rows[k]].shape[:2]
            nh, nw = max(hmax, a), max(wmax, c)
            if chunks[-1] and nh * nw * (len(chunks[-1]) + 1) > self.max_cells:
                chunks.append([])
                nh, nw = a, c
            chunks[-1].append(k)
            hmax, wmax = nh, nw
        pieces = []
        for ch in chunks:
            sub = rows[np.asarray(ch)]
            pieces.append((ch, net.joint(*self.tensors(sub))))
        dim = pieces[0][1].shape[1]
        joint = pieces[0][1].new_empty(len(rows), dim)
        for ch, j in pieces:
            joint[torch.as_tensor(ch, device=joint.device)] = j
        return joint


# ---------------------------------------------------------------- fitted model


@dataclass
class FittedMTL:
    """A trained network with the feature builder and pair-value scaling it was trained with."""

    config: MTLConfig
    net: MTLNet
    builder: object  # medrank.features.FeatureBuilder
    pf_mean: np.ndarray
    pf_scale: np.ndarray
    history: list[dict] = field(default_factory=list)
    best_epoch: int = 0

    def prepare(self, data: MTLData) -> _Prepared:
        return _prepare(data, self.builder, self.pf_mean, self.pf_scale)

    @torch.no_grad()
    def predict(self, data: MTLData, gids: Sequence[str] | None = None, device: str | torch.device = "cpu") -> tuple[pd.DataFrame, pd.DataFrame]:
        """Per-(candidate, entailed) filter probabilities and per-ordered-pair P(i above j), non-augmented rows.

        Returns (filter_df: gid, aid, entailed, prob; pair_df: gid, entailed, aid_i, aid_j, prob) with both
        orders of each pair (prob_ji = 1 - prob_ij).
        """
        dev = torch.device(device) if not isinstance(device, torch.device) else device
        gids = list(pd.unique(data.cand["gid"])) if gids is None else list(gids)
        rows = data.pair_rows(gids, augmented=False)
        self.net.to(dev).eval()
        prep = self.prepare(data)
        batcher = _Batcher(data, prep, dev, self.config.max_cells_per_chunk)
        aid = data.cand["aid"].to_numpy()[data.pairs["cand"].to_numpy()]
        f_parts, p_parts = [], []
        # a few questions at a time keeps memory flat on large inputs
        by_q = pd.Series(rows).groupby(data.pairs["gid"].to_numpy()[rows], sort=False).indices
        qs = list(by_q)
        for s in range(0, len(qs), 16):
            sub = np.concatenate([rows[by_q[q]] for q in qs[s : s + 16]]) if qs else rows
            joint = batcher.joint(self.net, sub)
            prob = torch.sigmoid(self.net.filter_logits(joint)).cpu().numpy()
            f_parts.append(pd.DataFrame({"gid": data.pairs["gid"].to_numpy()[sub], "aid": aid[sub], "entailed": data.pairs["entailed"].to_numpy()[sub], "prob": prob}))
            i, j, _ = pair_index(prep.groups[sub], None)
            if len(i):
                pij = torch.sigmoid(self.net.pair_logits(joint, torch.as_tensor(i, device=dev), torch.as_tensor(j, device=dev))).cpu().numpy()
                g = data.pairs["gid"].to_numpy()[sub]
                e = data.pairs["entailed"].to_numpy()[sub]
                a = aid[sub]
                p_parts.append(pd.DataFrame({"gid": g[i], "entailed": e[i], "aid_i": a[i], "aid_j": a[j], "prob": pij}))
                p_parts.append(pd.DataFrame({"gid": g[i], "entailed": e[i], "aid_i": a[j], "aid_j": a[i], "prob": 1.0 - pij}))
        fcols = ["gid", "aid", "entailed", "prob"]
        pcols = ["gid", "entailed", "aid_i", "aid_j", "prob"]
        f_df = pd.concat(f_parts, ignore_index=True) if f_parts else pd.DataFrame(columns=fcols)
        p_df = pd.concat(p_parts, ignore_index=True) if p_parts else pd.DataFrame(columns=pcols)
        return f_df, p_df

    # ------------------------------------------------------------ persistence
    def save(self, out_dir: str | Path, extra_meta: dict | None = None) -> None:
        """model.pt (state dict only) + mtl.json (config, dims, feature builder state, pair-value scaling)."""
        from medrank.io import atomic_path, write_json

        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        with atomic_path(out_dir / "model.pt") as tmp:
            torch.save({k: v.detach().cpu() for k, v in self.net.state_dict().items()}, tmp)
        meta = {
            "config": self.config.to_json(),
            "dims": self.dims,
            "builder": builder_to_json(self.builder),
            "pf_mean": self.pf_mean.tolist(),
            "pf_scale": self.pf_scale.tolist(),
            "best_epoch": self.best_epoch,
            "history": self.history,
            **(extra_meta or {}),
        }
        write_json(out_dir / "mtl.json", meta)

    @property
    def dims(self) -> dict:
        return {
            "hidden_size": self.net.hidden_size,
            "rqe_size": self.net.rqe_proj.in_features if self.net.rqe_proj is not None else 0,
            "meta_dim": len(self.builder.feature_names),
            "pair_dim": len(PAIR_FEATURES),
        }

    @classmethod
    def load(cls, path: str | Path) -> tuple["FittedMTL", dict]:
        """(model, its mtl.json metadata) from a folder written by `save`."""
        path = Path(path)
        if not (path / "model.pt").exists() or not (path / "mtl.json").exists():
            raise MedrankError(f"{path}: no trained MTL model (model.pt + mtl.json; run the mtl stage)")
        meta = json.loads((path / "mtl.json").read_text(encoding="utf-8"))
        cfg = MTLConfig.from_json(meta["config"])
        net = MTLNet(cfg, **meta["dims"])
        state = torch.load(path / "model.pt", map_location="cpu", weights_only=True)
        net.load_state_dict(state)
        net.eval()
        fitted = cls(cfg, net, builder_from_json(meta["builder"]), np.asarray(meta["pf_mean"]), np.asarray(meta["pf_scale"]), meta.get("history", []), meta.get("best_epoch", 0))
        return fitted, meta


@dataclass
class MTLBag:
    """Networks of one recipe trained with different seeds; predictions are their mean (variance reduction)."""

    members: list[FittedMTL]

    @property
    def builder(self):
        return self.members[0].builder

    @property
    def best_epoch(self) -> list[int]:
        return [m.best_epoch for m in self.members]

    @property
    def history(self) -> list[dict]:
        """The first member's curves (what dvclive plots)."""
        return self.members[0].history

    def predict(self, data: MTLData, gids: Sequence[str] | None = None, device: str | torch.device = "cpu") -> tuple[pd.DataFrame, pd.DataFrame]:
        """FittedMTL.predict of every member, probabilities averaged (members return rows in the same order)."""
        outs = [m.predict(data, gids, device) for m in self.members]
        f_df, p_df = outs[0][0].copy(), outs[0][1].copy()
        if len(outs) > 1:
            f_df["prob"] = np.mean([o[0]["prob"].to_numpy() for o in outs], axis=0)
            p_df["prob"] = np.mean([o[1]["prob"].to_numpy() for o in outs], axis=0)
        return f_df, p_df

    def save(self, out_dir: str | Path, extra_meta: dict | None = None) -> None:
        """The first member as FittedMTL.save (with n_members), the others in member1/, member2/, ..."""
        out_dir = Path(out_dir)
        self.members[0].save(out_dir, {**(extra_meta or {}), "n_members": len(self.members)})
        for i, m in enumerate(self.members[1:], start=1):
            m.save(out_dir / f"member{i}")

    @classmethod
    def load(cls, path: str | Path) -> tuple["MTLBag", dict]:
        """(bag, the first member's mtl.json) from a folder written by `save` (or by FittedMTL.save: one member)."""
        first, meta = FittedMTL.load(path)
        members = [first] + [FittedMTL.load(Path(path) / f"member{i}")[0] for i in range(1, int(meta.get("n_members", 1)))]
        return cls(members), meta


def fit_mtl_bag(data: MTLData, train_gids: Sequence[str], cfg: MTLConfig, make_builder: Callable[[], object], *, seed: int = 13,
                device: str | torch.device = "cpu") -> MTLBag:  # fmt: skip
    """`cfg.n_seeds` networks (fit_mtl with seeds seed, seed + 1000, ...), each with a fresh feature builder."""
    return MTLBag([fit_mtl(data, train_gids, cfg, make_builder(), seed=seed + 1000 * i, device=device) for i in range(cfg.n_seeds)])


def builder_to_json(builder) -> dict:
    """FeatureBuilder state as plain JSON (TF-IDF as vocabulary + idf), no pickles in the model folder."""
    d = {
        "groups": list(builder.groups),
        "n_candidates": builder.n_candidates,
        "min_source_count": builder.min_source_count,
        "sources_": list(builder.sources_),
        "mean_": np.asarray(builder.mean_).tolist(),
        "scale_": np.asarray(builder.scale_).tolist(),
        "dense_names_": list(builder.dense_names_),
        "tfidf": None,
    }
    if builder.tfidf is not None:
        v = builder.tfidf
        d["tfidf"] = {"params": {k: v.get_params()[k] for k in ("lowercase", "stop_words", "sublinear_tf", "token_pattern", "min_df", "max_features")}, "vocabulary": {k: int(i) for k, i in v.vocabulary_.items()}, "idf": v.idf_.tolist()}
    return d


def builder_from_json(d: dict):
    from sklearn.feature_extraction.text import TfidfVectorizer

    from medrank.features import FeatureBuilder

    tfidf = None
    if d.get("tfidf"):
        t = d["tfidf"]
        tfidf = TfidfVectorizer(**t["params"], dtype=np.float32, vocabulary=t["vocabulary"])
        tfidf.idf_ = np.asarray(t["idf"], dtype=np.float64)
    b = FeatureBuilder(tuple(d["groups"]), n_candidates=d["n_candidates"], tfidf=tfidf, min_source_count=d["min_source_count"])
    b.sources_ = list(d["sources_"])
    b.mean_ = np.asarray(d["mean_"], dtype=float)
    b.scale_ = np.asarray(d["scale_"], dtype=float)
    b.dense_names_ = list(d["dense_names_"])
    return b


# ---------------------------------------------------------------- training


def _prepare(data: MTLData, builder, pf_mean: np.ndarray, pf_scale: np.ndarray) -> _Prepared:
    meta_c = builder.transform(data.cand)
    meta_c = np.asarray(meta_c.todense() if hasattr(meta_c, "todense") else meta_c, dtype=np.float32)
    cand = data.pairs["cand"].to_numpy()
    pf = (data.pairs[list(PAIR_FEATURES)].to_numpy(dtype=float) - pf_mean) / pf_scale
    labels = data.cand["label"].to_numpy(dtype=float)[cand]
    ranks = data.cand["reference_rank"].to_numpy(dtype=float)[cand]
    groups = (data.pairs["gid"].astype(str) + "\0" + data.pairs["entailed"].astype(str)).to_numpy()
    return _Prepared(meta_c[cand], pf.astype(np.float32), labels, ranks, groups)


def _split_inner(gids: Sequence[str], frac: float, seed: int) -> tuple[list[str], list[str]]:
    gids = list(gids)
    n_inner = int(round(len(gids) * frac))
    if frac <= 0 or n_inner < 1 or n_inner >= len(gids):
        return gids, []
    perm = np.random.default_rng(seed).permutation(len(gids))
    inner = {gids[i] for i in perm[:n_inner]}
    return [g for g in gids if g not in inner], [g for g in gids if g in inner]


def set_seed(seed: int) -> None:
    import random

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def _batch_loss(net: MTLNet, batcher: _Batcher, prep: _Prepared, rows: np.ndarray, alpha: float, n_q: int, dev: torch.device, pair_scope: str = "all"):
    joint = batcher.joint(net, rows)
    fl = net.filter_logits(joint)
    y = torch.as_tensor(prep.labels[rows], dtype=torch.float32, device=dev)
    i, j, t = pair_index(prep.groups[rows], prep.ranks[rows])
    if pair_scope != "all" and len(i):
        lab = prep.labels[rows]
        keep = (lab[i] + lab[j] >= 1) if pair_scope == "valid_any" else (lab[i] + lab[j] == 2)
        i, j, t = i[keep], j[keep], t[keep]
    pl = net.pair_logits(joint, torch.as_tensor(i, device=dev), torch.as_tensor(j, device=dev))
    loss, lf, lp = mtl_loss(fl, y, pl, torch.as_tensor(t, device=dev), alpha, n_q)
    return loss, lf, lp, fl, y, pl, t


def _valid_training_rows(data: MTLData, gids: Sequence[str], augment: bool) -> np.ndarray:
    """Pair rows of `gids` with a label; augmented rows keep only candidates ranked below the entailed one."""
    rows = data.pair_rows(gids, augmented=augment)
    labels = data.cand["label"].to_numpy(dtype=float)[data.pairs["cand"].to_numpy()[rows]]
    if np.isnan(labels).any():
        raise MedrankError("MTL training rows without a label (test rows cannot be used for training)")
    return rows


def fit_mtl(
    data: MTLData,
    train_gids: Sequence[str],
    cfg: MTLConfig,
    builder,
    *,
    seed: int = 13,
    device: str | torch.device = "cpu",
    epochs: int | None = None,
    on_epoch: Callable[[int, dict], None] | None = None,
) -> FittedMTL:
    """Train on the questions `train_gids`; early stopping on an inner split of them (inner-val loss).

    `builder` is an unfitted medrank.features.FeatureBuilder (fitted here on the training candidates).
    With `epochs` (or cfg.fixed_epochs) set, no inner split: train exactly that many epochs on all of `train_gids`.
    """
    dev = torch.device(device) if not isinstance(device, torch.device) else device
    set_seed(seed)
    train_gids = list(train_gids)
    epochs = epochs if epochs is not None else cfg.fixed_epochs
    if epochs is None:
        fit_gids, inner_gids = _split_inner(train_gids, cfg.inner_val_frac, seed)
    else:
        fit_gids, inner_gids = train_gids, []
    cand_fit = data.cand["gid"].isin(set(fit_gids)).to_numpy()
    builder.fit(data.cand[cand_fit])
    rows_fit = _valid_training_rows(data, fit_gids, cfg.augment)
    pf = data.pairs[list(PAIR_FEATURES)].to_numpy(dtype=float)[rows_fit]
    pf_mean = pf.mean(axis=0)
    sd = pf.std(axis=0)
    pf_scale = np.where(sd > 1e-12, sd, 1.0)
    prep = _prepare(data, builder, pf_mean, pf_scale)
    net = MTLNet(cfg, data.hidden_size, data.rqe_size, prep.meta.shape[1], len(PAIR_FEATURES)).to(dev)
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    batcher = _Batcher(data, prep, dev, cfg.max_cells_per_chunk)
    rows_inner = _valid_training_rows(data, inner_gids, False) if inner_gids else np.zeros(0, np.int64)
    gid_of = data.pairs["gid"].to_numpy()
    fit_by_q = pd.Series(rows_fit).groupby(gid_of[rows_fit], sort=False).indices
    fit_qs = list(fit_by_q)
    rng = np.random.default_rng(seed)
    n_epochs = epochs if epochs is not None else cfg.max_epochs
    best = (math.inf, 0, None)
    history: list[dict] = []
    bad = 0
    for epoch in range(1, n_epochs + 1):
        t0 = time.perf_counter()
        net.train()
        order = rng.permutation(len(fit_qs))
        tot = tf = tp = 0.0
        nb = 0
        for s in range(0, len(order), cfg.questions_per_batch):
            qs = [fit_qs[k] for k in order[s : s + cfg.questions_per_batch]]
            rows = np.concatenate([rows_fit[fit_by_q[q]] for q in qs])
            if len(rows) < 2:
                continue  # BatchNorm needs two rows
            loss, lf, lp, *_ = _batch_loss(net, batcher, prep, rows, cfg.alpha, len(qs), dev, cfg.pair_scope)
            opt.zero_grad()
            loss.backward()
            opt.step()
            tot += float(loss.detach()) * len(qs)
            tf += float(lf.detach()) * len(qs)
            tp += float(lp.detach()) * len(qs)
            nb += len(qs)
        rec = {"epoch": epoch, "train_loss": tot / max(nb, 1), "train_filter_loss": tf / max(nb, 1), "train_pair_loss": tp / max(nb, 1)}
        if len(rows_inner):
            rec.update(_inner_eval(net, batcher, prep, rows_inner, gid_of, cfg.alpha, dev, cfg.pair_scope))
        rec["seconds"] = round(time.perf_counter() - t0, 2)
        history.append(rec)
        log.info("epoch %d: %s", epoch, {k: round(v, 4) if isinstance(v, float) else v for k, v in rec.items()})
        if on_epoch is not None:
            on_epoch(epoch, rec)
        if len(rows_inner):
            if rec["val_loss"] < best[0] - 1e-4:
                best = (rec["val_loss"], epoch, copy.deepcopy(net.state_dict()))
                bad = 0
            else:
                bad += 1
                if bad >= cfg.patience:
                    break
    best_epoch = epoch
    if best[2] is not None:
        net.load_state_dict(best[2])
        best_epoch = best[1]
    net.eval()
    return FittedMTL(cfg, net, builder, pf_mean, pf_scale, history, best_epoch)


@torch.no_grad()
def _inner_eval(net, batcher, prep, rows, gid_of, alpha, dev, pair_scope="all") -> dict:
    net.eval()
    by_q = pd.Series(rows).groupby(gid_of[rows], sort=False).indices
    tot = tf = tp = 0.0
    correct = n = pc = pn = 0
    for q, idx in by_q.items():
        r = rows[idx]
        loss, lf, lp, fl, y, pl, t = _batch_loss(net, batcher, prep, r, alpha, 1, dev, pair_scope)
        tot += float(loss)
        tf += float(lf)
        tp += float(lp)
        correct += int(((fl > 0).float() == y).sum())
        n += len(r)
        pc += int(((pl > 0).float().cpu().numpy() == t).sum())
        pn += len(t)
    nq = max(len(by_q), 1)
    return {
        "val_loss": tot / nq,
        "val_filter_loss": tf / nq,
        "val_pair_loss": tp / nq,
        "val_filter_accuracy": correct / max(n, 1),
        "val_pair_accuracy": pc / max(pn, 1),
    }


# ---------------------------------------------------------------- ensembling over entailed answers


def ensemble(filter_df: pd.DataFrame, pair_df: pd.DataFrame, mode: EnsembleMode = "sum") -> pd.DataFrame:
    """Per candidate, combining its N entailed answers by `mode`:

    prob = mode_e P_e(valid); pair_score = Σ_j mode_e P_e(i above j) (0 for a single candidate);
    expected_score = p_i Σ_j [p_j P(i above j) + (1 - p_j)] with p = mean_e P_e(valid): the expected number of
    answers i outranks when valid answers precede invalid ones. Rows in first-appearance order of (gid, aid).
    """
    if mode not in ENSEMBLE_MODES:
        raise MedrankError(f"ensemble mode '{mode}': expected one of {', '.join(ENSEMBLE_MODES)}")
    by_c = filter_df.groupby(["gid", "aid"], sort=False)
    out = getattr(by_c["prob"], mode)().rename("prob").reset_index()
    p_mean = by_c["prob"].mean()
    out["prob_mean"] = p_mean.to_numpy()
    out["n_entailed"] = by_c["entailed"].nunique().to_numpy()
    out["pair_score"] = 0.0
    out["expected_score"] = p_mean.to_numpy()  # a lone candidate: its own probability
    if len(pair_df):
        pe = getattr(pair_df.groupby(["gid", "aid_i", "aid_j"], sort=False)["prob"], mode)()
        pm = pair_df.groupby(["gid", "aid_i", "aid_j"], sort=False)["prob"].mean().reset_index()
        s = pe.groupby(level=[0, 1], sort=False).sum()
        key = pd.MultiIndex.from_frame(out[["gid", "aid"]])
        out["pair_score"] = s.reindex(key).fillna(0.0).to_numpy(dtype=float)
        pi = p_mean.reindex(pd.MultiIndex.from_frame(pm[["gid", "aid_i"]])).to_numpy()
        pj = p_mean.reindex(pd.MultiIndex.from_frame(pm[["gid", "aid_j"]])).to_numpy()
        wins = pd.Series(pi * (pj * pm["prob"].to_numpy() + (1 - pj)), index=pd.MultiIndex.from_frame(pm[["gid", "aid_i"]]))
        w = wins.groupby(level=[0, 1], sort=False).sum()
        out["expected_score"] = w.reindex(key).fillna(0.0).to_numpy(dtype=float) + 1e-3 * p_mean.reindex(key).to_numpy()
    return out


# ---------------------------------------------------------------- decisions and the CV recipe


@dataclass(frozen=True)
class Decision:
    """How per-candidate predictions become a submission: ensemble mode, ranking key, threshold rule."""

    ensemble: EnsembleMode = "sum"
    rank_by: Literal["pairwise", "expected", "filter"] = "pairwise"
    threshold: float | None = None  # None = chosen on out-of-fold predictions
    prior_shift: Literal["none", "em"] = "none"
    min_keep: int = 0


def decide(ens: pd.DataFrame, threshold: float, decision: Decision, train_prior: float | None = None) -> pd.DataFrame:
    """Add label (keep/drop) and score (submission order key: kept first, then by the ranking key)."""
    from medrank.models.baseline import em_prior_shift, keep_labels, submission_score

    prob = ens["prob"].to_numpy(dtype=float)
    # EM re-estimation needs probabilities: not defined on the summed scale
    if decision.prior_shift == "em" and train_prior is not None and decision.ensemble != "sum":
        _, prob = em_prior_shift(prob, train_prior)
    gid = ens["gid"].to_numpy()
    labels = keep_labels(prob, threshold, gid, decision.min_keep)
    key = {"pairwise": ens["pair_score"], "expected": ens["expected_score"], "filter": ens["prob"]}[decision.rank_by].to_numpy(dtype=float)
    # ties in the pairwise score (e.g. a single candidate) fall back to the filter probability
    key = key + 1e-6 * ens["prob"].to_numpy(dtype=float)
    return ens.assign(prob_used=prob, label=labels, rank_key=key, score=submission_score(labels, key, gid))


def threshold_grid(mode: str, max_entailed: int) -> np.ndarray:
    """Candidate thresholds: probabilities for mean/max, multiples up to N for sum."""
    from medrank.models.baseline import THRESHOLD_GRID

    return THRESHOLD_GRID * (max_entailed if mode == "sum" else 1)


def choose_threshold(ens: pd.DataFrame, labels: np.ndarray, mode: str) -> float:
    """Best-accuracy threshold of the ensembled probability on labelled rows (baseline.select_threshold)."""
    from medrank.models.baseline import select_threshold

    n = int(ens["n_entailed"].max()) if len(ens) else 1
    return select_threshold(np.asarray(labels, dtype=int), ens["prob"].to_numpy(dtype=float), threshold_grid(mode, max(n, 1)))


def with_truth(ens: pd.DataFrame, cand: pd.DataFrame) -> pd.DataFrame:
    """Attach label / reference columns of the candidate table to ensembled rows (by gid, aid)."""
    cols = ["gid", "aid", "split", "qid", "label", "reference_rank", "reference_score", "n_sentences", "chiqa_rank"]
    return ens.merge(cand[[c for c in cols if c in cand.columns]], on=["gid", "aid"], how="left")


def evaluate_rows(pred: pd.DataFrame) -> dict:
    """Official Task 3 metrics of decided rows (gid, aid, label, score + truth columns from with_truth)."""
    from medrank.models.baseline import evaluate

    truth = pred[["gid", "aid", "qid", "split", "reference_rank", "reference_score"]].assign(label=pred["label_true"])
    return evaluate(pred[["gid", "aid", "label", "score"]], truth)


@dataclass
class CVResult:
    """Out-of-fold predictions (long tables) and per-fold training facts."""

    filter_df: pd.DataFrame
    pair_df: pd.DataFrame
    folds: dict[str, int]  # gid -> fold
    best_epochs: list[list[int]]  # per fold, one per bag member
    seconds: list[float]
    histories: list[list[dict]]


def cross_validate_mtl(
    data: MTLData,
    gids: Sequence[str],
    cfg: MTLConfig,
    make_builder: Callable[[], object],
    *,
    k: int,
    seed: int,
    device: str | torch.device = "cpu",
) -> CVResult:
    """Question-grouped k-fold CV: each fold's model (early stopping on an inner split of its training
    questions) predicts the held-out questions."""
    from medrank.models.baseline import grouped_folds

    gids = list(gids)
    fold_of = grouped_folds(np.asarray(gids), k, seed)
    fold = dict(zip(gids, fold_of.tolist()))
    f_parts, p_parts, best, secs, hists = [], [], [], [], []
    for f in range(k):
        t0 = time.perf_counter()
        train = [g for g in gids if fold[g] != f]
        test = [g for g in gids if fold[g] == f]
        model = fit_mtl_bag(data, train, cfg, make_builder, seed=seed + f, device=device)
        fd, pdf = model.predict(data, test, device=device)
        f_parts.append(fd.assign(fold=f))
        p_parts.append(pdf.assign(fold=f))
        best.append(model.best_epoch)
        secs.append(round(time.perf_counter() - t0, 1))
        hists.append(model.history)
        log.info("CV fold %d/%d: best epoch(s) %s, %.0fs", f + 1, k, model.best_epoch, secs[-1])
    return CVResult(pd.concat(f_parts, ignore_index=True), pd.concat(p_parts, ignore_index=True), fold, best, secs, hists)


def cv_metrics(cv: CVResult, cand: pd.DataFrame, decision: Decision) -> tuple[dict, pd.DataFrame]:
    """Per-fold official metrics (threshold for fold f chosen on the out-of-fold rows of the other folds,
    unless fixed) → (mean/sd summary with thresholds, decided OOF rows)."""
    from medrank.models.baseline import summarize

    ens = with_truth(ensemble(cv.filter_df, cv.pair_df, decision.ensemble), cand)
    ens = ens.rename(columns={"label": "label_true"})
    ens["fold"] = ens["gid"].map(cv.folds)
    per_fold, thresholds, decided = [], [], []
    for f in sorted(ens["fold"].unique()):
        rest, part = ens[ens["fold"] != f], ens[ens["fold"] == f]
        t = decision.threshold if decision.threshold is not None else choose_threshold(rest, rest["label_true"].to_numpy(), decision.ensemble)
        d = decide(part, t, decision, float(rest["label_true"].mean()))
        per_fold.append(evaluate_rows(d))
        thresholds.append(float(t))
        decided.append(d)
    out = summarize(per_fold)
    out["thresholds"] = thresholds
    return out, pd.concat(decided, ignore_index=True)


# ---------------------------------------------------------------- the stage recipe

PREDICTIONS_SCHEMA = pa.schema(
    [
        ("part", pa.string()),  # oof (CV over train+val) | val (train-only model) | test (final model)
        ("split", pa.string()),
        ("qid", pa.string()),
        ("aid", pa.string()),
        ("fold", pa.int16()),  # CV fold (oof), -1 otherwise
        ("prob", pa.float64()),  # ensembled filter probability (sum: on the 0..N scale)
        ("prob_mean", pa.float64()),  # mean over the entailed answers (0..1 whatever the ensemble mode)
        ("pair_score", pa.float64()),  # Σ_j P(i above j), ensembled
        ("rank_key", pa.float64()),  # the ranking key of the decision rule (pair_score | expected_score | prob)
        ("n_entailed", pa.int16()),
        ("threshold", pa.float64()),
        ("label", pa.int8()),  # kept (1) or filtered out (0)
        ("score", pa.float64()),  # submission order key within the question (higher = earlier)
    ]
)


def config_from_params(mp) -> tuple[MTLConfig, Decision]:
    """MTLConfig + Decision from the params.yaml `mtl` section (medrank.params.MtlParams)."""
    cfg = MTLConfig(
        proj_channels=mp.proj_channels, conv_channels=tuple(mp.conv_channels), rqe_dim=mp.rqe_dim,
        filter_hidden=tuple(mp.filter_hidden), pair_hidden=tuple(mp.pair_hidden), dropout=mp.dropout, alpha=mp.alpha,
        lr=mp.lr, weight_decay=mp.weight_decay, max_epochs=mp.max_epochs, patience=mp.patience,
        questions_per_batch=mp.questions_per_batch, inner_val_frac=mp.inner_val_frac, augment=mp.augment,
        pair_scope=mp.pair_scope, n_seeds=mp.n_seeds, fixed_epochs=mp.fixed_epochs, nli_grid=mp.nli_grid,
    )  # fmt: skip
    return cfg, Decision(mp.ensemble, mp.rank_by, mp.threshold, mp.prior_shift, mp.min_keep)


def builder_factory(groups: Sequence[str], n_candidates: int, tfidf=None) -> Callable[[], object]:
    """A function returning a fresh (unfitted) FeatureBuilder for each fit."""
    from medrank.features import FeatureBuilder

    return lambda: FeatureBuilder(tuple(groups), n_candidates=n_candidates, tfidf=tfidf)


@dataclass
class RecipeReport:
    final_model: MTLBag
    predictions: pd.DataFrame
    metrics: dict
    decision_json: dict


def _variants(decision: Decision) -> dict[str, Decision]:
    from dataclasses import replace

    out = {}
    for mode in ENSEMBLE_MODES:
        for rank_by in ("pairwise", "expected", "filter"):
            out[f"{mode}/{rank_by}"] = replace(decision, ensemble=mode, rank_by=rank_by)
    out["mean/pairwise/em"] = replace(decision, ensemble="mean", rank_by="pairwise", prior_shift="em")
    return out


def _rows(part: str, d: pd.DataFrame, threshold: float | np.ndarray, fold: np.ndarray | int = -1) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "part": part,
            "split": d["split"].to_numpy(),
            "qid": d["qid"].to_numpy(),
            "aid": d["aid"].to_numpy(),
            "fold": np.broadcast_to(np.asarray(fold, dtype=np.int16), (len(d),)),
            "prob": d["prob"].to_numpy(dtype=float),
            "prob_mean": d["prob_mean"].to_numpy(dtype=float),
            "pair_score": d["pair_score"].to_numpy(dtype=float),
            "rank_key": d["rank_key"].to_numpy(dtype=float),
            "n_entailed": d["n_entailed"].to_numpy(dtype=np.int16),
            "threshold": np.broadcast_to(np.asarray(threshold, dtype=float), (len(d),)),
            "label": d["label"].to_numpy(dtype=np.int8),
            "score": d["score"].to_numpy(dtype=float),
        }
    )


def _log_curves(live, runs: dict[str, list[dict]]) -> None:
    """dvclive: one curve per run and metric, x = epoch."""
    n = max((len(h) for h in runs.values()), default=0)
    for e in range(n):
        for name, hist in runs.items():
            if e < len(hist):
                for k, v in hist[e].items():
                    if k not in ("epoch", "seconds"):
                        live.log_metric(f"{name}/{k}", float(v), plot=True)
        live.next_step()


def run_recipe(
    data: MTLData,
    train_gids: Sequence[str],
    val_gids: Sequence[str],
    test_gids: Sequence[str],
    cfg: MTLConfig,
    decision: Decision,
    make_builder: Callable[[], object],
    *,
    k: int,
    seed: int,
    device: str | torch.device = "cpu",
    live=None,
    ablations: dict[str, tuple[MTLConfig, Decision, Callable[[], object]]] | None = None,
) -> RecipeReport:
    """CV over train+val → thresholds and mean ± sd; train-only model → validation check; train+val model → test.
    `ablations`: rows (config, decision, feature builder) that get the same CV only (ablation_cv)."""
    # labelled questions in table order (the baseline's CV sees them in this order: same folds for one seed)
    lab_set = set(train_gids) | set(val_gids)
    labelled = [g for g in pd.unique(data.cand["gid"]) if g in lab_set]
    t0 = time.perf_counter()
    cv = cross_validate_mtl(data, labelled, cfg, make_builder, k=k, seed=seed, device=device)
    cv_seconds = time.perf_counter() - t0
    variants = {}
    for name, dv in _variants(decision).items():
        variants[name], _ = cv_metrics(cv, data.cand, dv)
    cv_summary, oof = cv_metrics(cv, data.cand, decision)
    ablation = ablation_cv(data, labelled, ablations or {}, k=k, seed=seed, device=device)

    def _threshold(rows: pd.DataFrame) -> float:
        if decision.threshold is not None:
            return float(decision.threshold)
        return choose_threshold(rows, rows["label_true"].to_numpy(), decision.ensemble)

    oof_train = oof[oof["gid"].isin(set(train_gids))]
    t_val, t_final = _threshold(oof_train), _threshold(oof)
    prior_train = float(oof_train["label_true"].mean())
    prior_all = float(oof["label_true"].mean())

    t1 = time.perf_counter()
    val_model = fit_mtl_bag(data, train_gids, cfg, make_builder, seed=seed + 101, device=device)
    val_seconds = time.perf_counter() - t1
    ens_val = with_truth(ensemble(*val_model.predict(data, val_gids, device=device), decision.ensemble), data.cand)
    ens_val = ens_val.rename(columns={"label": "label_true"})
    dec_val = decide(ens_val, t_val, decision, prior_train)
    val_metrics = evaluate_rows(dec_val)

    t2 = time.perf_counter()
    final = fit_mtl_bag(data, labelled, cfg, make_builder, seed=seed + 202, device=device)
    final_seconds = time.perf_counter() - t2
    parts = [_rows("oof", oof, oof["fold"].map(dict(enumerate(cv_summary["thresholds"]))).to_numpy(), oof["fold"].to_numpy()), _rows("val", dec_val, t_val)]
    if test_gids:
        ens_test = with_truth(ensemble(*final.predict(data, test_gids, device=device), decision.ensemble), data.cand)
        parts.append(_rows("test", decide(ens_test, t_final, decision, prior_all), t_final))

    if live is not None:
        runs = {f"fold{f + 1}": h for f, h in enumerate(cv.histories)}
        runs["val_model"] = val_model.history
        runs["final_model"] = final.history
        with live:
            live.log_params({"config": cfg.to_json(), "decision": asdict(decision), "cv_folds": k, "seed": seed})
            _log_curves(live, runs)

    decision_json = {**asdict(decision), "threshold_used": t_final, "train_prior": prior_all}
    metrics = {
        "decision": {**asdict(decision), "threshold_val_model": t_val, "threshold_final_model": t_final},
        "cv": cv_summary,
        "cv_variants": variants,
        "ablations": ablation,
        "val": {m: val_metrics[m] for m in ("accuracy", "precision", "mrr", "spearman", "spearman_true")},
        "val_counts": {m: val_metrics[m] for m in ("n_questions", "n_gold_rows", "n_predicted_positive", "n_correct_positive", "n_spearman_questions")},
        "best_epochs": {"cv_folds": cv.best_epochs, "val_model": val_model.best_epoch, "final_model": final.best_epoch},
        "seconds": {"cv": round(cv_seconds, 1), "cv_folds": cv.seconds, "val_model": round(val_seconds, 1), "final_model": round(final_seconds, 1)},
        "n_pairs": {"all": int(len(data.pairs)), "augmented": int(data.pairs["augmented"].sum())},
        "questions": {"train": len(train_gids), "val": len(val_gids), "test": len(test_gids)},
    }
    return RecipeReport(final, pd.concat(parts, ignore_index=True), metrics, decision_json)


def ablation_cv(
    data: MTLData,
    labelled: Sequence[str],
    rows: dict[str, tuple[MTLConfig, Decision, Callable[[], object]]],
    *,
    k: int,
    seed: int,
    device: str | torch.device = "cpu",
) -> dict[str, dict]:
    """CV mean ± sd of each ablation row (its config, decision rule and feature builder), on the folds of the
    stage's own CV (same questions, same seed), so rows compare with the default and with each other."""
    out = {}
    for name, (cfg, decision, make_builder) in rows.items():
        t0 = time.perf_counter()
        cv = cross_validate_mtl(data, labelled, cfg, make_builder, k=k, seed=seed, device=device)
        summary, _ = cv_metrics(cv, data.cand, decision)
        out[name] = {**summary, "seconds": round(time.perf_counter() - t0, 1)}
        log.info("ablation %s: CV accuracy %.3f ± %.3f", name, summary["accuracy"]["mean"], summary["accuracy"]["sd"])
    return out


# ---------------------------------------------------------------- final system: ensemble with the baseline, error analysis


def _pct_rank(values: pd.Series, gid: pd.Series) -> np.ndarray:
    """Within-question rank of `values` scaled to (0, 1] (1 = best), so two systems' keys can be averaged."""
    r = values.groupby(gid.to_numpy(), sort=False).rank(method="average")
    n = values.groupby(gid.to_numpy(), sort=False).transform("size")
    return (r / n).to_numpy(dtype=float)


def combine_systems(a: pd.DataFrame, b: pd.DataFrame, weight: float) -> pd.DataFrame:
    """weight·a + (1-weight)·b of two systems' (part, gid, aid, fold, prob in [0,1], rank_key) rows, on a's rows
    (b may cover more, e.g. a capped profile); rank keys are averaged as within-question percentile ranks."""
    m = a.merge(b[["part", "gid", "aid", "prob", "rank_key"]], on=["part", "gid", "aid"], suffixes=("_a", "_b"), validate="one_to_one")
    if len(m) != len(a):
        raise MedrankError(f"systems to combine: {len(a) - len(m)} of {len(a)} rows have no prediction of the other system")
    key = m["part"] + "\0" + m["gid"]
    return pd.DataFrame(
        {
            "part": m["part"], "gid": m["gid"], "aid": m["aid"], "fold": m["fold"],
            "prob": weight * m["prob_a"] + (1 - weight) * m["prob_b"],
            "rank_key": weight * _pct_rank(m["rank_key_a"], key) + (1 - weight) * _pct_rank(m["rank_key_b"], key),
        }
    )  # fmt: skip


def decide_system(pred: pd.DataFrame, cand: pd.DataFrame, train: Sequence[str], threshold: float | None = None) -> tuple[dict, pd.DataFrame]:
    """Thresholds and labels for one system's rows (part oof / val / test; prob in [0,1], rank_key).

    oof fold f: threshold from the other folds' rows; val: from the oof rows of the training questions;
    test: from all oof rows (unless `threshold` is fixed). Returns (CV mean ± sd + thresholds, decided rows).
    """
    from medrank.models.baseline import keep_labels, select_threshold, submission_score, summarize

    truth = cand[["gid", "aid", "label"]].rename(columns={"label": "label_true"})
    pred = pred.merge(truth, on=["gid", "aid"], how="left")
    oof = pred[pred["part"] == "oof"]

    def _t(rows: pd.DataFrame) -> float:
        return float(threshold) if threshold is not None else select_threshold(rows["label_true"].to_numpy(dtype=int), rows["prob"].to_numpy(dtype=float))

    def _decide(rows: pd.DataFrame, t: float) -> pd.DataFrame:
        gid = rows["gid"].to_numpy()
        labels = keep_labels(rows["prob"].to_numpy(dtype=float), t, gid)
        return rows.assign(threshold=t, label=labels, score=submission_score(labels, rows["rank_key"].to_numpy(dtype=float), gid))

    out, per_fold, thresholds = [], [], []
    for f in sorted(oof["fold"].unique()):
        t = _t(oof[oof["fold"] != f])
        d = _decide(oof[oof["fold"] == f], t)
        per_fold.append(evaluate_decided(d, cand))
        thresholds.append(t)
        out.append(d)
    out.append(_decide(pred[pred["part"] == "val"], _t(oof[oof["gid"].isin(set(train))])))
    if (pred["part"] == "test").any():
        out.append(_decide(pred[pred["part"] == "test"], _t(oof)))
    summary = summarize(per_fold)
    summary["thresholds"] = thresholds
    return summary, pd.concat(out, ignore_index=True)


def evaluate_decided(rows: pd.DataFrame, cand: pd.DataFrame) -> dict:
    """Official Task 3 metrics of decided rows (gid, aid, label, score) against the candidate table's truth."""
    from medrank.models.baseline import evaluate

    truth = cand[cand["gid"].isin(set(rows["gid"]))]
    return evaluate(rows[["gid", "aid", "label", "score"]], truth)


def cv_summary_of(decided: pd.DataFrame, cand: pd.DataFrame) -> dict:
    """CV mean ± sd of already-decided oof rows (one official score per fold)."""
    from medrank.models.baseline import summarize

    oof = decided[decided["part"] == "oof"]
    return summarize([evaluate_decided(oof[oof["fold"] == f], cand) for f in sorted(oof["fold"].unique())])


SENTENCE_BINS = ((0, 5), (6, 10), (11, 20), (21, 40), (41, 80), (81, None))


def per_question_scores(decided: pd.DataFrame, cand: pd.DataFrame) -> pd.DataFrame:
    """Official accuracy and Spearman (official + true; 0 with fewer than 2 kept correct answers, the paper's
    convention) of each question, with its number of valid answers."""
    from medrank.metrics import score_task3
    from medrank.models.baseline import gold_of, ranked_rows

    rows = []
    for g, d in decided.groupby("gid", sort=False):
        truth = cand[cand["gid"] == g]
        sub = ranked_rows(d)[["gid", "aid", "label"]].rename(columns={"gid": "qid"})
        m = score_task3(gold_of(truth), sub)
        rows.append({"gid": g, "n_valid": int(truth["label"].sum()), "accuracy": m["accuracy"], "spearman": m["spearman"], "spearman_true": m["spearman_true"]})
    return pd.DataFrame(rows)


def error_analysis(decided: pd.DataFrame, cand: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The paper's error analysis (Figures 7-9) of decided rows on labelled questions:
    filter recall of valid answers by CHiQA rank, accuracy by number of sentences, accuracy and Spearman by
    number of valid answers per question. Each table has an `n` column (answers or questions per bin)."""
    d = decided.merge(cand[["gid", "aid", "label", "chiqa_rank", "n_sentences"]].rename(columns={"label": "label_true"}), on=["gid", "aid"], how="left", suffixes=("_x", ""))
    d = d.drop(columns=[c for c in d.columns if c.endswith("_x")])
    valid = d[d["label_true"] == 1]
    fig7 = valid.groupby("chiqa_rank").agg(recall=("label", "mean"), n=("label", "size")).reset_index()
    fig7["chiqa_rank"] = fig7["chiqa_rank"].astype(int)
    labels = [f"{lo}-{hi}" if hi is not None else f">{lo - 1}" for lo, hi in SENTENCE_BINS]
    edges = [lo - 0.5 for lo, _ in SENTENCE_BINS] + [np.inf]
    d["sentences"] = pd.cut(d["n_sentences"], edges, labels=labels, right=False)
    d["correct"] = (d["label"] == d["label_true"]).astype(float)
    fig8 = d.groupby("sentences", observed=False).agg(accuracy=("correct", "mean"), n=("correct", "size")).reset_index()
    fig8 = fig8[fig8["n"] > 0]
    fig8["sentences"] = [f"{s} ({n})" for s, n in zip(fig8["sentences"], fig8["n"])]
    pq_ = per_question_scores(decided, cand)
    fig9 = pq_.groupby("n_valid").agg(accuracy=("accuracy", "mean"), spearman=("spearman", "mean"), spearman_true=("spearman_true", "mean"),
                                     n=("accuracy", "size")).reset_index()  # fmt: skip
    return {"recall_by_chiqa_rank": fig7, "accuracy_by_sentences": fig8, "by_valid_answers": fig9}
