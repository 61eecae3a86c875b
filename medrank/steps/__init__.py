"""The inference path's steps, one module each, shared by the stages that run them and `medrank rank`.

    normalize_step  NormalizeStep   answers -> normalized texts + sentences                    stage normalize
    retrieve_step   RetrieveStep    + the N entailed MedQuAD questions (BM25, RQE scores), N   stage retrieve
    grid_step       GridStep        + NLI grid rows of (answer, entailed answer) pairs          stage embed
    score_step      AnswerScores    + per-answer scores (bienc, passage, qtype, cnn, qa)        stages bienc, passages, cnn_mediqa (+ models)
    system_step     SystemStep      + filter probability, keep, order (the decided rows)        stages baseline / mtl / score
    pipeline        InferencePipeline: the five, loaded from models/ and composed (medrank rank)

Every step is `transform(frame) -> frame` and `>>` composes them (medrank.core.frame: Frame, Composable, Pipeline;
PyTerrier's transformers): what `medrank rank` runs is `normalize >> retrieve >> grids >> scores >> system`, and
`selection.experiment.Deployed` evaluates that composed pipeline under the same protocols as the training recipes. A stage builds its step (`fit` from its params and
inputs), `save`s it and calls the step's own method on every question (normalize, retrieve, grids, scores: they
write the extraction caches and return the stage's statistics); a loaded step's `transform` reads the caches when
they are there (never writing them).

Saved form (this module): each stage writes models/steps/<step>/: step.json with the params keys it read
(params.STEP_PARAMS; never params.yaml at rank time, never copied through another stage) and, where the step holds
data, parquet tables beside it (the vocabularies of normalize, the MedQuAD documents retrieve searches, the fitted
question-type classifier). The fitted models (models/nli, rqe, baseline, mtl, cnn, qa) and the final decision
(models/system.json, stage score) are their own stages' outputs. `load_recipe` joins saved steps into typed params.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa

from medrank.core import layout
from medrank.core.errors import MedrankError
from medrank.core.io import read_sealed_json, sha256_file, write_parquet, write_sealed_json

STEP_FILE = "step.json"


def step_dir(step: str, models_dir: str | os.PathLike = layout.MODELS) -> Path:
    """models/steps/<step> under `models_dir` (layout.STEP_DIRS)."""
    return Path(models_dir) / layout.STEP_DIRS[step].relative_to(layout.MODELS)


def save_step(
    step: str,
    params: dict,
    tables: dict[str, pd.DataFrame] | None = None,
    models_dir: str | os.PathLike = layout.MODELS,
) -> Path:
    """Write models/steps/<step>/ (step.json: {"params": ...}, + <name>.parquet per table); each file atomically."""
    from medrank.params import STEP_PARAMS

    if step not in STEP_PARAMS:
        raise MedrankError(f"save_step: unknown step '{step}' (one of {', '.join(STEP_PARAMS)})")
    out = step_dir(step, models_dir)
    for name, df in (tables or {}).items():
        write_parquet(df, out / f"{name}.parquet", pa.Schema.from_pandas(df, preserve_index=False))
    names = sorted(tables or {})
    meta = {
        "step": step,
        "stage": STEP_PARAMS[step][0],
        "params": params,
        "tables": names,
        # checked at every load: a flipped bit in a table decodes to another valid table; the record's own checksum
        # covers the params (an edited n_candidates was used silently)
        "sha256": {n: sha256_file(out / f"{n}.parquet") for n in names},
    }
    write_sealed_json(out / STEP_FILE, meta)  # last: it names the tables of this save
    for stale in set(out.glob("*.parquet")) - {out / f"{n}.parquet" for n in tables or {}}:
        stale.unlink()  # an earlier save's table (e.g. concepts, before a switch to UMLS) never outlives it
    return out


@dataclass(frozen=True)
class SavedStep:
    """A step as its stage saved it: the params keys it read and its tables."""

    step: str
    params: dict
    tables: dict[str, pd.DataFrame]


def load_step(step: str, models_dir: str | os.PathLike = layout.MODELS) -> SavedStep:
    """models/steps/<step>/ read back; a missing or damaged folder is one error line naming the stage to run."""
    from medrank.params import STEP_PARAMS

    d = step_dir(step, models_dir)
    stage = layout.dvc_target(STEP_PARAMS[step][0])
    path = d / STEP_FILE
    if not path.is_file():
        raise MedrankError(f"{path}: the {step} step is missing (run `dvc repro {stage}`)")
    restore = f"re-run `dvc repro {stage}` (or restore the folder with `dvc checkout {d}`)"
    meta = read_sealed_json(path, restore)
    params, names, sums = meta.get("params"), meta.get("tables"), meta.get("sha256")
    if meta.get("step") != step or not isinstance(params, dict) or not isinstance(names, list):
        raise MedrankError(f"{path}: not the {step} step's file (step {meta.get('step')!r}); {restore}")
    tables = {}
    for name in names:
        t = d / f"{name}.parquet"
        if not t.is_file():
            raise MedrankError(f"{t}: table of the {step} step missing (run `dvc repro {stage}`)")
        if not isinstance(sums, dict) or sums.get(name) != sha256_file(t):
            raise MedrankError(f"{t}: differs from the sha256 recorded in {path} (damaged or replaced); {restore}")
        try:
            tables[name] = pd.read_parquet(t)
        except (OSError, ValueError) as e:  # pyarrow's errors are both
            raise MedrankError(
                f"{t}: not a table the {step} step wrote ({type(e).__name__}); re-run `dvc repro {stage}`"
            ) from None
    return SavedStep(step, params, tables)


def load_recipe(steps: dict[str, SavedStep], where: str):
    """The typed params of the saved steps together (sections no step saved get their defaults)."""
    from medrank.params import recipe_params

    merged: dict = {}
    for s in steps.values():
        for section, value in s.params.items():
            if isinstance(value, dict):
                merged.setdefault(section, {}).update(value)
            else:
                merged[section] = value
    return recipe_params(merged, where)


def model_dir(path: Path, what: str, stage: str) -> Path:
    if not path.is_dir():
        raise MedrankError(f"{path}: the {what} model is missing (run `dvc repro {layout.dvc_target(stage)}`)")
    return path
