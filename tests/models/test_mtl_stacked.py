"""Group stacked, issue 61's early fusion: the MTL fed the baseline's scores, cross-fitted inside each MTL fit so that
no score an MTL fit reads comes from a baseline that saw the question it scores."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from medrank.core.errors import MedrankError
from medrank.models import mtl
from medrank.models.baseline import BaselineConfig
from medrank.models.baseline_protocols import stacked_scores
from medrank.params import BaselineParams
from tests.models.test_mtl import fake_tables, gids_of, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data():
    a, g, ret = fake_tables(seed=3, splits={"train_liveqa": 12, "train_alexa": 12, "val": 6, "test": 2})
    return mtl.build_mtl_data(a, g, ret, n_candidates=2)


def _cfg() -> BaselineConfig:
    return BaselineConfig(BaselineParams(features=["metadata"], cv_folds=3), ("metadata",), n_candidates=2, seed=13)


def _labelled(data) -> pd.DataFrame:
    return data.cand[data.cand["split"] != "test"].reset_index(drop=True)


def _flip(table: pd.DataFrame, gid: str) -> pd.DataFrame:
    out = table.copy()
    mine = out["gid"] == gid
    out.loc[mine, "label"] = 1 - out.loc[mine, "label"]
    out.loc[mine, "reference_rank"] = out.loc[mine, "reference_rank"].max() + 1 - out.loc[mine, "reference_rank"]
    return out


def test_no_row_is_scored_by_a_baseline_that_saw_its_question(data):
    table = _labelled(data)
    gids = list(pd.unique(table["gid"]))
    train, test = gids[:24], gids[24:]
    rows = stacked_scores(table, _cfg(), None, train, test)
    assert list(rows.columns) == ["gid", "aid", "stacked_rank_score", "stacked_prob"]
    assert set(rows["gid"]) == set(gids) and len(rows) == len(table) and not rows.isna().any().any()
    by_key = rows.set_index(["gid", "aid"])
    # a training question's own labels never reach its scores (the other questions' fits learn them)
    g = train[5]
    flipped = stacked_scores(_flip(table, g), _cfg(), None, train, test).set_index(["gid", "aid"])
    mine = by_key.index.get_level_values("gid") == g
    pd.testing.assert_frame_equal(flipped[mine], by_key[mine])
    assert not flipped[~mine].equals(by_key[~mine])
    # a held-out question's labels reach no score at all
    flipped = stacked_scores(_flip(table, test[0]), _cfg(), None, train, test).set_index(["gid", "aid"])
    pd.testing.assert_frame_equal(flipped, by_key)


def test_each_mtl_fit_reads_the_stack_of_its_own_questions(data):
    calls = []

    def stack(train, test):
        calls.append((tuple(train), tuple(test)))
        rows = data.cand[data.cand["gid"].isin(set(train) | set(test))][["gid", "aid"]]
        return rows.assign(stacked_rank_score=np.arange(len(rows), dtype=float), stacked_prob=0.5)

    inner = gids_of(data, "train")
    outer = gids_of(data, "val")
    cfg = tiny_config(max_epochs=1, cv_folds=2, feature_groups=["metadata", "stacked"])
    make = mtl.builder_factory(cfg.feature_groups, 2)
    rows = mtl.held_out_rows(data, inner, ["train_liveqa", "train_alexa"], outer, cfg, make, seed=1, stack=stack)
    assert sorted(rows["part"].unique()) == ["loso", "oof", "test"]
    assert len(calls) == 2 + 2 + 1  # CV folds, LOSO folds, the refit: one stack per fit
    assert all(not set(train) & set(outer) for train, _ in calls)  # no stacked baseline saw an outer question
    assert (tuple(inner), tuple(outer)) in calls
    assert "stacked_rank_score" not in data.cand.columns  # the shared candidate table is left as it was


def test_a_stack_missing_rows_of_a_fit_is_one_error_line(data):
    inner, outer = gids_of(data, "train"), gids_of(data, "val")
    cfg = tiny_config(max_epochs=1, cv_folds=2, feature_groups=["metadata", "stacked"])
    system = mtl.MTLSystem(data, cfg, mtl.builder_factory(cfg.feature_groups, 2), stack=lambda tr, te: _few(data, tr))
    from medrank.selection.experiment import Refit

    task = Refit(tuple(inner), tuple(outer), 1).tasks(system.questions(inner))[0]
    with pytest.raises(MedrankError, match=r"^stacked scores: \d+ candidate answers of test's fold 0 have none$"):
        system.jobs([task])


def _few(data, train):
    rows = data.cand[data.cand["gid"].isin(set(train))][["gid", "aid"]]
    return rows.assign(stacked_rank_score=0.0, stacked_prob=0.5)


def test_with_columns_shares_the_inputs_and_checks_lengths(data):
    more = data.with_columns({"x": np.zeros(len(data.cand))})
    assert "x" in more.cand.columns and "x" not in data.cand.columns and more.grids is data.grids
    with pytest.raises(MedrankError, match="^MTL data: column x has 1 rows, the candidates"):
        data.with_columns({"x": np.zeros(1)})


def test_a_fit_with_few_training_questions_still_gets_stacked_scores(data):
    """Tiny profiles: with fewer than 2 x cv_folds training questions none can be held out of a baseline fit that
    still picks its own threshold by CV: they get 0 (no information), never a score fitted on themselves."""
    table = _labelled(data)
    gids = list(pd.unique(table["gid"]))
    few = stacked_scores(table, _cfg(), None, gids[:4], gids[24:26]).set_index("gid")
    assert set(few.index) == set(gids[:4]) | set(gids[24:26]) and not few.isna().any().any()
    assert (few.loc[gids[:4], ["stacked_rank_score", "stacked_prob"]] == 0.0).all().all()
    assert (few.loc[gids[24:26], "stacked_prob"] != 0.0).any()  # the held-out ones by a baseline on the four
    none = stacked_scores(table, _cfg(), None, gids[:1], gids[24:26])
    assert (none[["stacked_rank_score", "stacked_prob"]] == 0.0).all().all()
