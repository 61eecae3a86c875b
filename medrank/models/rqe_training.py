"""The RQE fine-tune's steps (stages finetune_rqe and rqe_selection): its inputs, the model kinds' training and scoring
(one `Trainer` per run: it logs each pretraining's curves and seconds), the final models of the chosen recipe, and the
test pairs' P(entailed) (the cross-encoder's, or the chosen stack's over the same columns the CV measured)."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from medrank.models import rqe

from medrank.models import rqe_choice

BI_MAX_LENGTH = 128  # tokens per question for the bi-encoders (consumer questions run long)
# finetune.rqe keys the selection replaces (analysis.rqe's sets, every row); the others it reads as they are, and
# analysis/dvc.yaml's rqe_selection declares exactly those (tests/pipeline/test_layout.py)
SELECTION_OVERRIDES = ("extra_sets", "bi_encoder_sets", "val_only_rows", "val_stages")
SELECTION_RULE = (
    "best mean CV accuracy over the validation folds (grouped by CHQ); a tie keeps the earlier, simpler row"
)


def selection_params(p):
    """finetune.rqe with analysis.rqe's every candidate row (validation-only and every "> val" row included)."""
    update = {**p.analysis.rqe.model_dump(), "val_only_rows": True, "val_stages": ["cross_encoder", "bi_encoder"]}
    assert set(update) == set(SELECTION_OVERRIDES), update
    return p.finetune.rqe.model_copy(update=update)


@dataclass
class Inputs:
    task: object  # data.tasks.PairTask: the validation (eval) and test pairs
    data: rqe.CvData
    sources: rqe.PairSources
    qtypes: object  # task3.qtype.QuestionTypes
    zero_shot: object  # the zero-shot SentenceEncoder
    cos: np.ndarray  # its cosine of every validation pair


def read_inputs(p, tp) -> Inputs:
    """The Task 2 validation pairs with their CHQ-grouped folds, the training-pair sources, the question types, and the
    zero-shot bi-encoder's cosine of every validation pair."""
    from medrank.core import layout
    from medrank.data.tasks import rqe_task
    from medrank.selection.experiment import grouped_folds
    from medrank.encoders.sentence_encoder import SentenceEncoder
    from medrank.core.io import read_parquet
    from medrank.task3.qtype import QuestionTypes

    table = read_parquet(layout.CLEAN_RQE_PAIRS)
    task = rqe_task(table).capped(tp.max_eval_pairs)
    chq, faq = [a for a, _ in task.eval_pairs], [b for _, b in task.eval_pairs]
    data = rqe.CvData(chq, faq, task.eval_labels, grouped_folds(np.asarray(chq), tp.folds, p.seed))
    medquad = read_parquet(layout.CLEAN_MEDQUAD)
    qtypes = QuestionTypes(medquad, p.seed)  # BLAS threads fixed inside
    sources = rqe.PairSources(
        amia=table[table["split"] == "train"],
        meqsum=read_parquet(layout.CLEAN_MEQSUM),
        liveqa=read_parquet(layout.CLEAN_LIVEQA_QUESTIONS),
        medquad=medquad,
        medquad_pairs=tp.medquad_pairs,
        hard_negatives=tp.hard_negatives,
        easy_negatives=tp.easy_negatives,
        max_pairs=tp.max_train_pairs,
    )
    zero_shot = SentenceEncoder(tp.bi_encoder, device=p.device, max_length=BI_MAX_LENGTH)
    cos = (zero_shot.encode(chq) * zero_shot.encode(faq)).sum(1)  # unit vectors
    return Inputs(task, data, sources, qtypes, zero_shot, cos)


@dataclass
class Trainer:
    """Trains and scores both model kinds for `rqe_choice.select` with finetune.rqe's knobs `tp`; the cross-encoder's training
    precision (`auto`: the hardware's flags) is the bi-encoder's too (the cross-encoder family trains first)."""

    p: object
    tp: object
    data: rqe.CvData
    live: object  # dvclive: each pretraining's curves
    seconds: dict[str, float] = field(default_factory=dict)
    precision: str | None = None

    def __post_init__(self) -> None:
        self.precision = None if self.tp.train_precision == "auto" else self.tp.train_precision

    def fresh_ce(self):
        from medrank.data.tasks import RQE_LABELS
        from medrank.encoders.cross_encoder import CrossEncoder

        tp = self.tp
        return CrossEncoder.from_base(
            tp.base_model,
            2,
            tp.max_length,
            device=self.p.device,
            seed=self.p.seed,
            label_names=RQE_LABELS,
            precision=tp.predict_precision,
        )

    def fresh_bi(self):
        from medrank.encoders.runtime import set_seed
        from medrank.encoders.sentence_encoder import SentenceEncoder

        set_seed(self.p.seed)
        return SentenceEncoder(self.tp.bi_encoder, device=self.p.device, max_length=BI_MAX_LENGTH)

    def fit_ce(self, model, pairs, y, epochs: int, lr: float, **kw):
        tp = self.tp
        model.fit(
            pairs,
            y,
            epochs=epochs,
            lr=lr,
            batch_size=tp.batch_size,
            warmup_ratio=tp.warmup_ratio,
            weight_decay=tp.weight_decay,
            seed=self.p.seed,
            precision=tp.train_precision,
            threads=tp.threads,
            **kw,
        )
        self.precision = self.precision or model.train_precision
        return model

    def fit_bi(self, model, pairs, y, epochs: int, lr: float, **kw):
        tp = self.tp
        return model.fit(
            pairs,
            y,
            epochs=epochs,
            lr=lr,
            batch_size=tp.batch_size,
            seed=self.p.seed,
            warmup_ratio=tp.warmup_ratio,
            weight_decay=tp.weight_decay,
            precision=self.precision or "fp32",
            **kw,
        )

    def pretrain_ce(self, pairs, y, name: str):
        # curves per source set: the validation pairs are held out from this step, so they are a fair eval
        from medrank.encoders.curves import CURVES, live_step_logger

        t0 = time.perf_counter()
        keys = {k: f"{name}/{v}" for k, v in CURVES.items()}
        model = self.fit_ce(
            self.fresh_ce(),
            pairs,
            y,
            self.tp.epochs,
            self.tp.lr,
            eval_pairs=self.data.pairs,
            eval_labels=self.data.y,
            eval_every=self.tp.eval_every,
            step_callback=live_step_logger(self.live, keys),
        )
        self.seconds[f"pretrain {name}"] = round(time.perf_counter() - t0, 1)
        return model

    def pretrain_bi(self, pairs, y, name: str):
        t0 = time.perf_counter()
        model = self.fresh_bi()
        for h in self.fit_bi(model, pairs, y, self.tp.epochs, self.tp.lr):
            self.live.step = h["epoch"]
            self.live.log_metric(f"{name}/train/loss", h["train_loss"])
        self.seconds[f"pretrain {name}"] = round(time.perf_counter() - t0, 1)
        return model

    def val_ce(self, pairs, y, init):
        model = copy.deepcopy(init) if init is not None else self.fresh_ce()
        return self.fit_ce(model, pairs, y, self.tp.val_epochs, self.tp.val_lr, show_progress=False)

    def val_bi(self, pairs, y, init):
        model = copy.deepcopy(init) if init is not None else self.fresh_bi()
        self.fit_bi(model, pairs, y, self.tp.val_epochs, self.tp.val_lr, show_progress=False)
        return model

    def predict_ce(self, model, pairs) -> np.ndarray:
        return model.predict(pairs, batch_size=self.tp.eval_batch_size, show_progress=False)[:, 1]

    @staticmethod
    def predict_bi(model, pairs) -> np.ndarray:
        return (model.encode([a for a, _ in pairs]) * model.encode([b for _, b in pairs])).sum(1)

    def families(self) -> list[rqe_choice.Family]:
        tp = self.tp
        out = [
            rqe_choice.Family(
                "cross_encoder",
                tp.extra_sets,
                self.pretrain_ce,
                self.val_ce,
                self.predict_ce,
                "cross_encoder" in tp.val_stages,
            )
        ]
        if tp.bi_encoder_sets:
            out.append(
                rqe_choice.Family(
                    "bi_encoder",
                    tp.bi_encoder_sets,
                    self.pretrain_bi,
                    self.val_bi,
                    self.predict_bi,
                    "bi_encoder" in tp.val_stages,
                )
            )
        return out

    def select(self, inputs: Inputs) -> rqe_choice.Selection:
        t0 = time.perf_counter()
        sel = rqe_choice.select(
            inputs.data,
            inputs.sources,
            inputs.qtypes,
            self.families(),
            inputs.cos,
            self.p.seed,
            val_only=self.tp.val_only_rows,
        )
        self.seconds["selection"] = round(time.perf_counter() - t0, 1)
        return sel

    def final_models(self, sel: rqe_choice.Selection) -> tuple[object, tuple, object | None]:
        """(cross-encoder, its recipe, bi-encoder or None): the chosen recipe's (and the best cross-encoder: retrieval
        always needs one), trained on every validation pair."""
        t0 = time.perf_counter()

        def final(kind: str, recipe: tuple[tuple[str, ...], bool], train):
            extras, val_stage = recipe
            init = sel.pretrained.get((kind, extras))
            return train(self.data.pairs, self.data.y, init) if val_stage else init

        ce_recipe = sel.recipe.ce or sel.best_ce
        final_ce = final("cross_encoder", ce_recipe, self.val_ce)
        final_bi = final("bi_encoder", sel.recipe.bi, self.val_bi) if sel.recipe.bi else None
        self.seconds["final"] = round(time.perf_counter() - t0, 1)
        return final_ce, ce_recipe, final_bi


def selection_metrics(sel: rqe_choice.Selection, data: rqe.CvData, seconds: dict) -> dict:
    """metrics/rqe_selection.json: every row and the rule's choice (`medrank report` checks that finetune.rqe, as
    metrics/finetune_rqe.json's `trained` records it, holds the choice: models.rqe_choice.missing_from_default)."""
    recipe = sel.recipe.as_dict()
    return {
        "chosen": sel.chosen,
        "recipe": {**recipe, "best_cross_encoder": {"extras": list(sel.best_ce[0]), "val_stage": sel.best_ce[1]}},
        "selection_rule": SELECTION_RULE,
        "vs": rqe_choice.paired_differences(sel, data),
        "rows": sel.rows,
        "n_val_pairs": len(data.y),
        "n_val_questions": len(set(data.chq)),
        "n_pretrain_pairs": sel.pretrain_pairs,
        "seconds": seconds,
    }


def final_recipe(sel: rqe_choice.Selection, ce_recipe: tuple, stack: dict | None) -> dict:
    """The chosen recipe as the final models were trained: the row's recipe, the cross-encoder's extras and validation
    stage, the stack's saved form (None: the cross-encoder alone)."""
    return {
        **sel.recipe.as_dict(),
        "cross_encoder": {"extras": list(ce_recipe[0]), "val_stage": ce_recipe[1]},
        "stack": stack,
    }


def final_metrics(
    sel: rqe_choice.Selection, inputs: Inputs, trainer: Trainer, final_ce, recipe: dict, test_prob: np.ndarray
) -> dict:
    """metrics/finetune_rqe.json, less the saved models' fingerprints: the choice and its CV row, the rows this stage
    trains, every row, the question types, and the final cross-encoder's training and speed."""
    tp, data, qtypes, chosen = trainer.tp, inputs.data, inputs.qtypes, sel.rows[sel.chosen]
    return {
        "task": "rqe",
        "base_model": tp.base_model,
        "base_fingerprint": final_ce.base_fingerprint,
        "chosen": sel.chosen,
        # the rows this stage trains (finetune.rqe): analysis rqe_selection's choice must be among them
        "trained": {"extra_sets": tp.extra_sets, "bi_encoder_sets": tp.bi_encoder_sets, "val_stages": tp.val_stages},
        "recipe": recipe,
        "selection_rule": SELECTION_RULE,
        "cv": {k: chosen[k] for k in ("accuracy", "accuracy_sd", "auc", "same_focus", "by_overlap")},
        "vs": rqe_choice.paired_differences(sel, data),
        "rows": sel.rows,
        "n_val_pairs": len(data.y),
        "n_val_questions": int(pd.Series(data.chq).nunique()),
        "n_pretrain_pairs": sel.pretrain_pairs,
        "question_types": {
            "types": qtypes.types,
            "val_faq_types": pd.Series(qtypes.predict(data.faq)).value_counts().to_dict(),
        },
        "train_precision": trainer.precision,
        "threads": final_ce.threads,
        "seconds": trainer.seconds,
        "predict_speed": dict(final_ce.last_predict_stats),
        "test_mean_prob": round(float(test_prob.mean()), 4) if len(test_prob) else None,
    }


def test_probabilities(
    sel: rqe_choice.Selection, inputs: Inputs, trainer: Trainer, final_ce, final_bi
) -> tuple[np.ndarray, dict | None]:
    """P(entailed) of the test pairs and the stack's saved form (None: the cross-encoder alone). A stack is a logistic
    regression over the chosen row's out-of-fold columns, as the CV measured it; retrieval
    (medrank.task3.retrieval.stacked_rqe_scores) rebuilds the same columns for every MedQuAD candidate."""
    from medrank.core import layout

    pairs = inputs.task.test_pairs
    t_chq, t_faq = [a for a, _ in pairs], [b for _, b in pairs]
    ce_test = trainer.predict_ce(final_ce, pairs) if pairs else np.zeros(0)
    if sel.recipe.features == ("ce",):
        return ce_test, None
    feats = list(sel.recipe.features)
    combiner = rqe.fit_stack(rqe.stack_features(sel.columns, feats), inputs.data.y, trainer.p.seed)
    cols = {"ce": ce_test}
    if "cosine" in feats:
        enc = final_bi or inputs.zero_shot
        cols["cosine"] = (enc.encode(t_chq) * enc.encode(t_faq)).sum(1) if t_chq else np.zeros(0)
    if "qtype" in feats:
        cols["qtype"] = inputs.qtypes.agreement(t_chq, t_faq)
    prob = combiner.predict_proba(rqe.stack_features(cols, feats))[:, 1] if t_chq else ce_test
    coef, intercept = rqe.linear_form(combiner)
    stack = {
        "features": feats,
        "coef": [round(float(c), 8) for c in coef],
        "intercept": round(intercept, 8),
        # a fine-tuned bi-encoder is saved inside the cross-encoder's folder (local); else the zero-shot one by name
        "bi_encoder": layout.RQE_BI_MODEL.name if final_bi else trainer.tp.bi_encoder,
        "bi_encoder_local": final_bi is not None,
        "max_length": BI_MAX_LENGTH,
        "seed": trainer.p.seed,
    }
    return prob, stack


def task2_probs(sel: rqe_choice.Selection, inputs: Inputs, test_prob: np.ndarray) -> pd.DataFrame:
    """data/processed/task2_probs.parquet: the chosen row's out-of-fold P(entailed) of the validation pairs (honest:
    the final model has seen every validation pair) with their folds, and the final model's of the test pairs."""
    task, data = inputs.task, inputs.data
    t_chq = [a for a, _ in task.test_pairs]
    val = pd.DataFrame(
        {
            "split": "val",
            "pair_id": task.eval_ids,
            "chq": data.chq,
            "prob": sel.oof,
            "label": data.y,
            "fold": data.folds,
        }
    )
    test = pd.DataFrame(
        {"split": "test", "pair_id": task.test_ids, "chq": t_chq, "prob": test_prob, "label": -1, "fold": -1}
    )
    return pd.concat([val, test], ignore_index=True)
