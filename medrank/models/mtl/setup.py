"""What every MTL stage sets up before it fits (mtl, noise_band, mtl_ablations, mtl_confirm, the nested LOSO): torch
threads and the device, the data with the per-answer scores every config reads, each config's feature builder, the
augmentation check, and the question ids of each part in table order (the baseline's CV folds for the same seed)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import torch

from medrank.models.mtl.data import MTLData, check_augmentation, read_mtl_data
from medrank.models.mtl.fits import labelled_gids
from medrank.models.mtl.recipe import builder_factory
from medrank.params import MtlParams

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
