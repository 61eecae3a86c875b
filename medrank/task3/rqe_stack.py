"""A stacked RQE scorer's design matrix (finetune.rqe's stack rows): what models.rqe trains the stack on and what
task3.retrieval applies at inference, one definition below both."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=float), 1e-4, 1 - 1e-4)
    return np.log(p / (1 - p))


def stack_features(columns: dict[str, np.ndarray], names: Sequence[str]) -> np.ndarray:
    """The stack's design matrix: logit of the cross-encoder's P, the cosine and the type agreement as they are."""
    return np.column_stack([_logit(columns[n]) if n == "ce" else np.asarray(columns[n], dtype=float) for n in names])
