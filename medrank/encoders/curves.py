"""dvclive training curves of a cross-encoder fine-tuning run (x = optimizer step)."""

from __future__ import annotations

import os
import time
from typing import Any, Sequence

import numpy as np

from medrank.encoders.cross_encoder import CrossEncoder
from medrank.encoders.cross_encoder_training import EpochCallback, Pair

# train loss (mean since the last point) and validation metrics, the curves of every fine-tuned cross-encoder
CURVES = {
    "train_loss": "train/loss",
    "eval_loss": "val/loss",
    "eval_accuracy": "val/accuracy",
    "eval_macro_f1": "val/macro_f1",
}


def live_step_logger(live: Any, keys: dict[str, str]) -> EpochCallback:
    """A CrossEncoder.fit step_callback writing `keys` (fit metric -> dvclive name) at x = optimizer step."""

    def log_step(step: int, m: dict) -> None:
        live.step = step
        for key, name in keys.items():
            if key in m:
                live.log_metric(name, m[key])
        live.next_step()

    return log_step


def fit_with_curves(
    model: CrossEncoder,
    pairs: Sequence[Pair],
    labels: np.ndarray,
    eval_pairs: Sequence[Pair],
    eval_labels: np.ndarray,
    knobs: Any,
    *,
    seed: int,
    live_dir: str | os.PathLike,
) -> tuple[list[dict[str, float]], float]:
    """`model.fit` with the training knobs of a params section (epochs, lr, batch_size, warmup_ratio, weight_decay,
    train_precision, threads, eval_every), the section logged as dvclive params and CURVES at `live_dir`.
    Returns the per-epoch history and the training seconds."""
    from medrank.core.live import open_live

    with open_live(live_dir, knobs) as live:
        t0 = time.perf_counter()
        history = model.fit(
            pairs,
            labels,
            epochs=knobs.epochs,
            lr=knobs.lr,
            batch_size=knobs.batch_size,
            warmup_ratio=knobs.warmup_ratio,
            weight_decay=knobs.weight_decay,
            eval_pairs=eval_pairs,
            eval_labels=eval_labels,
            seed=seed,
            precision=knobs.train_precision,
            threads=knobs.threads,
            eval_every=knobs.eval_every,
            step_callback=live_step_logger(live, CURVES),
        )
        return history, time.perf_counter() - t0


def fine_tune(
    knobs: Any,
    label_names: Sequence[str],
    train: tuple[Sequence[Pair], np.ndarray],
    evaluation: tuple[Sequence[Pair], np.ndarray],
    *,
    seed: int,
    device: str,
    live_dir: str | os.PathLike,
) -> tuple[CrossEncoder, list[dict[str, float]], float]:
    """A fresh classifier head on `knobs.base_model` (seeded), trained by `fit_with_curves` on `train` (pairs,
    labels) and evaluated each epoch on `evaluation`: (model, history, training seconds). finetune_nli and qa."""
    model = CrossEncoder.from_base(
        knobs.base_model,
        len(label_names),
        knobs.max_length,
        device=device,
        seed=seed,
        label_names=label_names,
        precision=knobs.predict_precision,
    )
    history, seconds = fit_with_curves(model, *train, *evaluation, knobs, seed=seed, live_dir=live_dir)
    return model, history, seconds


def training_record(knobs: Any, model: CrossEncoder, n_train_pairs: int, history: list[dict], seconds: float) -> dict:
    """The training part of a `fine_tune` run's metrics (finetune_nli, qa): base model and its fingerprint, pairs,
    seconds, training precision and threads, the per-epoch history."""
    return {
        "base_model": knobs.base_model,
        "base_fingerprint": model.base_fingerprint,
        "n_train_pairs": n_train_pairs,
        "train_seconds": round(seconds, 1),
        "train_precision": model.train_precision,
        "threads": model.threads,
        "history": history,
    }
