"""DVC stage `finetune_nli`: fine-tune the NLI cross-encoder (SICK train -> dev, or a user-supplied set), log curves,
write metrics and the dev/test predictions (`pair_id,label`). The RQE cross-encoder has its own stage (finetune_rqe).
"""

from medrank.stage.runner import run


def main(params_path: str = "params.yaml") -> None:
    # heavy imports (torch, transformers) inside main
    import numpy as np

    from medrank.core import layout
    from medrank.data.tasks import cap_pairs, load_task
    from medrank.encoders.cross_encoder_training import classification_metrics
    from medrank.encoders.curves import fine_tune, training_record
    from medrank.core.io import write_json, write_text
    from medrank.params import load_params

    task = "nli"
    p = load_params(params_path)
    tp = p.finetune.nli
    rng = np.random.default_rng(p.seed)
    data = load_task(task, tp.dataset).capped(tp.max_eval_pairs)
    pairs, labels = cap_pairs(data.train_pairs, data.train_labels, tp.max_train_pairs, rng)
    model, history, train_seconds = fine_tune(
        tp,
        data.label_names,
        (pairs, labels),
        (data.eval_pairs, data.eval_labels),
        seed=p.seed,
        device=p.device,
        live_dir=layout.plots_dir(f"finetune_{task}"),
    )
    val_probs = model.predict(data.eval_pairs, batch_size=tp.eval_batch_size)
    speed = dict(model.last_predict_stats)  # steady-state rate on validation, after the precision probe
    metrics = {
        "task": task,
        **training_record(tp, model, len(pairs), history, train_seconds),
        "predict_precision": speed["precision"],
        "precision_probe": model.precision_report.as_dict() if model.precision_report else None,
        "val": classification_metrics(data.eval_labels, val_probs),
    }
    test_probs = model.predict(data.test_pairs, batch_size=tp.eval_batch_size) if data.test_pairs else None
    if test_probs is not None:
        speed["test"] = dict(model.last_predict_stats)
    write_text(layout.NLI_SUBMISSIONS["val"], data.predictions_csv(data.eval_ids, val_probs))
    write_text(layout.NLI_SUBMISSIONS["test"], data.predictions_csv(data.test_ids, test_probs))
    if data.test_labels is not None:
        # SICK's test labels are public (not a MEDIQA blind set): reported, never used for selection
        metrics["test"] = classification_metrics(data.test_labels, test_probs)
    metrics["predict_speed"] = speed
    metrics["model_fingerprint"] = model.save(layout.finetuned_model(task), extra_meta={"task": task})
    write_json(layout.metrics_file(f"finetune_{task}"), metrics)


if __name__ == "__main__":
    run(main)
