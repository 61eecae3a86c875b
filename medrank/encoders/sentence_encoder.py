"""A bi-encoder: mean-pooled, L2-normalised sentence vectors (the sentence-transformers recipe) from a transformers
checkpoint, for the NLI grid prefilter and the zero-shot question-answer cosines; `fit` fine-tunes it on labelled
question pairs (the RQE bi-encoder of stage finetune_rqe)."""

from __future__ import annotations

import json
import os
from typing import Callable, Sequence

import numpy as np
import torch

from medrank.encoders.hardware import resolve_device
from medrank.encoders.low_precision import PrecisionCopies
from medrank.encoders.openvino_path import LastHidden, is_openvino
from medrank.encoders.weights import (
    ENCODER_META,
    model_fingerprint,
    quiet_transformers,
    resolve_model_path,
    save_checkpoint,
    verify_saved,
)
from medrank.encoders.batching import length_sorted_batches, openvino_requests, padded_width, request_batches
from medrank.core.errors import MedrankError


class SentenceEncoder(PrecisionCopies):
    """Mean-pooled, L2-normalised sentence embeddings; `encode(texts, precision)` -> (n, H) float32."""

    def __init__(self, name_or_path: str, device: str = "auto", max_length: int = 128, saved: bool = False) -> None:
        """`saved`: a folder `save` wrote (a medrank fine-tune): its weights must match the fingerprint recorded there.
        The weights (and transformers' model code, ~4 s) are read at the first use of `.model` / `.tokenizer`, so a
        caller whose texts are all in a cache never pays for them; the fingerprint is computed here."""
        path = resolve_model_path(name_or_path)
        if saved:
            verify_saved(path)
        self.path = path
        self.device = resolve_device(device)
        self.max_length = int(max_length)
        self.fingerprint = model_fingerprint(path)
        try:
            self.hidden = int(json.loads((path / "config.json").read_text(encoding="utf-8"))["hidden_size"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise MedrankError(f"{path}/config.json: no hidden_size to read ({type(e).__name__}: {e})") from None
        self._model: torch.nn.Module | None = None
        self._tokenizer = None
        self._int8_model: torch.nn.Module | None = None
        self.memo = (
            None  # a VectorMemo (medrank.encoders.memo) cached_sentence_embeddings reads: a server's, across requests
        )
        # 1: the stages' batching (length-sorted, batch_size at a time); n > 1: a served request's, for n streams at
        # once, each text padded to its own width (encoders.batching.request_batches; set by serving's scorers)
        self.parts = 1

    @property
    def model(self) -> torch.nn.Module:
        if self._model is None:
            self._materialize()
        return self._model

    @property
    def tokenizer(self):
        if self._model is None:
            self._materialize()
        return self._tokenizer

    def _materialize(self) -> None:
        from transformers import AutoModel, AutoTokenizer

        with quiet_transformers():
            self._tokenizer = AutoTokenizer.from_pretrained(str(self.path))
            model = AutoModel.from_pretrained(str(self.path), use_safetensors=True)
        self._model = model.float().to(self.device).eval()

    def encode(
        self,
        texts: Sequence[str],
        precision: str = "fp32",
        batch_size: int = 128,
        progress: Callable[[int], object] | None = None,
    ) -> np.ndarray:
        """(n, H) float32 unit vectors, in input order; length-sorted batches under inference_mode. `progress(k)` is
        called as each batch of k texts is done (a tqdm bar's update: the callers' shards can be minutes long)."""
        out = np.zeros((len(texts), self.hidden), dtype=np.float32)
        if not texts:
            return out
        enc = self.tokenizer(list(texts), truncation=True, max_length=self.max_length, padding=False)
        ids = enc["input_ids"]
        lengths = [len(x) for x in ids]
        if self.parts > 1:  # served: each text as if alone, the call shared by the streams
            batches = request_batches(lengths, batch_size, self.max_length, self.parts)
        else:
            batches = length_sorted_batches(lengths, batch_size, max_tokens=16384)

        def width_of(idx) -> int:
            return padded_width(max(len(ids[i]) for i in idx), self.max_length)

        def collate(idx, width: int | None = None) -> dict[str, torch.Tensor]:
            width = width or width_of(idx)
            input_ids = np.zeros((len(idx), width), dtype=np.int64)
            mask = np.zeros((len(idx), width), dtype=np.int64)
            for r, i in enumerate(idx):
                input_ids[r, : len(ids[i])] = ids[i]
                mask[r, : len(ids[i])] = 1
            return {
                "input_ids": torch.from_numpy(input_ids).to(self.device),
                "attention_mask": torch.from_numpy(mask).to(self.device),
            }

        if is_openvino(precision):  # a batch per stream at once
            compiled = self.openvino_model(precision, lambda: (LastHidden(self.model.eval()), collate(batches[0][:2])))
            # a request per stream holds at most OPENVINO_REQUEST_TOKENS, each chunk at its batch's width (memory)
            chunks = openvino_requests(batches, width_of)
            run = lambda keyed: ((idx, outputs[0]) for idx, outputs in compiled.map(keyed))
        else:
            chunks = [(b, None) for b in batches]
            model = self.inference_model(precision)
            run = lambda keyed: ((idx, model(**batch).last_hidden_state) for idx, batch in keyed)
        cast = torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=precision == "bf16")

        def keyed():  # each batch keyed by where its vectors go and its mask, for the pooling below
            for idx, width in chunks:
                batch = collate(idx, width)
                yield (idx, batch["attention_mask"]), batch

        with torch.inference_mode(), cast:
            for (idx, t_mask), hidden in run(keyed()):
                m = t_mask.unsqueeze(-1).float()
                emb = (hidden.float() * m).sum(1) / m.sum(1).clamp(min=1.0)
                out[idx] = torch.nn.functional.normalize(emb, dim=-1).cpu().numpy()
                if progress is not None:
                    progress(len(idx))
        return out

    # ------------------------------------------------------------------ fine-tuning (RQE: question pairs)
    def fit(
        self,
        pairs: Sequence[tuple[str, str]],
        labels: Sequence[int],
        *,
        epochs: int,
        lr: float,
        batch_size: int,
        seed: int,
        warmup_ratio: float = 0.1,
        weight_decay: float = 0.01,
        precision: str = "bf16",
        scale: float = 20.0,
        show_progress: bool = True,
    ) -> list[dict[str, float]]:
        """Fine-tune on labelled text pairs: P(label 1) = sigmoid(scale * cos(a, b) + bias), binary cross-entropy,
        AdamW with linear warmup/decay, length-bucketed shuffled batches (by the first text). The learned bias is
        only a training aid: what the encoder keeps is the geometry (callers calibrate cosines on their own data)."""
        from medrank.encoders.runtime import set_seed
        from medrank.encoders.batching import bucketed_shuffle_batches

        y = np.asarray(labels, dtype=np.float32)
        if len(pairs) != len(y) or not len(pairs):
            raise MedrankError(f"fit: {len(pairs)} pairs vs {len(y)} labels (need the same, > 0)")
        set_seed(seed)
        rng = np.random.default_rng(seed)
        a_texts, b_texts = [str(a) for a, _ in pairs], [str(b) for _, b in pairs]
        enc_a = self.tokenizer(a_texts, truncation=True, max_length=self.max_length, padding=False)["input_ids"]
        enc_b = self.tokenizer(b_texts, truncation=True, max_length=self.max_length, padding=False)["input_ids"]
        bias = torch.nn.Parameter(torch.tensor(-0.6 * scale))

        def loss_of(idx: np.ndarray, cast) -> torch.Tensor:
            with cast:
                u = self._pooled([enc_a[i] for i in idx], self.model)
                v = self._pooled([enc_b[i] for i in idx], self.model)
            cos = (u.float() * v.float()).sum(1)
            return torch.nn.functional.binary_cross_entropy_with_logits(
                scale * cos + bias, torch.from_numpy(y[idx]).to(self.device)
            )

        return self._train(
            lambda: bucketed_shuffle_batches([len(x) for x in enc_a], batch_size, rng),
            loss_of,
            n=len(pairs),
            epochs=epochs,
            lr=lr,
            batch_size=batch_size,
            warmup_ratio=warmup_ratio,
            weight_decay=weight_decay,
            precision=precision,
            extra_params=[bias],
            desc="bi-encoder",
            show_progress=show_progress,
        )

    def fit_ranking(
        self,
        queries: Sequence[str],
        positives: Sequence[str],
        negatives: Sequence[str] | None = None,
        *,
        epochs: int,
        lr: float,
        batch_size: int,
        seed: int,
        warmup_ratio: float = 0.1,
        weight_decay: float = 0.01,
        precision: str = "bf16",
        scale: float = 20.0,
        show_progress: bool = True,
    ) -> list[dict[str, float]]:
        """Fine-tune for retrieval: each query against every positive (and hard negative) of its batch, softmax
        cross-entropy towards its own positive (in-batch negatives, multiple-negatives ranking loss), AdamW with
        linear warmup/decay; batches of random queries (length buckets would put near-duplicate queries together)."""
        from medrank.encoders.runtime import set_seed

        n = len(queries)
        if not n or len(positives) != n or (negatives is not None and len(negatives) != n):
            raise MedrankError(
                f"fit_ranking: {n} queries, {len(positives)} positives, {len(negatives or [])} negatives (need the same, > 0)"
            )
        set_seed(seed)
        rng = np.random.default_rng(seed)
        tok = lambda texts: self.tokenizer(
            [str(t) for t in texts], truncation=True, max_length=self.max_length, padding=False
        )["input_ids"]
        enc_q, enc_p = tok(queries), tok(positives)
        enc_n = tok(negatives) if negatives is not None else None

        def loss_of(idx: np.ndarray, cast) -> torch.Tensor:
            with cast:
                q = self._pooled([enc_q[i] for i in idx], self.model)
                d = self._pooled(
                    [enc_p[i] for i in idx] + ([enc_n[i] for i in idx] if enc_n is not None else []), self.model
                )
            logits = scale * q.float() @ d.float().T  # (b, b or 2b): column i is query i's positive
            return torch.nn.functional.cross_entropy(logits, torch.arange(len(idx), device=self.device))

        def batches() -> list[np.ndarray]:
            order = rng.permutation(n)
            return [order[i : i + batch_size] for i in range(0, n, batch_size)]

        return self._train(
            batches,
            loss_of,
            n=n,
            epochs=epochs,
            lr=lr,
            batch_size=batch_size,
            warmup_ratio=warmup_ratio,
            weight_decay=weight_decay,
            precision=precision,
            extra_params=[],
            desc="ranking",
            show_progress=show_progress,
        )

    def _train(
        self,
        batches,
        loss_of,
        *,
        n: int,
        epochs: int,
        lr: float,
        batch_size: int,
        warmup_ratio: float,
        weight_decay: float,
        precision: str,
        extra_params: list[torch.nn.Parameter],
        desc: str,
        show_progress: bool,
    ) -> list[dict[str, float]]:
        """The fine-tuning loop of fit / fit_ranking: AdamW (no decay on biases, LayerNorm and `extra_params`) with linear
        warmup/decay, gradient clipping at 1; `batches()` gives an epoch's index batches, `loss_of(idx, cast)` a loss."""
        from tqdm import tqdm

        decay = [p for n_, p in self.model.named_parameters() if p.ndim >= 2 and "LayerNorm" not in n_]
        no_decay = [p for n_, p in self.model.named_parameters() if not (p.ndim >= 2 and "LayerNorm" not in n_)] + list(
            extra_params
        )
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=lr
        )
        steps = max(1, epochs * -(-n // batch_size))
        warmup = int(steps * warmup_ratio)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: (s + 1) / (warmup + 1) if s < warmup else max(0.0, (steps - s) / max(1, steps - warmup))
        )
        cast = torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=precision == "bf16")
        history = []
        self._int8_model = None
        for epoch in range(1, epochs + 1):
            self.model.train()
            losses: list[float] = []
            for idx in tqdm(
                batches(), desc=f"{desc} epoch {epoch}/{epochs}", unit="batch", disable=not show_progress, leave=False
            ):
                loss = loss_of(idx, cast)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
                losses.append(float(loss.detach()))
            history.append({"epoch": epoch, "train_loss": float(np.mean(losses))})
        self.model.eval()
        return history

    def _pooled(self, ids: list[list[int]], model: torch.nn.Module) -> torch.Tensor:
        """Unit mean-pooled vectors of token id lists (padded to the batch's longest), with gradients."""
        width = padded_width(max(len(x) for x in ids), self.max_length)
        input_ids = torch.zeros((len(ids), width), dtype=torch.long)
        mask = torch.zeros((len(ids), width), dtype=torch.long)
        for r, x in enumerate(ids):
            input_ids[r, : len(x)] = torch.tensor(x)
            mask[r, : len(x)] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        hidden = model(input_ids=input_ids, attention_mask=mask).last_hidden_state.float()
        m = mask.unsqueeze(-1).float()
        return torch.nn.functional.normalize((hidden * m).sum(1) / m.sum(1).clamp(min=1.0), dim=-1)

    def save(self, path: str | os.PathLike) -> str:
        """Write safetensors weights + config + tokenizer to `path` (atomically: a temp folder renamed); the fingerprint."""
        self.fingerprint = save_checkpoint(
            self.model,
            self.tokenizer,
            path,
            meta=lambda fp: (ENCODER_META, {"kind": "sentence-encoder", "fingerprint": fp}),
        )
        return self.fingerprint
