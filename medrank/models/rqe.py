"""Question entailment for consumer questions: training-pair sources (their question types: task3.qtype), selection by
question-grouped CV over the MEDIQA Task 2 validation pairs (the only labelled pairs with consumer CHQs).

Two model kinds: a cross-encoder (P(entailed) of the pair) and a fine-tuned bi-encoder (cosine of mean-pooled unit
vectors, calibrated on the other folds). Training is two-step: a model is first trained on a set of *extra* sources
(AMIA clinician pairs, MeQSum and LiveQA consumer -> summary pairs, MedQuAD-mined pairs; none holds a validation pair,
so one model per source set serves every fold), then fine-tuned on the validation pairs of the other folds. Rows side
by side: each set alone ("ce: amia" is yesterday's recipe), each set then + validation pairs, validation pairs only,
the zero-shot bi-encoder cosine, and stacks of the best cross-encoder with the best cosine (and the question-type
agreement) by logistic regression fitted on the other folds.

The error slices (`pair_slices`): a pair is *same-focus* when the FAQ names something the CHQ names (they share a
content word): there the topic agrees and only what is asked can decide; the word-overlap bucket is the share of
the FAQ's content words found in the CHQ.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from medrank.data.mining import Pair, medquad_rqe_pairs
from medrank.core.errors import MedrankError
from medrank.task3.qtype import QuestionTypes
from medrank.task3.rqe_stack import stack_features  # noqa: F401 (re-exported: rqe_choice, rqe_training)

log = logging.getLogger(__name__)

EXTRA_SOURCES = ("amia", "meqsum", "liveqa", "medquad")  # training-pair sources besides the validation pairs
VAL = "val"

_WORD = re.compile(r"[a-z0-9]+")
# question words, pronouns and filler: what is left of a question is (mostly) its focus and aspect words
STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being below between both
    but by can could did do does doing done down during each few for from further get gets getting had has have having
    he her here hers him his how i if in into is it its itself just know like me more most my no nor not now of off on
    once only or other our out over own please same she should so some such than that the their them then there these
    they this those through to too under until up very was we were what when where which while who whom why will with
    would you your yours also any anything something thank thanks hello hi dear sir madam want wanted need needs
    tell help information info question questions ask asking regarding re per may might must shall us let lets im ive
    dont doesnt cant wont""".split()
)


def content_tokens(text: str) -> set[str]:
    """Lower-cased words of 3+ characters minus STOPWORDS, a plural 's' stripped (crude, for overlap only)."""
    out = set()
    for w in _WORD.findall(str(text).lower()):
        if len(w) < 3 or w in STOPWORDS:
            continue
        out.add(w[:-1] if len(w) > 4 and w.endswith("s") and not w.endswith("ss") else w)
    return out


OVERLAP_BUCKETS = ("none", "low", "high")  # share of FAQ content words in the CHQ: 0 | (0, 0.5] | > 0.5


def pair_slices(chqs: Sequence[str], faqs: Sequence[str]) -> pd.DataFrame:
    """Per pair: `overlap` (share of the FAQ's content words found in the CHQ), `bucket` (OVERLAP_BUCKETS) and
    `same_focus` (overlap > 0: the FAQ names something the CHQ names, so topic alone cannot decide)."""
    overlap = []
    for c, f in zip(chqs, faqs):
        ft = content_tokens(f)
        overlap.append(len(ft & content_tokens(c)) / len(ft) if ft else 0.0)
    ov = np.asarray(overlap, dtype=float)
    bucket = np.where(ov == 0, OVERLAP_BUCKETS[0], np.where(ov <= 0.5, OVERLAP_BUCKETS[1], OVERLAP_BUCKETS[2]))
    return pd.DataFrame({"overlap": ov, "bucket": bucket, "same_focus": ov > 0})


# ---------------------------------------------------------------- training-pair sources


def _tfidf_neighbours(texts: Sequence[str], vocab: frozenset[str] | None = None) -> np.ndarray:
    """(n, n) cosine of TF-IDF vectors over content words (diagonal set to -1); with `vocab`, over the content words
    in it (e.g. words of MedQuAD foci: neighbours then share a topic, not an asking word), else over all of them."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    def words(t: str) -> list[str]:
        toks = content_tokens(t)
        focus = toks & vocab if vocab else toks
        return sorted(focus or toks)

    x = TfidfVectorizer(analyzer=words, sublinear_tf=True).fit_transform(list(texts))
    sim = (x @ x.T).toarray()
    np.fill_diagonal(sim, -1.0)
    return sim


def focus_vocabulary(medquad: pd.DataFrame) -> frozenset[str]:
    """Content words of MedQuAD's foci (disease, drug, test names): the topic words of a question."""
    return frozenset(w for f in medquad["focus"].dropna().unique() for w in content_tokens(f))


def _norm(text: str) -> str:
    return " ".join(_WORD.findall(str(text).lower()))


def summary_pairs(
    chqs: Sequence[str],
    positives: Sequence[Sequence[str]],
    qtypes: QuestionTypes,
    rng: np.random.Generator,
    hard: int = 1,
    easy: int = 1,
    focus_vocab: frozenset[str] | None = None,
) -> tuple[list[Pair], np.ndarray]:
    """Consumer question -> short question pairs: (chq_i, each of its positives) labelled 1; negatives are other
    questions' summaries (the first positive of each): `hard` per CHQ = the most similar summaries (TF-IDF over
    the content words in `focus_vocab`: the same topic) whose predicted question type differs from the CHQ's own summary's (so a
    paraphrase of the same ask is not made a negative), `easy` per CHQ = random other summaries."""
    summaries = [str(p[0]) for p in positives]
    n = len(summaries)
    if n < 2:
        raise MedrankError(f"{n} consumer questions with summaries: need at least 2 to build negatives")
    sim = _tfidf_neighbours(summaries, focus_vocab)
    types = qtypes.predict(summaries)
    norms = [_norm(s) for s in summaries]
    pairs: list[Pair] = []
    labels: list[int] = []
    for i, chq in enumerate(chqs):
        seen = set()
        for pos in positives[i]:
            if pos and _norm(pos) not in seen:
                seen.add(_norm(pos))
                pairs.append((str(chq), str(pos)))
                labels.append(1)
        taken = 0
        for j in np.argsort(-sim[i], kind="stable"):
            if taken >= hard or sim[i, j] <= 0:
                break
            if types[j] != types[i] and norms[j] not in seen:
                pairs.append((str(chq), summaries[j]))
                labels.append(0)
                seen.add(norms[j])
                taken += 1
        for _ in range(easy):
            j = int(rng.integers(n))
            if j != i and norms[j] not in seen:
                pairs.append((str(chq), summaries[j]))
                labels.append(0)
                seen.add(norms[j])
    return pairs, np.asarray(labels, dtype=np.int64)


@dataclass
class PairSources:
    """Everything the training-pair sources are built from (clean/normalized tables, already hygiene-filtered)."""

    amia: pd.DataFrame  # rqe_pairs split train: chq, faq, label
    meqsum: pd.DataFrame  # chq, summary
    liveqa: pd.DataFrame  # question, nlm_summary, nist_paraphrase
    medquad: pd.DataFrame  # focus, question_type, question
    medquad_pairs: int = 2000
    hard_negatives: int = 1
    easy_negatives: int = 1
    max_pairs: int | None = None  # stratified cap on each source's pairs (tiny profiles); None = all

    def __post_init__(self) -> None:
        self.focus_vocab = focus_vocabulary(self.medquad)

    def pairs(self, source: str, qtypes: QuestionTypes, seed: int) -> tuple[list[Pair], np.ndarray]:
        """The training pairs of one source, deterministic in `seed` (the same draw for every row using it)."""
        from medrank.data.tasks import cap_pairs

        if source not in EXTRA_SOURCES:
            raise MedrankError(f"unknown RQE training source '{source}' (expected one of {', '.join(EXTRA_SOURCES)})")
        rng = np.random.default_rng([seed, EXTRA_SOURCES.index(source)])
        if source == "amia":
            pairs, y = (
                list(zip(self.amia["chq"].astype(str), self.amia["faq"].astype(str))),
                self.amia["label"].to_numpy(np.int64),
            )
        elif source == "meqsum":
            pairs, y = summary_pairs(
                self.meqsum["chq"].tolist(),
                [[s] for s in self.meqsum["summary"]],
                qtypes,
                rng,
                self.hard_negatives,
                self.easy_negatives,
                self.focus_vocab,
            )
        elif source == "liveqa":
            pos = [
                [s, p] for s, p in zip(self.liveqa["nlm_summary"].fillna(""), self.liveqa["nist_paraphrase"].fillna(""))
            ]
            pairs, y = summary_pairs(
                self.liveqa["question"].tolist(),
                pos,
                qtypes,
                rng,
                self.hard_negatives,
                self.easy_negatives,
                self.focus_vocab,
            )
        else:
            pairs, y = medquad_rqe_pairs(self.medquad, self.medquad_pairs, rng)
        return cap_pairs(list(pairs), y, self.max_pairs, rng)


def mixed(parts: Sequence[tuple[list[Pair], np.ndarray]], seed: int) -> tuple[list[Pair], np.ndarray]:
    """Concatenated and shuffled (seeded) pair sets."""
    pairs = [p for ps, _ in parts for p in ps]
    labels = np.concatenate([y for _, y in parts]) if parts else np.zeros(0, dtype=np.int64)
    order = np.random.default_rng(seed).permutation(len(pairs))
    return [pairs[i] for i in order], labels[order]


# ---------------------------------------------------------------- cross-validation


@dataclass
class CvData:
    """The Task 2 validation pairs, their folds (grouped by CHQ) and slices."""

    chq: list[str]
    faq: list[str]
    y: np.ndarray
    folds: np.ndarray
    slices: pd.DataFrame = field(init=False)

    def __post_init__(self) -> None:
        self.slices = pair_slices(self.chq, self.faq)

    @property
    def pairs(self) -> list[Pair]:
        return list(zip(self.chq, self.faq))

    def subset(self, mask: np.ndarray) -> tuple[list[Pair], np.ndarray]:
        idx = np.flatnonzero(mask)
        return [(self.chq[i], self.faq[i]) for i in idx], self.y[idx]


def fold_accuracies(y: np.ndarray, pred: np.ndarray, folds: np.ndarray, mask: np.ndarray | None = None) -> list[float]:
    """Accuracy per fold (over the rows of `mask`; a fold without such rows is skipped)."""
    mask = np.ones(len(y), dtype=bool) if mask is None else mask
    return [
        float(np.mean(pred[(folds == k) & mask] == y[(folds == k) & mask]))
        for k in np.unique(folds)
        if ((folds == k) & mask).any()
    ]


def row_report(data: CvData, prob: np.ndarray, pred: np.ndarray | None = None) -> dict:
    """CV accuracy mean ± sd over folds, pooled AUC, and accuracy on the same-focus pairs and per overlap bucket."""
    from sklearn.metrics import roc_auc_score

    pred = (prob >= 0.5).astype(int) if pred is None else pred
    acc = fold_accuracies(data.y, pred, data.folds)
    same = data.slices["same_focus"].to_numpy()
    same_acc = fold_accuracies(data.y, pred, data.folds, same)
    out = {
        "accuracy": round(float(np.mean(acc)), 4),
        "accuracy_sd": round(float(np.std(acc, ddof=1)) if len(acc) > 1 else 0.0, 4),
        "accuracy_folds": [round(a, 4) for a in acc],
        "auc": round(float(roc_auc_score(data.y, prob)), 4) if len(np.unique(data.y)) == 2 else None,
        "same_focus": {
            "n": int(same.sum()),
            "accuracy": round(float(np.mean(same_acc)), 4) if same_acc else None,
            "accuracy_sd": round(float(np.std(same_acc, ddof=1)), 4) if len(same_acc) > 1 else None,
            "accuracy_folds": [round(a, 4) for a in same_acc],
        },
        "by_overlap": {},
    }
    for b in OVERLAP_BUCKETS:
        m = (data.slices["bucket"] == b).to_numpy()
        if m.any():
            out["by_overlap"][b] = {"n": int(m.sum()), "accuracy": round(float(np.mean(pred[m] == data.y[m])), 4)}
    return out


FEATURES = (
    "ce",
    "cosine",
    "qtype",
)  # what a stacked scorer may combine: CE P(entailed), a bi-encoder cosine, type agreement


def fit_stack(x: np.ndarray, y: np.ndarray, seed: int):
    """Logistic regression (C = 1) on standardised columns: a cosine (spread ~0.1) and a logit (spread ~5) get the same
    prior weight, else the L2 penalty starves the cosine."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=1000, random_state=seed)).fit(x, y)


def linear_form(stack) -> tuple[np.ndarray, float]:
    """(coef, intercept) on the raw columns of a fitted `fit_stack` pipeline: z = x @ coef + intercept."""
    scaler, lr = stack[0], stack[-1]
    coef = lr.coef_[0] / scaler.scale_
    return coef, float(lr.intercept_[0] - np.sum(coef * scaler.mean_))


def stack_oof(data: CvData, x: np.ndarray, seed: int) -> np.ndarray:
    """Logistic regression over out-of-fold features, fitted on the other folds: out-of-fold probabilities (with one
    feature, a cosine, this is its calibration: the threshold comes from the other folds)."""
    prob = np.zeros(len(data.y))
    for k in np.unique(data.folds):
        test = data.folds == k
        prob[test] = fit_stack(x[~test], data.y[~test], seed).predict_proba(x[test])[:, 1]
    return prob


TrainFn = Callable[[list[Pair], np.ndarray, object], object]  # (pairs, labels, init model or None) -> model
PredictFn = Callable[[object, list[Pair]], np.ndarray]  # (model, pairs) -> P(entailed) or cosine


def cv_scores(data: CvData, pretrained: object | None, train: TrainFn, predict: PredictFn) -> np.ndarray:
    """Out-of-fold scores: per fold, `train` on the other folds' pairs starting from `pretrained` (None = the base
    model; `train` must not change it), then `predict` the fold."""
    out = np.zeros(len(data.y))
    for k in np.unique(data.folds):
        test = data.folds == k
        pairs, y = data.subset(~test)
        model = train(pairs, y, pretrained)
        out[test] = predict(model, data.subset(test)[0])
    return out


def row_name(sources: Sequence[str], val_stage: bool) -> str:
    """'meqsum+medquad' (trained on those sources), '... > val' (then on validation pairs), 'val' (only on them)."""
    parts = (["+".join(sources)] if sources else []) + ([VAL] if val_stage else [])
    return " > ".join(parts) if parts else VAL


def check_row_sources(rows: Sequence[Sequence[str]]) -> None:
    for srcs in rows:
        bad = [s for s in srcs if s not in EXTRA_SOURCES]
        if bad:
            raise MedrankError(f"finetune.rqe.extra_sets: unknown source(s) {bad} (expected {list(EXTRA_SOURCES)})")
