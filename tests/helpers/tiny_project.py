"""A tiny trained project (models/ as the stages save it) for `medrank rank` and `medrank serve` tests: tiny random
NLI / RQE cross-encoders and bi-encoder, a MedQuAD table, every saved step, a trained MTL (system.json: mtl) and,
on request, a fitted baseline reading metadata + bienc + passage (the decided system's shape)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from tests.helpers import FIXTURES as FIXTURES_ROOT
from tests.helpers.models import make_tiny_bert

FIXTURES = FIXTURES_ROOT / "mtl"
HIDDEN = 16


def tiny_bert(path: Path) -> Path:
    return make_tiny_bert(
        path,
        vocab=FIXTURES / "vocab.txt",
        hidden_size=HIDDEN,
        num_hidden_layers=1,
        intermediate_size=32,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
    )


def tiny_mtl(max_epochs: int):
    """The smallest MTL recipe the fake grids fit (HIDDEN-wide inputs, no inner split)."""
    from medrank.params import MtlParams

    return MtlParams(
        proj_channels=4,
        conv_channels=[4, 4, 4, 4],
        rqe_dim=4,
        filter_hidden=[8],
        pair_hidden=[8],
        max_epochs=max_epochs,
        inner_val_frac=0.0,
    )


def fake_training_data(seed: int = 0):
    """MTLData with HIDDEN-wide grids / RQE vectors, enough to fit the tiny MTL model's shapes."""
    from medrank.models.mtl import MTLData

    rng = np.random.default_rng(seed)
    cand, pairs, grids, rqe = [], [], [], []
    for q in range(12):
        n = int(rng.integers(2, 5))
        for c in range(n):
            ci = len(cand)
            cand.append(
                dict(
                    gid=f"t:{q}",
                    split="train_liveqa",
                    qid=str(q),
                    aid=f"{q}_{c}",
                    source=str(rng.choice(["medlineplus", "mayoclinic"])),
                    n_sentences=float(rng.integers(1, 9)),
                    chiqa_rank=float(c + 1),
                    answer_text="a",
                    label=float(c == 0 or rng.random() < 0.3),
                    reference_rank=float(c + 1),
                    reference_score=3.0,
                    bienc_cos=rng.random(),
                    heading_cos=rng.random(),
                )
            )
            for e in range(2):
                grids.append(
                    rng.normal(size=(int(rng.integers(1, 4)), int(rng.integers(1, 3)), HIDDEN)).astype(np.float16)
                )
                rqe.append(rng.normal(size=HIDDEN).astype(np.float32))
                pairs.append(
                    dict(
                        cand=ci,
                        entailed=f"rqe:{e}",
                        augmented=0.0,
                        entailed_log_sentences=1.0,
                        rqe_score=rng.random(),
                        anli=rng.random(),
                    )
                )
    return MTLData(pd.DataFrame(cand), pd.DataFrame(pairs), grids, np.stack(rqe))


def build_tiny_project(root: Path) -> Path:
    """`root`/models: the tiny project (system.json: the MTL); returns `root`."""
    from medrank.encoders.cross_encoder import CrossEncoder
    from medrank.core.io import write_sealed_json
    from medrank.models import mtl
    from medrank.params import Params, step_params
    from medrank.task3.retrieval import medquad_documents, saved_documents
    from medrank.task3.qtype import QuestionTypes
    from medrank.steps import save_step
    from medrank.steps.normalize_step import normalizer_state_tables
    from medrank.text.normalize import normalizer_state
    from medrank.text.sentences import split_rule

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    bert = tiny_bert(root / "bert")
    CrossEncoder.from_base(
        str(bert), 3, 32, device="cpu", seed=1, label_names=["entailment", "neutral", "contradiction"], precision="fp32"
    ).save(root / "models" / "nli", extra_meta={"task": "nli"})
    CrossEncoder.from_base(
        str(bert), 2, 32, device="cpu", seed=2, label_names=["not_entailment", "entailment"], precision="fp32"
    ).save(root / "models" / "rqe", extra_meta={"task": "rqe"})
    mq = pd.read_json(FIXTURES / "medquad.jsonl", lines=True)
    mq["question_norm"] = mq["question"]
    mq["answer_norm"] = mq["answer"]
    mq["answer_sentences"] = [split_rule(a) if a else [] for a in mq["answer"]]
    mq["focus"], mq["question_type"] = "topic", "information"

    cfg = tiny_mtl(max_epochs=2)
    data = fake_training_data()
    model = mtl.fit_mtl(
        data, list(pd.unique(data.cand["gid"])), cfg, mtl.builder_factory(["metadata", "bienc", "heading"], 2)(), seed=0
    )
    decision = {
        "ensemble": "mean",
        "rank_by": "pairwise",
        "threshold": None,
        "prior_shift": "none",
        "min_keep": 0,
        "threshold_used": 0.5,
    }
    model.save(root / "models" / "mtl", extra_meta={"decision": decision, "n_candidates": 2})
    recipe = Params(
        device="cpu",
        n_candidates=2,
        normalize={"preferred_names": False},
        retrieve={"bm25_top_k": 4},
        embed={"bi_encoder": str(bert), "max_sentences": 3, "prefilter_top_k": 2},
        encoders={"zero_shot": {"model": str(bert), "max_length": 32}},
    )
    # each step as its stage saves it: all `medrank rank` reads besides the models (no params.yaml, no data/)
    models = root / "models"
    state = normalizer_state_tables(normalizer_state(recipe.normalize))
    save_step("normalize", step_params(recipe, "normalize"), state, models_dir=models)
    docs = saved_documents(medquad_documents(mq, "question_norm", "answer_norm"), "question_norm")
    save_step("retrieve", step_params(recipe, "retrieve"), {"medquad": docs}, models_dir=models)
    save_step("grids", step_params(recipe, "grids"), models_dir=models)
    asks = {"focus": ["flu", "flu", "cold", "cold"], "question_type": ["treatment", "symptoms"] * 2}
    asks["question"] = [f"{w} {f}?" for w, f in zip(["How to treat", "Signs of"] * 2, asks["focus"])]
    qtypes = QuestionTypes(pd.DataFrame(asks), 0).tables()
    save_step("answer_scores", step_params(recipe, "answer_scores"), qtypes, models_dir=models)
    save_step("cnn_scores", step_params(recipe, "cnn_scores"), models_dir=models)
    keep = {"kind": "threshold", "value": 0.5, "min_keep": 0, "target_prior": None}
    write_sealed_json(
        models / "system.json",
        {
            "system": "mtl",
            "mtl_weight": 1.0,
            "keep": {"val": keep, "test": keep},
            "keep_rule": "threshold",
            "order": "rank",
        },
    )
    torch.set_num_threads(n)
    return root


def use_tiny_baseline(
    root: Path, bert: Path | None = None, groups: tuple[str, ...] = ("metadata", "bienc", "passage")
) -> Path:
    """Make `root`'s decided system a baseline fitted on synthetic rows of `groups` (passage: filter only, as the
    real one), like the real decision: MTL weight 0, keep rule threshold with min_keep 1, order rank. `bert`: the
    tiny encoder `build_tiny_project` saved (default root/bert)."""
    from medrank.core.io import write_sealed_json
    from medrank.models.baseline import BaselineConfig, fit_baseline
    from medrank.params import BaselineParams, Params, step_params
    from medrank.steps import save_step

    rng = np.random.default_rng(3)
    rows = []
    for q in range(30):
        quality = rng.normal(size=int(rng.integers(3, 7)))
        for i, x in enumerate(quality):
            rows.append(
                {
                    "gid": f"train_liveqa:{q}",
                    "split": "train_liveqa",
                    "qid": str(q),
                    "aid": f"{q}_{i}",
                    "source": str(rng.choice(["medlineplus", "mayoclinic"])),
                    "n_sentences": float(rng.integers(1, 9)),
                    "chiqa_rank": float(i + 1),
                    "answer_text": "",
                    "label": float(x > 0),
                    "reference_rank": float(np.argsort(np.argsort(-quality))[i] + 1),
                    "reference_score": 3.0 if x > 0 else 1.0,
                    "bienc_cos": 0.5 + 0.1 * x + 0.05 * rng.normal(),
                    "passage_max_cos": 0.5 + 0.1 * x + 0.05 * rng.normal(),
                }
            )
    cfg = BaselineConfig(
        BaselineParams(features=list(groups), filter_only=["passage"] if "passage" in groups else []),
        tuple(groups),
        n_candidates=2,
    )
    model = fit_baseline(pd.DataFrame(rows), cfg)
    for fit in ("final", "val"):
        model.save(root / "models" / "baseline" / f"{fit}.json")
    bert = bert or root / "bert"
    recipe = Params(device="cpu", n_candidates=2, encoders={"zero_shot": {"model": str(bert), "max_length": 32}})
    save_step("passages", step_params(recipe, "passages"), models_dir=root / "models")
    keep = {"kind": "threshold", "value": 0.5, "min_keep": 1, "target_prior": None}
    write_sealed_json(
        root / "models" / "system.json",
        {
            "system": "baseline",
            "mtl_weight": 0.0,
            "keep": {"val": keep, "test": keep},
            "keep_rule": "min_keep_1",
            "order": "rank",
        },
    )
    return root
