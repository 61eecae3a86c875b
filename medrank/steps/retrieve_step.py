"""The retrieve step: BM25 candidates from MedQuAD scored by RQE, the N entailed (stage retrieve)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from medrank.core import layout
from medrank.steps import load_recipe, load_step, model_dir, save_step
from medrank.core.frame import Composable, Frame

if TYPE_CHECKING:
    import pandas as pd

    from medrank.params import Params


@dataclass
class RetrieveStep(Composable):
    """BM25 candidates from MedQuAD scored by the RQE cross-encoder; the N entailed (score >= T, else the top-1)."""

    p: Params  # n_candidates, rqe_threshold, retrieve
    docs: pd.DataFrame  # retrieval.saved_documents
    rqe: Any  # CrossEncoder

    @property
    def question_col(self) -> str:
        return self.p.retrieve.question_column

    @classmethod
    def fit(cls, p: Params, medquad: pd.DataFrame, rqe: Any) -> "RetrieveStep":
        """The step of `p` over the MedQuAD table; `n_candidates` beyond `retrieve.bm25_top_k` is refused."""
        from medrank.task3.retrieval import check_candidate_depth, medquad_documents, saved_documents

        check_candidate_depth(p)
        qcol = p.retrieve.question_column
        return cls(p, saved_documents(medquad_documents(medquad, qcol, "answer_norm"), qcol), rqe)

    def save(self, models_dir: str | os.PathLike = layout.MODELS) -> Path:
        from medrank.params import step_params

        return save_step("retrieve", step_params(self.p, "retrieve"), {"medquad": self.docs}, models_dir)

    @classmethod
    def load(cls, models_dir: str | os.PathLike = layout.MODELS, device: str = "auto") -> "RetrieveStep":
        from medrank.encoders.cross_encoder import CrossEncoder

        saved = load_step("retrieve", models_dir)
        p = load_recipe({"retrieve": saved}, str(models_dir))
        path = model_dir(Path(models_dir) / layout.RQE_MODEL.name, "rqe", "finetune_rqe")
        return cls(
            p,
            saved.tables["medquad"],
            CrossEncoder.load(path, device=device, precision=p.retrieve.precision, task="rqe"),
        )

    def score(self, questions: pd.DataFrame, cache_root: str | os.PathLike, **kw: Any):
        """ScoredCandidates of `questions` (retrieval.questions_table); `kw`: read_only, shard_size, backend, ..."""
        from medrank.task3.retrieval import score_candidates

        rp = self.p.retrieve
        return score_candidates(
            questions,
            self.docs,
            self.rqe,
            cache_root,
            question_col=self.question_col,
            bm25_top_k=rp.bm25_top_k,
            precision=rp.precision,
            batch_size=rp.batch_size,
            **kw,
        )

    def entailed(self, scored: pd.DataFrame) -> pd.DataFrame:
        """The N entailed MedQuAD questions of each question (N applied here, once) with their answers."""
        from medrank.task3.retrieval import attach_entailed, select_entailed

        chosen = select_entailed(scored, self.p.n_candidates, self.p.rqe_threshold)
        return attach_entailed(chosen, self.docs, self.question_col)

    def retrieve(self, answers: pd.DataFrame, cache_root: str | os.PathLike, **kw: Any) -> pd.DataFrame:
        """The entailed MedQuAD questions of the normalized answers' questions (`score`, then `entailed`)."""
        from medrank.task3.retrieval import questions_table

        return self.entailed(self.score(questions_table(answers, self.question_col, None), cache_root, **kw).table)

    def transform(self, frame: Frame) -> Frame:
        """The frame with its questions' entailed MedQuAD questions and this step's N (the RQE cache: read only)."""
        retrieved = self.retrieve(frame.answers, layout.CACHE_RQE, read_only=True, show_progress=False)
        return frame.with_(retrieved=retrieved, n_candidates=self.p.n_candidates)
