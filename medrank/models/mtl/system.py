"""The MTL as a medrank.selection.experiment system, and what runs through it: the seed spread (stage noise_band), the ablation
rows (stages mtl_ablations, mtl_confirm) and the nested refits' rows (medrank.models.nested_refits). The mtl stage's own
recipe (medrank.models.mtl.recipe) plans the same protocols and adds its two models to the same batch of fits."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch

from medrank.core.errors import MedrankError
from medrank.selection.decision import decide
from medrank.selection.experiment import CV, LOSO, Protocol, Refit, Scored, Task, experiment, reseeded, seed_spread_of
from medrank.models.mtl.data import MTLData
from medrank.models.mtl.ensembling import decide_folds, ensembled
from medrank.models.mtl.fits import FitJob, FitResult, cv_result, fit_many
from medrank.params import MtlParams

log = logging.getLogger(__name__)

REFIT_SEED_OFFSET = 202  # a model on every training question draws seed + 202 (the mtl stage's final model)


@dataclass
class MTLSystem:
    """A task is one FitJob (fold f of a protocol seeded s trains with seed s + f; a Refit's with s + 202); the fits of
    one `run` go side by side (`fit_many`, `workers`). Scoring decides each fold on the other folds' rows, as
    configured ("base") and, on CV folds, under each decision-rule variant of `variants` (sharing the fits)."""

    data: MTLData
    cfg: MtlParams
    make_builder: Callable[[], object]
    device: str | torch.device = "cpu"
    workers: int = 1
    variants: dict[str, MtlParams] = field(default_factory=dict)
    name: str = ""
    # (train, test) questions -> gid, aid + the columns of a stacked group (baseline_protocols.stacked_scores): each
    # fit reads them for its own questions only (its training rows held out of the model that scored them)
    stack: Callable[[Sequence[str], Sequence[str]], pd.DataFrame] | None = None

    def questions(self, gids: Sequence[str]) -> pd.DataFrame:
        split_of = self.data.cand.drop_duplicates("gid").set_index("gid")["split"]
        return pd.DataFrame({"gid": list(gids), "split": [split_of[g] for g in gids]})

    def jobs(self, tasks: Sequence[Task]) -> list[FitJob]:
        n = {}
        for t in tasks:
            n[t.protocol] = n.get(t.protocol, 0) + 1
        tag = f"{self.name} " if self.name else ""
        return [
            FitJob(
                self.cfg,
                self.make_builder,
                t.train,
                t.test,
                t.seed + (REFIT_SEED_OFFSET if t.refit else t.fold),
                f"{tag}{t.protocol} fold {t.fold + 1}/{n[t.protocol]}",
                columns=self._stacked(t),
            )
            for t in tasks
        ]

    def _stacked(self, t: Task) -> dict[str, np.ndarray] | None:
        """The stacked group's columns for task `t`, aligned with the candidate table (NaN outside its questions)."""
        if self.stack is None:
            return None
        rows = self.stack(t.train, t.test)
        cand = self.data.cand[["gid", "aid"]]
        m = cand.merge(rows, on=["gid", "aid"], how="left", validate="one_to_one")
        cols = [c for c in rows.columns if c not in ("gid", "aid")]
        need = cand["gid"].isin(set(t.train) | set(t.test or ())).to_numpy()
        lacking = int(m.loc[need, cols].isna().any(axis=1).sum())
        if lacking:
            raise MedrankError(f"stacked scores: {lacking} candidate answers of {t.protocol}'s fold {t.fold} have none")
        return {c: m[c].to_numpy(dtype=float) for c in cols}

    def run(self, tasks: Sequence[Task]) -> list[FitResult]:
        return fit_many(self.data, self.jobs(tasks), device=self.device, workers=self.workers)

    def score(self, protocol: Protocol, tasks: Sequence[Task], results: Sequence[FitResult]) -> Scored:
        if isinstance(protocol, Refit):  # rows for a decision made downstream: the rank key only
            ens = ensembled(results[0].filter_df, results[0].pair_df, self.data.cand, self.cfg.ensemble)
            return Scored({}, decide(ens, 0.5, self.cfg).assign(fold=-1))
        cv = cv_result({g: t.fold for t in tasks for g in t.test}, results)
        per_fold, extra, rows = {}, {}, None
        # the decision-rule variants are reported on the CV folds only (metrics/mtl.json cv_variants)
        variants = self.variants if isinstance(protocol, CV) else {}
        for name, decision in {"base": self.cfg, **variants}.items():
            per_fold[name], thresholds, decided = decide_folds(cv, self.data.cand, decision)
            extra[name] = {"thresholds": thresholds}
            rows = decided if rows is None else rows
        info = {"best_epochs": cv.best_epochs, "seconds": cv.seconds, "histories": cv.histories}
        return Scored(per_fold, rows, extra, info)


def spread_over_seeds(
    data: MTLData,
    labelled: Sequence[str],
    cfg: MtlParams,
    make_builder: Callable[[], object],
    *,
    seeds: Sequence[int],
    sources: Sequence[str],
    device: str | torch.device = "cpu",
    workers: int = 1,
) -> dict:
    """The seed spread (medrank.selection.experiment.seed_spread_of) of the recipe's CV and LOSO under each of `seeds` (folds and
    initialisation): one experiment, every seed's fits side by side."""
    system = MTLSystem(data, cfg, make_builder, device, workers)
    protocols = reseeded([CV(cfg.cv_folds, seeds[0]), LOSO(tuple(sources), seeds[0])], seeds)
    return seed_spread_of(experiment({"mtl": system}, system.questions(labelled), protocols)["mtl"], seeds)


def ablation_cv(
    data: MTLData,
    labelled: Sequence[str],
    rows: dict[str, tuple[MtlParams, Callable[[], object]]],
    *,
    k: int,
    seed: int,
    device: str | torch.device = "cpu",
    sources: Sequence[str] | None = None,
    workers: int = 1,
) -> dict[str, dict]:
    """CV mean ± sd of each ablation row (a system: its params and feature builder), on the folds of the mtl stage's
    own CV (same questions, same seed), so rows compare with the default and with each other; with `sources`, LOSO
    too (key "loso"); "seconds": the rows' fit seconds (summed over processes)."""
    systems = {name: MTLSystem(data, cfg, make, device, workers, name=name) for name, (cfg, make) in rows.items()}
    protocols = [CV(k, seed)] + ([LOSO(tuple(sources), seed)] if sources is not None else [])
    questions = next(iter(systems.values())).questions(labelled)
    out: dict[str, dict] = {}
    for name, r in experiment(systems, questions, protocols).items():
        out[name] = {**r["cv"].summary["base"], "seconds": round(sum(r["cv"].info["seconds"]), 1)}
        if "loso" in r:
            out[name]["loso"] = r["loso"].summary["base"]
            out[name]["seconds"] = round(out[name]["seconds"] + sum(r["loso"].info["seconds"]), 1)
        log.info(
            "ablation %s: CV accuracy %.3f ± %.3f", name, out[name]["accuracy"]["mean"], out[name]["accuracy"]["sd"]
        )
    return out


def held_out_rows(
    data: MTLData,
    inner: Sequence[str],
    inner_sources: Sequence[str],
    outer: Sequence[str],
    cfg: MtlParams,
    make_builder: Callable[[], object],
    *,
    seed: int,
    device: str | torch.device = "cpu",
    workers: int = 1,
    stack: Callable[[Sequence[str], Sequence[str]], pd.DataFrame] | None = None,
) -> pd.DataFrame:
    """Rows for a nested selection (medrank.selection.nested): part oof (question-grouped CV over the `inner` questions),
    loso (leave one of `inner_sources` out; fold = its index) and test (the `outer` questions, by a model trained
    on every inner question); columns part, gid, aid, fold, prob_mean, rank_key. No fit sees an outer question
    (`stack`: MTLSystem.stack, called with each fit's questions only)."""
    system = MTLSystem(data, cfg, make_builder, device, workers, name="nested", stack=stack)
    protocols = [CV(cfg.cv_folds, seed), LOSO(tuple(inner_sources), seed), Refit(tuple(inner), tuple(outer), seed)]
    r = experiment({"mtl": system}, system.questions(inner), protocols)["mtl"]
    cols = ["part", "gid", "aid", "fold", "prob_mean", "rank_key"]
    parts = {"oof": r["cv"].rows, "loso": r["loso"].rows, "test": r["test"].rows}
    return pd.concat([rows.assign(part=part)[cols] for part, rows in parts.items()], ignore_index=True)
