"""The whole inference path: the five steps loaded from models/ and chained (`medrank rank`, `medrank serve`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from medrank.core import layout
from medrank.core.frame import Frame, Pipeline
from medrank.steps.grid_step import GridStep
from medrank.steps.normalize_step import NormalizeStep
from medrank.steps.retrieve_step import RetrieveStep
from medrank.steps.score_step import AnswerScores
from medrank.steps.system_step import Fit, SystemStep

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class InferencePipeline:
    """normalize -> retrieve -> grids -> answer scores -> system, each step loaded from models/. Retrieve and grids are
    loaded and run only where the decided system reads them (SystemStep.reads_retrieval / reads_grids): the baseline
    on metadata + bienc + passage reads neither, and skipping them changes no output bit (tests/serving)."""

    normalize: NormalizeStep
    retrieve: RetrieveStep | None
    grids: GridStep | None
    scores: AnswerScores
    system: SystemStep

    @classmethod
    def load(
        cls,
        models_dir: str | os.PathLike = layout.MODELS,
        fit: Fit = "final",
        device: str = "auto",
        every_step: bool = False,
        adapt: bool = False,
    ) -> "InferencePipeline":
        """`every_step`: also load and run what the system does not read (what `medrank rank` ran before issue 48);
        `adapt`: SystemStep.adapt (a batch-adaptive keep rule re-fitted on a large enough batch)."""
        system = SystemStep.load(models_dir, fit, adapt)
        retrieve = every_step or system.reads_retrieval
        scores = AnswerScores.load(system.groups, models_dir, device)
        scores.every_cosine = every_step
        return cls(
            NormalizeStep.load(models_dir),
            RetrieveStep.load(models_dir, device) if retrieve else None,
            GridStep.load(models_dir, device) if retrieve and (every_step or system.reads_grids) else None,
            scores,
            system,
        )

    @property
    def steps(self) -> Pipeline:
        """The loaded steps composed (`>>`): only those the decided system reads."""
        chain = [self.normalize, self.retrieve, self.grids, self.scores, self.system]
        return Pipeline(tuple(s for s in chain if s is not None))

    def transform(self, answers: pd.DataFrame) -> pd.DataFrame:
        """Decided rows of a cleaned answers table (medrank.serving.rank.answers_table): the caches under data/cache are read
        when the working folder has them (the very values the stages computed), else every pair is computed."""
        return self.run(answers).decided

    def run(self, answers: pd.DataFrame) -> Frame:
        """The last step's frame: the decided rows and the keep rule they were decided by (Frame.keep)."""
        return self.steps.transform(Frame(answers))
