"""The normalize step: abbreviations, preferred names and sentences (stage normalize)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from medrank.core import layout
from medrank.steps import SavedStep, load_recipe, load_step, save_step
from medrank.core.frame import Composable, Frame

if TYPE_CHECKING:
    from medrank.params import Params


@dataclass
class NormalizeStep(Composable):
    """Abbreviations, preferred names and sentences (params.normalize; the vocabularies are its fitted state)."""

    p: Params
    state: Any  # medrank.text.normalize.NormalizerState
    normalizer: Any = field(init=False)
    splitter: Any = field(init=False)

    def __post_init__(self) -> None:
        from medrank.text.sentences import make_splitter

        self.normalizer = self.state.normalizer()
        self.splitter = make_splitter(self.p.normalize.sentence_splitter, self.p.normalize.stanza_dir)

    @classmethod
    def fit(cls, p: Params) -> "NormalizeStep":
        """Read the vocabularies the section names (abbreviation list, Disease Ontology or UMLS)."""
        from medrank.text.normalize import normalizer_state

        return cls(p, normalizer_state(p.normalize))

    def save(self, models_dir: str | os.PathLike = layout.MODELS) -> Path:
        """The section and the vocabularies as tables; concept entries drawn from a licensed UMLS are NOT copied into
        models/ (a DVC output others may pull): the step records the user's MRCONSO path and `load` re-reads it."""
        from medrank.params import step_params

        tables = normalizer_state_tables(self.state)
        if self.p.normalize.umls_mrconso:
            tables.pop("concepts", None)
        return save_step("normalize", step_params(self.p, "normalize"), tables, models_dir)

    @classmethod
    def load(cls, models_dir: str | os.PathLike = layout.MODELS) -> "NormalizeStep":
        saved = load_step("normalize", models_dir)
        p = load_recipe({"normalize": saved}, str(models_dir))
        state = normalizer_state_of(saved)
        if p.normalize.preferred_names and p.normalize.umls_mrconso and state.concepts is None:
            from medrank.text.normalize import normalizer_state

            state = normalizer_state(p.normalize)  # the licensed vocabulary, from the user's own file
        return cls(p, state)

    def normalize(self, table: pd.DataFrame, spec: Any, coref: Any = None, desc: str = "normalize"):
        """(normalized table, stats) of one table (medrank.text.normalize.TABLES[name]): stage normalize's call."""
        from medrank.text.normalize import normalize_table

        return normalize_table(table, spec, self.normalizer, self.splitter, coref, desc=desc)

    def transform(self, frame: Frame) -> Frame:
        """The frame's answers normalized as stage normalize normalizes the answers table."""
        from medrank.text.normalize import TABLES

        return frame.with_(answers=self.normalize(frame.answers, TABLES["answers"], desc="rank")[0])


def normalizer_state_tables(state) -> dict[str, pd.DataFrame]:
    """A NormalizerState as tables: abbreviations (abbreviation, expansion), concepts (surface, name); a pass that is
    off has no table."""
    out = {}
    if state.abbreviations is not None:
        out["abbreviations"] = pd.DataFrame(
            {"abbreviation": list(state.abbreviations), "expansion": list(state.abbreviations.values())}
        )
    if state.concepts is not None:
        out["concepts"] = pd.DataFrame(state.concepts, columns=["surface", "name"]).astype(str)
    return out


def normalizer_state_of(saved: SavedStep):
    from medrank.text.normalize import NormalizerState

    a, c = saved.tables.get("abbreviations"), saved.tables.get("concepts")
    return NormalizerState(
        dict(zip(a["abbreviation"], a["expansion"])) if a is not None else None,
        list(zip(c["surface"], c["name"])) if c is not None else None,
    )
