"""Fine-tuning of the cross-encoder (CrossEncoder's `fit` / `evaluate`, a mixin): AdamW with linear warmup and decay,
length-bucketed shuffled batches, bf16 autocast where the hardware computes it natively, a fixed thread count (the
weights depend on it), soft targets for graded labels, evaluation every `eval_every` steps that never touches the RNG."""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable, Literal, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from medrank.encoders.hardware import hardware_precision, probe_precision
from medrank.encoders.runtime import deterministic_torch, pick_threads, set_seed, set_threads
from medrank.encoders.batching import (
    bucketed_shuffle_batches,
)
from medrank.core.errors import MedrankError

log = logging.getLogger(__name__)

Pair = tuple[str, str]
EpochCallback = Callable[[int, dict[str, float]], None]  # (epoch, metrics); also (optimizer step, metrics)


def check_pairs(pairs: Sequence[Pair], what: str) -> list[Pair]:
    out = []
    for i, p in enumerate(pairs):
        if not isinstance(p, (tuple, list)) or len(p) != 2 or not all(isinstance(s, str) for s in p):
            raise MedrankError(f"{what}[{i}]: expected a (text_a, text_b) pair of strings")
        out.append((p[0], p[1]))
    return out


def classification_metrics(y: np.ndarray, probs: np.ndarray) -> dict[str, float]:
    """Accuracy, macro-F1 and NLL of argmax predictions (probs (n, num_labels), integer labels y)."""
    from sklearn.metrics import accuracy_score, f1_score

    pred = probs.argmax(1)
    labels = list(range(probs.shape[1]))
    return {
        "accuracy": float(accuracy_score(y, pred)),
        "macro_f1": float(f1_score(y, pred, average="macro", labels=labels, zero_division=0)),
        "loss": float(-np.mean(np.log(np.clip(probs[np.arange(len(y)), y], 1e-12, 1.0)))),
        "n": int(len(y)),
    }


def _loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy against integer labels, or against the distribution (1 - t, t) for float targets t (soft)."""
    logits = logits.float()
    if target.dtype.is_floating_point:
        logp = torch.log_softmax(logits, dim=-1)
        return -(target * logp[:, 1] + (1.0 - target) * logp[:, 0]).mean()
    return torch.nn.functional.cross_entropy(logits, target)


class CrossEncoderTraining:
    """`fit` and `evaluate` of medrank.encoders.cross_encoder.CrossEncoder (which supplies model, tokenizer, device,
    label_names, _encode, _collate, _autocast, _probs, predict)."""

    def _label_ids(self, labels: Sequence[Any]) -> np.ndarray:
        name_to_id = {n: i for i, n in enumerate(self.label_names)}
        out = np.empty(len(labels), dtype=np.int64)
        for i, y in enumerate(labels):
            if isinstance(y, str):
                if y not in name_to_id:
                    raise MedrankError(f"label {y!r} not in {self.label_names}")
                out[i] = name_to_id[y]
            else:
                out[i] = int(y)
                if not 0 <= out[i] < self.num_labels:
                    raise MedrankError(f"label {y!r} out of range for {self.num_labels} labels")
        return out

    def _soft_targets(self, labels: Sequence[Any]) -> np.ndarray:
        if self.num_labels != 2:
            raise MedrankError(f"soft targets need 2 labels, the model has {self.num_labels}")
        y = np.asarray(labels, dtype=np.float32)
        if y.ndim != 1 or not np.isfinite(y).all() or (y < 0).any() or (y > 1).any():
            raise MedrankError("soft targets must be probabilities in [0, 1], one per pair")
        return y

    def _train_step_probe(self, enc: dict, y: np.ndarray, batch_size: int, precision: str) -> Callable[[], None]:
        # forward + backward on a real batch: what an optimizer step costs (grads discarded, RNG restored)
        idx = np.arange(min(batch_size, len(y)))
        batch = self._collate(enc, idx)
        target = torch.from_numpy(y[idx]).to(self.device)

        def step() -> None:
            state = torch.random.get_rng_state()
            self.model.train()
            with self._autocast(precision):
                logits = self.model(**batch).logits
            _loss(logits, target).backward()
            self.model.zero_grad(set_to_none=True)
            self.model.eval()
            torch.random.set_rng_state(state)

        return step

    def _train_precision(self, requested: str) -> str:
        if requested != "auto":
            return probe_precision(self.device, requested).choice if requested != "int8" else "fp32"
        # on CPUs without native bf16 the emulated kernels are slower than fp32 anyway
        return hardware_precision(self.device)

    @deterministic_torch()
    def fit(
        self,
        pairs: Sequence[Pair],
        labels: Sequence[Any],
        *,
        epochs: int,
        lr: float,
        batch_size: int,
        warmup_ratio: float = 0.1,
        weight_decay: float = 0.01,
        eval_pairs: Sequence[Pair] | None = None,
        eval_labels: Sequence[Any] | None = None,
        callback: EpochCallback | None = None,
        seed: int = 13,
        max_grad_norm: float = 1.0,
        precision: str = "auto",
        threads: int | Literal["probe"] | None = None,
        show_progress: bool = True,
        eval_every: int | None = None,
        step_callback: EpochCallback | None = None,
        soft_targets: bool = False,
    ) -> list[dict[str, float]]:
        """Fine-tune on labelled pairs (AdamW, linear warmup/decay); per-epoch metrics → `callback(epoch, m)`.

        `soft_targets` (2 labels only): `labels` are probabilities in [0, 1] of the second label (e.g. a grade
        rescaled), trained with the cross-entropy against that distribution (a regression through the sigmoid of
        the logit difference); `eval_labels` stay label names / ids.

        `threads` (CPU): torch threads; None = every core this process may use; "probe" = time 1 vs all cores on a
        real training step and keep the faster (helps on busy shared cores, but the weights then depend on load).
        `step_callback(step, m)` gets the mean train loss since its last call (+ eval metrics) every `eval_every`
        optimizer steps and at each epoch end, for training curves finer than epochs. Evaluating does not touch
        the RNG streams, so the trained weights do not depend on `eval_every`.
        """
        pairs = check_pairs(pairs, "pairs")
        y = self._soft_targets(labels) if soft_targets else self._label_ids(labels)
        if len(pairs) != len(y) or not pairs:
            raise MedrankError(f"fit: {len(pairs)} pairs vs {len(y)} labels (need the same, > 0)")
        if (eval_pairs is None) != (eval_labels is None):
            raise MedrankError("fit: give both eval_pairs and eval_labels, or neither")
        y_eval = self._label_ids(eval_labels) if eval_labels is not None else None
        set_seed(seed)
        rng = np.random.default_rng(seed)
        enc = self._encode(pairs)
        lengths = [len(x) for x in enc["input_ids"]]
        if self.device.type == "cpu":
            # a fixed count by default: float sums, and so the trained weights, depend on the thread count
            self.threads = (
                pick_threads(self._train_step_probe(enc, y, batch_size, "fp32"))
                if threads == "probe"
                else set_threads(threads)
            )
        self.train_precision = self._train_precision(precision)
        log.info(
            "training on %d pairs, %d epochs, batch %d, lr %g, precision %s",
            len(pairs),
            epochs,
            batch_size,
            lr,
            self.train_precision,
        )

        decay, no_decay = [], []
        for name, prm in self.model.named_parameters():
            (no_decay if prm.ndim < 2 or "LayerNorm" in name or "layer_norm" in name else decay).append(prm)
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=lr
        )
        steps_per_epoch = math.ceil(len(pairs) / batch_size)
        total = max(1, steps_per_epoch * epochs)
        warmup = int(total * warmup_ratio)

        def schedule(step: int) -> float:
            if step < warmup:
                return (step + 1) / (warmup + 1)
            return max(0.0, (total - step) / max(1, total - warmup))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
        history: list[dict[str, float]] = []
        self._fingerprint = None
        self._int8_model = None
        self.precision_report = None  # weights change: re-probe at next predict
        global_step = 0
        since: list[float] = []  # train losses since the last step_callback

        def report(step: int, eval_metrics: dict[str, float] | None) -> float:
            t = time.perf_counter()
            m = {"train_loss": float(np.mean(since))} if since else {}
            if eval_metrics is None and eval_pairs is not None:
                eval_metrics = self.evaluate(eval_pairs, y_eval, precision=self.train_precision)
            m.update(eval_metrics or {})
            since.clear()
            if step_callback is not None:
                step_callback(step, m)
            return time.perf_counter() - t

        for epoch in range(1, epochs + 1):
            self.model.train()
            t0 = time.perf_counter()
            eval_seconds = 0.0
            losses: list[float] = []
            batches = bucketed_shuffle_batches(lengths, batch_size, rng)
            with tqdm(
                total=len(pairs), unit="pair", desc=f"epoch {epoch}/{epochs}", disable=not show_progress, leave=False
            ) as bar:
                for idx in batches:
                    batch = self._collate(enc, idx)
                    target = torch.from_numpy(y[idx]).to(self.device)
                    with self._autocast(self.train_precision):
                        logits = self.model(**batch).logits
                    loss = _loss(logits, target)
                    loss.backward()
                    if max_grad_norm:
                        torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_grad_norm)
                    opt.step()
                    sched.step()
                    opt.zero_grad(set_to_none=True)
                    losses.append(float(loss.detach()))
                    since.append(losses[-1])
                    global_step += 1
                    bar.update(len(idx))
                    bar.set_postfix(loss=f"{np.mean(losses[-20:]):.4f}")
                    if (
                        step_callback is not None
                        and eval_every
                        and global_step % eval_every == 0
                        and idx is not batches[-1]
                    ):
                        eval_seconds += report(global_step, None)
                        self.model.train()
            self.model.eval()
            dt = time.perf_counter() - t0 - eval_seconds
            m: dict[str, float] = {
                "epoch": epoch,
                "train_loss": float(np.mean(losses)),
                "train_seconds": round(dt, 2),
                "train_pairs_per_s": round(len(pairs) / dt, 2),
            }
            if eval_pairs is not None:
                # evaluate at the training precision: no re-probe per epoch, curves comparable across epochs
                m.update(self.evaluate(eval_pairs, y_eval, show_progress=show_progress, precision=self.train_precision))
            history.append(m)
            if step_callback is not None:
                report(global_step, {k: v for k, v in m.items() if k.startswith("eval_")})
            log.info("epoch %d: %s", epoch, ", ".join(f"{k} {v:.4g}" for k, v in m.items() if k != "epoch"))
            if callback is not None:
                callback(epoch, m)
        return history

    def evaluate(
        self, pairs: Sequence[Pair], labels: Sequence[Any], show_progress: bool = False, precision: str | None = None
    ) -> dict[str, float]:
        """Accuracy, macro-F1 and mean NLL on labelled pairs."""
        y = self._label_ids(labels)
        m = classification_metrics(y, self.predict(pairs, show_progress=show_progress, precision=precision))
        return {"eval_loss": m["loss"], "eval_accuracy": m["accuracy"], "eval_macro_f1": m["macro_f1"]}
