"""Training of the MTL: batches of questions, the per-question loss, early stopping on an inner split; the fitted
network and its batching are medrank.models.mtl.fitted."""

from __future__ import annotations

import copy
import logging
import math
import time
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch
from torch.nn import functional as F

from medrank.encoders.runtime import set_seed
from medrank.core.errors import MedrankError
from medrank.models.mtl.data import PAIR_FEATURES, MTLData
from medrank.models.mtl.fitted import (
    MAX_CELLS_PER_CHUNK,
    FittedMTL,
    MTLBag,
    Batcher,
    prepare_rows,
    PreparedRows,
    pair_index,
)
from medrank.models.mtl.network import MTLNet, mtl_loss
from medrank.params import MtlParams

log = logging.getLogger(__name__)


def fit_mtl_bag(
    data: MTLData,
    train_gids: Sequence[str],
    cfg: MtlParams,
    make_builder: Callable[[], object],
    *,
    seed: int = 13,
    device: str | torch.device = "cpu",
) -> MTLBag:
    """`cfg.n_seeds` networks (fit_mtl with seeds seed, seed + 1000, ...), each with a fresh feature builder."""
    return MTLBag(
        [
            fit_mtl(data, train_gids, cfg, make_builder(), seed=seed + 1000 * i, device=device)
            for i in range(cfg.n_seeds)
        ]
    )


def _split_inner(gids: Sequence[str], frac: float, seed: int) -> tuple[list[str], list[str]]:
    gids = list(gids)
    n_inner = int(round(len(gids) * frac))
    if frac <= 0 or n_inner < 1 or n_inner >= len(gids):
        return gids, []
    perm = np.random.default_rng(seed).permutation(len(gids))
    inner = {gids[i] for i in perm[:n_inner]}
    return [g for g in gids if g not in inner], [g for g in gids if g in inner]


def _training_pairs(prep: PreparedRows, rows: np.ndarray, pair_scope: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """pair_index of `rows` (positions into rows) restricted to `pair_scope` (all | valid_any | valid_both)."""
    i, j, t = pair_index(prep.groups[rows], prep.ranks[rows])
    if pair_scope != "all" and len(i):
        lab = prep.labels[rows]
        keep = (lab[i] + lab[j] >= 1) if pair_scope == "valid_any" else (lab[i] + lab[j] == 2)
        i, j, t = i[keep], j[keep], t[keep]
    return i, j, t


def _batch_loss(
    net: MTLNet,
    batcher: Batcher,
    prep: PreparedRows,
    rows: np.ndarray,
    alpha: float,
    n_q: int,
    dev: torch.device,
    pair_scope: str = "all",
):
    joint = batcher.joint(net, rows)
    fl = net.filter_logits(joint)
    y = torch.as_tensor(prep.labels[rows], dtype=torch.float32, device=dev)
    i, j, t = _training_pairs(prep, rows, pair_scope)
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
    cfg: MtlParams,
    builder,
    *,
    seed: int = 13,
    device: str | torch.device = "cpu",
    epochs: int | None = None,
    on_epoch: Callable[[int, dict], None] | None = None,
) -> FittedMTL:
    """Train on the questions `train_gids`; early stopping on an inner split of them (inner-val loss).

    `builder` is an unfitted medrank.task3.features.FeatureBuilder (fitted here on the training candidates).
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
    prep = prepare_rows(data, builder, pf_mean, pf_scale)
    net = MTLNet(cfg, data.hidden_size, data.rqe_size, prep.meta.shape[1], len(PAIR_FEATURES)).to(dev)
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    batcher = Batcher(data, prep, dev, MAX_CELLS_PER_CHUNK)
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
        rec = {
            "epoch": epoch,
            "train_loss": tot / max(nb, 1),
            "train_filter_loss": tf / max(nb, 1),
            "train_pair_loss": tp / max(nb, 1),
        }
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
    """Inner-split losses (each question's loss as a batch of its own, averaged over questions) and accuracies.

    One forward pass over every inner question: in eval mode rows do not interact (BatchNorm on running statistics,
    masked grids), so this is the per-question loop's arithmetic at a fraction of its calls."""
    net.eval()
    q_of = torch.as_tensor(pd.factorize(gid_of[rows])[0], device=dev)
    nq = max(int(q_of.max()) + 1, 1) if len(rows) else 1
    joint = batcher.joint(net, rows)
    fl = net.filter_logits(joint)
    y = torch.as_tensor(prep.labels[rows], dtype=torch.float32, device=dev)
    i, j, t = _training_pairs(prep, rows, pair_scope)  # pairs never cross questions (groups are question x entailed)
    ti, tj = torch.as_tensor(i, device=dev), torch.as_tensor(j, device=dev)
    pl = net.pair_logits(joint, ti, tj)
    tt = torch.as_tensor(t, device=dev)
    lf = torch.zeros(nq, device=dev).index_add_(0, q_of, F.binary_cross_entropy_with_logits(fl, y, reduction="none"))
    lp = torch.zeros(nq, device=dev)
    if len(i):
        lp.index_add_(0, q_of[ti], F.binary_cross_entropy_with_logits(pl, tt, reduction="none"))
    return {
        "val_loss": float((lf + alpha * lp).sum()) / nq,
        "val_filter_loss": float(lf.sum()) / nq,
        "val_pair_loss": float(lp.sum()) / nq,
        "val_filter_accuracy": int(((fl > 0).float() == y).sum()) / max(len(rows), 1),
        "val_pair_accuracy": int(((pl > 0).float().cpu().numpy() == t).sum()) / max(len(t), 1),
    }
