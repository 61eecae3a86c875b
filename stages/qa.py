"""Stage `qa`: a question-answer relevance cross-encoder, then a score for every MEDIQA answer.

FINDINGS: a cross-encoder fine-tuned on the 1.7k MEDIQA training pairs barely learned; it needs more data.
Here it learns from MedQuAD alone: (question, answer) pairs mined with `medquad_qa_pairs` (positives, same-focus
answers of another question type, answers about another focus), validated on pairs of held-out foci. No MEDIQA
label is used, so its score is a plain feature (group `qa`) for the baseline and mtl stages.
Writes models/qa, data/processed/qa_scores.parquet (split, qid, aid, qa_score), metrics/qa.json, plots/qa.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from medrank.runner import run

log = logging.getLogger("stages.qa")
OUT = Path("data/processed/qa_scores.parquet")
METRICS = Path("metrics/qa.json")
MODEL_DIR = Path("models/qa")
LIVE_DIR = Path("plots/qa")


def main(params_path: str = "params.yaml") -> None:
    import numpy as np
    import pyarrow as pa
    from dvclive import Live

    from medrank.encoders.cross_encoder import CrossEncoder
    from medrank.encoders.finetune import CURVES, classification_metrics, live_step_logger
    from medrank.encoders.qa import QA_LABELS, qa_task
    from medrank.features import cap_questions
    from medrank.io import read_parquet, write_json, write_parquet
    from medrank.params import load_params

    p = load_params(params_path)
    qp = p.qa
    t0 = time.perf_counter()
    medquad = read_parquet(Path(qp.normalized_dir) / "medquad.parquet", columns=["focus", "question_type", "question", "answer_norm"])
    data = qa_task(medquad, qp.train_pairs, qp.eval_pairs, qp.eval_focus_frac, np.random.default_rng(p.seed))
    model = CrossEncoder.from_base(qp.base_model, len(QA_LABELS), qp.max_length, device=p.device, seed=p.seed, label_names=QA_LABELS,
                                   precision=qp.predict_precision)  # fmt: skip
    with Live(dir=str(LIVE_DIR), dvcyaml=None, save_dvc_exp=False) as live:
        live.log_params(qp.model_dump())
        t1 = time.perf_counter()
        history = model.fit(
            data.train_pairs, data.train_labels, epochs=qp.epochs, lr=qp.lr, batch_size=qp.batch_size, warmup_ratio=qp.warmup_ratio,
            weight_decay=qp.weight_decay, eval_pairs=data.eval_pairs, eval_labels=data.eval_labels, seed=p.seed,
            precision=qp.train_precision, threads=qp.threads, eval_every=qp.eval_every, step_callback=live_step_logger(live, CURVES),
        )  # fmt: skip
        train_seconds = time.perf_counter() - t1
    val = classification_metrics(data.eval_labels, model.predict(data.eval_pairs, batch_size=qp.eval_batch_size))
    fingerprint = model.save(MODEL_DIR, extra_meta={"task": "qa"})

    answers = read_parquet(Path(qp.normalized_dir) / "answers.parquet", columns=["split", "qid", "aid", "question_norm", "answer_norm"])
    answers = cap_questions(answers, qp.max_questions_per_split)
    pairs = list(zip(answers["question_norm"].fillna("").astype(str), answers["answer_norm"].fillna("").astype(str)))
    score = model.predict(pairs, batch_size=qp.eval_batch_size)[:, 1] if pairs else np.zeros(0)
    speed = dict(model.last_predict_stats) if pairs else {}
    schema = pa.schema([("split", pa.string()), ("qid", pa.string()), ("aid", pa.string()), ("qa_score", pa.float64())])
    write_parquet(answers[["split", "qid", "aid"]].assign(qa_score=score), OUT, schema)
    write_json(
        METRICS,
        {
            "base_model": qp.base_model,
            "base_fingerprint": model.base_fingerprint,
            "model_fingerprint": fingerprint,
            "n_train_pairs": len(data.train_pairs),
            "train_seconds": round(train_seconds, 1),
            "train_precision": model.train_precision,
            "threads": model.threads,
            "val_heldout_foci": val,
            "history": history,
            "mediqa_answers_scored": len(pairs),
            "predict_speed": speed,
            "seconds": round(time.perf_counter() - t0, 1),
        },
    )  # fmt: skip
    log.info("qa: held-out MedQuAD accuracy %.3f; %d MEDIQA answers scored (%.0fs)", val["accuracy"], len(pairs), time.perf_counter() - t0)


if __name__ == "__main__":
    run(main)
