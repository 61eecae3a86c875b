"""What every MTL stage sets up before it fits (mtl, noise_band, mtl_ablations, mtl_confirm, the nested LOSO): torch
threads and the device, the data with the per-answer scores every config reads, each config's feature builder, the
augmentation check, and the question ids of each part in table order (the baseline's CV folds for the same seed); and
the fits the stages run on it, under deterministic kernels and fixed BLAS threads."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import torch

from medrank.core.layout import LABELLED_SPLITS
from medrank.encoders.runtime import deterministic_torch, fixed_blas_threads
from medrank.models.mtl.data import MTLData, check_augmentation, read_mtl_data
from medrank.models.mtl.fits import labelled_gids
from medrank.models.mtl.recipe import RecipeReport, builder_factory, run_recipe
from medrank.models.mtl.system import ablation_cv, spread_over_seeds
from medrank.params import MtlParams
from medrank.selection.evaluation import selection_score

log = logging.getLogger(__name__)


@dataclass
class MtlSetup:
    data: MTLData
    device: torch.device
    train: list[str]
    val: list[str]
    test: list[str]
    tfidf: dict[int, object]
    n_candidates: int

    @property
    def labelled(self) -> list[str]:
        """Train + validation questions in table order (what CV, LOSO and the noise band fold)."""
        return labelled_gids(self.data, self.train, self.val)

    def builder(self, cfg: MtlParams) -> Callable[[], object]:
        """The feature builder factory of `cfg` (its groups, and its TF-IDF vocabulary when it reads bow)."""
        return builder_factory(cfg.feature_groups, self.n_candidates, self.tfidf.get(cfg.tfidf_max_features))

    # the fits: deterministic kernels (on CUDA; CPU kernels already are at the fixed mtl.threads), fixed BLAS threads

    def recipe(self, cfg: MtlParams, seed: int, live) -> RecipeReport:
        """`run_recipe` of `cfg` (stage mtl): CV and LOSO over the labelled sources, the train-only and final models."""
        with deterministic_torch(), fixed_blas_threads():
            return run_recipe(
                self.data,
                self.train,
                self.val,
                self.test,
                cfg,
                self.builder(cfg),
                seed=seed,
                device=self.device,
                live=live,
                sources=LABELLED_SPLITS,
                workers=cfg.workers,
            )

    def spread(self, cfg: MtlParams, seeds: list[int]) -> dict:
        """The seed spread of `cfg`'s CV and LOSO over `seeds` (stage noise_band: the same fits as run_recipe's)."""
        with deterministic_torch(), fixed_blas_threads():
            return spread_over_seeds(
                self.data,
                self.labelled,
                cfg,
                self.builder(cfg),
                seeds=seeds,
                sources=LABELLED_SPLITS,
                device=self.device,
                workers=cfg.workers,
            )

    def ablations(self, rows: dict[str, MtlParams], cfg: MtlParams, seed: int) -> dict[str, dict]:
        """`ablation_cv` of `rows` (name -> config) on the folds of `cfg` (the mtl section: cv_folds, workers) under
        `seed`: CV and LOSO, the same folds and initialisation for every row."""
        with deterministic_torch(), fixed_blas_threads():
            return ablation_cv(
                self.data,
                self.labelled,
                {n: (r, self.builder(r)) for n, r in rows.items()},
                k=cfg.cv_folds,
                seed=seed,
                device=self.device,
                sources=LABELLED_SPLITS,
                workers=cfg.workers,
            )

    def confirm(self, rows: dict[str, MtlParams], cfg: MtlParams, seeds: list[int]) -> tuple[dict, list[dict]]:
        """`rows` under each of `seeds`, one seed's rows side by side (stage mtl_confirm): each row's score per seed
        (the written rule's, on accuracy: the mean of CV and LOSO mean accuracy) and each seed's accuracies."""
        by_row: dict[str, list[float]] = {n: [] for n in rows}
        per_seed = []
        for seed in seeds:
            table = self.ablations(rows, cfg, seed)
            per_seed.append(
                {
                    n: {"cv_accuracy": t["accuracy"]["mean"], "loso_accuracy": t["loso"]["accuracy"]["mean"]}
                    for n, t in table.items()
                }
            )
            for n, t in table.items():
                by_row[n].append(selection_score(t, t["loso"], "accuracy"))
        return by_row, per_seed


def prepare(p, configs: dict[str, MtlParams], params_path: str = "params.yaml") -> MtlSetup:
    """Set up the fits of `configs` (name in error messages -> config): threads of the `mtl` section, device, the data
    of the union of their feature groups, their TF-IDF vocabularies, and the check that augment finds its pairs."""
    from medrank.core import layout as L
    from medrank.encoders.hardware import resolve_device
    from medrank.selection.evaluation import split_questions
    from medrank.task3.bow import medquad_tfidf

    if p.mtl.threads:
        torch.set_num_threads(p.mtl.threads)
    device = resolve_device(p.device)
    _, data = read_mtl_data(p, set().union(*(c.feature_groups for c in configs.values())))
    tfidf = {
        c.tfidf_max_features: medquad_tfidf(c.tfidf_max_features) for c in configs.values() if "bow" in c.feature_groups
    }
    check_augmentation(data, configs, params_path)
    setup = MtlSetup(
        data,
        device,
        split_questions(data.cand, L.TRAIN_SPLITS),
        split_questions(data.cand, [L.VAL_SPLIT]),
        split_questions(data.cand, [L.TEST_SPLIT]),
        tfidf,
        p.n_candidates,
    )
    log.info(
        "%d candidates, %d (candidate, entailed) pairs; questions: %d train, %d val, %d test; %d fit processes",
        len(data.cand),
        len(data.pairs),
        len(setup.train),
        len(setup.val),
        len(setup.test),
        p.mtl.workers,
    )
    return setup
