"""The question-type signal: a classifier of MedQuAD's question types that learns the asking words, not the topic
(group `qtype`, the RQE stacks, the retrieval stack)."""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np
import pandas as pd

from medrank.core.errors import MedrankError


# more consumer wordings of some types (beside mining.CONSUMER_ASKS, which also drives the mined pairs' draws)
MORE_ASKS: dict[str, tuple[str, ...]] = {
    "treatment": ("What therapy is there for {f}?", "What is the best medication for {f}?", "How is {f} treated?"),
    "inheritance": ("Is {f} hereditary?", "Is {f} genetic?", "Can I pass {f} to my baby?"),
    "exams and tests": (
        "Where can I get tested for {f}?",
        "Is there a test for {f}?",
        "Where can I get genetic testing for {f}?",
    ),
    "outlook": ("What is the prognosis for {f}?", "Will {f} come back?"),
    "causes": ("What is the cause of {f}?", "Can {f} be caused by stress?"),
}


_PARTS = ("word", "char")  # the vectorizer's two parts, in its order


def _unfitted(seed: int):
    """(the vectorizer: words + character n-grams within words ("treated" ~ "treatments"), the classifier)."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_union

    vectorizer = make_union(
        TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True),
        TfidfVectorizer(analyzer="char_wb", ngram_range=(3, 5), min_df=3, sublinear_tf=True, max_features=20000),
    )
    return vectorizer, LogisticRegression(max_iter=2000, C=4.0, class_weight="balanced", random_state=seed)


class QuestionTypes:
    """A classifier of MedQuAD's question types (TF-IDF word 1-2 grams + logistic regression), trained on MedQuAD
    questions with their focus masked so that it learns the asking words, not the topic; `proba(texts)` gives the
    type distribution of any question (consumer or FAQ), `agreement(a, b)` the chance both ask the same type."""

    def __init__(self, medquad: pd.DataFrame, seed: int = 13, min_count: int = 20) -> None:
        from medrank.data.mining import CONSUMER_ASKS

        df = medquad[["focus", "question_type", "question"]].dropna()
        counts = df["question_type"].value_counts()
        if (counts >= min_count).sum() >= 2:  # rare types (support groups: 1 question) are dropped
            df = df[df["question_type"].isin(counts[counts >= min_count].index)]
        if df["question_type"].nunique() < 2:
            raise MedrankError("medquad table: fewer than two question types to learn the question type from")
        texts = [self._mask(q, f) for q, f in zip(df["question"], df["focus"])]
        labels = df["question_type"].tolist()
        # MedQuAD asks in a few templates per type: the consumer wordings of each type (mining.CONSUMER_ASKS,
        # weighted like 50 template questions each) teach the other ways people ask it
        asks = [
            (a.format(f=" "), t) for t in sorted(set(labels)) for a in CONSUMER_ASKS.get(t, ()) + MORE_ASKS.get(t, ())
        ]
        texts += [a for a, _ in asks] * 50
        labels += [t for _, t in asks] * 50
        self.vectorizer, self.model = _unfitted(seed)
        x = self.vectorizer.fit_transform(texts)
        from medrank.encoders.runtime import fixed_blas_threads

        with fixed_blas_threads():  # lbfgs's BLAS sums depend on the thread count: fixed, the same on any machine
            self.model.fit(x, labels)
        self.types = list(self.model.classes_)

    # ------------------------------------------------------------ the fitted state as tables (no pickle)
    def tables(self) -> dict[str, pd.DataFrame]:
        """qtype_word / qtype_char (term, idf: in vocabulary order), qtype_types and qtype_lr (intercept, coef): what
        `from_tables` needs to predict the same bits without refitting (saved by stage bienc's step)."""
        out = {}
        for name, (_, vec) in zip(_PARTS, self.vectorizer.transformer_list):
            terms = sorted(vec.vocabulary_, key=vec.vocabulary_.get)
            out[f"qtype_{name}"] = pd.DataFrame({"term": terms, "idf": np.asarray(vec.idf_, dtype=np.float64)})
        lr = self.model
        out["qtype_types"] = pd.DataFrame({"type": [str(t) for t in lr.classes_]})
        out["qtype_lr"] = pd.DataFrame({"intercept": lr.intercept_, "coef": list(lr.coef_)})  # 1 row for 2 types
        return out

    @classmethod
    def from_tables(cls, tables: dict[str, pd.DataFrame], seed: int = 13) -> "QuestionTypes":
        """The classifier `tables()` describes (a one-line error when a table is missing or malformed)."""
        try:
            vectorizer, model = _unfitted(seed)
            for name, (_, vec) in zip(_PARTS, vectorizer.transformer_list):
                t = tables[f"qtype_{name}"]
                vec.set_params(vocabulary={str(term): i for i, term in enumerate(t["term"])})
                vec.idf_ = t["idf"].to_numpy(dtype=np.float64)
            lr = tables["qtype_lr"]
            model.classes_ = np.asarray(tables["qtype_types"]["type"].tolist(), dtype=object)
            model.intercept_ = lr["intercept"].to_numpy(dtype=np.float64)
            model.coef_ = np.stack([np.asarray(c, dtype=np.float64) for c in lr["coef"]])
            model.n_features_in_ = model.coef_.shape[1]
        except (KeyError, ValueError, TypeError) as e:
            raise MedrankError(f"question-type classifier tables: {type(e).__name__}: {e}") from None
        out = cls.__new__(cls)
        out.vectorizer, out.model, out.types = vectorizer, model, list(model.classes_)
        return out

    @staticmethod
    def _mask(question: str, focus: str) -> str:
        return re.sub(re.escape(str(focus)), " ", str(question), flags=re.IGNORECASE)

    def proba(self, texts: Sequence[str]) -> np.ndarray:
        from medrank.encoders.runtime import fixed_blas_threads

        with fixed_blas_threads():
            return self.model.predict_proba(self.vectorizer.transform([str(t) for t in texts]))

    def predict(self, texts: Sequence[str]) -> np.ndarray:
        return np.asarray(self.types)[self.proba(texts).argmax(1)]

    def agreement(self, a: Sequence[str], b: Sequence[str]) -> np.ndarray:
        """sum_t P(type t | a) P(type t | b), per pair."""
        return (self.proba(a) * self.proba(b)).sum(1)
