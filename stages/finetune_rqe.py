"""DVC stage `finetune_rqe`: RQE for consumer questions, selected where the users' questions are.

The stage trains the rows of `finetune.rqe` (the sets analysis/dvc.yaml's `rqe_selection` chose: `main(selection=True)`
measures every candidate row of `analysis.rqe` the same way, writes metrics/rqe_selection.json and trains no final model).
Every row of models/rqe.py is measured by question-grouped CV over the 302 Task 2 validation pairs (the only
labelled pairs with consumer CHQs; folds grouped by CHQ): each set of extra training sources alone ("amia" alone is
yesterday's recipe), each set then fine-tuned on the other folds' validation pairs, validation pairs only, the
zero-shot bi-encoder cosine, and stacks with the cosine and the question-type agreement. The row with the best mean
CV accuracy is kept; the final model is that recipe trained on every validation pair (its pretrained first step is
the one the CV already trained). data/processed/task2_probs.parquet holds the chosen row's out-of-fold P(entailed) of
the validation pairs (honest: the final model has seen every validation pair) with their folds, and the final model's
P(entailed) of the test pairs: stage `task2` decides them within each CHQ and writes the submissions.
"""

import copy
import logging
import time

from medrank.runner import run

log = logging.getLogger("stages.finetune_rqe")
BI_MAX_LENGTH = 128  # tokens per question for the bi-encoders (consumer questions run long)
# finetune.rqe keys the selection (main(selection=True)) replaces: analysis.rqe's sets, every row; the others it reads as
# they are, and analysis/dvc.yaml's rqe_selection declares exactly those (tests/test_layout.py)
SELECTION_OVERRIDES = ("extra_sets", "bi_encoder_sets", "val_only_rows", "val_stages")
SELECTION_RULE = "best mean CV accuracy over the validation folds (grouped by CHQ); a tie keeps the earlier, simpler row"


def selection_metrics(sel, data, seconds: dict) -> dict:
    """metrics/rqe_selection.json: every row and the rule's choice (`medrank report` checks that finetune.rqe, as
    metrics/finetune_rqe.json's `trained` records it, holds the choice: models.rqe.missing_from_default)."""
    from medrank.models import rqe

    recipe = sel.recipe.as_dict()
    return {
        "chosen": sel.chosen,
        "recipe": {**recipe, "best_cross_encoder": {"extras": list(sel.best_ce[0]), "val_stage": sel.best_ce[1]}},
        "selection_rule": SELECTION_RULE,
        "vs": rqe.paired_differences(sel, data),
        "rows": sel.rows,
        "n_val_pairs": len(data.y),
        "n_val_questions": len(set(data.chq)),
        "n_pretrain_pairs": sel.pretrain_pairs,
        "seconds": seconds,
    }


def main(params_path: str = "params.yaml", selection: bool = False) -> None:
    import numpy as np
    import pandas as pd
    from dvclive import Live

    from medrank import layout
    from medrank.data.tasks import RQE_LABELS, rqe_task
    from medrank.decision import grouped_folds
    from medrank.encoders.base import set_seed
    from medrank.encoders.cross_encoder import CrossEncoder
    from medrank.encoders.curves import CURVES, live_step_logger
    from medrank.encoders.sentence_encoder import SentenceEncoder
    from medrank.io import read_parquet, write_json, write_parquet
    from medrank.models import rqe
    from medrank.params import load_params
    from medrank.task2 import PROBS_SCHEMA

    p = load_params(params_path)
    tp = p.finetune.rqe
    trained = {"extra_sets": tp.extra_sets, "bi_encoder_sets": tp.bi_encoder_sets, "val_stages": tp.val_stages}
    if selection:  # every candidate row (analysis.rqe), validation-only and every "> val" row included
        update = {**p.analysis.rqe.model_dump(), "val_only_rows": True, "val_stages": ["cross_encoder", "bi_encoder"]}
        assert set(update) == set(SELECTION_OVERRIDES), update
        tp = tp.model_copy(update=update)
    table = read_parquet(layout.CLEAN_RQE_PAIRS)
    task = rqe_task(table).capped(tp.max_eval_pairs)
    chq, faq = [a for a, _ in task.eval_pairs], [b for _, b in task.eval_pairs]
    data = rqe.CvData(chq, faq, task.eval_labels, grouped_folds(np.asarray(chq), tp.folds, p.seed))
    medquad = read_parquet(layout.CLEAN_MEDQUAD)
    qtypes = rqe.QuestionTypes(medquad, p.seed)  # BLAS threads fixed inside
    sources = rqe.PairSources(
        amia=table[table["split"] == "train"], meqsum=read_parquet(layout.CLEAN_MEQSUM), liveqa=read_parquet(layout.CLEAN_LIVEQA_QUESTIONS),
        medquad=medquad, medquad_pairs=tp.medquad_pairs, hard_negatives=tp.hard_negatives, easy_negatives=tp.easy_negatives,
        max_pairs=tp.max_train_pairs,
    )  # fmt: skip
    zero_shot = SentenceEncoder(tp.bi_encoder, device=p.device, max_length=BI_MAX_LENGTH)
    cos = (zero_shot.encode(chq) * zero_shot.encode(faq)).sum(1)  # unit vectors
    seconds: dict[str, float] = {}

    def fresh_ce() -> CrossEncoder:
        return CrossEncoder.from_base(tp.base_model, 2, tp.max_length, device=p.device, seed=p.seed, label_names=RQE_LABELS,
                                      precision=tp.predict_precision)  # fmt: skip

    def fresh_bi() -> SentenceEncoder:
        set_seed(p.seed)
        return SentenceEncoder(tp.bi_encoder, device=p.device, max_length=BI_MAX_LENGTH)

    # training precision: the cross-encoder's (`auto`: the hardware's flags) is the bi-encoder's too (the
    # cross-encoder family trains first); an explicit train_precision is used as it is
    precision = {"train": None if tp.train_precision == "auto" else tp.train_precision}

    def fit_ce(model: CrossEncoder, pairs, y, epochs: int, lr: float, **kw) -> CrossEncoder:
        model.fit(pairs, y, epochs=epochs, lr=lr, batch_size=tp.batch_size, warmup_ratio=tp.warmup_ratio, weight_decay=tp.weight_decay,
                  seed=p.seed, precision=tp.train_precision, threads=tp.threads, **kw)  # fmt: skip
        precision["train"] = precision["train"] or model.train_precision
        return model

    def fit_bi(model: SentenceEncoder, pairs, y, epochs: int, lr: float) -> SentenceEncoder:
        model.fit(pairs, y, epochs=epochs, lr=lr, batch_size=tp.batch_size, seed=p.seed, warmup_ratio=tp.warmup_ratio,
                  weight_decay=tp.weight_decay, precision=precision["train"] or "fp32", show_progress=False)  # fmt: skip
        return model

    with Live(dir=str(layout.plots_dir("rqe_selection" if selection else "finetune_rqe")), dvcyaml=None, save_dvc_exp=False) as live:
        live.log_params(tp.model_dump())

        def pretrain_ce(pairs, y, name: str) -> CrossEncoder:
            # curves per source set: the validation pairs are held out from this step, so they are a fair eval
            t0 = time.perf_counter()
            keys = {k: f"{name}/{v}" for k, v in CURVES.items()}
            model = fit_ce(fresh_ce(), pairs, y, tp.epochs, tp.lr, eval_pairs=data.pairs, eval_labels=data.y, eval_every=tp.eval_every,
                           step_callback=live_step_logger(live, keys))  # fmt: skip
            seconds[f"pretrain {name}"] = round(time.perf_counter() - t0, 1)
            return model

        def pretrain_bi(pairs, y, name: str) -> SentenceEncoder:
            t0 = time.perf_counter()
            model = fresh_bi()
            history = model.fit(pairs, y, epochs=tp.epochs, lr=tp.lr, batch_size=tp.batch_size, seed=p.seed, warmup_ratio=tp.warmup_ratio,
                                weight_decay=tp.weight_decay, precision=precision["train"] or "fp32")  # fmt: skip
            for h in history:
                live.step = h["epoch"]
                live.log_metric(f"{name}/train/loss", h["train_loss"])
            seconds[f"pretrain {name}"] = round(time.perf_counter() - t0, 1)
            return model

        def val_ce(pairs, y, init):
            return fit_ce(copy.deepcopy(init) if init is not None else fresh_ce(), pairs, y, tp.val_epochs, tp.val_lr, show_progress=False)

        def val_bi(pairs, y, init):
            return fit_bi(copy.deepcopy(init) if init is not None else fresh_bi(), pairs, y, tp.val_epochs, tp.val_lr)

        def predict_ce(model: CrossEncoder, pairs) -> np.ndarray:
            return model.predict(pairs, batch_size=tp.eval_batch_size, show_progress=False)[:, 1]

        def predict_bi(model: SentenceEncoder, pairs) -> np.ndarray:
            return (model.encode([a for a, _ in pairs]) * model.encode([b for _, b in pairs])).sum(1)

        families = [rqe.Family("cross_encoder", tp.extra_sets, pretrain_ce, val_ce, predict_ce, "cross_encoder" in tp.val_stages)]
        if tp.bi_encoder_sets:
            families.append(rqe.Family("bi_encoder", tp.bi_encoder_sets, pretrain_bi, val_bi, predict_bi, "bi_encoder" in tp.val_stages))
        t0 = time.perf_counter()
        sel = rqe.select(data, sources, qtypes, families, cos, p.seed, val_only=tp.val_only_rows)
        seconds["selection"] = round(time.perf_counter() - t0, 1)
        if selection:
            live.log_metric("cv/accuracy", sel.rows[sel.chosen]["accuracy"], plot=False)
            write_json(layout.metrics_file("rqe_selection"), selection_metrics(sel, data, seconds))
            return

        # the final models: the chosen recipe's (and the best cross-encoder: retrieval always needs one), every validation pair
        t0 = time.perf_counter()

        def final(kind: str, recipe: tuple[tuple[str, ...], bool], train):
            extras, val_stage = recipe
            init = sel.pretrained.get((kind, extras))
            return train(data.pairs, data.y, init) if val_stage else init

        ce_recipe = sel.recipe.ce or sel.best_ce
        final_ce = final("cross_encoder", ce_recipe, val_ce)
        final_bi = final("bi_encoder", sel.recipe.bi, val_bi) if sel.recipe.bi else None
        seconds["final"] = round(time.perf_counter() - t0, 1)
        live.log_metric("cv/accuracy", sel.rows[sel.chosen]["accuracy"], plot=False)

    t_chq, t_faq = [a for a, _ in task.test_pairs], [b for _, b in task.test_pairs]
    ce_test = predict_ce(final_ce, task.test_pairs) if task.test_pairs else np.zeros(0)
    speed = dict(final_ce.last_predict_stats)
    stack = None
    test_prob = ce_test
    if sel.recipe.features != ("ce",):
        # a logistic regression over the chosen row's out-of-fold columns, as the CV measured it; retrieval
        # (medrank.retrieval.stacked_rqe_scores) rebuilds the same columns for every MedQuAD candidate
        feats = list(sel.recipe.features)
        combiner = rqe.fit_stack(rqe.stack_features(sel.columns, feats), data.y, p.seed)
        cols = {"ce": ce_test}
        if "cosine" in feats:
            enc = final_bi or zero_shot
            cols["cosine"] = (enc.encode(t_chq) * enc.encode(t_faq)).sum(1) if t_chq else np.zeros(0)
        if "qtype" in feats:
            cols["qtype"] = qtypes.agreement(t_chq, t_faq)
        if t_chq:
            test_prob = combiner.predict_proba(rqe.stack_features(cols, feats))[:, 1]
        coef, intercept = rqe.linear_form(combiner)
        stack = {"features": feats, "coef": [round(float(c), 8) for c in coef], "intercept": round(intercept, 8),
                 # a fine-tuned bi-encoder is saved inside the cross-encoder's folder (local); else the zero-shot one by name
                 "bi_encoder": layout.RQE_BI_MODEL.name if final_bi else tp.bi_encoder, "bi_encoder_local": final_bi is not None,
                 "max_length": BI_MAX_LENGTH, "seed": p.seed}  # fmt: skip
    probs = pd.concat([
        pd.DataFrame({"split": "val", "pair_id": task.eval_ids, "chq": chq, "prob": sel.oof, "label": data.y, "fold": data.folds}),
        pd.DataFrame({"split": "test", "pair_id": task.test_ids, "chq": t_chq, "prob": test_prob, "label": -1, "fold": -1}),
    ], ignore_index=True)  # fmt: skip
    write_parquet(probs, layout.TASK2_PROBS, PROBS_SCHEMA)
    chosen = sel.rows[sel.chosen]
    recipe = {**sel.recipe.as_dict(), "cross_encoder": {"extras": list(ce_recipe[0]), "val_stage": ce_recipe[1]}, "stack": stack}
    metrics = {
        "task": "rqe",
        "base_model": tp.base_model,
        "base_fingerprint": final_ce.base_fingerprint,
        "chosen": sel.chosen,
        "trained": trained,  # the rows this stage trains (finetune.rqe): analysis rqe_selection's choice must be among them
        "recipe": recipe,
        "selection_rule": SELECTION_RULE,
        "cv": {k: chosen[k] for k in ("accuracy", "accuracy_sd", "auc", "same_focus", "by_overlap")},
        "vs": rqe.paired_differences(sel, data),
        "rows": sel.rows,
        "n_val_pairs": len(data.y),
        "n_val_questions": int(pd.Series(chq).nunique()),
        "n_pretrain_pairs": sel.pretrain_pairs,
        "question_types": {"types": qtypes.types, "val_faq_types": pd.Series(qtypes.predict(faq)).value_counts().to_dict()},
        "train_precision": precision["train"],
        "threads": final_ce.threads,
        "seconds": seconds,
        "predict_speed": speed,
        "test_mean_prob": round(float(test_prob.mean()), 4) if len(test_prob) else None,
    }
    meta = {"task": "rqe", "recipe": recipe, "cv_accuracy": chosen["accuracy"]}
    # the cross-encoder's save replaces the whole folder (no stale bi-encoder survives); the bi-encoder goes inside it
    metrics["model_fingerprint"] = final_ce.save(layout.finetuned_model("rqe"), extra_meta=meta)
    if final_bi is not None:
        metrics["bi_encoder_fingerprint"] = final_bi.save(layout.RQE_BI_MODEL)
    write_json(layout.metrics_file("finetune_rqe"), metrics)


if __name__ == "__main__":
    run(main)
