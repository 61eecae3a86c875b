"""Choosing the RQE recipe (stage finetune_rqe, analysis rqe_selection): model families (cross-/bi-encoder, training
sets, validation stage), every candidate row's CV, the written rule's selection among them, and what a default needs
that a trained one lacks."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from medrank.data.mining import Pair
from medrank.core.errors import MedrankError
from medrank.task3.qtype import QuestionTypes
from medrank.models.rqe import (
    CvData,
    PairSources,
    PredictFn,
    TrainFn,
    check_row_sources,
    cv_scores,
    mixed,
    row_name,
    row_report,
    stack_features,
    stack_oof,
)

log = logging.getLogger(__name__)

KINDS = {"cross_encoder": "ce", "bi_encoder": "bi"}  # model kind -> row-name tag
ZERO_SHOT = "zero-shot bi-encoder cosine"


@dataclass
class Family:
    """One model kind's rows: each set of extra sources trains a model (`pretrain`), scored alone and after
    `train_val` on the other folds' validation pairs; plus `train_val` from the base model (validation pairs only).
    `predict` gives P(entailed) (cross-encoder) or a cosine (bi-encoder: calibrated on the other folds)."""

    kind: str
    sets: Sequence[Sequence[str]]
    pretrain: Callable[[list[Pair], np.ndarray, str], object]
    train_val: TrainFn
    predict: PredictFn
    val_stage: bool = True  # also the "> val" rows (a fine-tune per fold and set); off: the pretrained rows only


@dataclass
class Recipe:
    """How a row's score is made: `ce`/`bi` = (extra sources, then validation pairs?) of the model it uses
    (bi None with 'cosine' = the zero-shot encoder); `features` = what its logistic regression combines (["ce"] alone:
    the cross-encoder's own P, no regression)."""

    features: tuple[str, ...]
    ce: tuple[tuple[str, ...], bool] | None = None
    bi: tuple[tuple[str, ...], bool] | None = None

    def as_dict(self) -> dict:
        part = lambda r: None if r is None else {"extras": list(r[0]), "val_stage": r[1]}
        return {"features": list(self.features), "cross_encoder": part(self.ce), "bi_encoder": part(self.bi)}


@dataclass
class Selection:
    """What `select` measured and chose."""

    rows: dict[str, dict]
    chosen: str
    recipe: Recipe  # the chosen row's
    best_ce: tuple[tuple[str, ...], bool]  # the best cross-encoder row's recipe: retrieval always needs a cross-encoder
    oof: np.ndarray  # out-of-fold P(entailed) of the chosen row (the honest validation predictions)
    columns: dict[str, np.ndarray]  # out-of-fold feature columns of the chosen row (fit the final combiner on them)
    pretrained: dict[tuple[str, tuple[str, ...]], object]  # (kind, sources) -> pretrained model, for the final fits
    pretrain_pairs: dict[str, int] = field(default_factory=dict)


def _better(a: dict, b: dict | None) -> bool:
    """Row `a` beats `b` on the CV: higher mean accuracy (a tie keeps the earlier, simpler row)."""
    return b is None or a["accuracy"] > b["accuracy"] + 1e-9


def select(
    data: CvData,
    sources: PairSources,
    qtypes: QuestionTypes,
    families: Sequence[Family],
    zero_shot_cos: np.ndarray,
    seed: int,
    val_only: bool = True,
) -> Selection:
    """Every row side by side (see the module docstring) and the choice: the row with the best mean CV accuracy,
    among the cross-encoder rows, the bi-encoder rows (cosine calibrated on the other folds), the zero-shot cosine
    and the stacks of the best cross-encoder with the best cosine (and the question-type agreement)."""
    rows: dict[str, dict] = {}
    scores: dict[str, tuple[str, np.ndarray, Recipe, np.ndarray]] = {}  # name -> (kind, raw score, recipe, P)
    pretrained: dict[tuple[str, tuple[str, ...]], object] = {}
    n_pairs: dict[str, int] = {}
    cache: dict[tuple[str, ...], tuple[list[Pair], np.ndarray]] = {}

    def add(name: str, kind: str, raw: np.ndarray, recipe: Recipe) -> None:
        prob = raw if kind == "cross_encoder" else stack_oof(data, raw[:, None], seed)
        rows[name] = {"kind": kind, "recipe": recipe.as_dict(), **row_report(data, prob)}
        scores[name] = (kind, raw, recipe, prob)
        log.info(
            "rqe row %-45s CV accuracy %.3f ± %.3f (same-focus %.3f)",
            name,
            rows[name]["accuracy"],
            rows[name]["accuracy_sd"],
            rows[name]["same_focus"]["accuracy"] or float("nan"),
        )

    add(ZERO_SHOT, "cosine", zero_shot_cos, Recipe(("cosine",)))
    for fam in families:
        check_row_sources(fam.sets)
        tag, feat = KINDS[fam.kind], ("ce" if fam.kind == "cross_encoder" else "cosine")
        recipe = lambda key, v: Recipe((feat,), **{tag: (key, v)})
        if val_only:
            add(
                f"{tag}: {row_name((), True)}",
                fam.kind,
                cv_scores(data, None, fam.train_val, fam.predict),
                recipe((), True),
            )
        for srcs in fam.sets:
            key = tuple(srcs)
            if key not in cache:
                parts = [sources.pairs(s, qtypes, seed) for s in key]
                for s, (ps, _) in zip(key, parts):
                    n_pairs[s] = len(ps)
                cache[key] = mixed(parts, seed)
            model = fam.pretrain(*cache[key], f"{tag}/{'+'.join(key)}")
            pretrained[(fam.kind, key)] = model
            add(f"{tag}: {row_name(key, False)}", fam.kind, fam.predict(model, data.pairs), recipe(key, False))
            if fam.val_stage:
                add(
                    f"{tag}: {row_name(key, True)}",
                    fam.kind,
                    cv_scores(data, model, fam.train_val, fam.predict),
                    recipe(key, True),
                )

    def best(kinds: tuple[str, ...]) -> str | None:
        out = None
        for name, r in rows.items():
            if r["kind"] in kinds and _better(r, rows.get(out) if out else None):
                out = name
        return out

    ce_name, cos_name = best(("cross_encoder",)), best(("bi_encoder", "cosine"))
    if ce_name is None:
        raise MedrankError(
            "finetune.rqe: no cross-encoder row (retrieval needs one): give the cross-encoder family a set"
        )
    qt = qtypes.agreement(data.chq, data.faq)
    if cos_name is not None:
        base = {"ce": scores[ce_name][1], "cosine": scores[cos_name][1], "qtype": qt}
        for feats in (("ce", "cosine"), ("ce", "cosine", "qtype")):
            recipe = Recipe(feats, ce=scores[ce_name][2].ce, bi=scores[cos_name][2].bi)
            name = f"stack: {ce_name} + {cos_name}" + (" + question type" if "qtype" in feats else "")
            prob = stack_oof(data, stack_features(base, feats), seed)
            rows[name] = {"kind": "stack", "recipe": recipe.as_dict(), **row_report(data, prob)}
            scores[name] = ("stack", base, recipe, prob)
    chosen = best(("cross_encoder", "bi_encoder", "cosine", "stack"))
    kind, raw, recipe, prob = scores[chosen]
    columns = raw if kind == "stack" else {recipe.features[0]: raw}
    needed = {("cross_encoder", scores[ce_name][2].ce[0])} | ({("bi_encoder", recipe.bi[0])} if recipe.bi else set())
    keep = {k: m for k, m in pretrained.items() if k in needed}
    return Selection(rows, chosen, recipe, scores[ce_name][2].ce, prob, columns, keep, n_pairs)


def missing_from_default(recipe: dict, trained: dict) -> dict[str, list]:
    """What finetune.rqe lacks of analysis rqe_selection's choice: `recipe` = metrics/rqe_selection.json's (with
    `best_cross_encoder`: retrieval always needs a cross-encoder), `trained` = metrics/finetune_rqe.json's (extra_sets,
    bi_encoder_sets, val_stages). Empty: the default trains the chosen row and the best cross-encoder."""
    ce, bi = recipe.get("best_cross_encoder") or {}, recipe.get("bi_encoder") or {}
    needed = {
        "extra_sets": [ce["extras"]] if ce.get("extras") else [],
        "bi_encoder_sets": [bi["extras"]] if bi.get("extras") else [],
        "val_stages": [k for k, part in (("cross_encoder", ce), ("bi_encoder", bi)) if part.get("val_stage")],
    }
    missing = {k: [s for s in v if s not in (trained.get(k) or [])] for k, v in needed.items()}
    return {k: v for k, v in missing.items() if v}


def paired_differences(sel: Selection, data: CvData, baselines: Sequence[str] = ("ce: amia", ZERO_SHOT)) -> dict:
    """Chosen row minus each baseline row, per fold (the same folds: a paired comparison), on all pairs and on the
    same-focus pairs: mean and sd of the per-fold differences."""
    out = {}
    chosen = sel.rows[sel.chosen]
    for name in baselines:
        if name not in sel.rows or name == sel.chosen:
            continue
        row = sel.rows[name]
        d_all = np.subtract(chosen["accuracy_folds"], row["accuracy_folds"])
        d_same = np.subtract(chosen["same_focus"]["accuracy_folds"], row["same_focus"]["accuracy_folds"])
        out[name] = {
            "accuracy_diff": round(float(d_all.mean()), 4),
            "accuracy_diff_sd": round(float(d_all.std(ddof=1)), 4) if len(d_all) > 1 else None,
            "same_focus_diff": round(float(d_same.mean()), 4),
            "same_focus_diff_sd": round(float(d_same.std(ddof=1)), 4) if len(d_same) > 1 else None,
        }
    return out
