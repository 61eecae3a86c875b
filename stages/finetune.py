"""DVC stage `finetune@<task>` (task = nli | rqe): fine-tune a cross-encoder, log curves, write metrics.

rqe also writes the Task 2 validation and blind test predictions (`pair_id,label`) and scores validation.
"""

import sys
import time
from pathlib import Path

from medrank.errors import MedrankError
from medrank.runner import run

TASKS = ("nli", "rqe")

RQE_VAL_GOLD = "mediqa2019/Eval_Scripts/data/RQE_validationSet_ground_truth.txt"
# (validation, test) predictions per task; the same paths are the stage's outs in dvc.yaml
PREDICTIONS = {
    "nli": ("submissions/nli_sick_dev.csv", "submissions/nli_sick_test.csv"),
    "rqe": ("submissions/task2_val.csv", "submissions/task2_test.csv"),
}


def main() -> None:
    if len(sys.argv) != 2 or sys.argv[1] not in TASKS:
        raise MedrankError(f"usage: python -m stages.finetune {{{'|'.join(TASKS)}}}")
    task = sys.argv[1]
    # heavy imports (torch, transformers) after the argument check, so a usage error is instant
    import numpy as np
    import pandas as pd
    from dvclive import Live

    from medrank.encoders.cross_encoder import CrossEncoder
    from medrank.encoders.finetune import CURVES, classification_metrics, live_step_logger, load_task, training_set
    from medrank.io import write_json, write_text
    from medrank.metrics import score_task2
    from medrank.params import load_params
    from medrank.submission import write_task2_submission

    p = load_params()
    tp = getattr(p.finetune, task)
    clean_dir = Path(p.clean.out_dir)
    rng = np.random.default_rng(p.seed)

    data = load_task(task, clean_dir, tp.dataset).capped(tp.max_eval_pairs)
    pairs, labels, n_mined = training_set(task, data, tp, clean_dir, rng)
    model = CrossEncoder.from_base(
        tp.base_model, len(data.label_names), tp.max_length, device=p.device, seed=p.seed,
        label_names=data.label_names, precision=tp.predict_precision,
    )  # fmt: skip

    with Live(dir=f"plots/finetune_{task}", dvcyaml=None, save_dvc_exp=False) as live:
        live.log_params(tp.model_dump())
        t0 = time.perf_counter()
        history = model.fit(
            pairs, labels, epochs=tp.epochs, lr=tp.lr, batch_size=tp.batch_size, warmup_ratio=tp.warmup_ratio,
            weight_decay=tp.weight_decay, eval_pairs=data.eval_pairs, eval_labels=data.eval_labels,
            seed=p.seed, precision=tp.train_precision, threads=tp.threads,
            eval_every=tp.eval_every, step_callback=live_step_logger(live, CURVES),
        )  # fmt: skip
        train_seconds = time.perf_counter() - t0

    val_probs = model.predict(data.eval_pairs, batch_size=tp.eval_batch_size)
    speed = dict(model.last_predict_stats)  # steady-state rate on validation, after the precision probe
    metrics = {
        "task": task,
        "base_model": tp.base_model,
        "base_fingerprint": model.base_fingerprint,
        "n_train_pairs": len(pairs),
        "n_medquad_pairs": n_mined,
        "train_seconds": round(train_seconds, 1),
        "train_precision": model.train_precision,
        "threads": model.threads,
        "predict_precision": speed["precision"],
        "precision_probe": model.precision_report.as_dict() if model.precision_report else None,
        "val": classification_metrics(data.eval_labels, val_probs),
        "history": history,
    }
    test_probs = model.predict(data.test_pairs, batch_size=tp.eval_batch_size) if data.test_pairs else None
    if test_probs is not None:
        speed["test"] = dict(model.last_predict_stats)
    val_out, test_out = PREDICTIONS[task]
    if task == "rqe":
        # official Task 2 format: pair_id,label (0/1) with a header, as the validation gold
        write_task2_submission(val_out, pd.DataFrame({"pair_id": data.eval_ids, "label": val_probs.argmax(1)}))
        write_task2_submission(test_out, pd.DataFrame({"pair_id": data.test_ids, "label": test_probs.argmax(1)}))
        metrics["val_official"] = score_task2(Path(p.clean.raw_dir) / RQE_VAL_GOLD, val_out)
    else:
        names = np.asarray(data.label_names)
        write_text(val_out, pd.DataFrame({"pair_id": data.eval_ids, "label": names[val_probs.argmax(1)]}).to_csv(index=False))
        preds = names[test_probs.argmax(1)] if test_probs is not None else []
        write_text(test_out, pd.DataFrame({"pair_id": data.test_ids, "label": preds}).to_csv(index=False))
        if data.test_labels is not None:
            # SICK's test labels are public (not a MEDIQA blind set): reported, never used for selection
            metrics["test"] = classification_metrics(data.test_labels, test_probs)
    metrics["predict_speed"] = speed
    metrics["model_fingerprint"] = model.save(Path("models") / task, extra_meta={"task": task})
    write_json(f"metrics/finetune_{task}.json", metrics)


if __name__ == "__main__":
    run(main)
