"""One experiment for every system (PyTerrier's `Experiment` for medrank): a protocol cuts the questions into folds,
a system fits on each fold's training questions and predicts its held-out ones, the system decides and scores each
fold, and the protocol summarises the folds. The baseline, the MTL, the CNN, CHiQA and the deployed pipeline
(`Deployed`: the composed steps `medrank rank` runs) all run through `experiment`;
ablation rows are dicts of systems, seed spreads are protocols `reseeded`, a nested estimate adds a `Refit`.

A system implements `run(tasks) -> one result per task` (the fits; a system may run them side by side) and
`score(protocol, tasks, results) -> Scored` (its decision rule and the official scores of each fold, per variant).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Mapping, Protocol as Interface, Sequence

import numpy as np
import pandas as pd

from medrank.core.errors import MedrankError
from medrank.selection.evaluation import PriorShift as PriorShift  # the protocol's home is evaluation (the layers)
from medrank.selection.metrics import SHIFT_PRIORS as SHIFT_PRIORS

if TYPE_CHECKING:
    from medrank.core.frame import Step

# ---------------------------------------------------------------- folds


def grouped_folds(gid: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Fold index per row; all rows of a question share a fold; questions shuffled with `seed`."""
    questions = pd.unique(pd.Series(np.asarray(gid)))
    if k < 2 or k > len(questions):
        raise MedrankError(f"{k} folds for {len(questions)} questions")
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(questions))
    fold_of = {q: int(i % k) for i, q in zip(range(len(questions)), questions[perm])}
    return np.array([fold_of[q] for q in gid], dtype=np.int64)


def source_folds(splits: Sequence[str], sources: Sequence[str]) -> np.ndarray:
    """Leave-one-source-out folds: each row's fold is the index of its question's source in `sources`."""
    index = {s: i for i, s in enumerate(sources)}
    missing = sorted(set(splits) - set(index))
    if missing:
        raise MedrankError(f"leave-one-source-out: split(s) {', '.join(missing)} are not labelled sources")
    return np.array([index[s] for s in splits], dtype=np.int64)


# ---------------------------------------------------------------- protocols


TRAIN_ONLY = -1  # a question every fold trains on (a Refit's training questions)


@dataclass(frozen=True)
class Task:
    """One fit: train on `train` questions, predict `test` ones; `seed` is the protocol's (a system derives its fit
    seeds from it and `fold`); `refit`: a Refit's one model on every training question."""

    protocol: str
    fold: int
    train: tuple[str, ...]
    test: tuple[str, ...]
    seed: int
    refit: bool = False


class Protocol:
    """How questions are cut into folds, and how the folds' scores are summarised (subclasses are frozen dataclasses
    whose fields end with `seed` and `name`)."""

    name: str
    seed: int

    def fold_of(self, questions: pd.DataFrame) -> dict[str, int]:
        raise NotImplementedError

    def tasks(self, questions: pd.DataFrame) -> list[Task]:
        """One Task per fold (ascending fold index); `questions`: columns gid, split, one row per question in order."""
        fold = self.fold_of(questions)
        ids = sorted(set(fold.values()) - {TRAIN_ONLY})
        return [
            Task(
                self.name,
                f,
                tuple(g for g, v in fold.items() if v != f),
                tuple(g for g, v in fold.items() if v == f),
                self.seed,
                isinstance(self, Refit),
            )
            for f in ids
        ]

    def summary(self, per_fold: Mapping[int, dict]) -> dict:
        raise NotImplementedError


@dataclass(frozen=True)
class CV(Protocol):
    """Question-grouped k-fold cross-validation, questions shuffled by `seed` (every system: the same folds)."""

    k: int = 5
    seed: int = 0
    name: str = "cv"

    def fold_of(self, questions: pd.DataFrame) -> dict[str, int]:
        gids = questions["gid"].to_numpy()
        return dict(zip(gids, grouped_folds(gids, self.k, self.seed).tolist()))

    def summary(self, per_fold: Mapping[int, dict]) -> dict:
        from medrank.selection.evaluation import summarize

        return summarize([per_fold[f] for f in sorted(per_fold)])


@dataclass(frozen=True)
class LOSO(Protocol):
    """Leave one labelled source out: fold = the index of the question's source in `sources` (real question and label
    shift); `seed` only seeds the fits."""

    sources: tuple[str, ...] = ()
    seed: int = 0
    name: str = "loso"

    def fold_of(self, questions: pd.DataFrame) -> dict[str, int]:
        return dict(zip(questions["gid"], source_folds(questions["split"].to_numpy(), self.sources).tolist()))

    def summary(self, per_fold: Mapping[int, dict]) -> dict:
        from medrank.selection.evaluation import loso_summary

        return loso_summary({self.sources[f]: per_fold[f] for f in sorted(per_fold)})


@dataclass(frozen=True)
class Refit(Protocol):
    """One fit on every `train` question that predicts the `test` ones (a nested estimate's outer part, or a model
    for unlabelled questions): no summary, its rows are the result."""

    train: tuple[str, ...] = ()
    test: tuple[str, ...] = ()
    seed: int = 0
    name: str = "test"

    def fold_of(self, questions: pd.DataFrame) -> dict[str, int]:
        return {**{g: TRAIN_ONLY for g in self.train}, **{g: 0 for g in self.test}}

    def summary(self, per_fold: Mapping[int, dict]) -> dict:
        return dict(per_fold.get(0, {}))


def reseeded(protocols: Sequence[Protocol], seeds: Sequence[int]) -> list[Protocol]:
    """Each protocol under each seed (named "<name>@<seed>"): a seed spread is one experiment over these."""
    return [replace(p, seed=s, name=f"{p.name}@{s}") for s in seeds for p in protocols]


@dataclass
class Scored:
    """A system's decision on one protocol's folds: official scores per variant and fold ("base" = the system as
    configured; per-fold dicts may carry more keys than the metrics), extra summary keys per variant, the decided
    rows of the base variant (with `fold`), and facts (e.g. best epochs)."""

    per_fold: dict[str, dict[int, dict]]
    rows: pd.DataFrame
    extra: dict[str, dict] = field(default_factory=dict)
    info: dict = field(default_factory=dict)


@dataclass
class Result:
    """One system under one protocol: the summary per variant (the protocol's, then the system's extra keys), the
    per-fold scores, the decided rows and facts."""

    summary: dict[str, dict]
    per_fold: dict[str, dict[int, dict]]
    rows: pd.DataFrame
    info: dict


class System(Interface):
    def run(self, tasks: Sequence[Task]) -> list: ...

    def score(self, protocol: Protocol, tasks: Sequence[Task], results: Sequence) -> Scored: ...


def plan(protocols: Sequence[Protocol], questions: pd.DataFrame) -> list[tuple[Protocol, list[Task]]]:
    """Each protocol with its tasks over `questions` (gid, split; one row per question, in order)."""
    names = [p.name for p in protocols]
    if len(set(names)) != len(names):
        raise ValueError(f"protocol names repeat: {names}")
    return [(p, p.tasks(questions)) for p in protocols]


def collect(system: System, plans: Sequence[tuple[Protocol, list[Task]]], results: Sequence) -> dict[str, Result]:
    """`system.score` of each protocol's slice of `results` (the plans' tasks in order), summarised."""
    out, at = {}, 0
    for p, tasks in plans:
        s = system.score(p, tasks, results[at : at + len(tasks)])
        at += len(tasks)
        summary = {v: {**p.summary(pf), **s.extra.get(v, {})} for v, pf in s.per_fold.items()}
        out[p.name] = Result(summary, s.per_fold, s.rows, s.info)
    return out


def experiment(
    systems: Mapping[str, System], questions: pd.DataFrame, protocols: Sequence[Protocol]
) -> dict[str, dict[str, Result]]:
    """Every system under every protocol, on the same folds: {system: {protocol name: Result}}. Each system runs all
    its tasks in one call (side by side where it can)."""
    plans = plan(protocols, questions)
    tasks = [t for _, ts in plans for t in ts]
    return {name: collect(s, plans, s.run(tasks)) for name, s in systems.items()}


def questions_of(table: pd.DataFrame, key: str = "gid") -> pd.DataFrame:
    """One row (gid = `key`, split) per question of a per-answer table, in first-appearance order."""
    q = table.drop_duplicates(key)
    return pd.DataFrame({"gid": q[key].to_numpy(), "split": q["split"].to_numpy()})


def seed_spread_of(results: Mapping[str, Result], seeds: Sequence[int], variant: str = "base") -> dict:
    """evaluation.seed_spread of `reseeded` CV and LOSO results ({"cv@<seed>": ..., "loso@<seed>": ...})."""
    from medrank.selection.evaluation import seed_spread as spread

    return spread([(results[f"cv@{s}"].summary[variant], results[f"loso@{s}"].summary[variant]) for s in seeds])


# ---------------------------------------------------------------- systems that train nothing on MEDIQA


@dataclass
class FixedScores:
    """A system whose per-answer scores are fixed (CHiQA's order, the CNN's cross-fitted scores): `rows` (gid, aid;
    prob and rank_key, or an already decided label and score). Its only MEDIQA-fitted part, the keep rule, is fitted
    on the other folds' rows (decision.decide_system); already decided rows are scored as they are."""

    rows: pd.DataFrame
    cand: pd.DataFrame  # the truth: gid, aid, label, reference_rank, reference_score (+ split, qid)

    def __post_init__(self) -> None:
        self.rows = self.rows.reset_index(drop=True)

    def run(self, tasks: Sequence[Task]) -> list[pd.DataFrame]:
        return [self.rows[self.rows["gid"].isin(set(t.test))].assign(fold=t.fold) for t in tasks]

    def score(self, protocol: Protocol, tasks: Sequence[Task], results: Sequence[pd.DataFrame]) -> Scored:
        from medrank.selection.decision import decide_system

        rows = pd.concat(results)
        rows = rows.loc[self.rows.index[self.rows.index.isin(rows.index)]].reset_index(drop=True)  # in table order
        fits = None
        if "prob" in rows.columns:
            part = "oof" if isinstance(protocol, CV) else "loso"
            cols = ["part", "fold", "gid", "aid", "prob", "rank_key"]
            fits, rows = decide_system(rows.assign(part=part)[cols], self.cand, train=[])
        return scored_as_decided(rows, self.cand, info={"keep_fits": fits})


def scored_as_decided(rows: pd.DataFrame, cand: pd.DataFrame, info: dict | None = None) -> Scored:
    """Decided rows (gid, aid, label, score, fold) scored fold by fold as they are (official Task 3 metrics)."""
    from medrank.selection.evaluation import evaluate_decided

    per_fold = {int(f): evaluate_decided(rows[rows["fold"] == f], cand) for f in sorted(rows["fold"].unique())}
    return Scored({"base": per_fold}, rows, info=dict(info or {}))


@dataclass
class Deployed:
    """A composed, fitted pipeline as `medrank rank` runs it (`InferencePipeline.load(...).steps`: a step
    `transform(Frame) -> Frame`), evaluated as deployed: each task's held-out questions, their labels blanked, pass
    through the pipeline, and its decided rows (its own keep rule and order) are scored as they are. It fits nothing
    and its training folds go unused, so a protocol whose held-out questions the pipeline was fitted on gives an
    in-sample figure: evaluate the `fit="val"` pipeline on the validation questions (`Refit(test=...)`)."""

    pipeline: Step  # transform(Frame) -> Frame, e.g. InferencePipeline.load(...).steps
    answers: pd.DataFrame  # the labelled questions' cleaned answers (stage clean's answers table)
    cand: pd.DataFrame  # their truth (answer_truth)

    def run(self, tasks: Sequence[Task]) -> list[pd.DataFrame]:
        from medrank.core.frame import Frame
        from medrank.task3.features import question_key

        hidden = {c: pd.Series(pd.NA, index=self.answers.index, dtype="Float64") for c in TRUTH_COLUMNS}
        blind, key = self.answers.assign(**hidden), question_key(self.answers).to_numpy()
        out = []
        for t in tasks:
            part = blind[np.isin(key, list(t.test))].reset_index(drop=True)
            decided = self.pipeline.transform(Frame(part)).decided
            out.append(decided[["gid", "aid", "prob", "rank_key", "label", "score"]].assign(fold=t.fold))
        return out

    def score(self, protocol: Protocol, tasks: Sequence[Task], results: Sequence[pd.DataFrame]) -> Scored:
        return scored_as_decided(pd.concat(results, ignore_index=True), self.cand)


def held_out_scores(rows: pd.DataFrame, cand: pd.DataFrame, sources: Sequence[str], k: int, seed: int) -> dict:
    """A fixed-score system (`rows`: gid, split, aid, ...) under CV and LOSO over `sources`, on the folds every model
    uses: {"cv": rounded mean ± sd, "loso": per source, mean, worst}."""
    from medrank.selection.evaluation import rounded_summary

    rows = rows[rows["split"].isin(sources)]
    protocols = [CV(k, seed), LOSO(tuple(sources), seed)]
    r = experiment({"fixed": FixedScores(rows, cand)}, questions_of(rows), protocols)["fixed"]
    return {"cv": rounded_summary(r["cv"].summary["base"]), "loso": r["loso"].summary["base"]}


TRUTH_COLUMNS = ("label", "reference_rank", "reference_score")


def answer_truth(answers: pd.DataFrame, splits: Sequence[str]) -> pd.DataFrame:
    """The truth table (gid = question_key) of the answers of `splits`."""
    from medrank.task3.features import question_key

    labelled = answers[answers["split"].isin(splits)]
    return labelled[["split", "qid", "aid", *TRUTH_COLUMNS]].assign(gid=question_key(labelled))
