"""The feature-group registry owns how each group is served: every group a default system may read from a score file
names a scorer that resolves and a saved step that exists, and the served pipeline has no per-group code of its own."""

from __future__ import annotations

import inspect

import pytest

from medrank.core import layout
from medrank.params.groups import REGISTRY
from medrank.steps import score_step


@pytest.mark.parametrize("group", [g for g, s in REGISTRY.items() if s.serve])
def test_each_scorer_resolves_and_each_step_is_a_saved_step(group):
    spec = REGISTRY[group]
    scorer = score_step._resolve(spec.serve)
    assert callable(scorer) and list(inspect.signature(scorer).parameters) == ["ctx"]
    assert spec.file is not None and (spec.step is None or spec.step in layout.STEP_DIRS)


def test_every_default_group_with_a_score_file_is_servable():
    """A group the default DAG computes (not analysis-only) may be adopted by `baseline.features`: it must serve."""
    assert [g for g, s in REGISTRY.items() if s.file is not None and not s.analysis and s.serve is None] == []


def test_a_group_without_a_scorer_is_refused_in_one_line():
    from medrank.core.errors import MedrankError

    with pytest.raises(MedrankError, match="feature group 'agree' has no scorer in the registry"):
        score_step.served({"bienc", "agree"})
    assert score_step.served({"bienc", "heading", "metadata"}) == {
        REGISTRY["bienc"].serve: {"bienc", "heading"}
    }  # one encoding pass for both; metadata is read from the answers table


def test_the_served_pipeline_names_no_group():
    """score_step (and the app's fingerprints) read the registry: no feature group is spelled in their code."""
    from medrank.serving import app

    for module in (score_step, app):
        code = inspect.getsource(module)
        named = [g for g in REGISTRY if f'"{g}"' in code and g not in ("bienc", "qa", "rqe")]  # also model names
        assert named == [], (module.__name__, named)
