"""The inference steps are frame -> frame and compose with `>>` (medrank.core.frame); N is the fitted
retrieve step's, carried by the frame; `experiment` evaluates the composed pipeline as `medrank rank` runs it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from medrank.core.errors import MedrankError
from medrank.serving.rank import answers_table
from medrank.core.frame import Frame, Pipeline
from medrank.steps.pipeline import InferencePipeline
from tests.serving.test_lean_pipeline import _questions

pytestmark = pytest.mark.usefixtures("one_thread")  # the 2 cores are shared


@pytest.fixture()
def mtl(tiny_mtl_project, monkeypatch) -> InferencePipeline:
    monkeypatch.chdir(tiny_mtl_project)  # no data/cache here: every score is computed
    return InferencePipeline.load("models")


def test_every_step_takes_a_frame_and_returns_a_new_one(mtl):
    table = answers_table(_questions()[0])
    start = Frame(table)
    frames = [start]
    for step in mtl.steps:
        frames.append(step.transform(frames[-1]))
    normalized, retrieved, grids, scored, decided = frames[1:]
    assert all(isinstance(f, Frame) for f in frames)
    assert start.answers is table and list(table.columns) == list(answers_table(_questions()[0]).columns)
    assert {"question_norm", "answer_norm", "answer_sentences"} <= set(normalized.answers.columns)
    assert normalized.answers["aid"].tolist() == table["aid"].tolist()  # one row per answer, input order
    assert normalized.retrieved is None and normalized.n_candidates == 0
    assert retrieved.n_candidates == mtl.retrieve.p.n_candidates == 2  # N: the fitted retrieve step's
    assert retrieved.retrieved["rank"].max() <= retrieved.n_candidates
    assert grids.grid is not None and set(grids.grid["aid"]) == set(table["aid"])
    assert scored.scores and all(len(v) == len(table) for v in scored.scores.values())
    assert sorted(decided.decided["aid"]) == sorted(table["aid"])  # every answer decided once
    assert {"prob", "rank_key", "label", "score"} <= set(decided.decided.columns)


def test_steps_compose_with_rshift_into_what_rank_runs(mtl):
    table = answers_table(_questions()[1])
    composed = mtl.normalize >> mtl.retrieve >> mtl.grids >> mtl.scores >> mtl.system
    assert isinstance(composed, Pipeline) and list(composed) == list(mtl.steps)
    nested = (mtl.normalize >> mtl.retrieve) >> (mtl.grids >> (mtl.scores >> mtl.system))
    assert list(nested) == list(composed)  # pipelines flatten
    pd.testing.assert_frame_equal(composed(Frame(table)).decided, mtl.transform(table), check_exact=True)


def test_the_system_reads_n_from_the_frame_the_retrieve_step_made(mtl):
    """The system is never handed N by a sibling: it reads the frame's, so a frame whose N disagrees with its entailed
    answers (rank 2 under N = 1) stops with one line, and a frame without retrieval is refused for the MTL."""
    frame = (mtl.normalize >> mtl.retrieve >> mtl.grids >> mtl.scores)(Frame(answers_table(_questions()[0])))
    assert frame.retrieved["rank"].max() == 2
    with pytest.raises(MedrankError, match="n_candidates 1"):
        mtl.system.transform(frame.with_(n_candidates=1))
    with pytest.raises(MedrankError, match="compose"):
        mtl.system.transform(frame.with_(retrieved=None, grid=None))
    with pytest.raises(MedrankError, match="compose retrieve >> grids"):
        mtl.grids.transform(Frame(frame.answers))


def _labelled() -> pd.DataFrame:
    """Two questions as stage clean writes labelled answers (split val): the first answer of each correct."""
    parts = []
    for i, inp in enumerate(_questions()):
        t = answers_table(inp, f"q{i}").assign(split="val")
        n = len(t)
        t["system_rank"] = pd.array(np.arange(1, n + 1), dtype="Float64")
        t["label"] = pd.array([1.0] + [0.0] * (n - 1), dtype="Float64")
        t["reference_rank"] = pd.array(np.arange(1, n + 1), dtype="Float64")
        t["reference_score"] = pd.array([4.0] + [1.0] * (n - 1), dtype="Float64")
        parts.append(t)
    return pd.concat(parts, ignore_index=True)


def test_experiment_evaluates_the_composed_pipeline_as_deployed(mtl):
    """What is evaluated is what `medrank rank` runs: each held-out fold's questions pass through the composed steps
    with their labels blanked, and the decided rows are scored as they are (no keep rule refitted)."""
    from medrank.selection.evaluation import evaluate_decided
    from medrank.selection.experiment import CV, Deployed, Refit, answer_truth, experiment, questions_of

    answers = _labelled()
    truth = answer_truth(answers, ["val"])
    questions = questions_of(truth)
    protocols = [Refit(test=tuple(questions["gid"])), CV(k=2, seed=0)]
    got = experiment({"deployed": Deployed(mtl.steps, answers, truth)}, questions, protocols)["deployed"]

    blind = answers.assign(label=pd.NA, reference_rank=pd.NA, reference_score=pd.NA).astype(
        {"label": "Float64", "reference_rank": "Float64", "reference_score": "Float64"}
    )
    want = mtl.transform(blind)  # both questions in one pass, as the Refit fold sends them
    assert got["test"].summary["base"] == evaluate_decided(want, truth)
    decided = got["test"].rows
    assert decided[["gid", "aid", "label", "score"]].equals(want[["gid", "aid", "label", "score"]])
    # CV: one question per fold, each through the pipeline on its own, scored per fold and summarised
    for fold, scores in got["cv"].per_fold["base"].items():
        rows = got["cv"].rows[got["cv"].rows["fold"] == fold]
        assert scores == evaluate_decided(rows, truth)
    assert set(got["cv"].summary["base"]) >= {"accuracy", "precision", "mrr", "spearman"}
    # the truth never reaches the pipeline: other labels give the same decided rows
    flipped = answers.assign(label=1.0 - answers["label"])
    again = experiment({"d": Deployed(mtl.steps, flipped, truth)}, questions, protocols[:1])["d"]["test"].rows
    pd.testing.assert_frame_equal(again, decided, check_exact=True)
