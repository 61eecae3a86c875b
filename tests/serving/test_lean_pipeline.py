"""InferencePipeline runs only the steps the decided system reads (issue 48): the same output bits as running every
step, for the decided system's shape (a baseline on metadata + bienc + passage) and for the MTL, which reads all."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from medrank.serving.rank import Ranker, as_input, parse_rank_input
from medrank.steps.pipeline import InferencePipeline
from tests.helpers.tiny_project import FIXTURES

pytestmark = pytest.mark.usefixtures("one_thread")  # the 2 cores are shared


def _questions() -> list:
    fixture = parse_rank_input((FIXTURES / "rank_input.json").read_text())
    other = as_input(
        "How is the flu treated?",
        [
            ("f1", "Flu (Treatment): Rest and fluids. Antiviral drugs shorten the illness when taken early.", "u"),
            ("f2", "Colds are caused by viruses.", ""),
            ("f3", "See a doctor if a fever lasts more than three days. " * 20, "https://medlineplus.gov/flu.html"),
        ],
    )
    return [fixture, other]


def test_the_baseline_skips_retrieval_and_grids_with_the_same_bits(tiny_project, monkeypatch):
    monkeypatch.chdir(tiny_project)  # no data/cache here: every vector is computed
    lean = InferencePipeline.load("models")
    every = InferencePipeline.load("models", every_step=True)
    assert lean.system.groups == {"metadata", "bienc", "passage"} and lean.system.system["system"] == "baseline"
    assert lean.retrieve is None and lean.grids is None  # neither the RQE nor the NLI cross-encoder is loaded
    assert every.retrieve is not None and every.grids is not None and every.scores.every_cosine
    for inp in _questions():
        got, want = Ranker(lean).rank(inp), Ranker(every).rank(inp)
        pd.testing.assert_frame_equal(got, want, check_exact=True)
        assert got["kept"].any()  # min_keep 1


def test_the_mtl_still_runs_every_step(tiny_mtl_project, monkeypatch):
    monkeypatch.chdir(tiny_mtl_project)
    lean = InferencePipeline.load("models")
    assert lean.system.reads_retrieval and lean.system.reads_grids
    assert lean.retrieve is not None and lean.grids is not None
    inp = _questions()[0]
    pd.testing.assert_frame_equal(
        Ranker(lean).rank(inp), Ranker(InferencePipeline.load("models", every_step=True)).rank(inp), check_exact=True
    )


def test_a_missing_unread_step_is_not_needed(tiny_project, tmp_path, monkeypatch):
    """The baseline never reads the retrieve step: `medrank rank` answers without it (the MTL's test keeps the error
    line for a step the system reads: tests/serving/test_rank_cli.py)."""
    import shutil

    from medrank.cli import main

    shutil.copytree(tiny_project / "models", tmp_path / "models", ignore=shutil.ignore_patterns("retrieve", "nli"))
    monkeypatch.chdir(tmp_path)
    inp = _questions()[1]
    want = Ranker(InferencePipeline.load(tiny_project / "models")).rank(inp)
    assert (Ranker(InferencePipeline.load("models")).rank(inp)).equals(want)
    (tmp_path / "in.json").write_text(
        json.dumps({"question": inp.question, "answers": [{"id": a.id, "text": a.text} for a in inp.answers]})
    )
    assert main(["rank", "in.json"]) == 0


def test_ranking_questions_together_decides_each_alone(tiny_project, monkeypatch):
    """rank_many (the service's micro-batches): one question alone is `rank` bit for bit; together, each question is
    decided on its own rows (same ids in two questions are kept apart) and its scores move by rounding at most."""
    import numpy as np

    monkeypatch.chdir(tiny_project)
    ranker = Ranker(InferencePipeline.load("models"))
    a, b = _questions()
    same_ids = as_input("Is it contagious?", [(x.id, x.text, x.url) for x in a.answers[:2]])
    alone = [ranker.rank(q) for q in (a, b, same_ids)]
    pd.testing.assert_frame_equal(ranker.rank_many([a])[0], alone[0], check_exact=True)
    together = ranker.rank_many([a, b, as_input("q", []), same_ids])
    assert together[2].empty
    for got, want in zip([together[0], together[1], together[3]], alone):
        assert got["id"].tolist() == want["id"].tolist() and got["kept"].tolist() == want["kept"].tolist()
        np.testing.assert_allclose(got["prob"], want["prob"], atol=1e-3)
        assert ranker.pipeline.system.per_question
