"""DVC stage `finetune_rqe`: RQE for consumer questions, selected where the users' questions are.

Every row of models/rqe.py is measured by question-grouped CV over the 302 Task 2 validation pairs (the only
labelled pairs with consumer CHQs; folds grouped by CHQ): each set of extra training sources alone ("amia" alone is
yesterday's recipe), each set then fine-tuned on the other folds' validation pairs, validation pairs only, the
zero-shot bi-encoder cosine, and stacks with the cosine and the question-type agreement. The row with the best mean
CV accuracy is kept; the final model is that recipe trained on every validation pair (its pretrained first step is
the one the CV already trained). The validation submission holds the chosen row's out-of-fold predictions (honest:
the final model has seen every validation pair); the test submission is the final model's.
"""

import copy
import logging
import time

from medrank.runner import run

log = logging.getLogger("stages.finetune_rqe")


def main(params_path: str = "params.yaml") -> None:
    import numpy as np
    import pandas as pd
    from dvclive import Live

    from medrank import layout
    from medrank.data.tasks import RQE_LABELS, rqe_task
    from medrank.decision import grouped_folds
    from medrank.encoders.cross_encoder import CrossEncoder
    from medrank.encoders.curves import CURVES, live_step_logger
    from medrank.encoders.sentence_encoder import SentenceEncoder
    from medrank.io import read_parquet, write_json
    from medrank.metrics import score_task2
    from medrank.models import rqe
    from medrank.params import load_params
    from medrank.submission import write_task2_submission

    p = load_params(params_path)
    tp = p.finetune.rqe
    table = read_parquet(layout.CLEAN_RQE_PAIRS)
    task = rqe_task(table).capped(tp.max_eval_pairs)
    chq, faq = [a for a, _ in task.eval_pairs], [b for _, b in task.eval_pairs]
    data = rqe.CvData(chq, faq, task.eval_labels, grouped_folds(np.asarray(chq), tp.folds, p.seed))
    medquad = read_parquet(layout.CLEAN_MEDQUAD)
    qtypes = rqe.QuestionTypes(medquad, p.seed)
    sources = rqe.PairSources(
        amia=table[table["split"] == "train"], meqsum=read_parquet(layout.CLEAN_MEQSUM), liveqa=read_parquet(layout.CLEAN_LIVEQA_QUESTIONS),
        medquad=medquad, medquad_pairs=tp.medquad_pairs, hard_negatives=tp.hard_negatives, easy_negatives=tp.easy_negatives,
        max_pairs=tp.max_train_pairs,
    )  # fmt: skip
    bi = SentenceEncoder(tp.bi_encoder, device=p.device, max_length=256)  # 256: as retrieval's stacked scores
    cosine = lambda a, b: (bi.encode(a) * bi.encode(b)).sum(1)  # noqa: E731  (unit vectors)
    cos = cosine(chq, faq)
    seconds: dict[str, float] = {}

    def fresh() -> CrossEncoder:
        return CrossEncoder.from_base(tp.base_model, 2, tp.max_length, device=p.device, seed=p.seed, label_names=RQE_LABELS,
                                      precision=tp.predict_precision)  # fmt: skip

    def fit(model: CrossEncoder, pairs, y, epochs: int, lr: float, **kw) -> CrossEncoder:
        model.fit(pairs, y, epochs=epochs, lr=lr, batch_size=tp.batch_size, warmup_ratio=tp.warmup_ratio, weight_decay=tp.weight_decay,
                  seed=p.seed, precision=tp.train_precision, threads=tp.threads, show_progress=True, **kw)  # fmt: skip
        return model

    with Live(dir=str(layout.plots_dir("finetune_rqe")), dvcyaml=None, save_dvc_exp=False) as live:
        live.log_params(tp.model_dump())

        def pretrain(pairs, y, name: str) -> CrossEncoder:
            # curves per source set: the validation pairs are held out from this step, so they are a fair eval
            t0 = time.perf_counter()
            keys = {k: f"{name}/{v}" for k, v in CURVES.items()}
            model = fit(fresh(), pairs, y, tp.epochs, tp.lr, eval_pairs=data.pairs, eval_labels=data.y, eval_every=tp.eval_every,
                        step_callback=live_step_logger(live, keys))  # fmt: skip
            seconds[f"pretrain {name}"] = round(time.perf_counter() - t0, 1)
            return model

        def train_val(pairs, y, init):
            return fit(copy.deepcopy(init) if init is not None else fresh(), pairs, y, tp.val_epochs, tp.val_lr)

        def predict(model: CrossEncoder, pairs) -> np.ndarray:
            return model.predict(pairs, batch_size=tp.eval_batch_size, show_progress=False)[:, 1]

        t0 = time.perf_counter()
        sel = rqe.select(data, sources, qtypes, tp.extra_sets, pretrain, train_val, predict, cos, p.seed)
        seconds["selection"] = round(time.perf_counter() - t0, 1)
        t0 = time.perf_counter()
        init = sel.pretrained.get(sel.extras)
        final = train_val(data.pairs, data.y, init) if sel.val_stage else init
        seconds["final"] = round(time.perf_counter() - t0, 1)
        live.log_metric("cv/accuracy", sel.rows[sel.chosen]["accuracy"], plot=False)

    test_prob = predict(final, task.test_pairs) if task.test_pairs else np.zeros(0)
    speed = dict(final.last_predict_stats)
    stack = None
    if sel.stack:
        # the combiner is fitted on the chosen row's out-of-fold features, as the CV measured it
        combiner = rqe.fit_stack(sel.stack_x, data.y, p.seed)
        t_chq, t_faq = [a for a, _ in task.test_pairs], [b for _, b in task.test_pairs]
        qt = qtypes.agreement(t_chq, t_faq) if "qtype" in sel.stack else None
        test_prob = combiner.predict_proba(rqe.stack_features(test_prob, cosine(t_chq, t_faq), qt))[:, 1]
        # what retrieval needs to score candidates the same way (medrank.retrieval.stacked_rqe_scores)
        stack = {"features": list(sel.stack), "coef": combiner.coef_[0].round(6).tolist(), "intercept": round(float(combiner.intercept_[0]), 6),
                 "bi_encoder": tp.bi_encoder, "max_length": 256, "seed": p.seed}  # fmt: skip
    val_out, test_out = layout.TASK2_SUBMISSIONS["val"], layout.TASK2_SUBMISSIONS["test"]
    write_task2_submission(val_out, pd.DataFrame({"pair_id": task.eval_ids, "label": (sel.oof >= 0.5).astype(int)}))
    write_task2_submission(test_out, pd.DataFrame({"pair_id": task.test_ids, "label": (test_prob >= 0.5).astype(int)}))
    chosen = sel.rows[sel.chosen]
    metrics = {
        "task": "rqe",
        "base_model": tp.base_model,
        "base_fingerprint": final.base_fingerprint,
        "chosen": sel.chosen,
        "recipe": {"extras": list(sel.extras), "val_stage": sel.val_stage, "stack": stack},
        "selection_rule": "best mean CV accuracy over the validation folds (grouped by CHQ); a tie keeps the simpler row",
        "cv": {k: chosen[k] for k in ("accuracy", "accuracy_sd", "auc", "same_focus", "by_overlap")},
        "vs": rqe.paired_differences(sel, data),
        "rows": sel.rows,
        "n_val_pairs": len(data.y),
        "n_val_questions": int(pd.Series(chq).nunique()),
        "n_pretrain_pairs": sel.pretrain_pairs,
        "question_types": {"types": qtypes.types, "val_faq_types": pd.Series(qtypes.predict(faq)).value_counts().to_dict()},
        "train_precision": final.train_precision,
        "threads": final.threads,
        "seconds": seconds,
        "predict_speed": speed,
        "val_official_oof": score_task2(layout.RQE_VAL_GOLD, val_out) if tp.max_eval_pairs is None else None,
        "test_positive_rate": round(float((test_prob >= 0.5).mean()), 4) if len(test_prob) else None,
    }
    meta = {"task": "rqe", "recipe": metrics["recipe"], "cv_accuracy": chosen["accuracy"]}
    metrics["model_fingerprint"] = final.save(layout.finetuned_model("rqe"), extra_meta=meta)
    write_json(layout.metrics_file("finetune_rqe"), metrics)


if __name__ == "__main__":
    run(main)
