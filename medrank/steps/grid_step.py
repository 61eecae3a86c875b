"""The grid step: NLI sentence grids of every (candidate answer, entailed answer) pair (stage embed)."""

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
class GridStep(Composable):
    """NLI sentence grids of every (candidate answer, entailed answer) pair (params.embed)."""

    p: Params  # embed
    nli: Any  # CrossEncoder
    prefilter: Any | None  # SentenceEncoder of embed.bi_encoder, with embed.prefilter_top_k

    @classmethod
    def fit(cls, p: Params, nli: Any, device: str = "auto") -> "GridStep":
        from medrank.encoders.sentence_encoder import SentenceEncoder

        ep = p.embed
        return cls(p, nli, SentenceEncoder(ep.bi_encoder, device=device) if ep.prefilter_top_k is not None else None)

    def save(self, models_dir: str | os.PathLike = layout.MODELS) -> Path:
        from medrank.params import step_params

        return save_step("grids", step_params(self.p, "grids"), None, models_dir)

    @classmethod
    def load(cls, models_dir: str | os.PathLike = layout.MODELS, device: str = "auto") -> "GridStep":
        from medrank.encoders.cross_encoder import CrossEncoder

        p = load_recipe({"grids": load_step("grids", models_dir)}, str(models_dir))
        path = model_dir(Path(models_dir) / layout.NLI_MODEL.name, "nli", "finetune_nli")
        return cls.fit(p, CrossEncoder.load(path, device=device, precision=p.embed.precision, task="nli"), device)

    def grids(self, answers: pd.DataFrame, retrieved: pd.DataFrame, cache_root: str | os.PathLike, **kw: Any):
        """medrank.task3.grids.Grids of `answers` (normalized answers: split, qid, aid, reference_rank, answer_sentences)
        against `retrieved` (the retrieve step's table: entailed_sentences); `kw`: read_only, show_progress,
        shard_size, backend."""
        from medrank.task3.grids import answer_grids

        ep = self.p.embed
        return answer_grids(
            answers[["split", "qid", "aid", "reference_rank", "answer_sentences"]].rename(
                columns={"answer_sentences": "sentences"}
            ),
            retrieved.rename(columns={"entailed_sentences": "sentences"}),
            self.nli,
            cache_root,
            max_sentences=ep.max_sentences,
            prefilter_top_k=ep.prefilter_top_k,
            bi=self.prefilter,
            augment_top=ep.augment_top,
            precision=ep.precision,
            batch_size=ep.batch_size,
            bi_batch_size=ep.bi_batch_size,
            **kw,
        )

    def transform(self, frame: Frame) -> Frame:
        """The frame with the NLI grid rows of its answers against its entailed answers (the cache: read only)."""
        if frame.retrieved is None:
            from medrank.core.errors import MedrankError

            raise MedrankError("the grid step needs the retrieve step's entailed answers: compose retrieve >> grids")
        grids = self.grids(frame.answers, frame.retrieved, layout.CACHE_EMBED, read_only=True, show_progress=False)
        return frame.with_(grid=grids.rows)
