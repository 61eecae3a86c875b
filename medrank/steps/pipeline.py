"""The whole inference path: the five steps loaded from models/ and chained (`medrank rank`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from medrank import layout
from medrank.steps.grid_step import GridStep
from medrank.steps.normalize_step import NormalizeStep
from medrank.steps.retrieve_step import RetrieveStep
from medrank.steps.score_step import AnswerScores
from medrank.steps.system_step import Fit, SystemStep

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class InferencePipeline:
    """normalize -> retrieve -> grids -> answer scores -> system, each step loaded from models/."""

    normalize: NormalizeStep
    retrieve: RetrieveStep
    grids: GridStep
    scores: AnswerScores
    system: SystemStep

    @classmethod
    def load(
        cls, models_dir: str | os.PathLike = layout.MODELS, fit: Fit = "final", device: str = "auto"
    ) -> "InferencePipeline":
        system = SystemStep.load(models_dir, fit)
        return cls(
            NormalizeStep.load(models_dir),
            RetrieveStep.load(models_dir, device),
            GridStep.load(models_dir, device),
            AnswerScores.load(system.groups, models_dir, device),
            system,
        )

    def transform(self, answers: pd.DataFrame) -> pd.DataFrame:
        """Decided rows of a cleaned answers table (medrank.rank.answers_table): the caches under data/cache are read
        when the working folder has them (the very values the stages computed), else every pair is computed."""
        from medrank.text.normalize import TABLES

        answers, _ = self.normalize.transform(answers, TABLES["answers"], desc="rank")
        retrieved = self.retrieve.transform(answers, layout.CACHE_RQE, read_only=True, show_progress=False)
        grids = self.grids.transform(answers, retrieved, layout.CACHE_EMBED, read_only=True, show_progress=False)
        scores = self.scores.transform(answers)
        return self.system.transform(answers, retrieved, grids.rows, scores, self.retrieve.p.n_candidates)
