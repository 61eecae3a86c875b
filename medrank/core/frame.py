"""What flows between the inference steps (medrank.steps; PyTerrier's transformers over frames, for three grains).

Every step is `transform(frame) -> frame` and steps compose with `>>` into a `Pipeline` (itself a step). A frame holds
one pandas table per grain, because the steps produce three: the candidate answers (one row each, input order; the
normalize step adds their normalized texts and sentences, the answer-score step per-answer score arrays aligned with
them), the N entailed MedQuAD questions per question (retrieve) and the NLI grid rows per (answer, entailed answer)
(grids). Nesting the last two into cells of the answers table would only be unnested again by every reader. N is the
fitted retrieve step's: it writes it into the frame beside its table, and the system step reads it from there (never
from a sibling step). The system step adds the decided rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Iterator, Protocol

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd


@dataclass(frozen=True)
class Frame:
    """The candidate answers and what the steps so far added (a step returns a new frame; none is changed in place)."""

    answers: pd.DataFrame  # cleaned answers (rank.answers_table's columns); normalize adds *_norm and *_sentences
    retrieved: pd.DataFrame | None = None  # retrieve: the entailed MedQuAD questions (retrieval.retrieved_schema)
    n_candidates: int = 0  # retrieve: its fitted N (0 without retrieval: no entailed-answer column is built)
    grid: pd.DataFrame | None = None  # grids: NLI_GRID rows against the entailed answers
    scores: dict[str, np.ndarray] = field(default_factory=dict)  # answer scores: per-answer columns, answers' order
    decided: pd.DataFrame | None = None  # system: gid, aid, prob, rank_key, label, score
    keep: dict | None = None  # system: the keep rule the rows were decided by (SystemStep.keep_for)

    def with_(self, **changes) -> "Frame":
        return replace(self, **changes)


class Step(Protocol):
    def transform(self, frame: Frame) -> Frame: ...


class Composable:
    """`a >> b`: a Pipeline running a, then b (nested pipelines are flattened)."""

    def __rshift__(self, other: Step) -> "Pipeline":
        return Pipeline((*_steps(self), *_steps(other)))

    def __call__(self, frame: Frame) -> Frame:
        return self.transform(frame)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Pipeline(Composable):
    """Steps run in order, each on the frame the one before returned."""

    steps: tuple[Step, ...]

    def transform(self, frame: Frame) -> Frame:
        for step in self.steps:
            frame = step.transform(frame)
        return frame

    def __iter__(self) -> Iterator[Step]:
        return iter(self.steps)

    def __len__(self) -> int:
        return len(self.steps)


def _steps(step: Step) -> tuple[Step, ...]:
    return step.steps if isinstance(step, Pipeline) else (step,)
