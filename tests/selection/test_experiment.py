"""medrank.selection.experiment: protocols cut questions into folds that never leak, every system runs the same folds, seeds
and refits are protocols too."""

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest

from medrank.selection import experiment as X
from medrank.core.errors import MedrankError

SOURCES = ("train_liveqa", "train_alexa", "val")


def questions(n: int = 7) -> pd.DataFrame:
    return pd.DataFrame([{"gid": f"{s}/{q}", "split": s} for s in SOURCES for q in range(n)])


@pytest.mark.parametrize("protocol", [X.CV(4, 3), X.LOSO(SOURCES, 3)], ids=["cv", "loso"])
def test_a_protocol_holds_each_question_out_once_and_never_trains_on_it(protocol):
    q = questions()
    tasks = protocol.tasks(q)
    held = [set(t.test) for t in tasks]
    assert set().union(*held) == set(q["gid"]) and sum(map(len, held)) == len(q)
    for t, h in zip(tasks, held):
        assert not set(t.train) & h and set(t.train) | h == set(q["gid"]) and t.seed == 3
    assert [t.fold for t in tasks] == sorted(t.fold for t in tasks)
    if isinstance(protocol, X.LOSO):  # one fold per source, fold = its index
        assert [{g.split("/")[0] for g in h} for h in held] == [{s} for s in SOURCES]


def test_cv_folds_are_the_grouped_folds_every_model_used():
    q = questions()
    fold = X.CV(5, 13).fold_of(q)
    assert list(fold.values()) == X.grouped_folds(q["gid"].to_numpy(), 5, 13).tolist()


def test_loso_refuses_an_unlabelled_source():
    with pytest.raises(Exception, match="not labelled sources"):
        X.LOSO(SOURCES[:2], 0).tasks(questions())


def test_refit_trains_on_its_questions_only_and_protocol_names_must_differ():
    (task,) = X.Refit(("a", "b"), ("c",), 9).tasks(questions())
    assert (task.train, task.test, task.seed, task.protocol, task.refit) == (("a", "b"), ("c",), 9, "test", True)
    assert not any(t.refit for t in X.CV(2, 0).tasks(questions()))
    with pytest.raises(ValueError, match="repeat"):
        X.plan([X.CV(2, 0), X.CV(3, 0)], questions())
    seeded = X.reseeded([X.CV(2, 0), X.LOSO(SOURCES, 0)], [5, 6])
    assert [(p.name, p.seed) for p in seeded] == [("cv@5", 5), ("loso@5", 5), ("cv@6", 6), ("loso@6", 6)]


@dataclass
class Oracle:
    """A toy system: 'fits' record the tasks they saw; predicts each held-out answer's truth when `perfect`."""

    cand: pd.DataFrame
    perfect: bool
    seen: list

    def run(self, tasks):
        self.seen.extend(tasks)
        return [self.cand[self.cand["gid"].isin(set(t.test))] for t in tasks]

    def score(self, protocol, tasks, results):
        from medrank.selection.evaluation import evaluate

        per_fold, rows = {}, []
        for t, r in zip(tasks, results):
            label = r["label"] if self.perfect else 1 - r["label"]
            pred = r.assign(label=label, score=-r["reference_rank"], fold=t.fold)
            per_fold[t.fold] = evaluate(pred, r)
            rows.append(pred)
        return X.Scored({"base": per_fold}, pd.concat(rows), extra={"base": {"n": len(tasks)}})


def toy_answers() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for g, s in questions(4).itertuples(index=False):
        grades = sorted(rng.integers(1, 5, size=4), reverse=True)
        for a, grade in enumerate(grades):
            rows.append(
                {
                    "gid": g,
                    "split": s,
                    "qid": g,
                    "aid": f"{g}/{a}",
                    "label": int(grade >= 3),
                    "reference_rank": a + 1,
                    "reference_score": int(grade),
                }
            )
    return pd.DataFrame(rows)


def test_every_system_runs_the_same_folds_and_each_protocol_summarises_its_own():
    cand = toy_answers()
    systems = {"good": Oracle(cand, True, []), "bad": Oracle(cand, False, [])}
    out = X.experiment(systems, X.questions_of(cand), [X.CV(3, 1), X.LOSO(SOURCES, 1)])
    assert systems["good"].seen == systems["bad"].seen and len(systems["good"].seen) == 6
    good, bad = out["good"], out["bad"]
    assert good["cv"].summary["base"]["accuracy"] == {"mean": 1.0, "sd": 0.0}
    assert good["cv"].summary["base"]["n"] == 3  # the system's extra keys follow the protocol's summary
    assert bad["cv"].summary["base"]["accuracy"]["mean"] == 0.0
    assert set(good["loso"].summary["base"]["by_source"]) == set(SOURCES)
    assert good["loso"].summary["base"]["accuracy"]["worst"] == 1.0
    spread = X.seed_spread_of(
        X.experiment(
            {"good": Oracle(cand, True, [])}, X.questions_of(cand), X.reseeded([X.CV(3, 0), X.LOSO(SOURCES, 0)], [1, 2])
        )["good"],
        [1, 2],
    )
    assert spread["seeds"] == 2 and spread["accuracy"] == 0.0


def test_fixed_scores_fit_only_the_keep_rule_on_other_folds():
    cand = toy_answers()
    decided = cand.assign(label=1, score=-cand["reference_rank"])  # keep every answer, reference order
    got = X.held_out_scores(decided, cand, SOURCES, k=3, seed=0)
    assert got["cv"]["accuracy"]["mean"] == pytest.approx(cand["label"].mean(), abs=0.1)
    scored = cand.assign(prob=cand["label"] * 0.8 + 0.1, rank_key=-cand["reference_rank"])
    perfect = X.held_out_scores(scored, cand, SOURCES, k=3, seed=0)
    assert perfect["cv"]["accuracy"]["mean"] == 1.0 and perfect["loso"]["accuracy"]["worst"] == 1.0


def test_source_folds_reject_unknown_sources():
    assert list(X.source_folds(["val", "train_alexa"], ("train_alexa", "val"))) == [1, 0]
    with pytest.raises(MedrankError, match="test"):
        X.source_folds(["test"], ("train_alexa", "val"))
