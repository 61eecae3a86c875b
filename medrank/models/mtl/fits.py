"""The MTL's fits side by side: a FitJob is one fit_mtl_bag (train questions, seed, what to predict); `fit_many` runs
jobs on forked workers (the same bits for any count); `cv_result` gathers one protocol's fold results (medrank.selection.experiment
plans the folds: the mtl stage's CV and LOSO, the ablation rows, the noise band's seeds, the nested refits)."""

from __future__ import annotations

import importlib
import logging
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from medrank.models.mtl.data import MTLData
from medrank.models.mtl.training import MTLBag, fit_mtl_bag
from medrank.params import MtlParams

log = logging.getLogger(__name__)


@dataclass
class CVResult:
    """Out-of-fold predictions (long tables) and per-fold training facts."""

    filter_df: pd.DataFrame
    pair_df: pd.DataFrame
    folds: dict[str, int]  # gid -> fold
    best_epochs: list[list[int]]  # per fold, one per bag member
    seconds: list[float]
    histories: list[list[dict]]


@dataclass(frozen=True)
class FitJob:
    """One fit_mtl_bag: `cfg` on the `train` questions with `seed`; then `predict` those questions (None: keep the
    model; `keep_model`: both), the candidate table extended by `columns` for this fit alone. Jobs are independent (each fit seeds itself), so any order and any number of processes
    give the same bits."""

    cfg: MtlParams
    make_builder: Callable[[], object]
    train: tuple[str, ...]
    predict: tuple[str, ...] | None
    seed: int
    label: str = ""
    keep_model: bool = False
    columns: Mapping[str, np.ndarray] | None = None  # candidate columns of this fit only (a stacked group's scores)


@dataclass
class FitResult:
    filter_df: pd.DataFrame | None
    pair_df: pd.DataFrame | None
    best_epoch: list[int]
    history: list[dict]
    seconds: float
    model: MTLBag | None = None


_POOL_STATE: dict = {}  # the forked workers' view of the data and jobs (set before the fork: shared, not pickled)


def _run_job(i: int) -> tuple[int, FitResult]:
    data, jobs, device, threads = (_POOL_STATE[k] for k in ("data", "jobs", "device", "threads"))
    if threads:
        torch.set_num_threads(threads)
    job = jobs[i]
    if job.columns:
        data = data.with_columns(job.columns)
    t0 = time.perf_counter()
    model = fit_mtl_bag(data, list(job.train), job.cfg, job.make_builder, seed=job.seed, device=device)
    if job.predict is None:
        return i, FitResult(None, None, model.best_epoch, model.history, round(time.perf_counter() - t0, 1), model)
    fd, pdf = model.predict(data, list(job.predict), device=device)
    kept = model if job.keep_model else None
    return i, FitResult(fd, pdf, model.best_epoch, model.history, round(time.perf_counter() - t0, 1), kept)


def fit_many(
    data: MTLData, jobs: Sequence[FitJob], *, device: str | torch.device = "cpu", workers: int = 1
) -> list[FitResult]:
    """Every job's result, in job order. `workers` > 1 forks that many processes (CPU only; each at the parent's
    torch thread count), biggest jobs first; the results are the same bits as one process's."""
    from tqdm.auto import tqdm

    jobs = list(jobs)
    workers = max(1, min(workers, len(jobs)))
    if str(device).startswith("cuda") or workers == 1 or not jobs:
        workers = 1
    data.grids32()  # converted once here: the forked workers share it
    importlib.import_module(
        "torch._dynamo"
    )  # the first AdamW imports it (1.6 s): once here, not in every forked worker

    _POOL_STATE.update(data=data, jobs=jobs, device=device, threads=torch.get_num_threads())
    out: list[FitResult | None] = [None] * len(jobs)
    bar = tqdm(total=len(jobs), desc="mtl fits", unit="fit", disable=not jobs)
    try:
        if workers == 1:
            for i in range(len(jobs)):
                out[i] = _run_job(i)[1]
                bar.update()
        else:
            from medrank.core.forking import fork_pool

            cost = [len(j.train) * j.cfg.n_seeds for j in jobs]
            order = sorted(range(len(jobs)), key=lambda i: -cost[i])
            with fork_pool(workers) as pool:  # workers die with this process
                for i, r in pool.imap_unordered(_run_job, order):
                    out[i] = r
                    bar.update()
    finally:
        bar.close()
        _POOL_STATE.clear()
    for job, r in zip(jobs, out):
        if job.label:
            log.info("%s: best epoch(s) %s, %.0fs", job.label, r.best_epoch, r.seconds)
    return out  # type: ignore[return-value]


def cv_result(fold: dict[str, int], results: Sequence[FitResult]) -> CVResult:
    """The CVResult of one protocol's fold fits (`fold`: gid -> fold of the held-out questions) from their results
    (fold order)."""
    f_parts = [r.filter_df.assign(fold=f) for f, r in zip(sorted(set(fold.values())), results)]
    p_parts = [r.pair_df.assign(fold=f) for f, r in zip(sorted(set(fold.values())), results)]
    return CVResult(
        pd.concat(f_parts, ignore_index=True),
        pd.concat(p_parts, ignore_index=True),
        fold,
        [r.best_epoch for r in results],
        [r.seconds for r in results],
        [r.history for r in results],
    )


def labelled_gids(data: MTLData, train_gids: Sequence[str], val_gids: Sequence[str]) -> list[str]:
    """Train + validation questions in table order (the order the CV folds are drawn in, as the baseline's)."""
    lab_set = set(train_gids) | set(val_gids)
    return [g for g in pd.unique(data.cand["gid"]) if g in lab_set]
