"""The per-answer scores the final system's feature groups read (stages bienc, passages, cnn_mediqa; models/cnn, qa)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from medrank.core import layout
from medrank.steps import load_recipe, load_step, model_dir
from medrank.core.frame import Composable, Frame

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from medrank.params import Params


@dataclass
class AnswerScores(Composable):
    """The per-answer scores the final system's feature groups read: bienc / heading cosines and question-type
    agreement (stage bienc's step), the best answer window's cosine (stage passages' step), the CNN's answer score
    (cnn_mediqa's step + models/cnn), the QA cross-encoder's (models/qa: analysis stage qa, whose knobs are not saved:
    the qa section's defaults apply)."""

    p: Params
    groups: set[str]
    bienc: Any | None = None  # SentenceEncoder of groups bienc / heading / passage
    qtypes: Any | None = None  # QuestionTypes of group qtype
    cnn: Any | None = None  # CnnRanker of group cnn
    qa: Any | None = None  # CrossEncoder of group qa
    every_cosine: bool = False  # encode the headings too where the system reads only bienc (as before issue 48)

    @classmethod
    def load(cls, groups: set[str], models_dir: str | os.PathLike = layout.MODELS, device: str = "auto"):
        from medrank.encoders.cross_encoder import CrossEncoder
        from medrank.encoders.sentence_encoder import SentenceEncoder

        models_dir = Path(models_dir)
        steps = {}
        if groups & {"bienc", "heading", "qtype"}:
            steps["answer_scores"] = load_step("answer_scores", models_dir)
        if "passage" in groups:
            steps["passages"] = load_step("passages", models_dir)
        if "cnn" in groups:
            steps["cnn_scores"] = load_step("cnn_scores", models_dir)
        p = load_recipe(steps, str(models_dir))
        out = cls(p, set(groups))
        if groups & {"bienc", "heading", "passage"}:
            out.bienc = SentenceEncoder(p.bienc.model, device=device, max_length=p.bienc.max_length)
        if "qtype" in groups:
            from medrank.task3.qtype import QuestionTypes

            out.qtypes = QuestionTypes.from_tables(steps["answer_scores"].tables, p.seed)  # stage bienc's, not refitted
        if "cnn" in groups:
            from medrank.models.cnn import CnnRanker

            out.cnn = CnnRanker.load(model_dir(models_dir / layout.CNN_MODEL.name, "cnn", "cnn_train"))
        if "qa" in groups:
            path = model_dir(models_dir / layout.QA_MODEL.name, "qa", "qa")
            out.qa = CrossEncoder.load(path, device=device, precision=p.qa.predict_precision, task="qa")
        return out

    def transform(self, frame: Frame) -> Frame:
        """The frame with the per-answer scores of the groups the system reads (the caches under data/cache: read only)."""
        return frame.with_(scores={**frame.scores, **self.scores(frame.answers)})

    def scores(
        self,
        answers: pd.DataFrame,
        cache_root: str | os.PathLike = layout.CACHE_BIENC,
        passage_cache: str | os.PathLike = layout.CACHE_PASSAGES,
    ) -> dict[str, np.ndarray]:
        """Per-answer score columns aligned with `answers`, for the groups the system reads (the caches: read only)."""
        p, groups, out = self.p, self.groups, {}
        if groups & {"bienc", "heading"}:
            from medrank.task3.answer_scores import answer_heading, bienc_cosines

            bp = p.bienc
            # only the cosines the system reads (stage bienc's answer_bienc_scores encodes both): a vector depends on
            # its batch's padded width, not on the other rows, and a heading, a prefix of its answer, is sorted after
            # it and sets no width, so the answers' bits stay the same (tests/serving/test_lean_pipeline.py)
            answer = answers["answer_norm"].fillna("").astype(str)
            texts = {}
            if "bienc" in groups or self.every_cosine:
                texts["bienc_cos"] = answer.tolist()
            if "heading" in groups or self.every_cosine:
                texts["heading_cos"] = answer.map(answer_heading).tolist()
            cos, _ = bienc_cosines(
                answers["question_norm"].fillna("").tolist(),
                texts,
                self.bienc,
                cache_root=cache_root,
                batch_size=bp.batch_size,
                read_only=True,
                precision=bp.precision,
            )  # as stage bienc resolves it
            out.update({k: v for k, v in cos.items() if {"bienc_cos": "bienc", "heading_cos": "heading"}[k] in groups})
        if "passage" in groups:
            from medrank.task3.answer_scores import passage_scores

            table, _ = passage_scores(
                answers, self.bienc, cache_root=passage_cache, pp=p.passages, bp=p.bienc, read_only=True
            )
            out["passage_max_cos"] = table["passage_max_cos"].to_numpy()
        if "qtype" in groups:
            from medrank.task3.answer_scores import answer_qtype_scores

            out.update(answer_qtype_scores(answers, self.qtypes))
        if "cnn" in groups:
            from medrank.models.cnn import cnn_answer_scores
            from medrank.text.sentences import split_rule

            scored = cnn_answer_scores(self.cnn, answers, p.cnn.mediqa_aggregation, split_rule)
            out["cnn_score"] = scored["cnn_score"].to_numpy()
        if "qa" in groups:
            from medrank.task3.answer_scores import qa_pairs

            probs = self.qa.predict(qa_pairs(answers), batch_size=p.qa.eval_batch_size, show_progress=False)
            out["qa_score"] = probs[:, 1]
        return out
