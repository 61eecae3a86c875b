"""The per-answer scores the final system's feature groups read, computed for new answers by each group's scorer
(medrank.params.groups.REGISTRY: the saved step it reads and its `serve` function; nothing here is per group)."""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from medrank.core import layout
from medrank.core.errors import MedrankError
from medrank.core.frame import Composable, Frame
from medrank.params.groups import REGISTRY
from medrank.steps import load_recipe, load_step, model_dir

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from medrank.params import Params


def served(groups: set[str]) -> dict[str, set[str]]:
    """{scorer: the groups it computes} of the groups read from per-answer score files, in the registry's order (one
    scorer computing two groups runs once: bienc and heading share one encoding pass)."""
    out: dict[str, set[str]] = {}
    for g, spec in REGISTRY.items():
        if g in groups and spec.file is not None:
            if spec.serve is None:
                raise MedrankError(
                    f"feature group {g!r} has no scorer in the registry (medrank.params.groups): not servable"
                )
            out.setdefault(spec.serve, set()).add(g)
    return out


def _resolve(name: str) -> Callable:
    module, _, attr = name.partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclass
class AnswerScores(Composable):
    """The scorers of the groups the system reads, and what they share: the saved steps' records (`steps`), the
    models loaded once (`models`, by name: bienc, qtypes, cnn, qa), the caches they read (`caches`)."""

    p: Params
    groups: set[str]
    steps: dict[str, Any] = field(default_factory=dict)
    models: dict[str, Any] = field(default_factory=dict)
    models_dir: Path = layout.MODELS
    device: str = "auto"
    every_cosine: bool = False  # encode the headings too where the system reads only bienc (as before issue 48)
    caches: dict[str, Path] = field(default_factory=dict)  # cache roots by name (default: layout's)
    _scorers: dict[str, Callable] | None = None

    @classmethod
    def load(cls, groups: set[str], models_dir: str | os.PathLike = layout.MODELS, device: str = "auto"):
        """The step's recipe from the saved steps the groups' scorers read, every model loaded now (a damaged one is
        refused at load, not at the first question)."""
        models_dir = Path(models_dir)
        wanted = sorted({REGISTRY[g].step for g in groups if g in REGISTRY and REGISTRY[g].step})
        steps = {name: load_step(name, models_dir) for name in wanted}
        out = cls(load_recipe(steps, str(models_dir)), set(groups), steps, models_dir=models_dir, device=device)
        out.scorers()
        return out

    def shared(self, name: str, load: Callable[[], Any]) -> Any:
        """The model `name`, loaded by `load` the first time any scorer asks."""
        if name not in self.models:
            self.models[name] = load()
        return self.models[name]

    def saved_model(self, folder: str, what: str, stage: str) -> Path:
        return model_dir(self.models_dir / folder, what, stage)

    def scorers(self) -> dict[str, Callable]:
        if self._scorers is None:
            self._scorers = {name: _resolve(name)(self) for name in served(self.groups)}
        return self._scorers

    def transform(self, frame: Frame) -> Frame:
        """The frame with the per-answer scores of the groups the system reads (the caches under data/cache: read only)."""
        return frame.with_(scores={**frame.scores, **self.scores(frame.answers)})

    def scores(self, answers: pd.DataFrame) -> dict[str, np.ndarray]:
        """Per-answer score columns aligned with `answers`, for the groups the system reads (the caches: read only)."""
        out: dict[str, np.ndarray] = {}
        scorers = self.scorers()
        for name, groups in served(self.groups).items():
            out.update(scorers[name](answers, groups))
        return out
